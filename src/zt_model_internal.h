/* zt_model_internal.h — what a family file sees of the model (zt_model.c owns it).
 *
 * zt_model.c keeps what every family shares: the batch (backend copies of the
 * inputs and targets, and of a packed batch's segments and positions), each block's input x_in (the residual stream, kept for
 * backward even with recompute), the last block's output, the final norm's output,
 * the head's logits chunk and the per-token losses, and two residual-stream
 * gradient buffers. A family allocates the rest with zt_model_alloc (counted in
 * the activation bytes) and keeps it behind `fam`. */
#ifndef ZT_MODEL_INTERNAL_H
#define ZT_MODEL_INTERNAL_H

#include "zt_actcoll.h"
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
    const float *tok_scale;     /* (N) the caller's host dlogits factors (zt_model_set_token_scales) or NULL */
    /* zt_model_set_logit_sums: the caller's host (N) or NULL; each row's logit sum (N)
     * and a vector of V ones to make it with a GEMM, allocated at the first call */
    float *host_lsum, *lsum, *ones;
    /* (N,C): dres carries dL/d(residual stream) between blocks; dres2 is free scratch
     * for a family's block_backward (the head uses it before the blocks run) */
    float *dres, *dres2;
    int32_t *inputs, *targets;  /* (N) backend memory */
    /* Packed rows (zt_model_set_segments): the batch's segment ids and positions in
     * backend memory ((N) each, allocated with the model), and what the family hands
     * the kernels: those buffers, or NULL (one sequence per row, positions t) */
    int32_t *seg_buf, *pos_buf;
    const int32_t *seg, *pos;
    size_t act_bytes;
    void *fam;                  /* the family's state */
    /* LoRA scratch, shared by the GEMMs (zt_lora_scratch): dxa (N, ZT_LORA_MAX r); under
     * lora.dropout one target's dropped input and its input-gradient part (N, C), and
     * the batch's row keys (N) with whether this batch has them */
    float *lora_dxa, *lora_xd, *lora_dx;
    uint64_t *row_keys;
    int keys_set;
    /* tensor parallelism (d.tp_size > 1): the activation collectives, the batch's ids
     * as this rank's vocabulary rows (-1: another rank's), the vocabulary-parallel
     * cross-entropy's row statistics (head_rows) and (head_rows, 2), and one logits
     * row gathered over tp (V tp) */
    zt_actcoll_t ac;
    int32_t *inputs_tp, *host_inputs_tp;
    float *ce_max, *ce_sz, *logits_row_tp;
    /* sequence parallelism (d.sp_size > 1): the batch's global positions (N), the
     * all-to-all's send and receive buffers (sp_floats each) */
    int32_t *sp_positions, *host_sp_positions;
    float *sp_send, *sp_recv;
    size_t sp_floats;
    /* ring attention: K|V blocks in flight (2), their gradients (in, and 2 out), one
     * block pair's output (N/2, Q) and log-sum-exp (B, NH, T/2) */
    float *ring_kv[2], *ring_dkv_in, *ring_dkv[2], *ring_out, *ring_lse;
    int32_t *ring_seg, *host_ring_seg; /* packed rows' ids per chunk (2 sp, B, T/2) */
    size_t ring_kw, ring_q, ring_nh;
    int ring_serial, ring_have_in;
    /* tp_seq: two (N,C) scratches for gathered rows and partial sums, the (Nl,C) landing
     * of a reduce-scatter, and the residual-stream rows' positions (Nl) */
    float *tp_full, *tp_full2, *tp_rows;
    int32_t *tp_pos, *host_tp_pos;
    /* generation's KV cache (zt_model_kv_cache): per block (kv_nseq, Tmax, 2 NKV HD)
     * rows [k | v] of kv_nseq sequences; what the next forward is: kv_nrows = 1, the
     * sequence in kv_slot[0] after kv_pastv[0] positions; kv_nrows > 1, token i the next
     * of sequence kv_slot[i] at position kv_pastv[i] */
    float **kv;
    int kv_nseq, kv_nrows;
    int *kv_slot, *kv_pastv;
};

/* ---- tensor parallelism, for the families (no-ops at tp 1) ---------------------------
 * A column-parallel GEMM needs nothing; a row-parallel one leaves partial sums that
 * zt_model_tp_reduce completes (its bias added by one rank only: zt_model_tp_bias); in
 * the backward, the same holds for dL/dx of a column-parallel GEMM. */
/* Megatron sequence parallelism (d.tp_seq): the residual stream has zt_model_rows rows
 * (N / tp) on each tp rank. Around a GEMM pair: full = zt_model_tp_gather(m, x, scratch)
 * gives the (N,C) input of a column-parallel GEMM (x itself without tp_seq); a
 * row-parallel GEMM writes its partial sums into zt_model_tp_partial(m, out) and
 * zt_model_tp_reduce(m, y, out) makes out (rows, C) of them: a reduce-scatter, or the
 * all-reduce in place without tp_seq. The backward mirrors it: the gradient of a
 * gather is a reduce, of a reduce a gather. */
int zt_model_rows(const zt_model_t *m);
const float *zt_model_tp_gather(zt_model_t *m, const float *x, float *scratch);
float *zt_model_tp_partial(zt_model_t *m, float *out);
void zt_model_tp_reduce(zt_model_t *m, float *y, float *out);
/* the scratches the families use with them (N,C) */
float *zt_model_tp_scratch(zt_model_t *m, int k);
/* positions of the residual stream's rows (GPT-2's learned positions): the batch's
 * (zt_model_positions) or, under tp_seq, this rank's rows' */
const int32_t *zt_model_row_positions(const zt_model_t *m);
const float *zt_model_tp_bias(const zt_model_t *m, const float *bias);
/* x0 (N,C) = the token embedding of the batch (vocabulary-parallel: every rank its rows,
 * summed over tp); the backward adds this rank's rows' gradients */
void zt_model_embed_tokens(zt_model_t *m, const float *wte, float *x0);

/* ---- sequence parallelism (Ulysses), for the families ---------------------------------
 * Under sp the model runs T positions of each sequence; attention needs all sp T of
 * them: x (B,T,W), whose rows hold nblk blocks of heads side by side (q | k | v: heads[k]
 * heads of hd each), goes to y (B, sp T, W') with every position and this rank's share
 * of each block's heads (one all-to-all): heads / sp of them, or, where a block has
 * fewer heads than ranks (KV heads), the one head this rank's query heads read
 * (replicated). gather is the inverse; a replicated head's parts are summed (it carries
 * gradients there). The first position of this rank's T is sp_rank T. */
void zt_model_sp_scratch(zt_model_t *m, size_t floats);
void zt_model_sp_scatter_heads(zt_model_t *m, const float *x, int nblk, const int *heads, int hd, float *y);
void zt_model_sp_gather_heads(zt_model_t *m, const float *y, int nblk, const int *heads, int hd, float *x);
/* Ring attention (d.sp_ring): the causal attention of the whole sequence from this
 * rank's qkv (N,S) (q | k | v as attention_forward's, NH, NKV heads of HD), its two
 * chunks' rows chunk-major; K|V blocks go round the sp ring, each block pair's result is
 * merged through the log-sum-exp, the next block's transfer overlapping the current
 * block's compute. out (N, NH HD); lse (2, B, NH, T/2) per chunk. The backward adds dq
 * into dqkv's q columns and the K|V gradients, gone round the ring with their blocks,
 * into its k, v columns (dqkv zeroed by the caller). window > 0: a sliding window, the
 * block pairs wholly outside it skipped. */
void zt_model_ring_scratch(zt_model_t *m, int NH, int NKV, int HD);
void zt_model_ring_forward(zt_model_t *m, const float *qkv, int NH, int NKV, int HD, int window, float *out,
                           float *lse);
void zt_model_ring_backward(zt_model_t *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int NH, int NKV, int HD, int window);
/* the batch's positions for rope (NULL: 0..T-1, without sp) */
const int32_t *zt_model_positions(const zt_model_t *m);
void zt_model_embed_tokens_backward(zt_model_t *m, float *dwte, const float *dx0);

/* Whether block l's backward must produce dL/d(its input): not block 0's when the root
 * (embeddings) is frozen and the block has no trainable base weights (LoRA), which
 * saves the first GEMM's input gradient and the first norm's backward. */
int zt_model_needs_dx_in(const zt_model_t *m, int l, const float *dw);

/* Backend memory counted as activations. */
void *zt_model_alloc(zt_model_t *m, size_t bytes);

/* The self-attention of block l over the batch's qkv rows (N, (NH + 2 NKV) HD) into
 * out (N, NH HD) and lse, causal within each row (m->seg: packed rows). With the KV
 * cache on, one sequence: this call's keys and values go to its cache rows [past,
 * past + T) first, and a call after past > 0 positions (one new token) attends to all
 * past + 1 of them; several (zt_model_kv_rows): each token goes to its sequence's
 * cache and attends to that sequence's past + 1 positions alone (lse is then not
 * kept: there is no backward). window > 0: a sliding window (attention_forward's),
 * the cached positions before it unread. */
void zt_model_self_attention(zt_model_t *m, int l, const float *qkv, float *out, float *lse, int NH, int NKV,
                             int HD, int window);

/* ---- LoRA on one GEMM (zt_lora.h) ---------------------------------------------------
 * A GEMM y (N,OC) = x (N,C) W^T whose output holds up to ZT_LORA_MAX targets side by
 * side (Llama's q|k|v, gate|up) gets y_i += s * (x A_i^T) B_i^T on each target's columns
 * y_i: the targets' A matrices are adjacent rows of the adapter unit, so x A^T is one
 * (n r, C) product, and each B product reads and accumulates its columns in place (a
 * GEMM with leading dimensions, beta 1). The backward adds into dx and accumulates the
 * adapters' gradients the same way, with no scratch the size of y. s * x A^T (N, n r) is
 * kept per block for the backward. */
#define ZT_LORA_MAX 4
typedef struct zt_lora_gemm {
    int n;                      /* targets (0: no LoRA on this GEMM) */
    int C, OC;
    size_t a_off;               /* first A in the adapter unit */
    uint64_t mask_id;           /* dropout: the first A's offset in the whole (tp 1) unit */
    int c0;                     /* dropout: x's first column in the whole input (a tp
                                 * rank's slice of a row-parallel GEMM's input) */
    size_t b_off[ZT_LORA_MAX];  /* each target's B */
    int out_off[ZT_LORA_MAX], out_n[ZT_LORA_MAX]; /* its columns of y */
    float **xa;                 /* (L) s * x A^T (N, n r) */
} zt_lora_gemm_t;

/* Describes the GEMM over base weights params[0..nw) (their columns of y side by side,
 * in this order) of input width C; allocates its per-block buffers. */
void zt_lora_gemm_init(zt_model_t *m, zt_lora_gemm_t *g, const int *params, int nw, int C);
void zt_lora_gemm_free(zt_model_t *m, zt_lora_gemm_t *g);
/* y (N,OC) += s x A_i^T B_i^T in each target i's columns, block l (no-op without adapters,
 * or with lora NULL: the base alone, as PEFT's disable_adapter) */
void zt_lora_gemm_forward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, const float *x, float *y);
/* dx (N,C) += the adapters' part of dL/dx; their gradients += into dlora (may be NULL:
 * dx only; dx may be NULL: the gradients only) */
void zt_lora_gemm_backward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, float *dlora,
                           const float *x, const float *dy, float *dx);
/* The shared scratch for GEMMs up to c_max inputs (a family calls it once after its
 * zt_lora_gemm_init calls; the model frees it); its floats, for the estimates. */
void zt_lora_scratch(zt_model_t *m, int c_max);
void zt_lora_scratch_free(zt_model_t *m);
size_t zt_lora_scratch_floats(size_t N, int r, int c_max, int dropout);



#endif
