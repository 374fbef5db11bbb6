/* zt_tokenizer.h — tokenizers: Hugging Face tokenizer.json (byte-level BPE),
 * GPT-2 vocab.json + merges.txt, and ztrain's own byte tokenizer.
 *
 * tokenizer.json is read as the `tokenizers` library reads it, for the BPE
 * models of GPT-2, Llama-3 and Qwen2/Qwen3, the SentencePiece-style BPE of
 * Llama-2, TinyLlama, Mistral-7B, Vicuna, CodeLlama, Gemma 1/2/3 (and models
 * trained alike):
 *  - added_tokens: matched in the text before anything else, leftmost-longest,
 *    the normalized=false ones on the raw text, then the normalized=true ones on
 *    the normalized pieces between them; single_word, lstrip and rstrip as the
 *    library applies them (word characters: the regex crate's Unicode \w);
 *    the ids are the file's (the library renumbers an added token missing from
 *    the vocabulary whose id is not after it: a file it never writes);
 *  - normalizer: none, NFC (through utf8proc), Prepend, Replace (String
 *    pattern), alone or in a Sequence, on each piece between added tokens;
 *  - pre_tokenizer: ByteLevel (use_regex: GPT-2's pattern), alone or after
 *    Split in a Sequence; Split: a Regex or String pattern, every behavior
 *    (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous), invert,
 *    empty matches where Oniguruma's find_iter finds them. Regexes run through
 *    PCRE2 (UTF + UCP, JIT when available) with \s and \S rewritten to Unicode
 *    White_Space, \h and \H to hex digits and \uHHHH to \x{HHHH}, which is what
 *    the library's Oniguruma means by them. For a SentencePiece-style file: none,
 *    Split alone or in a Sequence (Gemma: Split(" ", MergedWithPrevious) after a
 *    Replace(" " -> "▁") normalizer, which finds nothing), or Metaspace alone
 *    (prepend_scheme first, always, never; split; the older add_prefix_space and
 *    str_rep keys);
 *  - model: BPE with merges as "a b" strings or ["a", "b"] lists, ignore_merges
 *    (a pre-token that is itself in the vocabulary is one token), unk_token,
 *    fuse_unk, and for SentencePiece-style files byte_fallback (a character
 *    outside the vocabulary becomes its bytes' "<0xXX>" tokens);
 *  - decoder: ByteLevel (tokens back to bytes; a token with a character outside
 *    the byte alphabet stays as its UTF-8, as in the library), which makes the
 *    file byte level. Any other decoder makes it SentencePiece style (BPE over
 *    the text's characters, the vocabulary's strings as they are): Metaspace, or
 *    a Sequence of Replace (String), ByteFallback, Fuse, then Strip on the fused
 *    text, as Llama-2 and Mistral have (Gemma: no Strip).
 * What is not implemented (other models, normalizers, pre-tokenizers, decoders,
 * BPE dropout, byte_fallback at byte level, add_prefix_space in ByteLevel,
 * Metaspace in a Sequence, a decoder step out of that order) is refused with a
 * one-line error naming the file and the JSON key. The post_processor is not applied: ids are
 * those of encode(text, add_special_tokens=False), as token files want.
 * The GPT-2 files (vocab.json + merges.txt) build the same object: ByteLevel with
 * GPT-2's regex, and "<|endoftext|>" as a special added token when the vocabulary
 * has it, as transformers' GPT2TokenizerFast does.
 *
 * A text is encoded as one string however long: pieces are cut only where the
 * library cuts them. Encoding keeps a cache of pre-token -> ids in the object, so
 * one tokenizer must not be used by two threads at once.
 *
 * The byte tokenizer (vocab 257: bytes 0..255, EOT 256; "<|endoftext|>" in the
 * text is NOT special) is the default; it is a static object and
 * zt_tokenizer_close() ignores it. Decoding is per token too, so the trainer can
 * print generated samples as they come. */
#ifndef ZT_TOKENIZER_H
#define ZT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct zt_tokenizer zt_tokenizer_t;

/* Opens PATH: a directory (its tokenizer.json, else its vocab.json + merges.txt)
 * or a tokenizer.json file. In a directory, tokenizer_config.json's eos_token
 * names the EOT token when present. NULL with a one-line error on failure. */
zt_tokenizer_t *zt_tokenizer_load(const char *path, char *err, size_t errlen);
/* A tokenizer.json file. */
zt_tokenizer_t *zt_tokenizer_open_json(const char *path, char *err, size_t errlen);
/* GPT-2 BPE from vocab.json (encoder.json) and merges.txt; errors name file and line. */
zt_tokenizer_t *zt_tokenizer_open_bpe(const char *vocab_json, const char *merges_txt, char *err,
                                      size_t errlen);
/* The byte-level tokenizer (never NULL, never freed). */
zt_tokenizer_t *zt_tokenizer_byte(void);
/* Opens by kind name as stored in token files: "byte" (or "") or "gpt2-bpe" (needs the files). */
zt_tokenizer_t *zt_tokenizer_open(const char *kind, const char *vocab_json, const char *merges_txt,
                                  char *err, size_t errlen);
void zt_tokenizer_close(zt_tokenizer_t *tok);

/* Encodes len bytes of text; *out is malloc'd (caller frees), *n its length. Returns 0 or -1. */
int zt_tokenizer_encode(zt_tokenizer_t *tok, const char *text, size_t len, int32_t **out, size_t *n);
/* Bytes of one token (not NUL-terminated in general); NULL for an id outside the vocab.
 * This is the token as it decodes after the first: for a SentencePiece-style
 * file "▁the" gives " the" and "<0xE4>" the byte 0xE4 (with a ByteFallback decoder). */
const char *zt_tokenizer_decode_token(const zt_tokenizer_t *tok, int32_t id, size_t *len);
/* The same for the token a decode starts with: a SentencePiece-style decoder
 * drops the space its normalizer or pre-tokenizer put there (Strip(" ", 1, 0)
 * on the text, or the Metaspace decoder's first token), so "▁the" gives "the".
 * Text printed token by token reads as zt_tokenizer_decode's when its first
 * token goes through this and the rest through zt_tokenizer_decode_token (Strip
 * on a first token that decodes to nothing would reach into the next; no file
 * we know has such a token). Same as zt_tokenizer_decode_token for the other kinds. */
const char *zt_tokenizer_decode_first(const zt_tokenizer_t *tok, int32_t id, size_t *len);
/* Decodes n tokens into a malloc'd NUL-terminated string of their bytes; unknown ids are
 * skipped. The decoder's start-of-text rule applies to the first (see above), so
 * decoding a continuation on its own drops its leading space, as `tokenizers` does. */
char *zt_tokenizer_decode(const zt_tokenizer_t *tok, const int32_t *ids, size_t n, size_t *len);
/* As zt_tokenizer_decode, then invalid UTF-8 replaced by U+FFFD as Rust's
 * from_utf8_lossy does (byte level), or as the ByteFallback decoder does (a run
 * of byte tokens that is not UTF-8 becomes one U+FFFD per byte): the text
 * `tokenizers`' decode() returns. */
char *zt_tokenizer_decode_utf8(const zt_tokenizer_t *tok, const int32_t *ids, size_t n, size_t *len);

/* tokenizer_config.json's KEY ("eos_token", "bos_token", "pad_token": a string or
 * {"content": ...}) in PATH (a directory) or beside it (a tokenizer.json file);
 * malloc'd, NULL when absent or null. */
char *zt_tokenizer_config_token(const char *path, const char *key);

/* Id of a token string: an added token's content or a vocabulary entry (raw bytes); -1 if none. */
int32_t zt_tokenizer_token_id(const zt_tokenizer_t *tok, const char *s, size_t len);
int zt_tokenizer_vocab_size(const zt_tokenizer_t *tok);
int zt_tokenizer_eot(const zt_tokenizer_t *tok); /* -1 when the vocab has none */
const char *zt_tokenizer_kind(const zt_tokenizer_t *tok); /* "byte" | "gpt2-bpe" | "hf" */

/* Writes ztrain's byte tokenizer as a Hugging Face tokenizer.json: a BPE without
 * merges over the 256 byte-level tokens (id = byte value), ByteLevel
 * pre-tokenizer and decoder, and "<|endoftext|>" as special added token eot_token
 * (>= 256; 256 for ztrain). AutoTokenizer loads it and encodes a text to its
 * UTF-8 bytes, as zt_tokenizer_byte() does. Returns 0, or -1 with err. */
int zt_tokenizer_write_byte_level_json(const char *path, int eot_token, char *err, size_t errlen);

#endif
