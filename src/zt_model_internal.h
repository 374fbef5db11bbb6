/* zt_model_internal.h — what a family file sees of the model (zt_model.c owns it, with
 * its two helpers for the blocks: zt_linear.c, a linear and its LoRA and tp collectives,
 * and zt_attention.c, the attention and its sequence parallelism).
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
    float **x_in;               /* (L) block inputs (N,C); NULL where no held block reads or writes it */
    /* A pipeline stage's model (zt_model_create_layers): the layers whose activations it
     * holds, (L + 2) flags of 0 the embedding, l + 1 block l, L + 1 the head; NULL: all */
    unsigned char *layers;
    float *x_out;               /* (N,C) output of the last block */
    float *xf;                  /* (N,C) final norm of x_out */
    float *logits;              /* (head_rows,V) one chunk's logits, then dlogits in place */
    float *dlogits;             /* (N,V) or NULL: the dlogits a split head pass holds between its halves
                                 * (zt_model_hold_dlogits) */
    int dlogits_ready;          /* train_head_forward has filled them, train_head_backward not yet read them */
    int head_rows, head_first;  /* chunk rows; first row of the chunk the buffer holds */
    float *losses;              /* (N) */
    float *host_losses;         /* (N) */
    /* The batch's loss-bearing rows (targets in [0, V); an SFT prompt's and padding's are
     * not): their count hn (N: every row, or no compaction: see head_compacts in zt_model.c),
     * their batch rows and targets (hn) on the backend and the host, and their losses
     * (hn) before they go back to their rows. The training head runs on these rows alone. */
    int hn;
    int32_t *hrows, *htgt, *host_hrows, *host_htgt;
    float *hloss;
    const float *tok_scale;     /* (N) the caller's host dlogits factors (zt_model_set_token_scales) or NULL */
    /* zt_model_set_logit_sums: the caller's host (N) or NULL; each row's logit sum (N)
     * and a vector of V ones to make it with a GEMM, allocated at the first call */
    float *host_lsum, *lsum, *ones;
    /* (C) the head weight's column sums, each row's logit sum as one dot product where the
     * preference head (HEAD_PREF in zt_model.c) computes no logits for the row */
    float *wsum;
    /* zt_model_pref_head: its dxf rows are the compacted ones (in xf) rather than every
     * row's (in dres2), unscaled until zt_model_pref_head_backward */
    int pref_compact;
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
    /* QLoRA: the widest 4-bit GEMM's weights dequantized to fp32 (zt_qlora_dequant_floats),
     * shared by the linears (each dequantizes its own just before its GEMM) */
    float *wdq;
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
    /* zt_model_set_shared_rows (the DPO reference's shared prompt): the batch set is a
     * compact one whose attention runs on a full (share_B, share_T) batch (share_B 0: none);
     * share_map (2 Bmax Tmax, made at the first call, outside the activation count as
     * lsum's) holds at 0 each full position's compact token (-1: zeros) and at Bmax Tmax
     * each compact token's full position; share_qkv (N,S) and share_out (N,NH HD): the
     * family's scratches that hold the full batch's qkv and attention output, free during
     * a forward (backward scratches; NULL: the family has none, and no sharing) */
    int share_B, share_T;
    int32_t *share_map;
    float *share_qkv, *share_out;
    /* generation's KV cache (zt_model_kv_cache): per block (kv_nseq, Tmax, 2 NKV HD)
     * rows [k | v] of kv_nseq sequences; what the next forward is: kv_nrows = 1, the
     * sequence in kv_slot[0] after kv_pastv[0] positions; kv_nrows > 1, token i the next
     * of sequence kv_slot[i] at position kv_pastv[i] */
    float **kv;
    int kv_nseq, kv_nrows;
    int *kv_slot, *kv_pastv;
};

/* ---- tensor parallelism (no-ops at tp 1): the linears' (zt_linear.c), the embedding's
 * and the head's collectives; a family's block meets them only through its linears.
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
/* the scratches used with them (N,C) */
float *zt_model_tp_scratch(zt_model_t *m, int k);
/* positions of the residual stream's rows (GPT-2's learned positions): the batch's
 * (zt_model_positions) or, under tp_seq, this rank's rows' */
const int32_t *zt_model_row_positions(const zt_model_t *m);
const float *zt_model_tp_bias(const zt_model_t *m, const float *bias);
/* x0 (N,C) = the token embedding of the batch (vocabulary-parallel: every rank its rows,
 * summed over tp); the backward adds this rank's rows' gradients */
void zt_model_embed_tokens(zt_model_t *m, const float *wte, float *x0);

/* ---- attention (zt_attention.c) -------------------------------------------------------
 * A block's self-attention over the batch's qkv rows (N, (NH + 2 NKV) HD) (q | k | v of
 * this rank's heads: m->d's NH, NKV, HD) into out (N, NH HD): causal within each
 * sequence (m->seg: packed rows), window > 0 a sliding window (attention_forward's). The
 * helper picks local attention (the KV cache's, zt_model_self_attention, included),
 * Ulysses or ring (d.sp_size, d.sp_ring), and keeps what its backward needs per block:
 * the log-sum-exp, and under Ulysses the rows of every position (one block's worth,
 * shared, with recompute). The backward overwrites dqkv (N, (NH + 2 NKV) HD) from dout. */
typedef struct zt_attention {
    float **lse;                /* (L) (B, NH, T) */
    float **qkv_sp, **out_sp;   /* Ulysses: (L) (B, sp T, S / sp), (B, sp T, Q / sp) */
    float *dqkv_sp, *dout_sp;   /* their gradients */
} zt_attention_t;

void zt_attention_init(zt_model_t *m, zt_attention_t *at);
void zt_attention_free(zt_model_t *m, zt_attention_t *at);
void zt_attention_forward(zt_model_t *m, zt_attention_t *at, int l, int window, const float *qkv, float *out);
void zt_attention_backward(zt_model_t *m, zt_attention_t *at, int l, int window, const float *qkv,
                           const float *out, const float *dout, float *dqkv);

/* the batch's positions for rope (NULL: 0..T-1, without sp) */
const int32_t *zt_model_positions(const zt_model_t *m);
void zt_model_embed_tokens_backward(zt_model_t *m, float *dwte, const float *dx0);

/* Whether block l's backward must produce dL/d(its input): not block 0's when the root
 * (embeddings) is frozen and the block has no trainable base weights (LoRA), which
 * saves the first GEMM's input gradient and the first norm's backward. */
int zt_model_needs_dx_in(const zt_model_t *m, int l, const float *dw);

/* Backend memory counted as activations. */
void *zt_model_alloc(zt_model_t *m, size_t bytes);

/* (zt_attention.c's local case) The self-attention of block l over the batch's qkv rows (N, (NH + 2 NKV) HD) into
 * out (N, NH HD) and lse, causal within each row (m->seg: packed rows). With the KV
 * cache on, one sequence: this call's keys and values go to its cache rows [past,
 * past + T) first, and a call after past > 0 positions (one new token) attends to all
 * past + 1 of them; several (zt_model_kv_rows): each token goes to its sequence's
 * cache and attends to that sequence's past + 1 positions alone (lse is then not
 * kept: there is no backward). window > 0: a sliding window (attention_forward's),
 * the cached positions before it unread. */
void zt_model_self_attention(zt_model_t *m, int l, const float *qkv, float *out, float *lse, int NH, int NKV,
                             int HD, int window);

/* ---- LoRA on one GEMM (zt_linear.c; the adapters as parameters: zt_lora.h) ---------
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

/* (zt_linear.c runs it: zt_linear_t's lora) The shared scratch for GEMMs up to c_max
 * inputs (a family calls it once after its zt_linear_init calls; the model frees it). */
void zt_lora_scratch(zt_model_t *m, int c_max);
void zt_lora_scratch_free(zt_model_t *m);

/* ---- one linear layer (zt_linear.c) --------------------------------------------------
 * y (N, out) = x (N, in) W^T + b, W the base weights params[0..nw) of a block unit side by
 * side (q|k|v, gate|up: one GEMM; adjacent in the unit), with their LoRA adapters
 * (dropout included) and the tensor-parallel collectives of its placement:
 *   ZT_LINEAR_COLUMN  x is the residual stream's rows (Nl, C) (gathered under
 *                     tp_sequence_parallel); y this rank's columns, whole rows
 *   ZT_LINEAR_ROW     x this rank's input columns; y (Nl, C) summed over tp (a
 *                     reduce-scatter under tp_seq), the bias added by one rank
 * described once at create time; the weight's layout (nn.Linear's (out, in) or Conv1D's
 * (in, out)) is the table's. */
typedef enum { ZT_LINEAR_COLUMN, ZT_LINEAR_ROW } zt_linear_placement_t;
/* The base weight as the unit stores it: fp32, or bitsandbytes' NF4/FP4 in the space of its
 * floats (zt_qlora.h; frozen), dequantized to fp32 into m->wdq just before each GEMM that
 * reads it. 16-bit types would be further entries. */
typedef enum { ZT_WT_F32 = 0, ZT_WT_NF4, ZT_WT_FP4 } zt_wtype_t;
#define ZT_LINEAR_MAXW 4
typedef struct zt_linear_weight {
    zt_wtype_t type;
    int n;                      /* its tensors, side by side (q|k|v: 3) */
    int param[ZT_LINEAR_MAXW];  /* their table indices (4-bit: each its own region) */
} zt_linear_weight_t;
typedef struct zt_linear {
    zt_linear_placement_t placement;
    int in, out;                /* this rank's widths */
    int transw;                 /* W is (out, in), used transposed; 0: (in, out) */
    size_t w_off, b_off;        /* in the block unit (b_off SIZE_MAX: no bias) */
    zt_linear_weight_t wt;
    zt_lora_gemm_t lora;        /* its adapters (lora.n 0: none) */
} zt_linear_t;

/* bias: the bias parameter's index, or -1 */
void zt_linear_init(zt_model_t *m, zt_linear_t *lin, zt_linear_placement_t placement, const int *params, int nw,
                    int bias);
void zt_linear_free(zt_model_t *m, zt_linear_t *lin);
/* block l, its unit w and adapter unit lora: y = linear(x) */
void zt_linear_forward(zt_model_t *m, zt_linear_t *lin, int l, const float *w, const float *lora, const float *x,
                       float *y);
/* pre = linear(x), y = gelu(pre) (GPT-2's c_fc): one fused backend op unless an adapter
 * must reach pre before the GELU */
void zt_linear_forward_gelu(zt_model_t *m, zt_linear_t *lin, int l, const float *w, const float *lora,
                            const float *x, float *pre, float *y);
/* The backward from dy (column: (N, out); row: the residual stream's rows, gathered
 * here): the base's gradients += into dw (NULL: a frozen base, no weight GEMM), the
 * adapters' into dlora; dx (N, in) overwritten (NULL: not needed). Returns dL/dx as the
 * caller reads it: column-parallel, the rows of the residual stream, summed over tp
 * (dx itself, or under tp_seq the model's (Nl, C) landing); row-parallel, dx. */
float *zt_linear_backward(zt_model_t *m, zt_linear_t *lin, int l, const float *w, float *dw, const float *lora,
                          float *dlora, const float *x, const float *dy, float *dx);
/* x = gelu(pre) (GPT-2's mlp.c_proj): dpre = gelu'(pre) * dL/dx, which may be x itself;
 * one fused backend op unless an adapter's part of dL/dx must join first (in dact (N, in)) */
float *zt_linear_backward_gelu(zt_model_t *m, zt_linear_t *lin, int l, const float *w, float *dw,
                               const float *lora, float *dlora, const float *x, const float *pre, const float *dy,
                               float *dact, float *dpre);

/* whether model m holds block l's activations, and the first block it holds (with
 * recompute the held blocks share that one's buffers) */
static inline int zt_model_holds_block(const zt_model_t *m, int l) { return !m->layers || m->layers[l + 1]; }
static inline int zt_model_first_block(const zt_model_t *m)
{
    int l = 0;
    while (l < m->d.L && !zt_model_holds_block(m, l)) l++;
    return l;
}

#endif
