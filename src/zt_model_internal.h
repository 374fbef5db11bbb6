/* zt_model_internal.h — what a family file sees of the model (zt_model.c owns it).
 *
 * zt_model.c keeps what every family shares: the batch (backend copies of the
 * inputs and targets), each block's input x_in (the residual stream, kept for
 * backward even with recompute), the last block's output, the final norm's output,
 * the head's logits chunk and the per-token losses, and two residual-stream
 * gradient buffers. A family allocates the rest with zt_model_alloc (counted in
 * the activation bytes) and keeps it behind `fam`. */
#ifndef ZT_MODEL_INTERNAL_H
#define ZT_MODEL_INTERNAL_H

#include "zt_model.h"

struct zt_model {
    const zt_param_table_t *table;
    const zt_arch_t *arch;
    const zt_backend_t *be;
    zt_model_dims_t d;
    int Bmax, Tmax, B, T, recompute, has_targets;
    float **x_in;               /* (L) block inputs (N,C) */
    float *x_out;               /* (N,C) output of the last block */
    float *xf;                  /* (N,C) final norm of x_out */
    float *logits;              /* (head_rows,V) one chunk's logits, then dlogits in place */
    int head_rows, head_first;  /* chunk rows; first row of the chunk the buffer holds */
    float *losses;              /* (N) */
    float *host_losses;         /* (N) */
    /* (N,C): dres carries dL/d(residual stream) between blocks; dres2 is free scratch
     * for a family's block_backward (the head uses it before the blocks run) */
    float *dres, *dres2;
    int32_t *inputs, *targets;  /* (N) backend memory */
    size_t act_bytes;
    void *fam;                  /* the family's state */
};

/* Backend memory counted as activations. */
void *zt_model_alloc(zt_model_t *m, size_t bytes);

#endif
