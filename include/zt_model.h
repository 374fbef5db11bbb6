/* zt_model.h — the model, family-neutral: unit-wise forward/backward of any zt_arch.
 *
 * The parameter table (zt_params.h) comes from a family (zt_arch.h): HF names and
 * shapes grouped into units: the root unit (embeddings, final norm, head; used at both
 * ends of a pass, so it stays materialized for the micro-step) and one unit per block.
 * The model never knows whether a unit buffer was gathered from shards: the shard
 * engine hands it full unit buffers. This file owns what every family shares: the
 * batch, the residual stream between blocks, the chunked head with its fused
 * cross-entropy and the loss; the family runs its embedding, blocks and final norm.
 *
 * A training micro-step is, in order:
 *   forward_embed(root) ; forward_block(l, block unit l) for l = 0..L-1 ;
 *   train_head(root, root grads) ;
 *   backward_block(l, ...) for l = L-1..0 ; backward_embed(root grads) ; loss().
 * The head runs in chunks of tokens whose logits are made, turned into dlogits and
 * consumed by both lm_head gradient GEMMs before the next chunk, so the (N,V) logits
 * never exist at once; that is why its forward and backward are one call.
 * Nothing in it waits for a device: the batch is uploaded and the per-token
 * losses downloaded asynchronously, and loss() is the only wait, so a device
 * runs the whole micro-step as queued.
 * Parameter gradients are accumulated (+=) into the unit gradient buffers. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zt_arch.h"
#include "zt_backend.h"
#include "zt_params.h"

typedef struct zt_model zt_model_t;

/* Model with activation buffers for micro-batches up to (B, T), on backend be. */
zt_model_t *zt_model_create(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                            int recompute);
/* The same for a pipeline stage (zt_step.h): activation buffers only for the layers
 * flagged in `layers` (L + 2 flags: 0 the embedding, l + 1 block l, L + 1 the head; NULL:
 * all, zt_model_create), the residual stream only where a held layer reads or writes
 * it, the head's logits chunk only with the head. Only the held layers may run. */
zt_model_t *zt_model_create_layers(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                                   int recompute, const unsigned char *layers);
void zt_model_free(zt_model_t *m);

/* Tensor parallelism (a table from zt_params_tp_local, d.tp_size > 1): the collectives
 * the model calls between the tp ranks (zt_actcoll.h); needed before the first pass.
 * Each tp rank runs the same batch on its heads, MLP columns and vocabulary rows; the
 * losses, logits rows and residual stream are the same on every tp rank. */
struct zt_actcoll;
void zt_model_set_collectives(zt_model_t *m, const struct zt_actcoll *ac);

/* Ring attention's causal balance: each sequence is cut into 2 sp chunks and sp rank i
 * holds chunk i then chunk 2 sp - 1 - i (h = 0, 1), chunk-major over the batch's rows
 * ((B, T/2) of the first, then of the second). The global chunk of rank i's half h; the
 * data reader, the model's positions and segment ids and the dropout keys all follow it. */
static inline int zt_model_ring_chunk(int sp, int i, int h) { return h ? 2 * sp - 1 - i : i; }

/* lora.dropout: the training batch's per-token keys (N, host memory that stays unchanged
 * until the batch's results are read, as the batch's own), the counters of the dropout
 * masks (zt_backend.h dropout_mask), set after zt_model_set_batch; a batch without them
 * (evaluation, generation) runs without dropout, as PEFT's eval mode. */
void zt_model_set_row_keys(zt_model_t *m, const uint64_t *keys);

/* Activation bytes the model allocated (for the memory report). */
size_t zt_model_activation_bytes(const zt_model_t *m);
/* Without allocating: a dry run of zt_model_create against a counting backend (zt_memplan.h). */
/* Model FLOPs per token of the step the table trains, for MFU: 6 per GEMM weight element
 * (4 where the weight is frozen: no weight gradient), 6 per LoRA adapter element, and
 * attention; recomputation not counted. */
double zt_model_flops_per_token(const zt_param_table_t *t, int T);

/* Host tokens (B,T); targets may be NULL for inference (then no loss). The upload
 * is asynchronous: the arrays must stay unchanged until a result of this batch is
 * read (zt_model_loss, zt_model_logits_row). */
void zt_model_set_batch(zt_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T);
/* Packed rows (SFT neat_packing), for the batch set last: host arrays, either may be
 * NULL. segments (B, sp T: whole sequences, sp = the sequence-parallel size, 1 without;
 * attention runs over every position of a sequence): token t of row b attends only to the
 * tokens j <= t of its sequence with segments[b*sp*T+j] == segments[b*sp*T+t] (NULL: to
 * every j <= t); positions (B,T, this rank's tokens): each one's position, the rope
 * angle's multiple (llama family) or the row of GPT-2's learned positions (NULL: t, or
 * sp_rank T + t), each in [0, maxT) (fatal otherwise). Packed samples then do not see each
 * other and each starts at position 0, so every one of them is computed as if it were
 * a row of its own (to rounding). zt_model_set_batch resets both to NULL, so a caller
 * that never calls this gets plain causal rows; the upload is asynchronous, the arrays
 * must stay unchanged as set_batch's. Why a call of its own: the model takes the
 * packing as given, whoever made it (zt_data_read_row reads it from an SFT file). */
void zt_model_set_segments(zt_model_t *m, const int32_t *segments, const int32_t *positions);
/* Rows that share a prefix, computed once (DPO's reference pass: a pair's chosen and
 * rejected rows share the prompt; zt_pref_ref.h builds the maps). After zt_model_set_batch
 * of a compact batch (each of its tokens one position of a full (Bf, Tf) batch) and
 * zt_model_set_segments(m, NULL, their positions), the next forward runs every per-token
 * operation on the compact tokens and each attention on the full batch: full (Bf Tf) gives
 * each full position's compact token (-1: zeros, a position no query before it sees), own
 * (the compact batch's B T) each compact token's full position. A full position is either
 * a compact token of its own or, inside the shared prefix, the token of the same id and
 * position in the row it shares it with, so each attention query sees the keys and values
 * it sees in the full batch, and every token gets what it gets there, to rounding (a
 * GEMM's rows round by the call's shape; with the full batch's shape, bit for bit: full
 * the identity). Forward only (no backward
 * reads this layout); zt_model_set_batch ends it; the arrays must stay as set_batch's.
 * zt_model_can_share_rows: 0 where the attention cannot (sequence parallelism, tp's
 * sequence-parallel residual, a KV cache, a family without the scratches). */
int zt_model_can_share_rows(const zt_model_t *m);
void zt_model_set_shared_rows(zt_model_t *m, int Bf, int Tf, const int32_t *full, const int32_t *own);
void zt_model_forward_embed(zt_model_t *m, const float *root);
/* lora: block l's adapter unit (NULL without LoRA) */
void zt_model_forward_block(zt_model_t *m, int l, const float *unit, const float *lora);
/* Inference and evaluation: logits, and with targets the per-token losses (read by
 * zt_model_loss). Only the last chunk's logits are kept (zt_model_logits_row). */
void zt_model_forward_head(zt_model_t *m, const float *root);
/* Generation: the logits of n rows from position t of batch row b on (rows of the head's
 * GEMM instead of every row's; n at most zt_model_head_rows_kept), for zt_model_logits_row.
 * Every tp rank of the model's group calls it. */
void zt_model_forward_head_rows(zt_model_t *m, const float *root, int b, int t, int n);
static inline void zt_model_forward_head_row(zt_model_t *m, const float *root, int b, int t)
{
    zt_model_forward_head_rows(m, root, b, t, 1);
}
/* The rows zt_model_forward_head_rows may compute at once */
int zt_model_head_rows_kept(const zt_model_t *m);
/* Generation's KV cache (no sequence parallelism or tp_sequence_parallel): nseq > 0
 * allocates each block's keys and values of nseq sequences of Tmax positions, 0 frees
 * them. With it on, before each forward of a batch (1, T):
 *  - zt_model_kv_seq(m, slot, past): the batch continues sequence `slot` after the past
 *    positions already cached (0: a new sequence, T tokens from position 0; past > 0:
 *    T = 1, the token at position past); positions are then past + t;
 *    zt_model_kv_past(m, past) is sequence 0's;
 *  - zt_model_kv_rows(m, n, slot, past): T = n tokens, token i the next of sequence
 *    slot[i] (distinct) at position past[i] (the caller's positions array says so too),
 *    each attending to its own sequence only: n sequences step at once. */
void zt_model_kv_cache(zt_model_t *m, int nseq);
/* Bytes the KV cache holds now (0 without one). */
size_t zt_model_kv_bytes(const zt_model_t *m);
void zt_model_kv_seq(zt_model_t *m, int slot, int past);
void zt_model_kv_rows(zt_model_t *m, int n, const int *slot, const int *past);
static inline void zt_model_kv_past(zt_model_t *m, int past) { zt_model_kv_seq(m, 0, past); }
/* Training: the head's forward and backward, chunk by chunk: the losses, the head's
 * parameter gradients (tied wte, ln_f) accumulated into droot (NULL: a frozen root unit),
 * and dL/d(last block output) for backward_block. dscale is the caller's 1/(tokens in the global batch)
 * share. Needs targets. */
void zt_model_train_head(zt_model_t *m, const float *root, float *droot, float dscale);
/* The same pass in two halves, for a pipeline's last stage whose schedule runs a phase of
 * forwards before one of backwards (zt_schedule_t's head_split): train_head_forward runs
 * the chunks' logits and fused cross-entropy (the losses, as train_head's) and holds the
 * dlogits, train_head_backward then both lm_head GEMMs from them, chunk by chunk, and the
 * final norm's backward: together the numbers train_head computes, the forward's third of
 * the head's GEMM work in the forward phase. zt_model_hold_dlogits allocates the (N,V)
 * dlogits they need (in the model's activations; a no-op without the head). */
void zt_model_hold_dlogits(zt_model_t *m);
void zt_model_train_head_forward(zt_model_t *m, const float *root, float dscale);
void zt_model_train_head_backward(zt_model_t *m, const float *root, float *droot);
/* Preference losses (zt_pref.h): scales (N, host memory unchanged until train_head has
 * run) gives each token its own dlogits factor in the next zt_model_train_head, in place
 * of dscale: dL/d(its sequence's log-prob sum) negated, as d logp / d logits is minus the
 * cross-entropy's. zt_model_set_batch resets it (NULL: dscale for every token). Tokens
 * of equal factors next to each other run as one kernel call, so a row per sequence costs
 * a call per row and chunk. */
void zt_model_set_token_scales(zt_model_t *m, const float *scales);
/* Preference training with a frozen head (LoRA: the head is the tied or frozen embedding),
 * its head computed once: zt_model_pref_head runs the head's chunks on the loss-bearing
 * rows (under LoRA without vocabulary parallelism; every row otherwise), making the
 * per-token losses (zt_model_token_losses) and, with logit sums set, every row's logit sum;
 * for the policy (reference 0) it also keeps dL/dxf of the cross-entropy at factor 1 for
 * each row, the (rows, V) logits of a chunk gone with the chunk; for the reference
 * (reference 1) the losses alone, through the same kernels on the same rows, so a policy
 * equal to its reference gets bit for bit its log-probabilities. Then
 * zt_model_pref_head_backward (the policy's pass last) multiplies each row's dL/dxf by
 * scales[row] (N, host: as zt_model_set_token_scales's) and runs the final norm's backward,
 * as zt_model_train_head does with token scales, for backward_block: a factor taken out of
 * the cross-entropy's gradient, which is linear in it. Needs targets. */
void zt_model_pref_head(zt_model_t *m, const float *root, int reference);
void zt_model_pref_head_backward(zt_model_t *m, const float *root, const float *scales);
/* Preference metrics (LLaMA-Factory's logits/chosen, logits/rejected): with out (N, host
 * memory), the next zt_model_forward_head also sums each token's logits over the whole
 * vocabulary (every tp rank's columns) into out[token], valid once the losses are
 * (zt_model_token_losses waits for both). Needs targets; zt_model_set_batch resets it.
 * Its buffers (N + V floats) are made at the first call, outside the activation count. */
void zt_model_set_logit_sums(zt_model_t *m, float *out);
/* The per-token losses (N) of the batch's last head pass, -log p(target) (0 where the
 * target is < 0); waits for them. Host memory of the model, valid until its next head
 * pass. A sequence's log-prob sum is minus the sum over its tokens (under sequence
 * parallelism, over every sp rank's part). */
const float *zt_model_token_losses(zt_model_t *m);
/* Mean loss of the batch's last head pass (0 without targets); waits for it. */
float zt_model_loss(zt_model_t *m);
/* The sum of its per-token losses (targets < 0 add 0), for means over the tokens that
 * carry a loss (SFT). */
double zt_model_loss_sum(zt_model_t *m);
/* Tokens per head chunk the model uses for N tokens per micro-batch (benchmarks). */
int zt_model_head_rows(zt_model_dims_t d, int N);
/* Tokens per head chunk: at most the automatic size (about 256 MiB of fp32 logits),
 * for tests and tuning; 1 <= rows. */
void zt_model_set_head_rows(zt_model_t *m, int rows);
/* dunit NULL: a frozen unit (no parameter gradients); dlora: the adapters' gradients */
void zt_model_backward_block(zt_model_t *m, int l, const float *unit, float *dunit, const float *lora,
                             float *dlora);
void zt_model_backward_embed(zt_model_t *m, float *droot);

/* Pipelines (zt_step.h): a stage is a range of layers, and what crosses between stages is
 * the residual stream and its gradient, which the caller moves. The residual stream
 * entering block l ((rows, C), rows = B T of the batch set last, B T / tp under
 * tp_sequence_parallel: this rank's rows; l = L: the last block's
 * output, the final norm's input): a stage that starts at block l has it written there
 * before zt_model_forward_block(l), and a stage that ends before block l reads its output
 * there. */
float *zt_model_residual(zt_model_t *m, int l);
/* dL/d(residual stream) where the backward stands ((rows, C)): after zt_model_train_head,
 * of the last block's output; after zt_model_backward_block(l), of block l's input. A
 * stage whose backward starts at a block has its gradient written there first. */
float *zt_model_residual_grad(zt_model_t *m);
/* The floats of the residual stream (or its gradient) of B rows of T positions on this rank:
 * what one message across a stage boundary carries (B T / tp rows under
 * tp_sequence_parallel, else B T; C each) */
size_t zt_model_residual_floats(const zt_model_t *m, int B, int T);

/* Logits of position t of batch row b, copied to host out (V): valid after
 * forward_head without targets, or with targets on the CPU backend, and only for
 * the tokens of the head's last chunk (the last one always is), or after
 * forward_head_row for that row; fatal otherwise. */
void zt_model_logits_row(zt_model_t *m, int b, int t, float *out);

#endif
