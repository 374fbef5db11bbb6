/* test_tokenizer.c — tokenizer.json BPE against the `tokenizers` library (zt_tokenizer.h).
 *
 * The fixtures in tests/reference/tokenizers/ come from
 * tests/reference/make_tokenizer_fixtures.py: three byte-level BPE tokenizers
 * trained by the library (gpt2: ByteLevel regex, legacy "a b" merges, a
 * single_word added token; llama3: Llama-3 Split + ignore_merges; qwen2: NFC +
 * Qwen2 Split, list merges, a normalized added token and an lstrip/rstrip special
 * token; and two SentencePiece-style ones with byte_fallback and fuse_unk:
 * llama2, the legacy Prepend + Replace normalizer without a pre-tokenizer, and
 * mistral, Metaspace(first) with [INST] tokens, both with the Replace,
 * ByteFallback, Fuse, Strip decoder; "metaspace" and "metaspace_never" are
 * mistral.json with the Metaspace pre-tokenizer and decoder patched in; and
 * gemma, Gemma's Replace normalizer, Split(" ", MergedWithPrevious) and decoder
 * without Strip, with variants "gemma_next", "gemma_prev", "gemma_contiguous",
 * "gemma_invert" patching in Split pre-tokenizers of every behavior) and
 * cases.json: the ids the library gives each test string, its decoded text, the
 * decoding of the first half of the ids and of single ids, and for the
 * SentencePiece styles more strings and id lists to decode. Only those
 * committed files are needed here. */
#include "zt_common.h"
#include "zt_test.h"
#include "zt_tokenizer.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[ZT_ERRLEN];
static char tmpdir[256];
static json_t *cases;

static const char *fixture(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tests/reference/tokenizers/%s", ZT_SRCDIR, name);
    return buf[k];
}

static const char *tpath(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/zt_test_tok.XXXXXX");
        if (!mkdtemp(tmpdir)) exit(2);
    }
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static json_t *load_cases(void)
{
    if (!cases) {
        json_error_t je;
        cases = json_load_file(fixture("cases.json"), 0, &je);
        if (!cases) printf("\n  cases.json:%d: %s\n", je.line, je.text);
    }
    return cases;
}

static int32_t *json_ids(json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    int32_t *ids = zt_malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static void show(const char *what, const char *text)
{
    printf("\n    %s: \"", what);
    for (const char *p = text; *p && p - text < 80; p++)
        if ((unsigned char)*p < 32) printf("\\x%02x", (unsigned char)*p);
        else putchar(*p);
    printf("\"");
}

static json_t *style_entry(const char *style)
{
    json_t *c = load_cases();
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    json_t *entry = json_object_get(json_object_get(c, "tokenizers"), style);
    CU_ASSERT_PTR_NOT_NULL_FATAL(entry);
    return entry;
}

/* A fixture file, or that file with `patch` (top-level keys replaced) written to the
 * temporary directory. */
static zt_tokenizer_t *open_patched(const char *file, json_t *patch)
{
    if (patch) {
        json_t *j = json_load_file(file, 0, NULL);
        CU_ASSERT_PTR_NOT_NULL_FATAL(j);
        json_object_update(j, patch);
        file = tpath("patched.json");
        CU_ASSERT_EQUAL_FATAL(json_dump_file(j, file, 0), 0);
        json_decref(j);
    }
    zt_tokenizer_t *t = zt_tokenizer_load(file, err, sizeof err);
    if (!t) printf("\n  %s\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    return t;
}

/* A fixture entry's tokenizer: its file, with the entry's "patch" if it has one. */
static zt_tokenizer_t *open_style(const char *style)
{
    json_t *entry = style_entry(style);
    return open_patched(fixture(json_string_value(json_object_get(entry, "file"))), json_object_get(entry, "patch"));
}

/* Every case of one fixture tokenizer: ids, decoded text, half and single-id decodes. */
static int check_style(const char *style)
{
    json_t *c = load_cases(), *entry = style_entry(style), *extra = json_object_get(entry, "extra_strings");
    json_t *strings = json_copy(json_object_get(c, "strings")), *res = json_object_get(entry, "cases");
    if (extra) json_array_extend(strings, extra);
    CU_ASSERT_FATAL(json_array_size(strings) > 20 && json_array_size(strings) == json_array_size(res));
    zt_tokenizer_t *t = open_style(style);
    CU_ASSERT_EQUAL(zt_tokenizer_vocab_size(t), json_integer_value(json_object_get(entry, "vocab_size")));
    CU_ASSERT_STRING_EQUAL(zt_tokenizer_kind(t), "hf");
    const char *eot = json_string_value(json_object_get(entry, "eot"));
    if (!eot) eot = extra ? "</s>" : "<|endoftext|>";
    CU_ASSERT_EQUAL(zt_tokenizer_eot(t), zt_tokenizer_token_id(t, eot, strlen(eot)));
    CU_ASSERT(zt_tokenizer_eot(t) >= 0);
    int bad = 0;
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(strings); k++) {
        const char *text = json_string_value(json_array_get(strings, k));
        json_t *r = json_array_get(res, k);
        size_t nw, n, len;
        int32_t *want = json_ids(json_object_get(r, "ids"), &nw), *ids;
        CU_ASSERT_EQUAL_FATAL(zt_tokenizer_encode(t, text, strlen(text), &ids, &n), 0);
        total += n;
        int same = n == nw && memcmp(ids, want, n * sizeof *ids) == 0;
        CU_ASSERT(same);
        if (!same && bad++ < 3) {
            size_t i = 0;
            while (i < n && i < nw && ids[i] == want[i]) i++;
            show(style, text);
            printf("\n    case %zu: %zu ids (want %zu), first difference at %zu: %d (want %d)", k, n, nw, i,
                   i < n ? ids[i] : -1, i < nw ? want[i] : -1);
        }
        char *dec = zt_tokenizer_decode_utf8(t, want, nw, &len);
        CU_ASSERT_STRING_EQUAL(dec, json_string_value(json_object_get(r, "decoded")));
        if (strcmp(dec, json_string_value(json_object_get(r, "decoded"))) != 0 && bad++ < 3) {
            show("decoded", dec);
            show("want", json_string_value(json_object_get(r, "decoded")));
        }
        free(dec);
        dec = zt_tokenizer_decode_utf8(t, want, nw / 2, &len);
        CU_ASSERT_STRING_EQUAL(dec, json_string_value(json_object_get(r, "decoded_half")));
        free(dec);
        json_t *each = json_object_get(r, "decoded_each");
        for (size_t i = 0; i < json_array_size(each); i++) {
            dec = zt_tokenizer_decode_utf8(t, want + i, 1, &len);
            CU_ASSERT_STRING_EQUAL(dec, json_string_value(json_array_get(each, i)));
            free(dec);
        }
        /* printed token by token (decode_first, then decode_token) it reads as decoded at once */
        dec = zt_tokenizer_decode(t, want, nw, &len);
        size_t o = 0, l;
        int streamed = 1;
        for (size_t i = 0; i < nw && streamed; i++) {
            const char *p = i ? zt_tokenizer_decode_token(t, want[i], &l) : zt_tokenizer_decode_first(t, want[i], &l);
            streamed = p && o + l <= len && memcmp(dec + o, p, l) == 0;
            o += l;
        }
        CU_ASSERT(streamed && o == len);
        free(dec);
        free(ids);
        free(want);
    }
    CU_ASSERT(total > 2000);
    /* id lists the library decoded: byte runs valid and not, spaces at the start, unknown ids */
    json_t *dc = json_object_get(entry, "decode_cases");
    CU_ASSERT(!extra || json_array_size(dc) > 10);
    for (size_t k = 0; k < json_array_size(dc); k++) {
        json_t *d = json_array_get(dc, k);
        size_t nw, len;
        int32_t *ids = json_ids(json_object_get(d, "ids"), &nw);
        char *dec = zt_tokenizer_decode_utf8(t, ids, nw, &len);
        int same = strcmp(dec, json_string_value(json_object_get(d, "decoded"))) == 0;
        CU_ASSERT(same);
        if (!same && bad++ < 3) printf("\n    %s decode case %zu: \"%s\", want \"%s\"", style, k, dec,
                                       json_string_value(json_object_get(d, "decoded")));
        free(dec);
        free(ids);
    }
    json_decref(strings);
    zt_tokenizer_close(t);
    return bad;
}

static void t_gpt2(void) { CU_ASSERT_EQUAL(check_style("gpt2"), 0); }
static void t_llama3(void) { CU_ASSERT_EQUAL(check_style("llama3"), 0); }
static void t_qwen2(void) { CU_ASSERT_EQUAL(check_style("qwen2"), 0); }
static void t_llama2(void) { CU_ASSERT_EQUAL(check_style("llama2"), 0); }
static void t_mistral(void) { CU_ASSERT_EQUAL(check_style("mistral"), 0); }
static void t_metaspace(void) { CU_ASSERT_EQUAL(check_style("metaspace"), 0); }
static void t_metaspace_never(void) { CU_ASSERT_EQUAL(check_style("metaspace_never"), 0); }
static void t_gemma(void) { CU_ASSERT_EQUAL(check_style("gemma"), 0); }
static void t_gemma_next(void) { CU_ASSERT_EQUAL(check_style("gemma_next"), 0); }
static void t_gemma_prev(void) { CU_ASSERT_EQUAL(check_style("gemma_prev"), 0); }
static void t_gemma_contiguous(void) { CU_ASSERT_EQUAL(check_style("gemma_contiguous"), 0); }
static void t_gemma_invert(void) { CU_ASSERT_EQUAL(check_style("gemma_invert"), 0); }

static int32_t id_of(const zt_tokenizer_t *t, const char *s)
{
    int32_t id = zt_tokenizer_token_id(t, s, strlen(s));
    CU_ASSERT(id >= 0);
    return id;
}

/* s encodes to the tokens named in want (NULL-terminated). */
static int encodes_to(zt_tokenizer_t *t, const char *s, const char *const *want)
{
    int32_t *ids;
    size_t n, k = 0;
    CU_ASSERT_EQUAL_FATAL(zt_tokenizer_encode(t, s, strlen(s), &ids, &n), 0);
    int ok = 1;
    for (; want[k]; k++) ok &= k < n && ids[k] == zt_tokenizer_token_id(t, want[k], strlen(want[k]));
    ok &= k == n;
    if (!ok) show("encoded differently", s);
    free(ids);
    return ok;
}

#define U8_GRIN "\xf0\x9f\x98\x80" /* U+1F600: 4 bytes; llama2 has no "<0xF0>", so unk */
#define U8_CUP "\xe2\x98\x95"      /* U+2615: not in the vocabulary, its three bytes are */

/* The SentencePiece rules one by one, as `tokenizers` 0.23.3 gave them (checked by hand). */
static void t_sentencepiece_rules(void)
{
    zt_tokenizer_t *t = open_style("llama2");
    /* byte fallback; fuse_unk; an unk waits for the next known character, so the bytes of a
     * character after it come first */
    CU_ASSERT(encodes_to(t, "\xe4\xbd\xa0", (const char *[]){"\xe2\x96\x81", "<0xE4>", "<0xBD>", "<0xA0>", NULL}));
    CU_ASSERT(encodes_to(t, "a" U8_GRIN U8_GRIN "b", (const char *[]){"\xe2\x96\x81" "a", "<unk>", "b", NULL}));
    CU_ASSERT(encodes_to(t, U8_GRIN U8_CUP U8_GRIN "x",
                         (const char *[]){"\xe2\x96\x81", "<0xE2>", "<0x98>", "<0x95>", "<unk>", "x", NULL}));
    /* Prepend runs on each piece between added tokens: "▁" before " world" too */
    CU_ASSERT(encodes_to(t, "x</s> y", (const char *[]){"\xe2\x96\x81", "x", "</s>", "\xe2\x96\x81", "\xe2\x96\x81" "y", NULL}));
    /* Strip takes the one space at the start of the text, not those after */
    int32_t two[2] = {id_of(t, "\xe2\x96\x81" "y"), id_of(t, "\xe2\x96\x81" "y")};
    size_t len;
    char *dec = zt_tokenizer_decode_utf8(t, two, 2, &len);
    CU_ASSERT_STRING_EQUAL(dec, "y y");
    free(dec);
    const char *first = zt_tokenizer_decode_first(t, two[0], &len);
    CU_ASSERT(len == 1 && first[0] == 'y');
    first = zt_tokenizer_decode_token(t, two[0], &len);
    CU_ASSERT(len == 2 && memcmp(first, " y", 2) == 0);
    /* the lowercase "<0xf0>" is no fallback target but decodes as the byte */
    int32_t grin[4] = {id_of(t, "<0xf0>"), id_of(t, "<0x9F>"), id_of(t, "<0x98>"), id_of(t, "<0x80>")};
    dec = zt_tokenizer_decode_utf8(t, grin, 4, &len);
    CU_ASSERT_STRING_EQUAL(dec, U8_GRIN);
    free(dec);
    /* a byte run that is not UTF-8: one U+FFFD per byte (not per maximal prefix) */
    dec = zt_tokenizer_decode_utf8(t, grin, 3, &len);
    CU_ASSERT_STRING_EQUAL(dec, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(dec);
    /* bytes that are not UTF-8 go through byte fallback and come back as they were */
    const char raw[] = "\xff\xfe a\xe4\xbd";
    int32_t *ids;
    size_t n;
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, raw, sizeof raw - 1, &ids, &n), 0);
    dec = zt_tokenizer_decode(t, ids, n, &len);
    CU_ASSERT(len == sizeof raw - 1 && memcmp(dec, raw, len) == 0);
    free(dec);
    free(ids);
    zt_tokenizer_close(t);

    /* Metaspace "first": only the piece at offset 0 of the input gets the "▁" */
    t = open_style("mistral");
    CU_ASSERT(encodes_to(t, "Hi", (const char *[]){"\xe2\x96\x81" "H", "i", NULL}));
    CU_ASSERT(encodes_to(t, "[INST]Hi", (const char *[]){"[INST]", "H", "i", NULL}));
    CU_ASSERT(encodes_to(t, "[INST] Hi", (const char *[]){"[INST]", "\xe2\x96\x81" "H", "i", NULL}));
    zt_tokenizer_close(t);

    /* Gemma: no prefix space, no Strip, the post_processor's <bos> not added; the text between
     * added tokens is one pre-token, so a run of spaces merges with the word after it as the
     * merges rank it */
#define M "\xe2\x96\x81" /* "▁" */
    t = open_style("gemma");
    CU_ASSERT(encodes_to(t, "Hi", (const char *[]){"H", "i", NULL}));
    CU_ASSERT(encodes_to(t, " Hi<eos>", (const char *[]){M "H", "i", "<eos>", NULL}));
    CU_ASSERT(encodes_to(t, "a  b   c", (const char *[]){"a", M, M "b", M M, M "c", NULL}));
    first = zt_tokenizer_decode_first(t, id_of(t, M "b"), &len);
    CU_ASSERT(len == 2 && memcmp(first, " b", 2) == 0);
    CU_ASSERT_EQUAL(zt_tokenizer_eot(t), id_of(t, "<eos>"));
    CU_ASSERT(id_of(t, "<pad>") == 0 && id_of(t, "<eos>") == 1 && id_of(t, "<bos>") == 2 && id_of(t, "<unk>") == 3);
    zt_tokenizer_close(t);
    /* Split behaviors (as `tokenizers` splits: checked by hand) */
    t = open_style("gemma_next"); /* "▁" MergedWithNext: a, ▁, ▁b, ▁c, ▁ */
    CU_ASSERT(encodes_to(t, "a  b c ", (const char *[]){"a", M, M "b", M "c", M, NULL}));
    zt_tokenizer_close(t);
    t = open_style("gemma_contiguous"); /* "\n" Removed, then ▁|(?=[.,!?]) Contiguous: a, ▁▁, b, ., ▁ */
    CU_ASSERT(encodes_to(t, "a\n  b. ", (const char *[]){"a", M M, "b", ".", M, NULL}));
    zt_tokenizer_close(t);
    /* Oniguruma's \h is a hex digit (PCRE2's: horizontal space), \uHHHH a code point:
     * \h+ Removed, then \u2581 MergedWithNext */
    json_t *patch = json_loads("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                               "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\h+\"}, "
                               "\"behavior\": \"Removed\"}, "
                               "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\u2581\"}, "
                               "\"behavior\": \"MergedWithNext\"}]}}", 0, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(patch);
    t = open_patched(fixture("gemma.json"), patch);
    json_decref(patch);
    CU_ASSERT(encodes_to(t, "Deadbeef is 0xFF, not good",
                         (const char *[]){M "is", M, "x", ",", M "not", M "g", "oo", NULL}));
    zt_tokenizer_close(t);
#undef M
}

/* The fixtures exercise what they claim: ignore_merges and NFC change some ids,
 * gpt2 has legacy string merges and qwen2 list merges. */
static void t_fixtures_bite(void)
{
    json_t *c = load_cases();
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    json_t *tk = json_object_get(c, "tokenizers");
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "llama3"), "ignore_merges_changes")) > 0);
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "qwen2"), "nfc_changes")) > 0);
    static const char *const sp[] = {"llama2", "mistral", "metaspace", "metaspace_never"};
    for (int k = 0; k < 4; k++) CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, sp[k]), "byte_fallback_ids")) > 0);
    /* mistral's one unk is the text "<unk>" (an added token); llama2 has unknown characters */
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "llama2"), "unk_ids")) >
              json_integer_value(json_object_get(json_object_get(tk, "mistral"), "unk_ids")) + 5);
    /* gemma's own Split finds no space after the normalizer; the variants' behaviors (and
     * gemma_invert's invert) change ids */
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "gemma"), "byte_fallback_ids")) > 0);
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "gemma"), "behavior_changes")) == 0);
    static const char *const gv[] = {"gemma_next", "gemma_prev", "gemma_contiguous", "gemma_invert"};
    for (int k = 0; k < 4; k++)
        CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, gv[k]), "behavior_changes")) > 10);
    CU_ASSERT(json_integer_value(json_object_get(json_object_get(tk, "gemma_invert"), "invert_changes")) > 10);
    json_t *g = json_load_file(fixture("gpt2.json"), 0, NULL), *q = json_load_file(fixture("qwen2.json"), 0, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    CU_ASSERT(json_is_string(json_array_get(json_object_get(json_object_get(g, "model"), "merges"), 0)));
    CU_ASSERT(json_is_array(json_array_get(json_object_get(json_object_get(q, "model"), "merges"), 0)));
    json_decref(g);
    json_decref(q);
}

/* GPT-2's vocab.json + merges.txt, written from gpt2.json, go through the same code:
 * the same ids on every case without added tokens other than <|endoftext|>. */
static void t_vocab_merges_files(void)
{
    json_t *g = json_load_file(fixture("gpt2.json"), 0, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    json_t *m = json_object_get(g, "model");
    CU_ASSERT_EQUAL_FATAL(json_dump_file(json_object_get(m, "vocab"), tpath("vocab.json"), 0), 0);
    FILE *f = fopen(tpath("merges.txt"), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("#version: 0.2\n", f);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(m, "merges"), i, e) fprintf(f, "%s\n", json_string_value(e));
    fclose(f);
    json_decref(g);
    zt_tokenizer_t *t = zt_tokenizer_open_bpe(tpath("vocab.json"), tpath("merges.txt"), err, sizeof err);
    if (!t) printf("\n  %s\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_STRING_EQUAL(zt_tokenizer_kind(t), "gpt2-bpe");
    json_t *c = load_cases(), *strings = json_object_get(c, "strings");
    json_t *res = json_object_get(json_object_get(json_object_get(c, "tokenizers"), "gpt2"), "cases");
    int compared = 0;
    for (size_t k = 0; k < json_array_size(strings); k++) {
        const char *text = json_string_value(json_array_get(strings, k));
        if (strstr(text, "[w]") || strstr(text, "<|im_") || strstr(text, "_of_text|>")) continue;
        size_t nw, n;
        int32_t *want = json_ids(json_object_get(json_array_get(res, k), "ids"), &nw), *ids;
        CU_ASSERT_EQUAL(zt_tokenizer_encode(t, text, strlen(text), &ids, &n), 0);
        CU_ASSERT(n == nw && memcmp(ids, want, n * sizeof *ids) == 0);
        free(ids);
        free(want);
        compared++;
    }
    CU_ASSERT(compared > 20);
    zt_tokenizer_close(t);
    /* a directory holding only vocab.json + merges.txt opens through zt_tokenizer_load */
    t = zt_tokenizer_load(tmpdir, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL(t);
    if (t) CU_ASSERT_STRING_EQUAL(zt_tokenizer_kind(t), "gpt2-bpe");
    zt_tokenizer_close(t);
}

/* Bytes that are not UTF-8 are never lost; the cache gives the same ids warm and cold. */
static void t_robust_and_cache(void)
{
    zt_tokenizer_t *t = zt_tokenizer_load(fixture("qwen2.json"), err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    const char text[] = "\xff\xfe caf\xc3 \xe2\x82 ok<|im_end|>\xf0\x9f\x98 e\xcc \x80\x80";
    int32_t *ids, *ids2;
    size_t n, n2, len;
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, text, sizeof text - 1, &ids, &n), 0);
    char *back = zt_tokenizer_decode(t, ids, n, &len);
    CU_ASSERT_EQUAL(len, sizeof text - 1);
    CU_ASSERT(memcmp(back, text, sizeof text - 1) == 0);
    free(back);
    free(ids);
    /* (NFC still composes the valid runs: bytes that are not UTF-8 are for ztrain to define,
     * the library takes no such text) */
    const char nfc_text[] = "\xff e\xcc\x81";
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, nfc_text, sizeof nfc_text - 1, &ids, &n), 0);
    back = zt_tokenizer_decode(t, ids, n, &len);
    CU_ASSERT(len == 4 && memcmp(back, "\xff \xc3\xa9", 4) == 0);
    free(back);
    free(ids);
    /* from_utf8_lossy: one U+FFFD per maximal invalid prefix */
    int32_t one[2] = {zt_tokenizer_token_id(t, "\xe2", 1), zt_tokenizer_token_id(t, "\x82", 1)};
    back = zt_tokenizer_decode_utf8(t, one, 2, &len);
    CU_ASSERT_STRING_EQUAL(back, "\xef\xbf\xbd");
    free(back);
    one[0] = zt_tokenizer_token_id(t, "\x80", 1);
    back = zt_tokenizer_decode_utf8(t, (int32_t[]){one[0], one[0]}, 2, &len);
    CU_ASSERT_STRING_EQUAL(back, "\xef\xbf\xbd\xef\xbf\xbd");
    free(back);

    json_t *strings = json_object_get(load_cases(), "strings");
    const char *big = json_string_value(json_array_get(strings, json_array_size(strings) - 1));
    CU_ASSERT_FATAL(strlen(big) > 4000);
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, big, strlen(big), &ids, &n), 0);
    zt_tokenizer_close(t);
    t = zt_tokenizer_load(fixture("qwen2.json"), err, sizeof err);
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, big, strlen(big), &ids2, &n2), 0); /* cold cache */
    CU_ASSERT(n == n2 && memcmp(ids, ids2, n * sizeof *ids) == 0);
    free(ids2);
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, big, strlen(big), &ids2, &n2), 0); /* warm */
    CU_ASSERT(n == n2 && memcmp(ids, ids2, n * sizeof *ids) == 0);
    free(ids2);
    free(ids);
    zt_tokenizer_close(t);
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

/* Bad input is refused with one line naming the file and the JSON key. */
static void t_errors(void)
{
    static const struct { const char *json, *want; } bad[] = {
        {"{\"model\": {\"type\": \"BPE\"", "bad.json:1:"},
        {"{\"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "normalizer.type 'Lowercase'"},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "pre_tokenizer.type 'Whitespace'"},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"Merged\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}}",
         "pre_tokenizer.pretokenizers[0].behavior 'Merged'"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", "
         "\"invert\": 1}}", "pre_tokenizer.invert: not a boolean"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}}}", "pre_tokenizer.behavior '?'"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[\\\\H]\"}, \"behavior\": \"Removed\"}}",
         "pre_tokenizer.pattern: \\H inside a character class"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}}",
         "pre_tokenizer.pattern: regex /(a/"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}}",
         "pre_tokenizer.add_prefix_space"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"WordPiece\"}}",
         "decoder.type 'WordPiece'"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
         "{\"type\": \"WordPiece\"}}", "model.type 'WordPiece'"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
         "{\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}", "model.byte_fallback"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
         "{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", [\"b\", \"a\"]]}}",
         "model.merges[1]"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
         "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "model.merges[0]"},
        {"{\"added_tokens\": [{\"content\": \"x\"}]}", "added_tokens[0]"},
        /* SentencePiece-style files */
        {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, "
         "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"AA==\"}]}}", "normalizer.normalizers[1].type 'Precompiled'"},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"\u2581\"}}",
         "normalizer.pattern.Regex"},
        {"{\"normalizer\": {\"type\": \"Prepend\"}}", "normalizer.prepend"},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"String\": \" \"}, \"behavior\": \"Isolated\"}, {\"type\": \"Metaspace\", \"replacement\": \"\u2581\"}]}}",
         "pre_tokenizer.pretokenizers[1]: Metaspace inside a Sequence"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"sometimes\"}}",
         "pre_tokenizer.prepend_scheme 'sometimes'"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"add_prefix_space\": false}}",
         "pre_tokenizer.add_prefix_space is false"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"__\"}}", "pre_tokenizer.replacement: not one"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"split\": \"yes\"}}",
         "pre_tokenizer.split"},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
         "pre_tokenizer: no ByteLevel"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": "
         "[{\"type\": \"ByteFallback\"}]}}", "pre_tokenizer: ByteLevel with a Sequence decoder"},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, "
         "\"stop\": 0}, {\"type\": \"Fuse\"}]}}", "decoder.decoders[0]: Strip before Fuse"},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Replace\", "
         "\"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"}]}}", "decoder.decoders[1]: Replace after ByteFallback"},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"CTC\"}]}}",
         "decoder.decoders[1].type 'CTC'"},
        {"{\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\"}, \"model\": "
         "{\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "model.unk_token"},
        {"{\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\"}, \"model\": {\"type\": \"BPE\", "
         "\"dropout\": 0.1, \"byte_fallback\": true, \"vocab\": {\"a\": 0}, \"merges\": []}}", "model.dropout"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        put(tpath("bad.json"), bad[k].json);
        err[0] = 0;
        zt_tokenizer_t *t = zt_tokenizer_load(tpath("bad.json"), err, sizeof err);
        CU_ASSERT_PTR_NULL(t);
        zt_tokenizer_close(t);
        int ok = strstr(err, bad[k].want) && strstr(err, "bad.json") && !strchr(err, '\n');
        CU_ASSERT(ok);
        if (!ok) printf("\n    case %zu: got \"%s\", want \"%s\"", k, err, bad[k].want);
    }
    /* a SentencePiece-style file cut short */
    size_t fl;
    char *whole = zt_read_file(fixture("llama2.json"), &fl, err, sizeof err);
    CU_ASSERT_FATAL(whole && fl > 30000);
    whole[30000] = 0;
    put(tpath("bad.json"), whole);
    free(whole);
    CU_ASSERT_PTR_NULL(zt_tokenizer_load(tpath("bad.json"), err, sizeof err));
    CU_ASSERT(strstr(err, "bad.json:") && !strchr(err, '\n'));
    CU_ASSERT_PTR_NULL(zt_tokenizer_load(tpath("missing.json"), err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing.json"));
    CU_ASSERT_EQUAL(mkdir(tpath("emptydir"), 0700), 0);
    CU_ASSERT_PTR_NULL(zt_tokenizer_load(tpath("emptydir"), err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no tokenizer.json"));
    rmdir(tpath("emptydir"));
}

/* ztrain's byte tokenizer as tokenizer.json: id = byte, EOT 256 special. */
static void t_byte_level_json(void)
{
    CU_ASSERT_EQUAL_FATAL(zt_tokenizer_write_byte_level_json(tpath("tokenizer.json"), 256, err, sizeof err), 0);
    zt_tokenizer_t *t = zt_tokenizer_load(tpath("tokenizer.json"), err, sizeof err);
    if (!t) printf("\n  %s\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(zt_tokenizer_vocab_size(t), 257);
    CU_ASSERT_EQUAL(zt_tokenizer_eot(t), 256);
    char text[600];
    for (int i = 0; i < 600; i++) text[i] = (char)(i * 37 % 255 + 1);
    int32_t *ids;
    size_t n, len;
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, text, sizeof text, &ids, &n), 0);
    CU_ASSERT_EQUAL_FATAL(n, sizeof text);
    for (size_t i = 0; i < n; i++) CU_ASSERT(ids[i] == (unsigned char)text[i]);
    char *back = zt_tokenizer_decode(t, ids, n, &len);
    CU_ASSERT(len == sizeof text && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, "a<|endoftext|>b", 15, &ids, &n), 0);
    CU_ASSERT(n == 3 && ids[0] == 'a' && ids[1] == 256 && ids[2] == 'b');
    free(ids);
    zt_tokenizer_close(t);
    CU_ASSERT_EQUAL(zt_tokenizer_write_byte_level_json(tpath("x.json"), 255, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "x.json"));
    unlink(tpath("tokenizer.json"));
}

/* Throughput on a few MB of text (the fortunes files), printed; never a failure. */
static void t_speed(void)
{
    DIR *d = opendir("/usr/share/games/fortunes");
    if (!d) {
        printf("SKIP (no /usr/share/games/fortunes) ");
        return;
    }
    size_t cap = 1 << 22, len = 0;
    char *buf = zt_malloc(cap);
    struct dirent *de;
    while ((de = readdir(d)) && len < 3000000) {
        size_t nl = strlen(de->d_name);
        if (de->d_name[0] == '.' || (nl > 4 && (!strcmp(de->d_name + nl - 4, ".dat") || !strcmp(de->d_name + nl - 3, ".u8"))))
            continue;
        char p[600];
        snprintf(p, sizeof p, "/usr/share/games/fortunes/%s", de->d_name);
        size_t fl;
        char *s = zt_read_file(p, &fl, err, sizeof err);
        if (!s) continue;
        if (len + fl > cap) fl = cap - len;
        memcpy(buf + len, s, fl);
        len += fl;
        free(s);
    }
    closedir(d);
    /* llama2, gemma: the whole text is one pre-token (no pre-tokenizer / a Split that finds
     * nothing), as in the library */
    static const char *const styles[] = {"gpt2.json", "llama3.json", "qwen2.json", "llama2.json", "mistral.json",
                                         "gemma.json"};
    for (int k = 0; k < 6; k++) {
        zt_tokenizer_t *t = zt_tokenizer_load(fixture(styles[k]), err, sizeof err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int32_t *ids;
        size_t n;
        CU_ASSERT_EQUAL(zt_tokenizer_encode(t, buf, len, &ids, &n), 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        printf("\n    %s: %.1f MB, %zu tokens in %.3f s: %.2f M tokens/s", styles[k], (double)len / 1e6, n, s,
               (double)n / s / 1e6);
        size_t bl;
        char *back = zt_tokenizer_decode(t, ids, n, &bl);
        if (k != 2) CU_ASSERT(bl == len && memcmp(back, buf, len) == 0); /* qwen2 applies NFC */
        free(back);
        free(ids);
        zt_tokenizer_close(t);
    }
    free(buf);
}

static void t_cleanup(void)
{
    json_decref(cases);
    cases = NULL;
    if (!tmpdir[0]) return;
    unlink(tpath("vocab.json"));
    unlink(tpath("merges.txt"));
    unlink(tpath("bad.json"));
    unlink(tpath("patched.json"));
    CU_ASSERT_EQUAL(rmdir(tmpdir), 0);
}

static const zt_test_t tests[] = {
    {"gpt2 (ByteLevel regex, legacy merges, single_word)", t_gpt2},
    {"llama3 (Split, ignore_merges)", t_llama3},
    {"qwen2 (NFC, Split, normalized and lstrip/rstrip tokens)", t_qwen2},
    {"llama2 (Prepend + Replace, byte_fallback, fuse_unk, Strip decoder)", t_llama2},
    {"mistral (Metaspace first, [INST])", t_mistral},
    {"metaspace (add_prefix_space form, split, Metaspace decoder)", t_metaspace},
    {"metaspace_never (prepend never, split, Metaspace decoder)", t_metaspace_never},
    {"gemma (Replace, Split \" \" MergedWithPrevious, no Strip)", t_gemma},
    {"gemma_next (Split String MergedWithNext)", t_gemma_next},
    {"gemma_prev (Split Isolated, Regex MergedWithPrevious)", t_gemma_prev},
    {"gemma_contiguous (Split Removed, Contiguous with an empty match)", t_gemma_contiguous},
    {"gemma_invert (Split MergedWithPrevious, invert)", t_gemma_invert},
    {"SentencePiece rules one by one", t_sentencepiece_rules},
    {"the fixtures exercise what they claim", t_fixtures_bite},
    {"vocab.json + merges.txt through the same code", t_vocab_merges_files},
    {"raw bytes, lossy decode, cache", t_robust_and_cache},
    {"errors name the file and the key", t_errors},
    {"byte tokenizer as tokenizer.json", t_byte_level_json},
    {"speed", t_speed},
    {"cleanup", t_cleanup},
    {NULL, NULL},
};
ZT_TEST_MAIN("test_tokenizer", tests)
