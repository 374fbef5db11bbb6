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
 *    again), or for llama2 a byte 0xF0 (its fixture has no "<0xF0>": unk).
 * The tokenizers are loaded once, from $ZT_FUZZ_TOKENIZERS (default
 * tests/reference/tokenizers, relative to the working directory). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_tokenizer.h"

static const char *const names[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral"};
enum { NTOK = 5, LLAMA2 = 3, MISTRAL = 4 };
static zt_tokenizer_t *tok[NTOK];
static int32_t cafe = -1; /* qwen2's added token "café" */

static void load(void)
{
    const char *dir = getenv("ZT_FUZZ_TOKENIZERS");
    if (!dir) dir = "tests/reference/tokenizers";
    for (int i = 0; i < NTOK; i++) {
        char path[4096], err[ZT_ERRLEN];
        snprintf(path, sizeof path, "%s/%s.json", dir, names[i]);
        tok[i] = zt_tokenizer_open_json(path, err, sizeof err);
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

/* The SentencePiece-style round trip applies: no "▁", no added-token text, no unk. */
static int sp_plain(int i, const char *s, size_t size)
{
    if (memchr(s, '<', size) || memchr(s, '[', size) || (i == LLAMA2 && memchr(s, 0xf0, size))) return 0;
    for (size_t k = 0; k + 3 <= size; k++)
        if (memcmp(s + k, "\xe2\x96\x81", 3) == 0) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok[0]) load();
    const char *s = (const char *)data;
    for (int i = 0; i < NTOK; i++) {
        size_t n = 0, dl = 0;
        int32_t *ids = encode(i, s, size, &n);
        char *back = zt_tokenizer_decode(tok[i], ids, n, &dl);
        if (i >= LLAMA2) {
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
