/* zt_bpe.c — GPT-2 byte-level BPE (vocab.json + merges.txt) and the byte tokenizer.
 *
 * Tokens are held as raw bytes: vocab.json strings are mapped back through the
 * inverse of GPT-2's byte-to-unicode table at load time, so encode works on the
 * text's bytes and decode is a table lookup. Merges become a hash map from a pair
 * of token ids to (rank, merged id); encoding a pre-token starts from single
 * bytes and repeatedly merges the lowest-ranked adjacent pair, which is GPT-2's
 * algorithm. Pre-tokenization is hand-written (see zt_bpe.h) so no regex
 * library with Unicode classes is needed. No cache: the prep tool is not a hot
 * path and pre-tokens are short. */
#include "zt_bpe.h"

#include "zt_common.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef enum { TOK_BYTE, TOK_BPE } tok_kind_t;

typedef struct {
    uint64_t key;   /* (a << 32 | b) + 1; 0 = empty slot */
    int32_t rank, merged;
} pair_slot_t;

struct zt_tokenizer {
    tok_kind_t kind;
    int vocab_size, eot;
    char **tok;             /* (V) bytes of each token, NULL for holes */
    size_t *tok_len;        /* (V) */
    int32_t *str_map;       /* open addressing: bytes -> id, -1 empty */
    size_t str_cap;
    pair_slot_t *pairs;
    size_t pair_cap;
    int32_t byte_id[256];
};

/* ---- the byte tokenizer ------------------------------------------------------ */

static char byte_chars[256];
static const char eot_text[] = "<|endoftext|>";
static struct zt_tokenizer byte_tok = {.kind = TOK_BYTE, .vocab_size = 257, .eot = 256};

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

static void init_cp_table(void)
{
    if (cp_to_byte_table[0] != 0) return;
    for (int i = 0; i < 324; i++) cp_to_byte_table[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte_table[byte_to_cp(b)] = b;
}

/* Decodes one UTF-8 code point at s[*i]; invalid bytes are returned as themselves
 * with a negative sign so the caller can keep them raw. */
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

/* Maps a token string in GPT-2's alphabet (UTF-8) to raw bytes, in place-safe out
 * (out must hold len bytes: the raw form is never longer). Characters outside
 * the alphabet (added tokens) are kept as their UTF-8. */
static size_t unmap_token(const char *s, size_t len, char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        size_t start = i;
        int cp = utf8_next((const unsigned char *)s, len, &i);
        if (cp >= 0 && cp < 324 && cp_to_byte_table[cp] >= 0) out[o++] = (char)cp_to_byte_table[cp];
        else {
            memmove(out + o, s + start, i - start);
            o += i - start;
        }
    }
    return o;
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

static int32_t str_lookup(const zt_tokenizer_t *t, const char *s, size_t n)
{
    size_t m = t->str_cap - 1;
    for (size_t h = hash_bytes(s, n) & m;; h = (h + 1) & m) {
        int32_t id = t->str_map[h];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
    }
}

static void str_insert(zt_tokenizer_t *t, int32_t id)
{
    size_t m = t->str_cap - 1;
    size_t h = hash_bytes(t->tok[id], t->tok_len[id]) & m;
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

/* ---- loading -------------------------------------------------------------------- */


static int load_vocab(zt_tokenizer_t *t, const char *path, char *err, size_t errlen)
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
    size_t cap = json_is_object(root) ? json_object_size(root) + 1 : 1, count = 0;
    char **strs = zt_calloc(cap, sizeof *strs);
    size_t *lens = zt_malloc(cap * sizeof *lens);
    int32_t *ids = zt_malloc(cap * sizeof *ids);
    int rc = 0, maxid = -1;
    if (!json_is_object(root)) {
        rc = zt_err(err, errlen, "%s: not a JSON object", path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > 10000000) {
            rc = zt_err(err, errlen, "%s: bad token id for \"%.40s\" (a non-negative integer up to 10^7)", path, key);
            goto done;
        }
        size_t sl = strlen(key);
        strs[count] = zt_malloc(sl + 1);
        size_t bl = unmap_token(key, sl, strs[count]);
        strs[count][bl] = 0;
        lens[count] = bl;
        ids[count] = (int32_t)id;
        if (id > maxid) maxid = (int)id;
        count++;
    }
    if (count == 0) {
        rc = zt_err(err, errlen, "%s: empty vocabulary", path);
        goto done;
    }
    t->vocab_size = maxid + 1;
    t->tok = zt_calloc((size_t)t->vocab_size, sizeof *t->tok);
    t->tok_len = zt_calloc((size_t)t->vocab_size, sizeof *t->tok_len);
    t->str_cap = pow2_at_least(2 * count);
    t->str_map = zt_malloc(t->str_cap * sizeof *t->str_map);
    for (size_t i = 0; i < t->str_cap; i++) t->str_map[i] = -1;
    for (size_t i = 0; i < count; i++) {
        if (t->tok[ids[i]]) {
            rc = zt_err(err, errlen, "%s: id %d used twice", path, ids[i]);
            goto done;
        }
        t->tok[ids[i]] = strs[i];
        t->tok_len[ids[i]] = lens[i];
        strs[i] = NULL;
        if (str_lookup(t, t->tok[ids[i]], lens[i]) < 0) str_insert(t, ids[i]);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = str_lookup(t, &c, 1);
        if (t->byte_id[b] < 0) {
            rc = zt_err(err, errlen, "%s: no token for byte 0x%02x: not a byte-level BPE vocabulary", path, b);
            goto done;
        }
    }
    t->eot = str_lookup(t, eot_text, strlen(eot_text));
done:
    for (size_t i = 0; i < count; i++) free(strs[i]);
    free(strs);
    free(lens);
    free(ids);
    json_decref(root);
    return rc;
}

static int load_merges(zt_tokenizer_t *t, const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return -1;
    size_t nlines = 1;
    for (size_t i = 0; i < n; i++) nlines += text[i] == '\n';
    t->pair_cap = pow2_at_least(2 * nlines);
    t->pairs = zt_calloc(t->pair_cap, sizeof *t->pairs);
    char *a = zt_malloc(n + 1), *b = zt_malloc(n + 1), *ab = zt_malloc(2 * n + 2);
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
        } else {
            size_t la = unmap_token(p, (size_t)(sp - p), a);
            size_t lb = unmap_token(sp + 1, len - (size_t)(sp - p) - 1, b);
            memcpy(ab, a, la);
            memcpy(ab + la, b, lb);
            int32_t ia = str_lookup(t, a, la), ib = str_lookup(t, b, lb), im = str_lookup(t, ab, la + lb);
            if (ia < 0 || ib < 0 || im < 0)
                rc = zt_err(err, errlen, "%s:%d: merge '%.*s' uses a token missing from the vocabulary",
                            path, line + 1, (int)ZT_MIN(len, (size_t)64), p);
            else pair_insert(t, ia, ib, rank++, im);
        }
        p = eol + 1;
    }
    free(a);
    free(b);
    free(ab);
    free(text);
    return rc;
}

zt_tokenizer_t *zt_tokenizer_open_bpe(const char *vocab_json, const char *merges_txt, char *err,
                                      size_t errlen)
{
    init_cp_table();
    zt_tokenizer_t *t = zt_calloc(1, sizeof *t);
    t->kind = TOK_BPE;
    t->eot = -1;
    if (load_vocab(t, vocab_json, err, errlen) != 0 || load_merges(t, merges_txt, err, errlen) != 0) {
        zt_tokenizer_close(t);
        return NULL;
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
    free(t->tok);
    free(t->tok_len);
    free(t->str_map);
    free(t->pairs);
    free(t);
}

/* ---- pre-tokenization ---------------------------------------------------------- */

enum { C_SPACE, C_LETTER, C_DIGIT, C_OTHER };

/* Class of the code point at s[i] and its length in bytes. */
static int cls_at(const unsigned char *s, size_t n, size_t i, size_t *len)
{
    unsigned c = s[i];
    if (c >= 0x80) {
        size_t j = i;
        utf8_next(s, n, &j);
        *len = j - i;
        return C_LETTER;
    }
    *len = 1;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return C_SPACE;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return C_LETTER;
    if (c >= '0' && c <= '9') return C_DIGIT;
    return C_OTHER;
}

/* Length of the pre-token starting at s[i] (> 0). */
static size_t pretoken(const unsigned char *s, size_t n, size_t i)
{
    if (s[i] == '\'' && i + 1 < n) {
        unsigned c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
        if (i + 2 < n && ((c == 'r' && s[i + 2] == 'e') || (c == 'v' && s[i + 2] == 'e') ||
                          (c == 'l' && s[i + 2] == 'l')))
            return 3;
    }
    size_t len, j = i;
    int c = cls_at(s, n, i, &len);
    if (s[i] == ' ' && i + 1 < n) {
        size_t l2;
        int c2 = cls_at(s, n, i + 1, &l2);
        if (c2 != C_SPACE) {
            j = i + 1;
            c = c2;
            len = l2;
        }
    }
    if (c == C_SPACE) {
        size_t k = i;
        while (k < n && cls_at(s, n, k, &len) == C_SPACE) k += len;
        /* \s+(?!\S): leave the last space to prefix the next word. */
        if (k < n && k - i > 1) return k - i - 1;
        return k - i;
    }
    size_t k = j + len;
    while (k < n && cls_at(s, n, k, &len) == c) k += len;
    return k - i;
}

/* ---- encode / decode ------------------------------------------------------------- */

static void bpe_chunk(const zt_tokenizer_t *t, const unsigned char *s, size_t n, int32_t *ids, size_t *m)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) ids[k++] = t->byte_id[s[i]];
    while (k > 1) {
        int32_t best = INT32_MAX, merged = -1;
        for (size_t i = 0; i + 1 < k; i++) {
            const pair_slot_t *p = pair_lookup(t, ids[i], ids[i + 1]);
            if (p && p->rank < best) {
                best = p->rank;
                merged = p->merged;
            }
        }
        if (merged < 0) break;
        int32_t a = -1, b = -1;
        for (size_t i = 0; i + 1 < k; i++) {
            const pair_slot_t *p = pair_lookup(t, ids[i], ids[i + 1]);
            if (p && p->rank == best) {
                a = ids[i];
                b = ids[i + 1];
                break;
            }
        }
        size_t o = 0;
        for (size_t i = 0; i < k; i++) {
            if (i + 1 < k && ids[i] == a && ids[i + 1] == b) {
                ids[o++] = merged;
                i++;
            } else ids[o++] = ids[i];
        }
        k = o;
    }
    *m = k;
}

int zt_tokenizer_encode(const zt_tokenizer_t *t, const char *text, size_t len, int32_t **out, size_t *n)
{
    /* Never more tokens than bytes. */
    int32_t *ids = zt_malloc(sizeof(int32_t) * (len ? len : 1));
    const unsigned char *s = (const unsigned char *)text;
    size_t k = 0;
    if (t->kind == TOK_BYTE) {
        for (size_t i = 0; i < len; i++) ids[k++] = s[i];
    } else {
        for (size_t i = 0; i < len;) {
            size_t pl = pretoken(s, len, i), m = 0;
            bpe_chunk(t, s + i, pl, ids + k, &m);
            k += m;
            i += pl;
        }
    }
    *out = ids;
    *n = k;
    return 0;
}

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

char *zt_tokenizer_decode(const zt_tokenizer_t *t, const int32_t *ids, size_t n, size_t *len)
{
    size_t total = 0, l;
    for (size_t i = 0; i < n; i++)
        if (zt_tokenizer_decode_token(t, ids[i], &l)) total += l;
    char *s = zt_malloc(total + 1), *p = s;
    for (size_t i = 0; i < n; i++) {
        const char *b = zt_tokenizer_decode_token(t, ids[i], &l);
        if (b) {
            memcpy(p, b, l);
            p += l;
        }
    }
    *p = 0;
    if (len) *len = total;
    return s;
}

int zt_tokenizer_vocab_size(const zt_tokenizer_t *t) { return t->vocab_size; }
int zt_tokenizer_eot(const zt_tokenizer_t *t) { return t->eot; }
const char *zt_tokenizer_kind(const zt_tokenizer_t *t) { return t->kind == TOK_BYTE ? "byte" : "gpt2-bpe"; }
