/* fuzz_tokenizer.c — libFuzzer target for encoding arbitrary bytes with the
 * tokenizer.json tokenizers of tests/reference/tokenizers (GPT-2's ByteLevel regex,
 * Llama-3's and Qwen2's Split regexes through PCRE2, Qwen2's NFC through utf8proc,
 * the SentencePiece-style llama2 and mistral with byte fallback, added tokens,
 * BPE merges): dataset records are text ztrain did not write.
 *
 * Asserted (a violation aborts, so libFuzzer reports it):
 *  - every id is inside the vocabulary;
 *  - GPT-2 and Llama-3 have no normalizer and map every byte to a token, so decoding
 *    the ids gives the input back byte for byte, valid UTF-8 or not;
 *  - Qwen2 normalizes (NFC) before it splits, so its decode is the normalized text,
 *    and encoding that again gives the same ids; except where the ids hold the
 *    fixture's added token "café", which decodes as `tokenizers` decodes it: é is in
 *    the byte alphabet, so the ByteLevel decoder turns it into the byte 0xE9;
 *  - llama2 (Prepend "▁" + Replace " " -> "▁", byte fallback) and mistral (Metaspace,
 *    prepend first) decode a text back byte for byte, bytes that are not UTF-8 too
 *    (byte fallback spells them), less the one leading space that mistral's
 *    Metaspace takes for its "▁" and Strip removes; unless the text holds "▁"
 *    (which decodes as a space), '<' or '[' (added tokens, which take Prepend
 *    again), or for llama2 a byte 0xF0 (its fixture has no "<0xF0>": unk);
 *  - gemma (Replace " " -> "▁", Split " " MergedWithPrevious, byte fallback, no
 *    Strip) decodes every text back byte for byte, added-token text too, unless it
 *    holds "▁"; so do its variants from cases.json with Split pre-tokenizers of
 *    every behavior but Removed (gemma_next, gemma_prev, gemma_invert: pieces are
 *    cut, never dropped); gemma_contiguous (Removed "\n", then Contiguous with an
 *    empty lookahead match) gives the text back less its newlines.
 * The tokenizers are loaded once, from $ZT_FUZZ_TOKENIZERS (default
 * tests/reference/tokenizers, relative to the working directory); the gemma
 * variants are written patched to $TMPDIR. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_tokenizer.h"

static const char *const names[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "gemma", "gemma_next",
                                    "gemma_prev", "gemma_invert", "gemma_contiguous"};
enum { NTOK = 10, LLAMA2 = 3, MISTRAL = 4, GEMMA = 5, GEMMA_CONTIGUOUS = 9 };
static zt_tokenizer_t *tok[NTOK];
static int32_t cafe = -1; /* qwen2's added token "café" */

/* gemma.json with cases.json's patch for variant `name`, opened from a temporary file */
static zt_tokenizer_t *open_variant(const char *dir, const char *name, char *err, size_t errlen)
{
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/cases.json", dir);
    json_t *cases = json_load_file(path, 0, NULL);
    json_t *patch = json_object_get(json_object_get(json_object_get(cases, "tokenizers"), name), "patch");
    snprintf(path, sizeof path, "%s/gemma.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    const char *td = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/fuzz_tokenizer_%s.XXXXXX", td ? td : "/tmp", name);
    int fd = mkstemp(tmp);
    if (!patch || !j || fd < 0 || json_object_update(j, patch) != 0 || json_dump_file(j, tmp, 0) != 0) {
        fprintf(stderr, "fuzz_tokenizer: cannot write the %s variant\n", name);
        abort();
    }
    close(fd);
    zt_tokenizer_t *t = zt_tokenizer_open_json(tmp, err, errlen);
    unlink(tmp);
    json_decref(j);
    json_decref(cases);
    return t;
}

static void load(void)
{
    const char *dir = getenv("ZT_FUZZ_TOKENIZERS");
    if (!dir) dir = "tests/reference/tokenizers";
    for (int i = 0; i < NTOK; i++) {
        char path[4096], err[ZT_ERRLEN];
        snprintf(path, sizeof path, "%s/%s.json", dir, names[i]);
        tok[i] = i > GEMMA ? open_variant(dir, names[i], err, sizeof err)
                           : zt_tokenizer_open_json(path, err, sizeof err);
        if (!tok[i]) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err);
            abort();
        }
    }
    cafe = zt_tokenizer_token_id(tok[2], "caf\xc3\xa9", 5);
    if (cafe < 0) abort();
}

static int32_t *encode(int i, const char *s, size_t len, size_t *n)
{
    int32_t *ids = NULL;
    if (zt_tokenizer_encode(tok[i], s, len, &ids, n) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: encode failed on %zu bytes\n", names[i], len);
        abort();
    }
    const int V = zt_tokenizer_vocab_size(tok[i]);
    for (size_t k = 0; k < *n; k++)
        if (ids[k] < 0 || ids[k] >= V) {
            fprintf(stderr, "fuzz_tokenizer: %s: id %d outside the vocabulary (%d)\n", names[i], (int)ids[k], V);
            abort();
        }
    return ids;
}

static int memchr_id(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t k = 0; k < n; k++)
        if (ids[k] == id) return 1;
    return 0;
}

static int has_meta(const char *s, size_t size)
{
    for (size_t k = 0; k + 3 <= size; k++)
        if (memcmp(s + k, "\xe2\x96\x81", 3) == 0) return 1;
    return 0;
}

/* The SentencePiece-style round trip applies: no "▁", no added-token text, no unk. */
static int sp_plain(int i, const char *s, size_t size)
{
    if (memchr(s, '<', size) || memchr(s, '[', size) || (i == LLAMA2 && memchr(s, 0xf0, size))) return 0;
    return !has_meta(s, size);
}

/* gemma_contiguous's Removed "\n": the text less its newlines */
static size_t drop_newlines(const char *s, size_t size, char *out)
{
    size_t o = 0;
    for (size_t k = 0; k < size; k++)
        if (s[k] != '\n') out[o++] = s[k];
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok[0]) load();
    const char *s = (const char *)data;
    for (int i = 0; i < NTOK; i++) {
        size_t n = 0, dl = 0;
        int32_t *ids = encode(i, s, size, &n);
        char *back = zt_tokenizer_decode(tok[i], ids, n, &dl);
        if (i >= GEMMA) {
            char *want = zt_malloc(size + 1);
            size_t wl = i == GEMMA_CONTIGUOUS ? drop_newlines(s, size, want) : size;
            if (i != GEMMA_CONTIGUOUS) memcpy(want, s, size);
            if (!has_meta(s, size) && (dl != wl || memcmp(back, want, wl) != 0)) {
                fprintf(stderr, "fuzz_tokenizer: %s: decode(encode(x)) != x (%zu -> %zu bytes)\n", names[i], size, dl);
                abort();
            }
            free(want);
        } else if (i >= LLAMA2) {
            size_t skip = i == MISTRAL && size > 0 && s[0] == ' ';
            if (sp_plain(i, s, size) && (dl != size - skip || memcmp(back, s + skip, dl) != 0)) {
                fprintf(stderr, "fuzz_tokenizer: %s: decode(encode(x)) != x (%zu -> %zu bytes)\n", names[i], size, dl);
                abort();
            }
        } else if (i < 2) {
            if (dl != size || memcmp(back, s, size) != 0) {
                fprintf(stderr, "fuzz_tokenizer: %s: decode(encode(x)) != x (%zu -> %zu bytes)\n", names[i], size, dl);
                abort();
            }
        } else if (!memchr_id(ids, n, cafe)) {
            size_t n2 = 0;
            int32_t *again = encode(i, back, dl, &n2);
            if (n2 != n || memcmp(again, ids, n * sizeof *ids) != 0) {
                fprintf(stderr, "fuzz_tokenizer: %s: encode(decode(encode(x))) != encode(x)\n", names[i]);
                abort();
            }
            free(again);
        }
        free(back);
        free(ids);
    }
    return 0;
}
