/* zt_sample.h — text generation: temperature sampling from a model's next-token
 * logits, prompt encoding and decoding.
 *
 * The model is reached only through a callback (zt_sample_logits_fn), so this
 * module knows neither the model nor the shard engine: the trainer's callback runs a
 * forward that gathers units, a future `ztrain --generate` can pass another. Every
 * rank calls zt_sample_generate with the same options; rank 0 of the world samples
 * each token and broadcasts it (zt_bcast), so all ranks feed the same context. */
#ifndef ZT_SAMPLE_H
#define ZT_SAMPLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zt_tokenizer.h"
#include "zt_comm.h"

/* The temperature of the end-of-run sample (train.sample_tokens). */
#define ZT_SAMPLE_TEMPERATURE 0.8

typedef struct zt_sample_opts {
    int tokens;          /* tokens to generate (> 0) */
    int context;         /* the model's window: the last `context` tokens are fed; caps the prompt */
    int vocab_size;
    double temperature;
    uint64_t seed;       /* the generator's seed (train.seed) */
    const char *prompt;  /* text to encode first; NULL or "" (or no tokenizer): start from EOT */
    int eot;             /* the EOT id, -1 when unknown (then a prompt-less sample starts at 0) */
} zt_sample_opts_t;

/* Next-token logits. Called on every rank with the same tokens[0..n) (one sequence,
 * 0 < n <= context): runs the model on them, and where logits is not NULL (rank 0
 * only) writes the vocab_size logits of the last position. A forward whose units are
 * gathered is collective, hence every rank. */
typedef void (*zt_sample_logits_fn)(void *arg, const int32_t *tokens, int n, float *logits);

typedef struct zt_sample {
    int32_t *tokens;     /* prompt then generated tokens (malloc'd; zt_sample_free) */
    size_t len, prompt_len;
} zt_sample_t;

/* The tokenizer to encode the prompt and decode with: the byte tokenizer for `kind`
 * "byte" or ""; else data.tokenizer (a directory or tokenizer.json), else GPT-2 BPE
 * from vocab_file and merges_file when both are given, else the model directory's
 * (logs why when it does not load); NULL: token ids are printed. Close it with
 * zt_tokenizer_close. */
zt_tokenizer_t *zt_sample_tokenizer(const char *kind, const char *tokenizer, const char *vocab_file,
                                    const char *merges_file, const char *model_dir);

/* Encodes the prompt (tok may be NULL) and samples o->tokens tokens after it.
 * Collective over comm's world. */
void zt_sample_generate(const zt_sample_opts_t *o, zt_tokenizer_t *tok, zt_sample_logits_fn logits,
                        void *arg, zt_comm_t *comm, zt_sample_t *out);

/* Writes the sample between "---- sample ... ----" and "---- end of sample ----"
 * lines, decoded with tok (token ids in brackets without one); an EOT in the prompt
 * is not shown, one generated is written as "<|endoftext|>" on its own line. */
void zt_sample_print(const zt_sample_opts_t *o, const zt_tokenizer_t *tok, const zt_sample_t *s, FILE *f);

void zt_sample_free(zt_sample_t *s);

#endif
