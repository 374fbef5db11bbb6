/* zt_model.h — GPT-2 family model: parameter table and unit-wise forward/backward.
 *
 * The model publishes one table of parameters with their HF GPT-2 state_dict
 * names and shapes (Conv1D weights are (in, out)), grouped into units:
 *   unit 0      "root": transformer.wte.weight (V,C), transformer.wpe.weight (maxT,C),
 *               transformer.ln_f.weight (C), transformer.ln_f.bias (C).
 *               Used twice per pass: embedding at the start and the head (ln_f and
 *               the tied lm_head = wte) at the end.
 *   unit 1+l    transformer.h.l.*: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj.
 * Within a unit, parameters are concatenated in table order (offset, numel), so a
 * unit is one flat fp32 buffer. The model never knows whether that buffer was
 * gathered from shards: the shard engine hands it full unit buffers.
 *
 * A training micro-step is, in order:
 *   forward_embed(root) ; forward_block(l, unit l+1) for l = 0..L-1 ;
 *   train_head(root, root grads) ;
 *   backward_block(l, ...) for l = L-1..0 ; backward_embed(root grads) ; loss().
 * The head runs in chunks of tokens whose logits are made, turned into dlogits and
 * consumed by both lm_head gradient GEMMs before the next chunk, so the (N,V) logits
 * never exist at once; that is why its forward and backward are one call.
 * Nothing in it waits for a device: the batch is uploaded and the per-token
 * losses downloaded asynchronously, and loss() is the only wait, so a device
 * runs the whole micro-step as queued.
 * Parameter gradients are accumulated (+=) into the unit gradient buffers.
 *
 * Initial values are a pure function of (seed, parameter name, element index)
 * (counter-based hashing + Box-Muller), so any rank can create exactly the slice
 * it owns and every world size starts from identical weights. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zt_backend.h"

enum { ZT_INIT_NORMAL = 0, ZT_INIT_ZEROS = 1, ZT_INIT_ONES = 2 };

typedef struct zt_param {
    char name[96];      /* HF name, e.g. "transformer.h.3.attn.c_attn.weight" */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];
    size_t numel;
    int unit;
    size_t offset;      /* element offset within its unit's flat buffer */
    int decay;          /* weight decay applies (ndim >= 2) */
    int init;           /* ZT_INIT_* */
    float init_std;
} zt_param_t;

typedef struct zt_model_dims {
    int L, NH, C, V, maxT;
} zt_model_dims_t;

typedef struct zt_model zt_model_t;

/* Builds the parameter table only (no activations, no backend): used by the shard
 * engine, the checkpoint code and the memory estimator. */
typedef struct zt_param_table {
    zt_model_dims_t dims;
    int nparams;
    zt_param_t *params;
    int nunits;
    size_t *unit_numel;     /* (nunits) */
    int *unit_first;        /* (nunits) first param index of each unit */
    int *unit_count;        /* (nunits) number of params in each unit */
    size_t total_numel;
} zt_param_table_t;

zt_param_table_t *zt_param_table_create(zt_model_dims_t dims, float init_std);
void zt_param_table_free(zt_param_table_t *t);
int zt_param_table_find(const zt_param_table_t *t, const char *name); /* -1 if absent */

/* Initial value of element `idx` of parameter p (pure function). */
float zt_param_init_value(const zt_param_t *p, uint64_t seed, size_t idx);
/* Fills out[0..n) with elements [start, start+n) of p's initial values. */
void zt_param_init_range(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out);

/* Model with activation buffers for micro-batches up to (B, T), on backend be. */
zt_model_t *zt_model_create(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                            int recompute);
void zt_model_free(zt_model_t *m);

/* Activation bytes the model allocated (for the memory report). */
size_t zt_model_activation_bytes(const zt_model_t *m);
/* Same, analytically, without allocating. */
size_t zt_model_activation_bytes_estimate(zt_model_dims_t d, int B, int T, int recompute);
/* Training FLOPs per token (forward + backward, 6N + attention), for MFU. */
double zt_model_flops_per_token(zt_model_dims_t d, int T);

/* Host tokens (B,T); targets may be NULL for inference (then no loss). The upload
 * is asynchronous: the arrays must stay unchanged until a result of this batch is
 * read (zt_model_loss, zt_model_logits_row). */
void zt_model_set_batch(zt_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T);
void zt_model_forward_embed(zt_model_t *m, const float *root);
void zt_model_forward_block(zt_model_t *m, int l, const float *unit);
/* Inference and evaluation: logits, and with targets the per-token losses (read by
 * zt_model_loss). Only the last chunk's logits are kept (zt_model_logits_row). */
void zt_model_forward_head(zt_model_t *m, const float *root);
/* Training: the head's forward and backward, chunk by chunk: the losses, the head's
 * parameter gradients (tied wte, ln_f) accumulated into droot, and dL/d(last block
 * output) for backward_block. dscale is the caller's 1/(tokens in the global batch)
 * share. Needs targets. */
void zt_model_train_head(zt_model_t *m, const float *root, float *droot, float dscale);
/* Mean loss of the batch's last head pass (0 without targets); waits for it. */
float zt_model_loss(zt_model_t *m);
/* Tokens per head chunk the model uses for N tokens per micro-batch (benchmarks). */
int zt_model_head_rows(zt_model_dims_t d, int N);
/* Tokens per head chunk: at most the automatic size (about 256 MiB of fp32 logits),
 * for tests and tuning; 1 <= rows. */
void zt_model_set_head_rows(zt_model_t *m, int rows);
void zt_model_backward_block(zt_model_t *m, int l, const float *unit, float *dunit);
void zt_model_backward_embed(zt_model_t *m, float *droot);

/* Logits of position t of batch row b, copied to host out (V): valid after
 * forward_head without targets, or with targets on the CPU backend, and only for
 * the tokens of the head's last chunk (the last one always is); fatal otherwise. */
void zt_model_logits_row(zt_model_t *m, int b, int t, float *out);

#endif
