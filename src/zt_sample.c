/* zt_sample.c — temperature sampling from next-token logits (see zt_sample.h). */
#include "zt_sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_log.h"

zt_tokenizer_t *zt_sample_tokenizer(const char *kind, const char *tokenizer, const char *vocab_file,
                                    const char *merges_file, const char *model_dir)
{
    zt_tokenizer_t *tok = NULL;
    char terr[ZT_ERRLEN] = "";
    if (strcmp(kind, "byte") == 0 || kind[0] == 0) {
        tok = zt_tokenizer_byte();
    } else if (tokenizer[0]) {
        tok = zt_tokenizer_load(tokenizer, terr, sizeof terr);
    } else if (vocab_file[0] && merges_file[0]) {
        tok = zt_tokenizer_open_bpe(vocab_file, merges_file, terr, sizeof terr);
    } else if (model_dir[0]) {
        tok = zt_tokenizer_load(model_dir, terr, sizeof terr);
    }
    if (!tok && terr[0]) zt_log("sample: %s; printing token ids", terr);
    return tok;
}

/* xorshift64: a fixed-seed generator, the same sample for the same seed everywhere */
static uint64_t xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* One token drawn from softmax(logits / temperature), u uniform in [0, 1). */
static int32_t draw(const float *logits, int V, double temperature, double u)
{
    double mx = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++) mx = fmax(mx, logits[v]);
    for (int v = 0; v < V; v++) sum += exp((logits[v] - mx) / temperature);
    const double target = u * sum;
    double acc = 0.0;
    for (int v = 0; v < V; v++) {
        acc += exp((logits[v] - mx) / temperature);
        if (acc >= target) return v;
    }
    return V - 1;
}

void zt_sample_generate(const zt_sample_opts_t *o, zt_tokenizer_t *tok, zt_sample_logits_fn logits_fn,
                        void *arg, zt_comm_t *comm, zt_sample_t *out)
{
    const int n = o->tokens, T = o->context, V = o->vocab_size;
    const int root = comm->world.rank == 0;
    int32_t *ctx = zt_malloc((size_t)(n + T + 1) * sizeof *ctx);
    size_t len = 0;
    if (tok && o->prompt && o->prompt[0]) {
        int32_t *p = NULL;
        size_t pn = 0;
        if (zt_tokenizer_encode(tok, o->prompt, strlen(o->prompt), &p, &pn) == 0) {
            for (size_t i = 0; i < pn && len < (size_t)T; i++) ctx[len++] = p[i];
            free(p);
        }
    }
    if (len == 0) ctx[len++] = o->eot >= 0 && o->eot < V ? o->eot : 0;
    out->prompt_len = len;
    float *logits = zt_malloc((size_t)V * sizeof *logits);
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < n; i++) {
        size_t start = len > (size_t)T ? len - (size_t)T : 0;
        int t = (int)(len - start);
        logits_fn(arg, ctx + start, t, root ? logits : NULL);
        int32_t next = 0;
        if (root) next = draw(logits, V, o->temperature, (double)(xorshift(&rng) >> 11) / 9007199254740992.0);
        zt_bcast(comm, &comm->world, &next, 1, ZT_I32, 0);
        ctx[len++] = next;
    }
    free(logits);
    out->tokens = ctx;
    out->len = len;
}

void zt_sample_print(const zt_sample_opts_t *o, const zt_tokenizer_t *tok, const zt_sample_t *s, FILE *f)
{
    fprintf(f, "---- sample (%zu tokens, temperature %g) ----\n", s->len - s->prompt_len, o->temperature);
    int first = 1; /* a SentencePiece decoder strips the text's leading space (decode_first) */
    for (size_t i = 0; i < s->len; i++) {
        const int32_t id = s->tokens[i];
        if (i < s->prompt_len && id == o->eot) continue;
        size_t bl = 0;
        const char *bytes = !tok ? NULL : first ? zt_tokenizer_decode_first(tok, id, &bl)
                                                : zt_tokenizer_decode_token(tok, id, &bl);
        first = 0;
        if (bytes) fwrite(bytes, 1, bl, f);
        else if (id == o->eot) fputs("\n<|endoftext|>\n", f);
        else fprintf(f, "[%d]", id);
    }
    fprintf(f, "\n---- end of sample ----\n");
    fflush(f);
}

void zt_sample_free(zt_sample_t *s)
{
    free(s->tokens);
    s->tokens = NULL;
    s->len = s->prompt_len = 0;
}
