/* zt_bpe.h — tokenizers: GPT-2 byte-level BPE and the plain byte tokenizer.
 *
 * GPT-2 BPE is loaded from the OpenAI/Hugging Face files: vocab.json (encoder.json:
 * token string -> id, strings written in GPT-2's byte-to-unicode alphabet) and
 * merges.txt (one "A B" pair per line, rank = line order). Pre-tokenization is a
 * regex-free C approximation of GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * in which every non-ASCII code point counts as a letter and only ASCII digits
 * and ASCII whitespace are digits and whitespace: exact for ASCII text.
 * "<|endoftext|>" in the text is not special: callers insert the EOT id.
 *
 * The byte tokenizer (vocab 257: bytes 0..255, EOT 256) is the default; it is a
 * static object and zt_tokenizer_close() ignores it. Decoding is per token so the
 * trainer can print generated samples as they come. */
#ifndef ZT_BPE_H
#define ZT_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct zt_tokenizer zt_tokenizer_t;

/* Loads GPT-2 BPE; NULL with a one-line message naming the file and line on error. */
zt_tokenizer_t *zt_tokenizer_open_bpe(const char *vocab_json, const char *merges_txt, char *err,
                                      size_t errlen);
/* The byte-level tokenizer (never NULL, never freed). */
zt_tokenizer_t *zt_tokenizer_byte(void);
/* Opens by kind name as stored in token files: "byte" (or "") or "gpt2-bpe" (needs the files). */
zt_tokenizer_t *zt_tokenizer_open(const char *kind, const char *vocab_json, const char *merges_txt,
                                  char *err, size_t errlen);
void zt_tokenizer_close(zt_tokenizer_t *tok);

/* Encodes len bytes of text; *out is malloc'd (caller frees), *n its length. Returns 0 or -1. */
int zt_tokenizer_encode(const zt_tokenizer_t *tok, const char *text, size_t len, int32_t **out,
                        size_t *n);
/* Bytes of one token (not NUL-terminated in general); NULL for an id outside the vocab. */
const char *zt_tokenizer_decode_token(const zt_tokenizer_t *tok, int32_t id, size_t *len);
/* Decodes n tokens into a malloc'd NUL-terminated string; unknown ids are skipped. */
char *zt_tokenizer_decode(const zt_tokenizer_t *tok, const int32_t *ids, size_t n, size_t *len);

int zt_tokenizer_vocab_size(const zt_tokenizer_t *tok);
int zt_tokenizer_eot(const zt_tokenizer_t *tok); /* -1 when the vocab has none */
const char *zt_tokenizer_kind(const zt_tokenizer_t *tok); /* "byte" | "gpt2-bpe" */

#endif
