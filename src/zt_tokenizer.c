/* zt_tokenizer.c — BPE as Hugging Face `tokenizers` runs it (byte-level and
 * SentencePiece-style), and the byte tokenizer.
 *
 * Tokens are held as raw bytes: vocabulary strings are mapped back through the
 * inverse of GPT-2's byte-to-unicode table at load time, so encoding works on
 * the text's bytes (a byte-level pre-token's characters are its bytes) and
 * decoding is a table lookup. The pipeline is the library's:
 *   added tokens (normalized=false) on the raw text -> the normalizer (NFC,
 *   Prepend, Replace) on each other piece -> added tokens (normalized=true) ->
 *   Split pre-tokenizers (any behavior) or Metaspace -> BPE per pre-token.
 * BPE is the library's Word::merge_all: a heap of (rank, position) over a linked
 * list of symbols, O(n log n) in the pre-token's length; merge ranks live in a
 * hash map of id pairs, and a bounded cache maps pre-token bytes to their ids.
 *
 * A SentencePiece-style file (Llama-2, Mistral, Gemma: no ByteLevel anywhere) is
 * "char level": the symbols are the pre-token's UTF-8 characters, the
 * vocabulary keeps its own strings ("▁the", "<0xE4>") in `key` for lookups,
 * and `tok` holds what the file's decoder makes of each token on its own
 * ("▁" -> " ", "<0xE4>" -> the byte). What the decoder does across tokens is
 * done at decode time: a run of byte tokens that is not UTF-8 becomes one
 * U+FFFD per byte (ByteFallback), Strip acts on the fused text, the Metaspace
 * decoder treats the first token apart. */
#include "zt_tokenizer.h"

#include "zt_common.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

typedef enum { TOK_BYTE, TOK_BPE } tok_kind_t;

typedef struct {
    uint64_t key;   /* (a << 32 | b) + 1; 0 = empty slot */
    int32_t rank, merged;
} pair_slot_t;

typedef struct {
    char *s; /* content as matched (NFC'd for normalized tokens under an NFC normalizer) */
    size_t len;
    int32_t id;
    unsigned char single_word, lstrip, rstrip, normalized, special;
} added_t;

/* One set of added tokens matched leftmost-longest: sorted by first byte, longest first. */
typedef struct {
    int n;
    added_t **tok;
    int start[257];
} match_set_t;

/* A Split pre-tokenizer's behavior: what becomes of the matches (the library's
 * SplitDelimiterBehavior). */
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } split_behavior_t;

typedef struct {
    pcre2_code *re;
    pcre2_match_data *md;
    int jit, invert;
    split_behavior_t behavior;
} split_t;

/* A normalizer step, applied to each piece between added tokens in file order. */
typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind_t;
typedef struct {
    norm_kind_t kind;
    char *a, *b; /* PREPEND a; REPLACE every a by b */
    size_t la, lb;
} norm_t;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_t;

/* DEC_PIECES: a Sequence of Replace (per token), ByteFallback, Fuse, Strip (on the fused text). */
typedef enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_PIECES } dec_kind_t;

typedef struct {
    uint64_t h; /* 0 = empty */
    uint32_t off, len, ids_off, nids;
} cache_slot_t;

#define MAX_SPLITS 4
#define MAX_NORMS 8
#define MAX_REPLACE 4
#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX_WORD 256

struct zt_tokenizer {
    tok_kind_t kind;
    const char *kind_name;
    int vocab_size, eot;
    char **tok;             /* (V) bytes of each token (decoder output), NULL for holes */
    size_t *tok_len;        /* (V) */
    int32_t *str_map;       /* open addressing: raw bytes of byte-level vocab tokens -> id, -1 empty */
    size_t str_cap;
    pair_slot_t *pairs;
    size_t pair_cap;
    int32_t byte_id[256];   /* -1: not in the vocabulary */
    int32_t unk;
    int ignore_merges, byte_fallback, fuse_unk;
    int32_t fb_id[256];     /* byte_fallback: the id of "<0xXX>", -1: not in the vocabulary */
    int char_level;         /* SentencePiece style: symbols are characters, see the top */
    char **key;             /* char level: (V) the vocabulary's own strings, which str_map indexes */
    size_t *key_len;        /* (V) */
    int nnorm;
    norm_t norm[MAX_NORMS];
    int nsplit;
    split_t split[MAX_SPLITS];
    int metaspace, ms_split; /* the Metaspace pre-tokenizer */
    prepend_t ms_prepend;
    char ms_rep[8];
    size_t ms_rep_len;
    const char *enc_text, *first_base; /* Metaspace "first": where the piece at offset 0 of the input starts */
    dec_kind_t dec;
    unsigned char *is_byte; /* (V) ByteFallback decoder: tok is the one byte of a "<0xXX>" token */
    char **tok_first;       /* (V) Metaspace decoder: a token as the first of a decode (NULL: as tok) */
    size_t *tok_first_len;
    int nrepl, dec_fallback, strip_start, strip_stop;
    char *repl_a[MAX_REPLACE], *repl_b[MAX_REPLACE];
    size_t repl_la[MAX_REPLACE], repl_lb[MAX_REPLACE];
    char strip_c[8], dec_rep[8];
    size_t strip_len, dec_rep_len;
    int dec_first_strip;    /* Metaspace decoder: the first token loses its replacement characters */
    int nadded;
    added_t *added;
    match_set_t raw_set, norm_set;
    cache_slot_t *cache;
    char *cache_bytes;
    int32_t *cache_ids;
    size_t cache_used, cache_bytes_len, cache_bytes_cap, cache_ids_len, cache_ids_cap;
};

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- the byte tokenizer ------------------------------------------------------ */

static char byte_chars[256];
static const char eot_text[] = "<|endoftext|>";
static struct zt_tokenizer byte_tok = {.kind = TOK_BYTE, .kind_name = "byte", .vocab_size = 257, .eot = 256};

zt_tokenizer_t *zt_tokenizer_byte(void) { return &byte_tok; }

/* ---- GPT-2's byte <-> unicode alphabet --------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes are given code
 * points 256, 257, ... in byte order, so every byte has a visible character. */
static int byte_to_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static int cp_to_byte_table[324];
static int byte_cp_table[256];

static void init_cp_table(void)
{
    if (cp_to_byte_table[0] != 0) return;
    for (int i = 0; i < 324; i++) cp_to_byte_table[i] = -1;
    for (int b = 0; b < 256; b++) {
        byte_cp_table[b] = byte_to_cp(b);
        cp_to_byte_table[byte_cp_table[b]] = b;
    }
}

/* Decodes one UTF-8 code point at s[*i]; an invalid byte is returned as -(byte)-1
 * and skipped alone. */
static int utf8_next(const unsigned char *s, size_t n, size_t *i)
{
    unsigned c = s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || *i + (size_t)len > n) {
        (*i)++;
        return -(int)c - 1;
    }
    int cp = len == 1 ? (int)c : len == 2 ? (int)(c & 0x1f) : len == 3 ? (int)(c & 0x0f) : (int)(c & 0x07);
    for (int k = 1; k < len; k++) {
        unsigned cc = s[*i + (size_t)k];
        if ((cc >> 6) != 2) {
            (*i)++;
            return -(int)c - 1;
        }
        cp = (cp << 6) | (int)(cc & 0x3f);
    }
    *i += (size_t)len;
    return cp;
}

/* The ByteLevel decoder on one token: its characters back to bytes when every one
 * is in the alphabet (returns 1), else the token's own UTF-8 (returns 0). out
 * holds len bytes: the raw form is never longer. */
static int unmap_token(const char *s, size_t len, char *out, size_t *olen)
{
    size_t i = 0, o = 0;
    while (i < len) {
        int cp = utf8_next((const unsigned char *)s, len, &i);
        if (cp < 0 || cp >= 324 || cp_to_byte_table[cp] < 0) {
            memcpy(out, s, len);
            *olen = len;
            return 0;
        }
        out[o++] = (char)cp_to_byte_table[cp];
    }
    *olen = o;
    return 1;
}

/* Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s). */
static int is_ws(int cp)
{
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}
#define WS_CLASS "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* A word character for single_word: the library tests its neighbours with the
 * regex crate's Unicode \w (Alphabetic, Mark, Decimal_Number,
 * Connector_Punctuation, Join_Control); Alphabetic as L, Nl and the letter-like
 * symbols of Other_Alphabetic (circled and squared Latin letters). */
static int is_word(int cp)
{
    if (cp < 0) return 0;
    if (cp < 128) return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z') || cp == '_';
    if (cp == 0x200c || cp == 0x200d || (cp >= 0x24b6 && cp <= 0x24e9) || (cp >= 0x1f130 && cp <= 0x1f149) ||
        (cp >= 0x1f150 && cp <= 0x1f169) || (cp >= 0x1f170 && cp <= 0x1f189))
        return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The last code point of s[0..n). */
static int last_cp(const unsigned char *s, size_t n)
{
    if (n == 0) return -1;
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && (s[i] & 0xc0) == 0x80) i--;
    size_t j = i;
    int cp = utf8_next(s, n, &j);
    return j == n ? cp : -1;
}

/* ---- hash maps ------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* str_map indexes the vocabulary's strings: raw bytes (byte level) or the file's own (char level). */
static int32_t str_lookup(const zt_tokenizer_t *t, const char *s, size_t n)
{
    char *const *ks = t->key ? t->key : t->tok;
    const size_t *kl = t->key ? t->key_len : t->tok_len;
    size_t m = t->str_cap - 1;
    for (size_t h = hash_bytes(s, n) & m;; h = (h + 1) & m) {
        int32_t id = t->str_map[h];
        if (id < 0) return -1;
        if (kl[id] == n && memcmp(ks[id], s, n) == 0) return id;
    }
}

static void str_insert(zt_tokenizer_t *t, int32_t id)
{
    size_t m = t->str_cap - 1;
    size_t h = t->key ? hash_bytes(t->key[id], t->key_len[id]) & m : hash_bytes(t->tok[id], t->tok_len[id]) & m;
    while (t->str_map[h] >= 0) h = (h + 1) & m;
    t->str_map[h] = id;
}

static const pair_slot_t *pair_lookup(const zt_tokenizer_t *t, int32_t a, int32_t b)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t m = t->pair_cap - 1;
    for (size_t h = hash_u64(key) & m;; h = (h + 1) & m) {
        if (t->pairs[h].key == 0) return NULL;
        if (t->pairs[h].key == key) return &t->pairs[h];
    }
}

static void pair_insert(zt_tokenizer_t *t, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t m = t->pair_cap - 1;
    size_t h = hash_u64(key) & m;
    while (t->pairs[h].key != 0 && t->pairs[h].key != key) h = (h + 1) & m;
    if (t->pairs[h].key == key) return; /* a repeated merge keeps its first (lowest) rank */
    t->pairs[h] = (pair_slot_t){key, rank, merged};
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- building: vocabulary, merges, added tokens --------------------------------- */

typedef struct {
    size_t n, cap;
    char **raw;
    size_t *len;
    int32_t *id;
    unsigned char *bytelevel;
} vocab_list_t;

/* unmap: byte-level keys go back to raw bytes; char-level ones are kept as they are. */
static void vl_push(vocab_list_t *v, const char *key, int32_t id, int unmap)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1024;
        v->raw = realloc(v->raw, v->cap * sizeof *v->raw);
        v->len = realloc(v->len, v->cap * sizeof *v->len);
        v->id = realloc(v->id, v->cap * sizeof *v->id);
        v->bytelevel = realloc(v->bytelevel, v->cap);
        if (!v->raw || !v->len || !v->id || !v->bytelevel) zt_fatal("out of memory: vocabulary");
    }
    size_t sl = strlen(key);
    v->raw[v->n] = zt_malloc(sl + 1);
    if (unmap) v->bytelevel[v->n] = (unsigned char)unmap_token(key, sl, v->raw[v->n], &v->len[v->n]);
    else {
        memcpy(v->raw[v->n], key, sl);
        v->len[v->n] = sl;
        v->bytelevel[v->n] = 1;
    }
    v->raw[v->n][v->len[v->n]] = 0;
    v->id[v->n++] = id;
}

static void vl_free(vocab_list_t *v)
{
    for (size_t i = 0; i < v->n; i++) free(v->raw[i]);
    free(v->raw);
    free(v->len);
    free(v->id);
    free(v->bytelevel);
}

/* Installs the vocabulary (and sizes the id space to cover max_extra_id). */
static int install_vocab(zt_tokenizer_t *t, vocab_list_t *v, int max_extra_id, const char *where, char *err,
                         size_t errlen)
{
    int maxid = max_extra_id;
    for (size_t i = 0; i < v->n; i++)
        if (v->id[i] > maxid) maxid = v->id[i];
    if (v->n == 0) return zt_err(err, errlen, "%s: empty vocabulary", where);
    t->vocab_size = maxid + 1;
    t->tok = zt_calloc((size_t)t->vocab_size, sizeof *t->tok);
    t->tok_len = zt_calloc((size_t)t->vocab_size, sizeof *t->tok_len);
    if (t->char_level) { /* tok is the decoder's, made in finish() */
        t->key = zt_calloc((size_t)t->vocab_size, sizeof *t->key);
        t->key_len = zt_calloc((size_t)t->vocab_size, sizeof *t->key_len);
    }
    char **ks = t->key ? t->key : t->tok;
    size_t *kl = t->key ? t->key_len : t->tok_len;
    t->str_cap = pow2_at_least(2 * v->n);
    t->str_map = zt_malloc(t->str_cap * sizeof *t->str_map);
    for (size_t i = 0; i < t->str_cap; i++) t->str_map[i] = -1;
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->id[i];
        if (ks[id]) return zt_err(err, errlen, "%s: id %d used twice", where, id);
        ks[id] = v->raw[i];
        kl[id] = v->len[i];
        v->raw[i] = NULL;
        if (v->bytelevel[i] && str_lookup(t, ks[id], kl[id]) < 0) str_insert(t, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = str_lookup(t, &c, 1);
    }
    return 0;
}

/* A vocabulary string in the form str_map holds: raw bytes (byte level; 0 when
 * it is not in the byte alphabet) or as it is (char level). */
static int key_form(const zt_tokenizer_t *t, const char *s, size_t n, char *out, size_t *olen)
{
    if (!t->char_level) return unmap_token(s, n, out, olen);
    memcpy(out, s, n);
    *olen = n;
    return 1;
}

/* A merge of two vocabulary strings. Returns 0, 1 when the merge cannot take
 * part in byte-level encoding (skipped), -1 when a part is missing from the
 * vocabulary. */
static int add_merge(zt_tokenizer_t *t, const char *a, size_t la, const char *b, size_t lb, int32_t rank)
{
    char *buf = zt_malloc(2 * (la + lb) + 2), *ra = buf, *rb = buf + la + 1, *ab = buf + la + lb + 2;
    size_t ra_len, rb_len;
    int rc = 1;
    if (key_form(t, a, la, ra, &ra_len) && key_form(t, b, lb, rb, &rb_len)) {
        memcpy(ab, ra, ra_len);
        memcpy(ab + ra_len, rb, rb_len);
        int32_t ia = str_lookup(t, ra, ra_len), ib = str_lookup(t, rb, rb_len), im = str_lookup(t, ab, ra_len + rb_len);
        if (ia < 0 || ib < 0 || im < 0) rc = -1;
        else {
            pair_insert(t, ia, ib, rank, im);
            rc = 0;
        }
    }
    free(buf);
    return rc;
}

static int cmp_added(const void *x, const void *y)
{
    const added_t *a = *(added_t *const *)x, *b = *(added_t *const *)y;
    unsigned char fa = (unsigned char)a->s[0], fb = (unsigned char)b->s[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void build_set(zt_tokenizer_t *t, match_set_t *ms, int normalized)
{
    ms->tok = zt_calloc((size_t)t->nadded + 1, sizeof *ms->tok);
    ms->n = 0;
    for (int i = 0; i < t->nadded; i++)
        if (!!t->added[i].normalized == normalized && t->added[i].len > 0) ms->tok[ms->n++] = &t->added[i];
    qsort(ms->tok, (size_t)ms->n, sizeof *ms->tok, cmp_added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < ms->n && (unsigned char)ms->tok[k]->s[0] < b) k++;
        ms->start[b] = k;
    }
}

/* NFC through utf8proc; NULL when s is ASCII (nothing to do). Only the non-ASCII
 * runs, each with the ASCII character before it (a base their marks may compose
 * with), go through utf8proc: an ASCII character is a starter that never
 * composes with what precedes it, so NFC never acts across one. A run that is
 * not valid UTF-8 is kept as it is. */
static char *nfc(const char *s, size_t n, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && u[i] < 0x80) i++;
    if (i == n) return NULL;
    size_t cap = n + n / 2 + 16, o = 0;
    char *out = zt_malloc(cap);
    i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && u[j] < 0x80) j++;
        size_t rs = j == n ? n : j > i ? j - 1 : j, k = j;
        memcpy(out + o, s + i, rs - i);
        o += rs - i;
        if (rs == n) break;
        while (k < n && u[k] >= 0x80) k++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map(u + rs, (utf8proc_ssize_t)(k - rs), &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        const char *src = r >= 0 ? (const char *)dst : s + rs;
        size_t len = r >= 0 ? (size_t)r : k - rs;
        if (o + len + (n - k) > cap) {
            cap = 2 * (o + len + (n - k)) + 16;
            out = realloc(out, cap);
            if (!out) zt_fatal("out of memory: NFC of %zu bytes", n);
        }
        memcpy(out + o, src, len);
        o += len;
        free(dst);
        i = k;
    }
    *out_len = o;
    return out;
}

/* Every a in s[0..n) replaced by b, left to right without overlaps (the library's
 * Replace with a String pattern); NULL when there is none. */
static char *replace_all(const char *s, size_t n, const char *a, size_t la, const char *b, size_t lb, size_t *out_len)
{
    size_t hits = 0;
    for (size_t i = 0; i + la <= n;)
        if (memcmp(s + i, a, la) == 0) hits++, i += la;
        else i++;
    if (hits == 0) return NULL;
    char *out = zt_malloc(n - hits * la + hits * lb + 1), *o = out;
    for (size_t i = 0; i < n;)
        if (i + la <= n && memcmp(s + i, a, la) == 0) {
            memcpy(o, b, lb);
            o += lb;
            i += la;
        } else {
            *o++ = s[i++];
        }
    *out_len = (size_t)(o - out);
    return out;
}

/* One normalizer step; NULL when it leaves the text as it is. */
static char *norm_step(const norm_t *m, const char *s, size_t n, size_t *out_len)
{
    if (m->kind == NORM_NFC) return nfc(s, n, out_len);
    if (m->kind == NORM_REPLACE) return replace_all(s, n, m->a, m->la, m->b, m->lb, out_len);
    if (n == 0) return NULL; /* Prepend leaves an empty piece alone */
    char *out = zt_malloc(m->la + n + 1);
    memcpy(out, m->a, m->la);
    memcpy(out + m->la, s, n);
    *out_len = m->la + n;
    return out;
}

/* The normalizer on one piece; NULL when nothing changed. */
static char *normalize(const zt_tokenizer_t *t, const char *s, size_t n, size_t *out_len)
{
    char *cur = NULL;
    size_t cl = n;
    for (int i = 0; i < t->nnorm; i++) {
        size_t nl;
        char *r = norm_step(&t->norm[i], cur ? cur : s, cl, &nl);
        if (r) {
            free(cur);
            cur = r;
            cl = nl;
        }
    }
    *out_len = cl;
    return cur;
}

/* Rewrites Oniguruma's (Ruby syntax) escapes that PCRE2 reads otherwise or not at
 * all: \s and \S to Unicode White_Space, \h and \H to hex digits (PCRE2's \h is
 * horizontal space), \uHHHH to \x{HHHH}; then compiles. */
static int add_split(zt_tokenizer_t *t, const char *pat, int literal, split_behavior_t behavior, int invert,
                     const char *where, char *err, size_t errlen)
{
    if (t->nsplit == MAX_SPLITS) return zt_err(err, errlen, "%s: more than %d Split pre-tokenizers", where, MAX_SPLITS);
    size_t n = strlen(pat);
    char *p = zt_malloc(n * 64 + 1), *o = p;
    if (literal) {
        memcpy(p, pat, n);
        o = p + n;
    } else {
        int in_class = 0;
        for (size_t i = 0; i < n; i++) {
            char c = pat[i];
            if (c == '\\' && i + 1 < n) {
                char d = pat[++i];
                if (d == 's') o += sprintf(o, in_class ? "%s" : "[%s]", WS_CLASS);
                else if (d == 'h') o += sprintf(o, in_class ? "%s" : "[%s]", "0-9a-fA-F");
                else if ((d == 'S' || d == 'H') && !in_class)
                    o += sprintf(o, "[^%s]", d == 'S' ? WS_CLASS : "0-9a-fA-F");
                else if (d == 'S' || d == 'H') {
                    free(p);
                    return zt_err(err, errlen, "%s: \\%c inside a character class is not supported", where, d);
                } else if (d == 'u' && i + 4 < n && strspn(pat + i + 1, "0123456789abcdefABCDEF") >= 4) {
                    o += sprintf(o, "\\x{%.4s}", pat + i + 1);
                    i += 4;
                } else {
                    *o++ = c;
                    *o++ = d;
                }
                continue;
            }
            if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* [:alpha:] */
                const char *e = strstr(pat + i, ":]");
                size_t l = e ? (size_t)(e - (pat + i)) + 2 : 1;
                memcpy(o, pat + i, l);
                o += l;
                i += l - 1;
                continue;
            }
            if (!in_class && c == '[') {
                in_class = 1;
                *o++ = c;
                if (i + 1 < n && pat[i + 1] == '^') *o++ = pat[++i];
                if (i + 1 < n && pat[i + 1] == ']') *o++ = pat[++i]; /* a leading ] is literal */
                continue;
            }
            if (in_class && c == ']') in_class = 0;
            *o++ = c;
        }
    }
    *o = 0;
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, (PCRE2_SIZE)(o - p), opts, &ecode, &eoff, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return zt_err(err, errlen, "%s: regex /%.60s/: %s", where, pat, (const char *)msg);
    }
    split_t *s = &t->split[t->nsplit++];
    s->re = re;
    s->behavior = behavior;
    s->invert = invert;
    s->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    s->md = pcre2_match_data_create_from_pattern(re, NULL);
    return 0;
}

static zt_tokenizer_t *new_bpe(const char *kind_name)
{
    init_cp_table();
    zt_tokenizer_t *t = zt_calloc(1, sizeof *t);
    t->kind = TOK_BPE;
    t->kind_name = kind_name;
    t->eot = -1;
    t->unk = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = t->fb_id[b] = -1;
    return t;
}

static void add_added(zt_tokenizer_t *t, const char *content, int32_t id, int single_word, int lstrip,
                      int rstrip, int normalized, int special)
{
    t->added = realloc(t->added, (size_t)(t->nadded + 1) * sizeof *t->added);
    if (!t->added) zt_fatal("out of memory: added tokens");
    added_t *a = &t->added[t->nadded++];
    a->len = strlen(content);
    a->s = zt_malloc(a->len + 1);
    memcpy(a->s, content, a->len + 1);
    a->id = id;
    a->single_word = (unsigned char)single_word;
    a->lstrip = (unsigned char)lstrip;
    a->rstrip = (unsigned char)rstrip;
    a->normalized = (unsigned char)normalized;
    a->special = (unsigned char)special;
}

static char *dup_bytes(const char *s, size_t n)
{
    char *d = zt_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* "<0xXX>" as the ByteFallback decoder reads it (Rust's u8::from_str_radix on
 * the two characters, which takes a leading '+' and either case): the byte, or -1. */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = s[3] == '+' ? 4 : 3; k < 5; k++) {
        int c = (unsigned char)s[k], d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = 16 * v + d;
    }
    return v;
}

/* Char level: what the decoder makes of token id on its own, from its string s. */
static void set_decoded(zt_tokenizer_t *t, int32_t id, const char *s, size_t n)
{
    char *d = NULL;
    size_t dl = 0;
    free(t->tok[id]);
    free(t->tok_first[id]);
    t->tok_first[id] = NULL;
    t->is_byte[id] = 0;
    if (t->dec == DEC_METASPACE) {
        d = replace_all(s, n, t->dec_rep, t->dec_rep_len, " ", 1, &dl);
        if (t->dec_first_strip) {
            size_t fl;
            char *f = replace_all(s, n, t->dec_rep, t->dec_rep_len, "", 0, &fl);
            if (f) {
                t->tok_first[id] = f;
                t->tok_first_len[id] = fl;
            }
        }
    } else {
        for (int k = 0; k < t->nrepl; k++) {
            size_t rl;
            char *r = replace_all(d ? d : s, d ? dl : n, t->repl_a[k], t->repl_la[k], t->repl_b[k], t->repl_lb[k], &rl);
            if (r) {
                free(d);
                d = r;
                dl = rl;
            }
        }
        int b = t->dec_fallback ? byte_token(d ? d : s, d ? dl : n) : -1;
        if (b >= 0) {
            free(d);
            d = zt_malloc(2);
            d[0] = (char)b;
            dl = 1;
            t->is_byte[id] = 1;
        }
    }
    if (!d) {
        d = dup_bytes(s, n);
        dl = n;
    }
    d[dl] = 0;
    t->tok[id] = d;
    t->tok_len[id] = dl;
}

/* After the vocabulary: added tokens' decoded bytes override the model's, the
 * normalized ones are matched in normalized form, the match sets are built. */
static void finish(zt_tokenizer_t *t)
{
    if (t->char_level) {
        t->is_byte = zt_calloc((size_t)t->vocab_size, 1);
        t->tok_first = zt_calloc((size_t)t->vocab_size, sizeof *t->tok_first);
        t->tok_first_len = zt_calloc((size_t)t->vocab_size, sizeof *t->tok_first_len);
        for (int32_t id = 0; id < t->vocab_size; id++)
            if (t->key[id]) set_decoded(t, id, t->key[id], t->key_len[id]);
    }
    for (int i = 0; i < t->nadded; i++) {
        /* the library decodes a normalized token from its normalized form ("▁<pad>") */
        added_t *a = &t->added[i];
        size_t nl;
        char *ns = a->normalized ? normalize(t, a->s, a->len, &nl) : NULL;
        const char *ds = ns ? ns : a->s;
        size_t dl = ns ? nl : a->len;
        if (t->char_level) set_decoded(t, a->id, ds, dl);
        else {
            char *raw = zt_malloc(dl + 1);
            size_t rl;
            unmap_token(ds, dl, raw, &rl);
            free(t->tok[a->id]);
            t->tok[a->id] = raw;
            t->tok_len[a->id] = rl;
        }
        if (ns) {
            free(a->s);
            a->s = ns;
            a->len = nl;
        }
    }
    build_set(t, &t->raw_set, 0);
    build_set(t, &t->norm_set, 1);
    t->cache = zt_calloc(CACHE_SLOTS, sizeof *t->cache);
}

static void set_default_eot(zt_tokenizer_t *t)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
    for (size_t k = 0; k < sizeof names / sizeof *names && t->eot < 0; k++)
        t->eot = zt_tokenizer_token_id(t, names[k], strlen(names[k]));
}

/* ---- GPT-2 files: vocab.json + merges.txt ---------------------------------------- */

static int load_vocab_json(vocab_list_t *v, const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return -1;
    /* jansson refuses a key holding U+0000; a byte-level vocabulary has none (its
     * alphabet spells byte 0 as U+0100). Of a repeated key the last entry counts. */
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    free(text);
    if (!root) return zt_err(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    int rc = 0;
    if (!json_is_object(root)) rc = zt_err(err, errlen, "%s: not a JSON object", path);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (rc) break;
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > 10000000)
            rc = zt_err(err, errlen, "%s: bad token id for \"%.40s\" (a non-negative integer up to 10^7)", path, key);
        else vl_push(v, key, (int32_t)id, 1);
    }
    json_decref(root);
    return rc;
}

static int load_merges_txt(zt_tokenizer_t *t, const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return -1;
    size_t nlines = 1;
    for (size_t i = 0; i < n; i++) nlines += text[i] == '\n';
    t->pair_cap = pow2_at_least(2 * nlines);
    t->pairs = zt_calloc(t->pair_cap, sizeof *t->pairs);
    int rc = 0, line = 0, rank = 0;
    for (char *p = text; p < text + n && rc == 0; line++) {
        char *eol = memchr(p, '\n', (size_t)(text + n - p));
        if (!eol) eol = text + n;
        size_t len = (size_t)(eol - p);
        if (len && p[len - 1] == '\r') len--;
        char *sp = memchr(p, ' ', len);
        if (len == 0 || (line == 0 && len >= 8 && strncmp(p, "#version", 8) == 0)) {
            /* header or blank line */
        } else if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp - p) - 1)) {
            rc = zt_err(err, errlen, "%s:%d: expected two tokens separated by one space", path, line + 1);
        } else if (add_merge(t, p, (size_t)(sp - p), sp + 1, len - (size_t)(sp - p) - 1, rank++) < 0) {
            rc = zt_err(err, errlen, "%s:%d: merge '%.*s' uses a token missing from the vocabulary", path,
                        line + 1, (int)ZT_MIN(len, (size_t)64), p);
        }
        p = eol + 1;
    }
    free(text);
    return rc;
}

zt_tokenizer_t *zt_tokenizer_open_bpe(const char *vocab_json, const char *merges_txt, char *err,
                                      size_t errlen)
{
    zt_tokenizer_t *t = new_bpe("gpt2-bpe");
    vocab_list_t v = {0};
    int rc = load_vocab_json(&v, vocab_json, err, errlen);
    if (rc == 0) rc = install_vocab(t, &v, -1, vocab_json, err, errlen);
    vl_free(&v);
    if (rc == 0) rc = load_merges_txt(t, merges_txt, err, errlen);
    if (rc == 0) rc = add_split(t, GPT2_PATTERN, 0, SPLIT_ISOLATED, 0, vocab_json, err, errlen);
    if (rc != 0) {
        zt_tokenizer_close(t);
        return NULL;
    }
    int32_t e = str_lookup(t, eot_text, strlen(eot_text));
    if (e >= 0) add_added(t, eot_text, e, 0, 0, 0, 0, 1);
    finish(t);
    t->eot = e;
    return t;
}

/* ---- tokenizer.json ------------------------------------------------------------------ */

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} jctx_t;

/* A key that must be absent, null, false or "" (features not implemented). */
static int refuse_set(jctx_t *c, json_t *obj, const char *objname, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && !json_string_length(v))) return 0;
    return zt_err(c->err, c->errlen, "%s: %s.%s is set: not supported", c->path, objname, key);
}

static const char *jtype(json_t *obj) { return json_string_value(json_object_get(obj, "type")); }

/* obj.key: a string of exactly one character (a Rust char), copied to out[8]. */
static int one_char(jctx_t *c, json_t *obj, const char *name, const char *key, char *out, size_t *len)
{
    json_t *v = json_object_get(obj, key);
    const char *s = json_string_value(v);
    size_t n = s ? json_string_length(v) : 0, i = 0;
    if (n == 0 || n > 4 || utf8_next((const unsigned char *)s, n, &i) <= 0 || i != n)
        return zt_err(c->err, c->errlen, "%s: %s.%s: not one character", c->path, name, key);
    memcpy(out, s, n);
    out[n] = 0;
    *len = n;
    return 0;
}

/* obj.pattern {"String": ...} and obj.content, malloc'd (a Regex pattern is not implemented). */
static int string_replace(jctx_t *c, json_t *obj, const char *name, char **a, size_t *la, char **b, size_t *lb)
{
    json_t *pat = json_object_get(obj, "pattern"), *str = json_object_get(pat, "String"),
           *content = json_object_get(obj, "content");
    if (json_object_get(pat, "Regex"))
        return zt_err(c->err, c->errlen, "%s: %s.pattern.Regex: not supported (String only)", c->path, name);
    if (!json_is_string(str) || !json_string_length(str))
        return zt_err(c->err, c->errlen, "%s: %s.pattern: no String", c->path, name);
    if (!json_is_string(content)) return zt_err(c->err, c->errlen, "%s: %s.content: not a string", c->path, name);
    *a = dup_bytes(json_string_value(str), *la = json_string_length(str));
    *b = dup_bytes(json_string_value(content), *lb = json_string_length(content));
    return 0;
}

static int parse_normalizer(zt_tokenizer_t *t, jctx_t *c, json_t *n, const char *name)
{
    if (!n || json_is_null(n)) return 0;
    const char *ty = jtype(n);
    if (ty && (strcmp(ty, "NFC") == 0 || strcmp(ty, "Prepend") == 0 || strcmp(ty, "Replace") == 0)) {
        if (t->nnorm == MAX_NORMS)
            return zt_err(c->err, c->errlen, "%s: %s: more than %d normalizers", c->path, name, MAX_NORMS);
        norm_t *m = &t->norm[t->nnorm];
        *m = (norm_t){.kind = ty[0] == 'N' ? NORM_NFC : ty[0] == 'P' ? NORM_PREPEND : NORM_REPLACE};
        if (m->kind == NORM_PREPEND) {
            json_t *pre = json_object_get(n, "prepend");
            if (!json_is_string(pre)) return zt_err(c->err, c->errlen, "%s: %s.prepend: not a string", c->path, name);
            m->a = dup_bytes(json_string_value(pre), m->la = json_string_length(pre));
        } else if (m->kind == NORM_REPLACE && string_replace(c, n, name, &m->a, &m->la, &m->b, &m->lb) != 0) {
            return -1;
        }
        t->nnorm++;
        return 0;
    }
    if (ty && strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return zt_err(c->err, c->errlen, "%s: %s.normalizers: not an array", c->path, name);
        size_t i;
        json_t *e;
        json_array_foreach(arr, i, e) {
            char sub[64];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", name, i);
            if (parse_normalizer(t, c, e, sub) != 0) return -1;
        }
        return 0;
    }
    return zt_err(c->err, c->errlen, "%s: %s.type '%s' is not supported (NFC, Prepend, Replace, Sequence)", c->path,
                  name, ty ? ty : "?");
}

/* A Metaspace pre-tokenizer or decoder, read as the library's deserializer reads it:
 * prepend_scheme defaults to always, split to true; the older add_prefix_space
 * (false means never, and then prepend_scheme must say never too) and str_rep keys. */
static int parse_metaspace(jctx_t *c, json_t *p, const char *name, char *rep, size_t *rep_len, prepend_t *scheme,
                           int *split)
{
    if (one_char(c, p, name, "replacement", rep, rep_len) != 0) return -1;
    json_t *ps = json_object_get(p, "prepend_scheme"), *aps = json_object_get(p, "add_prefix_space"),
           *sp = json_object_get(p, "split");
    const char *pss = json_string_value(ps);
    *scheme = PREPEND_ALWAYS;
    if (ps && !pss) return zt_err(c->err, c->errlen, "%s: %s.prepend_scheme: not a string", c->path, name);
    if (pss && strcmp(pss, "first") == 0) *scheme = PREPEND_FIRST;
    else if (pss && strcmp(pss, "never") == 0) *scheme = PREPEND_NEVER;
    else if (pss && strcmp(pss, "always") != 0)
        return zt_err(c->err, c->errlen, "%s: %s.prepend_scheme '%s' is not supported (first, always, never)",
                      c->path, name, pss);
    if (aps && !json_is_boolean(aps))
        return zt_err(c->err, c->errlen, "%s: %s.add_prefix_space: not a boolean", c->path, name);
    if (json_is_false(aps)) {
        if (*scheme != PREPEND_NEVER)
            return zt_err(c->err, c->errlen, "%s: %s.add_prefix_space is false but prepend_scheme is not never",
                          c->path, name);
    }
    if (sp && !json_is_null(sp) && !json_is_boolean(sp))
        return zt_err(c->err, c->errlen, "%s: %s.split: not a boolean", c->path, name);
    *split = !json_is_false(sp);
    return 0;
}

static int parse_pretok(zt_tokenizer_t *t, jctx_t *c, json_t *p, const char *name, int *bytelevel)
{
    const char *ty = p ? jtype(p) : NULL;
    if (*bytelevel) return zt_err(c->err, c->errlen, "%s: %s: a pre-tokenizer after ByteLevel is not supported", c->path, name);
    if (!ty && strcmp(name, "pre_tokenizer") == 0 && (!p || json_is_null(p))) return 0; /* none */
    if (!ty) return zt_err(c->err, c->errlen, "%s: %s: no type", c->path, name);
    if (strcmp(ty, "Metaspace") == 0) {
        if (strcmp(name, "pre_tokenizer") != 0)
            return zt_err(c->err, c->errlen, "%s: %s: Metaspace inside a Sequence is not supported", c->path, name);
        t->metaspace = 1;
        return parse_metaspace(c, p, name, t->ms_rep, &t->ms_rep_len, &t->ms_prepend, &t->ms_split);
    }
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return zt_err(c->err, c->errlen, "%s: %s.pretokenizers: not an array", c->path, name);
        size_t i;
        json_t *e;
        json_array_foreach(arr, i, e) {
            char sub[64];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", name, i);
            if (parse_pretok(t, c, e, sub, bytelevel) != 0) return -1;
        }
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return zt_err(c->err, c->errlen, "%s: %s.add_prefix_space is true: not supported", c->path, name);
        json_t *ur = json_object_get(p, "use_regex");
        if ((!ur || json_is_true(ur)) &&
            add_split(t, GPT2_PATTERN, 0, SPLIT_ISOLATED, 0, c->path, c->err, c->errlen) != 0)
            return -1;
        *bytelevel = 1;
        return 0;
    }
    if (strcmp(ty, "Split") == 0) {
        static const char *const behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                                "Contiguous"};
        json_t *pat = json_object_get(p, "pattern"), *inv = json_object_get(p, "invert");
        const char *rx = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!rx && !lit) return zt_err(c->err, c->errlen, "%s: %s.pattern: neither Regex nor String", c->path, name);
        int b = 0;
        while (beh && b < 5 && strcmp(beh, behaviors[b]) != 0) b++;
        if (!beh || b == 5)
            return zt_err(c->err, c->errlen, "%s: %s.behavior '%s' is not supported (Removed, Isolated, "
                          "MergedWithPrevious, MergedWithNext, Contiguous)", c->path, name, beh ? beh : "?");
        if (inv && !json_is_boolean(inv))
            return zt_err(c->err, c->errlen, "%s: %s.invert: not a boolean", c->path, name);
        char where[600];
        snprintf(where, sizeof where, "%s: %s.pattern", c->path, name);
        return add_split(t, rx ? rx : lit, rx == NULL, (split_behavior_t)b, json_is_true(inv), where, c->err,
                         c->errlen);
    }
    return zt_err(c->err, c->errlen, "%s: %s.type '%s' is not supported (ByteLevel, Split, Sequence, Metaspace)", c->path,
                  name, ty);
}

/* One step of a SentencePiece-style decoder Sequence. *stage: 0 per token
 * (Replace), 1 after ByteFallback, 2 after Fuse (one string: Strip acts on the
 * whole text), 3 after Strip. */
static int parse_dec_step(zt_tokenizer_t *t, jctx_t *c, json_t *d, const char *name, int *stage)
{
    const char *ty = jtype(d);
    if (ty && strcmp(ty, "Replace") == 0) {
        if (*stage > 0)
            return zt_err(c->err, c->errlen, "%s: %s: Replace after ByteFallback or Fuse is not supported", c->path, name);
        if (t->nrepl == MAX_REPLACE) return zt_err(c->err, c->errlen, "%s: %s: more than %d Replace", c->path, name, MAX_REPLACE);
        int k = t->nrepl;
        if (string_replace(c, d, name, &t->repl_a[k], &t->repl_la[k], &t->repl_b[k], &t->repl_lb[k]) != 0) return -1;
        t->nrepl++;
        return 0;
    }
    if (ty && strcmp(ty, "ByteFallback") == 0) {
        if (*stage > 0)
            return zt_err(c->err, c->errlen, "%s: %s: ByteFallback after ByteFallback or Fuse is not supported", c->path, name);
        t->dec_fallback = 1;
        *stage = 1;
        return 0;
    }
    if (ty && strcmp(ty, "Fuse") == 0) {
        if (*stage < 2) *stage = 2;
        return 0;
    }
    if (ty && strcmp(ty, "Strip") == 0) {
        json_t *a = json_object_get(d, "start"), *b = json_object_get(d, "stop");
        if (*stage != 2)
            return zt_err(c->err, c->errlen, "%s: %s: Strip %s is not supported (only one, after Fuse)", c->path, name,
                          *stage < 2 ? "before Fuse (on each token)" : "twice");
        if (one_char(c, d, name, "content", t->strip_c, &t->strip_len) != 0) return -1;
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0 ||
            json_integer_value(a) > 1000000 || json_integer_value(b) > 1000000)
            return zt_err(c->err, c->errlen, "%s: %s.start, .stop: not counts", c->path, name);
        t->strip_start = (int)json_integer_value(a);
        t->strip_stop = (int)json_integer_value(b);
        *stage = 3;
        return 0;
    }
    return zt_err(c->err, c->errlen, "%s: %s.type '%s' is not supported (ByteLevel, Metaspace, or a Sequence of "
                  "Replace, ByteFallback, Fuse, Strip)", c->path, name, ty ? ty : "null");
}

/* The decoder decides the kind: ByteLevel is byte level, the others char level. */
static int parse_decoder(zt_tokenizer_t *t, jctx_t *c, json_t *d)
{
    const char *ty = jtype(d);
    if (ty && strcmp(ty, "ByteLevel") == 0) {
        t->dec = DEC_BYTELEVEL;
        return 0;
    }
    t->char_level = 1;
    if (ty && strcmp(ty, "Metaspace") == 0) {
        prepend_t scheme;
        int split;
        t->dec = DEC_METASPACE;
        if (parse_metaspace(c, d, "decoder", t->dec_rep, &t->dec_rep_len, &scheme, &split) != 0) return -1;
        t->dec_first_strip = scheme != PREPEND_NEVER;
        return 0;
    }
    t->dec = DEC_PIECES;
    int stage = 0;
    if (!ty || strcmp(ty, "Sequence") != 0) return parse_dec_step(t, c, d, "decoder", &stage);
    json_t *arr = json_object_get(d, "decoders");
    if (!json_is_array(arr)) return zt_err(c->err, c->errlen, "%s: decoder.decoders: not an array", c->path);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        char sub[64];
        snprintf(sub, sizeof sub, "decoder.decoders[%zu]", i);
        if (parse_dec_step(t, c, e, sub, &stage) != 0) return -1;
    }
    return 0;
}

static int parse_model(zt_tokenizer_t *t, jctx_t *c, json_t *m, int max_added_id)
{
    const char *ty = jtype(m);
    if (!json_is_object(m)) return zt_err(c->err, c->errlen, "%s: model: missing", c->path);
    if (ty && strcmp(ty, "BPE") != 0)
        return zt_err(c->err, c->errlen, "%s: model.type '%s' is not supported (BPE only)", c->path, ty);
    /* byte_fallback is for char-level files: a byte-level vocabulary has every byte */
    if (refuse_set(c, m, "model", "dropout") || (!t->char_level && refuse_set(c, m, "model", "byte_fallback")) ||
        refuse_set(c, m, "model", "continuing_subword_prefix") || refuse_set(c, m, "model", "end_of_word_suffix"))
        return -1;
    t->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab)) return zt_err(c->err, c->errlen, "%s: model.vocab: not an object", c->path);
    if (!json_is_array(merges)) return zt_err(c->err, c->errlen, "%s: model.merges: not an array", c->path);
    vocab_list_t v = {0};
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > 10000000) {
            rc = zt_err(c->err, c->errlen, "%s: model.vocab[\"%.40s\"]: not a token id (0..10^7)", c->path, key);
            break;
        }
        vl_push(&v, key, (int32_t)id, !t->char_level);
    }
    char where[600];
    snprintf(where, sizeof where, "%s: model.vocab", c->path);
    if (rc == 0) rc = install_vocab(t, &v, max_added_id, where, c->err, c->errlen);
    vl_free(&v);
    if (rc) return rc;
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    t->pair_cap = pow2_at_least(2 * json_array_size(merges) + 2);
    t->pairs = zt_calloc(t->pair_cap, sizeof *t->pairs);
    size_t i;
    json_t *e;
    json_array_foreach(merges, i, e) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_is_string(e)) { /* legacy "a b" */
            const char *s = json_string_value(e), *sp = strchr(s, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                a = s;
                la = (size_t)(sp - s);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            la = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            lb = json_string_length(json_array_get(e, 1));
        }
        if (!a) return zt_err(c->err, c->errlen, "%s: model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", c->path, i);
        if (add_merge(t, a, la, b, lb, (int32_t)i) < 0)
            return zt_err(c->err, c->errlen, "%s: model.merges[%zu]: '%.30s' + '%.30s' uses a token missing from "
                          "model.vocab", c->path, i, a, b);
    }
    json_t *unk = json_object_get(m, "unk_token");
    if (json_is_string(unk)) {
        size_t ul;
        char *raw = zt_malloc(json_string_length(unk) + 1);
        key_form(t, json_string_value(unk), json_string_length(unk), raw, &ul);
        t->unk = str_lookup(t, raw, ul);
        free(raw);
        if (t->unk < 0) return zt_err(c->err, c->errlen, "%s: model.unk_token: not in model.vocab", c->path);
    }
    for (int b = 0; t->byte_fallback && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b); /* the library's format!("<{b:#04X}>") */
        t->fb_id[b] = str_lookup(t, name, 6);
    }
    return 0;
}

static int is_dir(const char *p);

char *zt_tokenizer_config_token(const char *path, const char *key)
{
    /* a tokenizer.json file's directory holds its tokenizer_config.json, as in a model directory */
    char dir[4096], cfg[4200];
    snprintf(dir, sizeof dir, "%s", path);
    if (!is_dir(dir)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    json_t *root = json_load_file(cfg, 0, NULL);
    json_t *e = root ? json_object_get(root, key) : NULL;
    if (json_is_object(e)) e = json_object_get(e, "content");
    char *s = json_is_string(e) ? strdup(json_string_value(e)) : NULL;
    json_decref(root);
    return s;
}

zt_tokenizer_t *zt_tokenizer_open_json(const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    free(text);
    if (!root) {
        zt_err(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        return NULL;
    }
    zt_tokenizer_t *t = new_bpe("hf");
    jctx_t c = {path, err, errlen};
    int rc = 0, bytelevel = 0, max_added = -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root)) rc = zt_err(err, errlen, "%s: not a JSON object", path);
    else if (added && !json_is_null(added) && !json_is_array(added))
        rc = zt_err(err, errlen, "%s: added_tokens: not an array", path);
    size_t i;
    json_t *a;
    if (rc == 0) json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 10000000 ||
            !json_is_string(content) || json_string_length(content) != strlen(json_string_value(content))) {
            rc = zt_err(err, errlen, "%s: added_tokens[%zu]: needs an id (0..10^7) and a content string", path, i);
            break;
        }
        int special = json_is_true(json_object_get(a, "special"));
        json_t *norm = json_object_get(a, "normalized");
        add_added(t, json_string_value(content), (int32_t)json_integer_value(id),
                  json_is_true(json_object_get(a, "single_word")), json_is_true(json_object_get(a, "lstrip")),
                  json_is_true(json_object_get(a, "rstrip")), norm ? json_is_true(norm) : !special, special);
        if (json_integer_value(id) > max_added) max_added = (int)json_integer_value(id);
    }
    if (rc == 0) rc = parse_normalizer(t, &c, json_object_get(root, "normalizer"), "normalizer");
    if (rc == 0) rc = parse_pretok(t, &c, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", &bytelevel);
    if (rc == 0) rc = parse_decoder(t, &c, json_object_get(root, "decoder"));
    if (rc == 0 && !t->char_level && !bytelevel)
        rc = zt_err(err, errlen, "%s: pre_tokenizer: no ByteLevel (the ByteLevel decoder needs it; a SentencePiece-"
                    "style file has Split, Metaspace or none)", path);
    if (rc == 0 && t->char_level && bytelevel)
        rc = zt_err(err, errlen, "%s: pre_tokenizer: ByteLevel with a %s decoder is not supported (SentencePiece "
                    "style: Split, Metaspace or none)", path, jtype(json_object_get(root, "decoder")));
    if (rc == 0) rc = parse_model(t, &c, json_object_get(root, "model"), max_added);
    json_decref(root);
    if (rc != 0) {
        zt_tokenizer_close(t);
        return NULL;
    }
    finish(t);
    set_default_eot(t);
    return t;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

zt_tokenizer_t *zt_tokenizer_load(const char *path, char *err, size_t errlen)
{
    if (!is_dir(path)) return zt_tokenizer_open_json(path, err, errlen);
    char tj[4096], vj[4096], mt[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    snprintf(vj, sizeof vj, "%s/vocab.json", path);
    snprintf(mt, sizeof mt, "%s/merges.txt", path);
    zt_tokenizer_t *t;
    if (access(tj, F_OK) == 0) t = zt_tokenizer_open_json(tj, err, errlen);
    else if (access(vj, F_OK) == 0 && access(mt, F_OK) == 0) t = zt_tokenizer_open_bpe(vj, mt, err, errlen);
    else {
        zt_err(err, errlen, "%s: no tokenizer.json, nor vocab.json + merges.txt", path);
        return NULL;
    }
    char *eos = t ? zt_tokenizer_config_token(path, "eos_token") : NULL;
    if (eos) {
        int32_t id = zt_tokenizer_token_id(t, eos, strlen(eos));
        if (id >= 0) t->eot = id;
        free(eos);
    }
    return t;
}

zt_tokenizer_t *zt_tokenizer_open(const char *kind, const char *vocab_json, const char *merges_txt,
                                  char *err, size_t errlen)
{
    if (!kind || !kind[0] || strcmp(kind, "byte") == 0) return zt_tokenizer_byte();
    if (strcmp(kind, "gpt2-bpe") == 0) {
        if (!vocab_json || !merges_txt || !vocab_json[0] || !merges_txt[0]) {
            zt_err(err, errlen, "tokenizer gpt2-bpe needs vocab.json and merges.txt");
            return NULL;
        }
        return zt_tokenizer_open_bpe(vocab_json, merges_txt, err, errlen);
    }
    zt_err(err, errlen, "unknown tokenizer '%s' (expected byte or gpt2-bpe)", kind);
    return NULL;
}

void zt_tokenizer_close(zt_tokenizer_t *t)
{
    if (!t || t == &byte_tok) return;
    if (t->tok)
        for (int i = 0; i < t->vocab_size; i++) free(t->tok[i]);
    if (t->key)
        for (int i = 0; i < t->vocab_size; i++) free(t->key[i]);
    if (t->tok_first)
        for (int i = 0; i < t->vocab_size; i++) free(t->tok_first[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->key);
    free(t->key_len);
    free(t->tok_first);
    free(t->tok_first_len);
    free(t->is_byte);
    for (int i = 0; i < t->nnorm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->nrepl; i++) {
        free(t->repl_a[i]);
        free(t->repl_b[i]);
    }
    free(t->str_map);
    free(t->pairs);
    for (int i = 0; i < t->nsplit; i++) {
        pcre2_match_data_free(t->split[i].md);
        pcre2_code_free(t->split[i].re);
    }
    for (int i = 0; i < t->nadded; i++) free(t->added[i].s);
    free(t->added);
    free(t->raw_set.tok);
    free(t->norm_set.tok);
    free(t->cache);
    free(t->cache_bytes);
    free(t->cache_ids);
    free(t);
}

/* ---- encoding ------------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} ivec_t;

static void iv_push(ivec_t *v, int32_t id)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 256;
        v->ids = realloc(v->ids, v->cap * sizeof *v->ids);
        if (!v->ids) zt_fatal("out of memory: %zu token ids", v->cap);
    }
    v->ids[v->n++] = id;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t x)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > x) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

/* The library's BPE::merge_word before the merges: a symbol per character (a
 * byte at byte level; at char level a UTF-8 character, or a byte that is not
 * UTF-8, which only byte_fallback can spell), else its bytes' <0xXX> tokens when
 * all exist, else unk. An unk waits until the next known character or the end
 * (so byte-fallback tokens after it come first, as in the library) and, with
 * fuse_unk, swallows the unknowns that follow. Returns the count (<= n). */
static size_t word_symbols(const zt_tokenizer_t *t, const unsigned char *s, size_t n, int32_t *c)
{
    size_t k = 0;
    int unk = 0; /* one pending */
    for (size_t i = 0, j; i < n; i = j) {
        j = i;
        if (t->char_level) utf8_next(s, n, &j);
        else j++;
        int32_t id = j - i == 1 ? t->byte_id[s[i]] : str_lookup(t, (const char *)s + i, j - i);
        if (id >= 0) {
            if (unk) c[k++] = t->unk;
            unk = 0;
            c[k++] = id;
            continue;
        }
        size_t b = i;
        while (t->byte_fallback && b < j && t->fb_id[s[b]] >= 0) b++;
        if (t->byte_fallback && b == j) {
            for (b = i; b < j; b++) c[k++] = t->fb_id[s[b]];
            continue;
        }
        if (t->unk < 0) continue; /* no token and no unk: the library drops it */
        if (unk && !t->fuse_unk) c[k++] = t->unk;
        unk = 1;
    }
    if (unk) c[k++] = t->unk;
    return k;
}

/* The library's Word::merge_all: pop the (lowest rank, leftmost) pair, merge it if
 * it is still current, push the two pairs it forms with its neighbours. */
static void bpe_merge(const zt_tokenizer_t *t, const unsigned char *s, size_t n, ivec_t *out)
{
    int32_t sbuf[4 * 128];
    uint64_t hbuf[2 * 128];
    int32_t *mem = n <= 128 ? sbuf : zt_malloc(4 * n * sizeof *mem);
    uint64_t *heap = n <= 128 ? hbuf : zt_malloc(2 * n * sizeof *heap);
    int32_t *c = mem, *prev = mem + n, *next = mem + 2 * n, *alive = mem + 3 * n;
    size_t k = word_symbols(t, s, n, c), hn = 0;
    for (size_t i = 0; i < k; i++) {
        alive[i] = 1;
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < k; i++) {
        const pair_slot_t *p = pair_lookup(t, c[i], c[i + 1]);
        if (p) heap_push(heap, &hn, ((uint64_t)(uint32_t)p->rank << 32) | i);
    }
    while (hn > 0) {
        uint64_t top = heap_pop(heap, &hn);
        int32_t rank = (int32_t)(top >> 32), pos = (int32_t)(uint32_t)top;
        if (!alive[pos] || next[pos] < 0) continue;
        int32_t r = next[pos];
        const pair_slot_t *p = pair_lookup(t, c[pos], c[r]);
        if (!p || p->rank != rank) continue; /* stale */
        c[pos] = p->merged;
        alive[r] = 0;
        next[pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = pos;
        if (prev[pos] >= 0) {
            const pair_slot_t *q = pair_lookup(t, c[prev[pos]], c[pos]);
            if (q) heap_push(heap, &hn, ((uint64_t)(uint32_t)q->rank << 32) | (uint32_t)prev[pos]);
        }
        if (next[pos] >= 0) {
            const pair_slot_t *q = pair_lookup(t, c[pos], c[next[pos]]);
            if (q) heap_push(heap, &hn, ((uint64_t)(uint32_t)q->rank << 32) | (uint32_t)pos);
        }
    }
    for (size_t i = 0; i < k; i++)
        if (alive[i]) iv_push(out, c[i]);
    if (mem != sbuf) free(mem);
    if (heap != hbuf) free(heap);
}

static void cache_reset(zt_tokenizer_t *t)
{
    memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
    t->cache_used = t->cache_bytes_len = t->cache_ids_len = 0;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    while (*cap < need) *cap = *cap ? 2 * *cap : 1 << 16;
    p = realloc(p, *cap * elem);
    if (!p) zt_fatal("out of memory: tokenizer cache");
    return p;
}

/* One pre-token to ids. */
static void bpe_word(zt_tokenizer_t *t, const char *s, size_t n, ivec_t *out)
{
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id = str_lookup(t, s, n);
        if (id >= 0) {
            iv_push(out, id);
            return;
        }
    }
    if (n == 1 && t->byte_id[(unsigned char)s[0]] >= 0) {
        iv_push(out, t->byte_id[(unsigned char)s[0]]);
        return;
    }
    if (n > CACHE_MAX_WORD) {
        bpe_merge(t, (const unsigned char *)s, n, out);
        return;
    }
    uint64_t h = hash_bytes(s, n) | 1;
    const size_t m = CACHE_SLOTS - 1;
    size_t slot = (size_t)hash_u64(h) & m;
    for (;; slot = (slot + 1) & m) {
        cache_slot_t *e = &t->cache[slot];
        if (e->h == 0) break;
        if (e->h == h && e->len == n && memcmp(t->cache_bytes + e->off, s, n) == 0) {
            for (uint32_t i = 0; i < e->nids; i++) iv_push(out, t->cache_ids[e->ids_off + i]);
            return;
        }
    }
    size_t first = out->n;
    bpe_merge(t, (const unsigned char *)s, n, out);
    if (t->cache_used >= CACHE_SLOTS / 2 || t->cache_bytes_len + n > UINT32_MAX / 2) {
        cache_reset(t);
        for (slot = (size_t)hash_u64(h) & m; t->cache[slot].h; slot = (slot + 1) & m) {}
    }
    size_t nids = out->n - first;
    t->cache_bytes = grow(t->cache_bytes, &t->cache_bytes_cap, t->cache_bytes_len + n, 1);
    t->cache_ids = grow(t->cache_ids, &t->cache_ids_cap, t->cache_ids_len + nids, sizeof(int32_t));
    memcpy(t->cache_bytes + t->cache_bytes_len, s, n);
    memcpy(t->cache_ids + t->cache_ids_len, out->ids + first, nids * sizeof(int32_t));
    t->cache[slot] = (cache_slot_t){h, (uint32_t)t->cache_bytes_len, (uint32_t)n, (uint32_t)t->cache_ids_len,
                                    (uint32_t)nids};
    t->cache_bytes_len += n;
    t->cache_ids_len += nids;
    t->cache_used++;
}

static void pre_tokenize(zt_tokenizer_t *t, int level, const char *s, size_t n, ivec_t *out);

/* The piece [a, b) of s to the next level; the library drops empty pieces. */
static void split_piece(zt_tokenizer_t *t, int level, const char *s, size_t a, size_t b, ivec_t *out)
{
    if (b > a) pre_tokenize(t, level + 1, s + a, b - a, out);
}

/* Split `level`, then the next. The library's NormalizedString::split: s is cut
 * into segments, the matches (flagged; empty ones too) and the gaps between them,
 * found as Oniguruma's find_iter finds them (an empty match right where the
 * previous match ended is skipped: the search moves on one character); invert
 * swaps the flags. The behavior folds the segments into pieces: Isolated keeps
 * each, Removed drops the matches, Contiguous joins runs of equal flags,
 * MergedWithPrevious joins a match to the gap before it, MergedWithNext to the
 * gap after it. Streamed: `cur` is the piece being built, `pend` (MergedWithNext)
 * a match waiting for its gap. */
static void pre_tokenize(zt_tokenizer_t *t, int level, const char *s, size_t n, ivec_t *out)
{
    if (n == 0) return;
    if (level == t->nsplit) {
        bpe_word(t, s, n, out);
        return;
    }
    split_t *sp = &t->split[level];
    size_t pos = 0, prev = 0, cur_a = 0, cur_b = 0, pend_a = 0;
    int have_cur = 0, cur_flag = 0, have_pend = 0;
    long last_match_end = -1;
    for (int done = 0; !done;) {
        size_t seg[2][2];
        int nseg = 0, flag0;
        int rc = pos <= n ? (sp->jit ? pcre2_jit_match(sp->re, (PCRE2_SPTR)s, n, pos, 0, sp->md, NULL)
                                     : pcre2_match(sp->re, (PCRE2_SPTR)s, n, pos, 0, sp->md, NULL))
                          : -1;
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sp->md);
            size_t ms = ov[0], me = ov[1] < ov[0] ? ov[0] : ov[1];
            if (me == ms && last_match_end == (long)me) { /* move on one character */
                if (pos >= n) pos = n + 1;
                else utf8_next((const unsigned char *)s, n, &pos);
                continue;
            }
            pos = me;
            last_match_end = (long)me;
            if (ms > prev) {
                seg[nseg][0] = prev, seg[nseg++][1] = ms;
            }
            seg[nseg][0] = ms, seg[nseg++][1] = me;
            flag0 = ms > prev ? 0 : 1; /* the gap, if any, comes first */
            prev = me;
        } else {
            done = 1;
            if (prev >= n) break;
            seg[nseg][0] = prev, seg[nseg++][1] = n;
            flag0 = 0;
        }
        for (int k = 0; k < nseg; k++) {
            size_t a = seg[k][0], b = seg[k][1];
            int m = (k == 0 ? flag0 : 1) != sp->invert;
            switch (sp->behavior) {
            case SPLIT_ISOLATED:
                split_piece(t, level, s, a, b, out);
                break;
            case SPLIT_REMOVED:
                if (!m) split_piece(t, level, s, a, b, out);
                break;
            case SPLIT_CONTIGUOUS:
            case SPLIT_MERGED_PREV:
                if (have_cur && (sp->behavior == SPLIT_CONTIGUOUS ? m == cur_flag : m && !cur_flag)) {
                    cur_b = b;
                } else {
                    if (have_cur) split_piece(t, level, s, cur_a, cur_b, out);
                    have_cur = 1, cur_a = a, cur_b = b;
                }
                cur_flag = m;
                break;
            case SPLIT_MERGED_NEXT:
                if (have_pend) split_piece(t, level, s, pend_a, m ? a : b, out);
                if (m) have_pend = 1, pend_a = a;
                else if (!have_pend) split_piece(t, level, s, a, b, out);
                else have_pend = 0;
                break;
            }
        }
    }
    if (have_cur) split_piece(t, level, s, cur_a, cur_b, out);
    if (have_pend) split_piece(t, level, s, pend_a, n, out);
}

typedef void (*piece_fn)(zt_tokenizer_t *t, const char *s, size_t n, ivec_t *out);

/* The library's AddedVocabulary::find_matches: leftmost-longest matches of the set
 * in s, each kept or dropped by single_word and widened by lstrip/rstrip; the text
 * between kept matches goes to `piece`. */
static void split_added(zt_tokenizer_t *t, const match_set_t *ms, const char *s, size_t n, piece_fn piece,
                        ivec_t *out)
{
    if (ms->n == 0) {
        piece(t, s, n, out);
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t start_offset = 0, i = 0;
    while (i < n) {
        const added_t *hit = NULL;
        for (int k = ms->start[u[i]]; k < ms->start[u[i] + 1]; k++) {
            const added_t *a = ms->tok[k];
            if (a->len <= n - i && memcmp(a->s, s + i, a->len) == 0) {
                hit = a; /* longest first */
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->len;
        i = stop;
        if (hit->single_word) {
            size_t j = stop;
            int before = start == 0 ? -1 : last_cp(u, start);
            int after = stop == n ? -1 : utf8_next(u, n, &j);
            if (is_word(before) || is_word(after)) continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                int cp = last_cp(u, ns);
                if (!is_ws(cp)) break;
                size_t w = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
                ns -= w;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) {
            for (size_t j = stop; j < n;) {
                size_t j0 = j;
                if (!is_ws(utf8_next(u, n, &j))) {
                    j = j0;
                    break;
                }
                stop = j;
            }
        }
        if (start_offset < start) piece(t, s + start_offset, start - start_offset, out);
        iv_push(out, hit->id);
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < n) piece(t, s + start_offset, n - start_offset, out);
}

/* The library's Metaspace pre-tokenizer: spaces become the replacement, which is
 * prepended (always; or first: only to the piece that starts at offset 0 of the
 * input) unless the piece starts with it; split: cut before each replacement. */
static void metaspace_piece(zt_tokenizer_t *t, const char *s, size_t n, ivec_t *out)
{
    const char *r = t->ms_rep;
    const size_t rl = t->ms_rep_len;
    size_t spaces = 0, o = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    char sbuf[1024], *buf = n + (spaces + 1) * rl <= sizeof sbuf ? sbuf : zt_malloc(n + (spaces + 1) * rl);
    int starts = s[0] == ' ' || (n >= rl && memcmp(s, r, rl) == 0);
    if (!starts && (t->ms_prepend == PREPEND_ALWAYS || (t->ms_prepend == PREPEND_FIRST && s == t->first_base))) {
        memcpy(buf, r, rl);
        o = rl;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') {
            memcpy(buf + o, r, rl);
            o += rl;
        } else {
            buf[o++] = s[i];
        }
    size_t start = 0;
    for (size_t i = 0; t->ms_split && i + rl <= o;)
        if (memcmp(buf + i, r, rl) == 0) {
            if (i > start) bpe_word(t, buf + start, i - start, out);
            start = i;
            i += rl;
        } else {
            i++;
        }
    bpe_word(t, buf + start, o - start, out);
    if (buf != sbuf) free(buf);
}

static void model_piece(zt_tokenizer_t *t, const char *s, size_t n, ivec_t *out)
{
    if (t->metaspace && n > 0) metaspace_piece(t, s, n, out);
    else pre_tokenize(t, 0, s, n, out);
}

/* A piece between normalized=false added tokens: normalize it, then the
 * normalized=true added tokens, then pre-tokenization. */
static void normalized_piece(zt_tokenizer_t *t, const char *s, size_t n, ivec_t *out)
{
    size_t nl = 0;
    char *ns = t->nnorm ? normalize(t, s, n, &nl) : NULL;
    const char *p = ns ? ns : s;
    t->first_base = s == t->enc_text ? p : NULL; /* its offset 0 is the input's */
    split_added(t, &t->norm_set, p, ns ? nl : n, model_piece, out);
    free(ns);
}

int zt_tokenizer_encode(zt_tokenizer_t *t, const char *text, size_t len, int32_t **out, size_t *n)
{
    ivec_t v = {0};
    if (t->kind == TOK_BYTE) {
        v.ids = zt_malloc(sizeof(int32_t) * (len ? len : 1));
        for (size_t i = 0; i < len; i++) v.ids[i] = (unsigned char)text[i];
        v.n = len;
    } else {
        t->enc_text = text;
        split_added(t, &t->raw_set, text, len, normalized_piece, &v);
        t->enc_text = t->first_base = NULL;
        if (!v.ids) v.ids = zt_malloc(sizeof(int32_t));
    }
    *out = v.ids;
    *n = v.n;
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------ */

const char *zt_tokenizer_decode_token(const zt_tokenizer_t *t, int32_t id, size_t *len)
{
    if (t->kind == TOK_BYTE) {
        if (id == byte_tok.eot) {
            *len = strlen(eot_text);
            return eot_text;
        }
        if (id < 0 || id > 255) return NULL;
        if (!byte_chars[1])
            for (int b = 0; b < 256; b++) byte_chars[b] = (char)b;
        *len = 1;
        return &byte_chars[id];
    }
    if (id < 0 || id >= t->vocab_size || !t->tok[id]) return NULL;
    *len = t->tok_len[id];
    return t->tok[id];
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 with *bad = the length of
 * the maximal invalid prefix that one U+FFFD replaces (Rust's Utf8Chunks). */
static size_t utf8_valid(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k <= need; k++) {
        unsigned x = (size_t)k < n ? s[k] : 0x100;
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (x < l || x > h) {
            *bad = (size_t)k;
            return 0;
        }
    }
    return (size_t)need + 1;
}

/* Strip's start: how many bytes of s[0..n) up to strip_start strip characters take. */
static size_t strip_head(const zt_tokenizer_t *t, const char *s, size_t n)
{
    size_t o = 0;
    for (int k = 0; k < t->strip_start && n - o >= t->strip_len && memcmp(s + o, t->strip_c, t->strip_len) == 0; k++)
        o += t->strip_len;
    return o;
}

const char *zt_tokenizer_decode_first(const zt_tokenizer_t *t, int32_t id, size_t *len)
{
    const char *s = zt_tokenizer_decode_token(t, id, len);
    if (!s || !t->char_level) return s;
    if (t->tok_first[id]) {
        *len = t->tok_first_len[id];
        return t->tok_first[id];
    }
    size_t h = strip_head(t, s, *len);
    *len -= h;
    return s + h;
}

static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t bad, v;
    for (size_t i = 0; i < n; i += v)
        if ((v = utf8_valid(s + i, n - i, &bad)) == 0) return 0;
    return 1;
}

/* The tokens' bytes as the decoder joins them. lossy (char level): a run of
 * ByteFallback tokens that is not UTF-8 becomes one U+FFFD per byte, as the
 * library's ByteFallback decoder makes it; the other tokens are the file's
 * strings, UTF-8 already. */
static char *decode_ids(const zt_tokenizer_t *t, const int32_t *ids, size_t n, int lossy, size_t *len)
{
    size_t total = 0, l, o = 0, run = 0;
    for (size_t i = 0; i < n; i++)
        if (zt_tokenizer_decode_token(t, ids[i], &l)) total += l;
    char *s = zt_malloc(3 * total + 1);
    int first = 1, in_run = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *b = i < n ? zt_tokenizer_decode_token(t, ids[i], &l) : NULL;
        if (i < n && !b) continue;
        int byte = b && t->is_byte && t->is_byte[ids[i]];
        if (in_run && !byte && lossy && !valid_utf8((unsigned char *)s + run, o - run)) {
            size_t nb = o - run;
            for (size_t k = 0; k < nb; k++) memcpy(s + run + 3 * k, "\xef\xbf\xbd", 3);
            o = run + 3 * nb;
        }
        if (!b) break;
        if (byte && !in_run) run = o;
        in_run = byte;
        if (first && t->tok_first && t->tok_first[ids[i]]) { /* the Metaspace decoder's first token */
            b = t->tok_first[ids[i]];
            l = t->tok_first_len[ids[i]];
        }
        first = 0;
        memcpy(s + o, b, l);
        o += l;
    }
    size_t h = strip_head(t, s, o); /* Strip works on the fused text */
    for (int k = 0; k < t->strip_stop && o - h >= t->strip_len && memcmp(s + o - t->strip_len, t->strip_c, t->strip_len) == 0;
         k++)
        o -= t->strip_len;
    memmove(s, s + h, o - h);
    s[o - h] = 0;
    if (len) *len = o - h;
    return s;
}

char *zt_tokenizer_decode(const zt_tokenizer_t *t, const int32_t *ids, size_t n, size_t *len)
{
    return decode_ids(t, ids, n, 0, len);
}

char *zt_tokenizer_decode_utf8(const zt_tokenizer_t *t, const int32_t *ids, size_t n, size_t *len)
{
    if (t->kind == TOK_BPE && t->char_level) return decode_ids(t, ids, n, 1, len);
    size_t rl;
    char *raw = zt_tokenizer_decode(t, ids, n, &rl);
    char *s = zt_malloc(3 * rl + 1), *o = s;
    const unsigned char *u = (const unsigned char *)raw;
    for (size_t i = 0; i < rl;) {
        size_t bad = 0, v = utf8_valid(u + i, rl - i, &bad);
        if (v) {
            memcpy(o, raw + i, v);
            o += v;
            i += v;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i += bad;
        }
    }
    *o = 0;
    free(raw);
    if (len) *len = (size_t)(o - s);
    return s;
}

int32_t zt_tokenizer_token_id(const zt_tokenizer_t *t, const char *s, size_t len)
{
    if (t->kind == TOK_BYTE) {
        if (len == 1) return (unsigned char)s[0];
        return len == strlen(eot_text) && memcmp(s, eot_text, len) == 0 ? t->eot : -1;
    }
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == len && memcmp(t->added[i].s, s, len) == 0) return t->added[i].id;
    return t->str_map ? str_lookup(t, s, len) : -1;
}

int zt_tokenizer_vocab_size(const zt_tokenizer_t *t) { return t->vocab_size; }
int zt_tokenizer_eot(const zt_tokenizer_t *t) { return t->eot; }
const char *zt_tokenizer_kind(const zt_tokenizer_t *t) { return t->kind_name; }

/* ---- ztrain's byte tokenizer as tokenizer.json ------------------------------------------ */

static json_t *byte_level_obj(void)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("ByteLevel"));
    json_object_set_new(o, "add_prefix_space", json_false());
    json_object_set_new(o, "trim_offsets", json_true());
    json_object_set_new(o, "use_regex", json_false());
    return o;
}

int zt_tokenizer_write_byte_level_json(const char *path, int eot_token, char *err, size_t errlen)
{
    init_cp_table();
    if (eot_token < 256) return zt_err(err, errlen, "%s: eot_token %d collides with a byte token (needs >= 256)", path, eot_token);
    json_t *root = json_object(), *added = json_array(), *eot = json_object(), *model = json_object(),
           *vocab = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(eot, "id", json_integer(eot_token));
    json_object_set_new(eot, "content", json_string(eot_text));
    json_object_set_new(eot, "single_word", json_false());
    json_object_set_new(eot, "lstrip", json_false());
    json_object_set_new(eot, "rstrip", json_false());
    json_object_set_new(eot, "normalized", json_false());
    json_object_set_new(eot, "special", json_true());
    json_array_append_new(added, eot);
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer", byte_level_obj());
    json_object_set_new(root, "post_processor", json_null());
    json_object_set_new(root, "decoder", byte_level_obj());
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_false());
    for (int b = 0; b < 256; b++) {
        char key[4];
        int cp = byte_cp_table[b];
        if (cp < 0x80) key[0] = (char)cp, key[1] = 0;
        else key[0] = (char)(0xc0 | (cp >> 6)), key[1] = (char)(0x80 | (cp & 0x3f)), key[2] = 0;
        json_object_set_new(vocab, key, json_integer(b));
    }
    json_object_set_new(vocab, eot_text, json_integer(eot_token));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(root, "model", model);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return zt_err(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    }
    return 0;
}
