/* zt_train_micro.c — a micro-batch's passes on the run's model and engine: lora.dropout's
 * per-token keys, the trimming of padded rows, the blocks' forward and backward unit by
 * unit (each gathered just before it runs and released after), the head, the forward-only
 * pass of evaluation (pipelined or not), and fp16's loss scale after an overflow. The step
 * runners (the one-stage schedule, the pipeline's actions, DPO's micro-step) are made of
 * these; they know the engine and the model, not the loop around them. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_log.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

/* lora.dropout's counters for micro-step m: one key per local token from (seed, step,
 * the sample's slot in the global batch, its position in the sequence), so any strategy,
 * world size and mesh drops the same elements of the same token */
void zt_tr_dropout_keys(run_t *r, int m, uint64_t *keys)
{
    const int B = r->B, Tm = r->Tm, sp = r->comm->mesh_sp, i = r->comm->sp.rank, ring = r->ltable->dims.sp_ring;
    const int64_t g0 = r->samples_seen + (int64_t)m * r->dp * B + (int64_t)r->drank * B;
    const uint64_t base = zt_splitmix64((uint64_t)r->cfg->train.seed ^ zt_splitmix64((uint64_t)r->step + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tm; t++) {
            size_t at = (size_t)b * Tm + t;
            int pos = i * Tm + t;
            if (ring) { /* chunk-major: (B, Tm/2) of chunk i, then of chunk 2 sp - 1 - i */
                const int c = Tm / 2, h = t / c;
                at = ((size_t)h * B + b) * c + t % c;
                pos = zt_model_ring_chunk(sp, i, h) * c + t % c;
            }
            keys[at] = zt_splitmix64(base ^ zt_splitmix64(((uint64_t)(g0 + b) << 24) ^ (uint64_t)pos));
        }
}

/* The columns of an SFT or DPO micro-batch that hold a token with a loss in some row: a row's
 * positions after its sample's last target are padding, which causal attention keeps from
 * every earlier position and which carries no loss, so a micro-batch whose rows all end
 * early trains on the shorter rows to the same result (fp32 rounding: the weight gradients'
 * sums skip the zero rows). LLaMA-Factory pads each batch to its longest sample the same way;
 * without it a cutoff_len of 2048 over 300-token samples would compute 7x the work. The
 * rows (inp, tgt, keys: (B, Tm)) are compacted in place to (B, T) and T returned, rounded up
 * to 8 positions (GEMM rows) and at most Tm. Rows split over ranks (sp, tp_sequence_parallel)
 * or packed (segments) keep their length: their ranks would have to agree on it. */
/* whether this rank may trim its rows (the rule above; pref_lf_rows trims by it too) */
int zt_tr_rows_trimmable(const run_t *r)
{
    return r->comm->mesh_sp <= 1 && !r->ltable->dims.tp_seq && !r->seg;
}

int zt_tr_trim_padding(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys)
{
    const int B = r->B, Tm = r->Tm;
    if (!zt_tr_rows_trimmable(r)) return Tm;
    int T = 0;
    for (int b = 0; b < B; b++)
        for (int t = Tm - 1; t >= T; t--)
            if (tgt[(size_t)b * Tm + t] >= 0) {
                T = t + 1;
                break;
            }
    return zt_tr_trim_rows(r, inp, tgt, keys, ZT_MIN(Tm, ZT_MAX(8, (T + 7) / 8 * 8)));
}

/* The rows (inp, tgt, keys: (B, Tm)) compacted in place to their first T positions; T */
int zt_tr_trim_rows(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys, int T)
{
    const int B = r->B, Tm = r->Tm;
    if (T == Tm) return Tm;
    for (int b = 1; b < B; b++) {
        memmove(inp + (size_t)b * T, inp + (size_t)b * Tm, (size_t)T * sizeof *inp);
        memmove(tgt + (size_t)b * T, tgt + (size_t)b * Tm, (size_t)T * sizeof *tgt);
        if (keys) memmove(keys + (size_t)b * T, keys + (size_t)b * Tm, (size_t)T * sizeof *keys);
    }
    return T;
}

/* A training micro-step's forward through the blocks: seg, pos: the rows' segments and
 * positions (neat packing), or NULL; keys: lora.dropout's per-token counters, or NULL;
 * adapters 0: LoRA's base alone (the DPO reference); T: the rows' length (at most r->Tm). The root unit (embeddings, tied
 * head, ln_f) stays materialized until train_backward, as FSDP does for its root
 * module: it is used at both ends. */
/* Blocks [l0, l1) of model m forward, each unit (and its LoRA adapters' with adapters)
 * gathered just before it runs and released after */
void zt_tr_forward_range(run_t *r, zt_shard_t *s, zt_model_t *m, int l0, int l1, int adapters)
{
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = adapters ? t->first_adapter_unit : -1;
    if (l0 < l1) zt_shard_prefetch(s, b0 + l0);
    for (int l = l0; l < l1; l++) {
        zt_watchdog_mark("forward", b0 + l, r->step + 1);
        const float *w = zt_shard_params(s, b0 + l);
        /* LoRA: the block's adapter unit beside its frozen base */
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l + 1 < l1) zt_shard_prefetch(s, b0 + l + 1);
        zt_model_forward_block(m, l, w, lw);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) zt_shard_release(s, a0 + l);
    }
}

/* Blocks [l0, l1) of model m backward, last first, from the gradient in its residual
 * stream; each unit's gradients reported ready as they are complete */
void zt_tr_backward_range(run_t *r, zt_model_t *m, int l0, int l1)
{
    zt_shard_t *s = r->shard;
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = t->first_adapter_unit;
    for (int l = l1 - 1; l >= l0; l--) {
        zt_watchdog_mark("backward", b0 + l, r->step + 1);
        const float *w = zt_shard_params(s, b0 + l);
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l > l0) zt_shard_prefetch(s, b0 + l - 1);
        zt_model_backward_block(m, l, w, zt_shard_grads(s, b0 + l), lw, a0 >= 0 ? zt_shard_grads(s, a0 + l) : NULL);
        zt_shard_grads_ready(s, b0 + l);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) {
            zt_shard_grads_ready(s, a0 + l);
            zt_shard_release(s, a0 + l);
        }
    }
}

/* The batch set in the model through the embedding and every block; the root unit stays
 * gathered */
const float *zt_tr_forward_set_batch(run_t *r, zt_shard_t *s, int adapters)
{
    const zt_param_table_t *t = r->table;
    zt_watchdog_mark("forward", 0, r->step + 1);
    const float *root = zt_shard_params(s, t->root_unit);
    zt_shard_prefetch(s, t->first_block_unit); /* the first block's gather overlaps the embedding */
    zt_model_forward_embed(r->model, root);
    zt_tr_forward_range(r, s, r->model, 0, t->dims.L, adapters);
    return root;
}

const float *zt_tr_train_forward(run_t *r, zt_shard_t *s, const int32_t *inp, const int32_t *tgt,
                                  const int32_t *seg, const int32_t *pos, const uint64_t *keys, int adapters, int T)
{
    zt_model_t *m = r->model;
    zt_model_set_batch(m, inp, tgt, r->B, T);
    if (seg) zt_model_set_segments(m, seg, pos);
    if (keys) zt_model_set_row_keys(m, keys);
    return zt_tr_forward_set_batch(r, s, adapters);
}

/* After the head's backward: the blocks' backward, the embedding's (droot: the root unit's
 * gradients, NULL when frozen), and the root unit's gradients ready and released */
void zt_tr_backward_from_head(run_t *r, float *droot)
{
    zt_shard_t *s = r->shard;
    const int root_unit = r->table->root_unit;
    zt_tr_backward_range(r, r->model, 0, r->table->dims.L);
    zt_watchdog_mark("backward", root_unit, r->step + 1);
    zt_model_backward_embed(r->model, droot);
    zt_shard_grads_ready(s, root_unit);
    zt_shard_release(s, root_unit);
}

/* The head's forward and backward (dscale, or the model's token scales) and the blocks'
 * backward after train_forward; releases the root unit; the loss */
float zt_tr_train_backward(run_t *r, const float *root, float dscale)
{
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_param_table_t *t = r->table;
    const int root_unit = t->root_unit;
    zt_watchdog_mark("forward head", root_unit, r->step + 1);
    float *droot = zt_shard_grads(s, root_unit);
    zt_model_train_head(m, root, droot, dscale);
    zt_tr_backward_from_head(r, droot);
    return zt_model_loss(m);
}

/* The row of this rank's token i (B rows of T tokens; ring attention: its two chunks of
 * each row chunk-major, (2, B, T/2)) */
int zt_tr_token_row(const run_t *r, size_t i, int T)
{
    if (r->ltable->dims.sp_ring) return (int)((i / (size_t)(T / 2)) % (size_t)r->B);
    return (int)(i / (size_t)T);
}

/* The position in its row of this rank's token i (B rows of T; sp: this rank's chunks of
 * each row, token_row's layout) */
int zt_tr_token_pos(const run_t *r, size_t i, int T)
{
    const int sp = r->comm->mesh_sp, k = r->comm->sp.rank;
    if (sp <= 1) return (int)(i % (size_t)T);
    if (!r->ltable->dims.sp_ring) return k * T + (int)(i % (size_t)T);
    const size_t c = (size_t)T / 2;
    return zt_model_ring_chunk(sp, k, (int)(i / (c * (size_t)r->B))) * (int)c + (int)(i % c);
}

/* Inside begin/end_inference: the batch through the embedding and the blocks; the root
 * unit stays gathered for the head (the caller releases it) */
const float *zt_tr_forward_blocks(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg,
                                   const int32_t *pos, int B, int T)
{
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    zt_model_set_batch(m, inp, tgt, B, T);
    if (seg || pos) zt_model_set_segments(m, seg, pos);
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = t->first_adapter_unit;
    const float *root = zt_shard_params(s, t->root_unit);
    zt_model_forward_embed(m, root);
    for (int l = 0; l < t->dims.L; l++) {
        const float *w = zt_shard_params(s, b0 + l);
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l + 1 < t->dims.L) zt_shard_prefetch(s, b0 + l + 1);
        zt_model_forward_block(m, l, w, lw);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) zt_shard_release(s, a0 + l);
    }
    return root;
}

/* Forward only, inside begin/end_inference; loss if targets given. */
static float forward_only(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, const int32_t *pos,
                          int B, int T)
{
    const float *root = zt_tr_forward_blocks(r, inp, tgt, seg, pos, B, T);
    zt_model_forward_head(r->model, root);
    zt_shard_release(r->shard, r->table->root_unit);
    return zt_model_loss(r->model);
}

/* The residual stream of a micro-batch of T positions on this rank, what crosses a stage boundary:
 * (B, T, C), its rows split over tp under tp_sequence_parallel (zt_model_residual) */
size_t zt_tr_residual_floats(const run_t *r, int T) { return zt_model_residual_floats(r->model, r->B, T); }

/* pp > 1, inside begin/end_inference: the batch in r->inp / r->tgt forward through this
 * rank's stages in order, a stage's input received from the previous stage's rank and its
 * output sent on (tagged by the stage it leaves; no step's message is in flight then).
 * The loss (SFT: its sum over tokens) where this rank runs the head, 0 elsewhere. */
static double eval_stages(run_t *r, int sft)
{
    zt_comm_t *c = r->comm;
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_parallel_plan_t *p = &r->plan;
    const int L = r->table->dims.L, root = r->table->root_unit, head = zt_params_head_unit(r->table);
    const size_t n = zt_tr_residual_floats(r, r->Tm);
    float **out = zt_calloc((size_t)p->pp_v, sizeof *out);
    zt_request_t *req = zt_calloc((size_t)p->pp_v, sizeof *req);
    int nsend = 0;
    double loss = 0.0;
    zt_model_set_batch(m, r->inp, r->tgt, r->B, r->Tm);
    if (r->seg || r->pos) zt_model_set_segments(m, r->seg, r->pos);
    for (int st = c->pp.rank; st < p->stages; st += p->pp) {
        const int first = p->stage_first[st], end = p->stage_first[st + 1];
        if (first > 0) {
            zt_request_t rq = {.req = MPI_REQUEST_NULL};
            zt_irecv(c, &c->pp, zt_model_residual(m, first - 1), (st - 1) % p->pp, st - 1, n, ZT_F32, &rq);
            zt_wait(c, &rq);
        } else {
            zt_model_forward_embed(m, zt_shard_params(s, root));
            zt_shard_release(s, root);
        }
        zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 1);
        if (end == L + 2) {
            zt_model_forward_head(m, zt_shard_params(s, head));
            zt_shard_release(s, head);
            loss += sft ? zt_model_loss_sum(m) : zt_model_loss(m);
            continue;
        }
        /* from a copy: a later stage of this rank may write the model's buffer meanwhile */
        out[nsend] = r->be->alloc(n * sizeof(float));
        r->be->copy(out[nsend], zt_model_residual(m, end - 1), n * sizeof(float));
        req[nsend].req = MPI_REQUEST_NULL;
        zt_isend(c, &c->pp, out[nsend], (st + 1) % p->pp, st, n, ZT_F32, &req[nsend]);
        nsend++;
    }
    for (int k = 0; k < nsend; k++) {
        zt_wait(c, &req[k]);
        r->be->free(out[k]);
    }
    free(out);
    free(req);
    return loss;
}

float zt_tr_evaluate(run_t *r, int *failed)
{
    char err[ZT_ERRLEN] = "";
    int rc = 0;
    double sum = 0.0, count = 0.0;
    const int nb = r->cfg->train.eval_batches, sft = zt_data_is_sft(r->val);
    zt_shard_begin_inference(r->shard);
    for (int j = 0; j < nb; j++) {
        zt_watchdog_mark("evaluation", -1, r->step);
        int64_t g0 = (int64_t)j * r->dp * r->B + (int64_t)r->drank * r->B;
        if (rc == 0) rc = zt_tr_read_rows(r, r->val, g0, 0, r->inp, r->tgt, r->seg, r->pos, err, sizeof err);
        /* every rank runs the pass (zero3 gathers are collective) even after an error */
        if (r->plan.pp > 1) {
            sum += eval_stages(r, sft);
        } else {
            const float l = forward_only(r, r->inp, r->tgt, r->seg, r->pos, r->B, r->Tm);
            /* SFT: a mean over the tokens that carry a loss, as in training */
            sum += sft ? zt_model_loss_sum(r->model) : l;
        }
        count += (double)zt_tr_loss_tokens(r->tgt, (size_t)r->B * r->Tm);
    }
    zt_shard_end_inference(r->shard);
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        *failed = 1;
        return NAN;
    }
    /* over the data group: each sequence once (tp ranks hold the same losses); under a
     * pipeline the loss is the last stage's (the others add 0) */
    sum = zt_sum_double(r->comm, &r->comm->data, sum);
    if (r->plan.pp > 1) sum = zt_sum_double(r->comm, &r->comm->pp, sum);
    if (sft) {
        count = zt_sum_double(r->comm, &r->comm->data, count);
        return (float)(count > 0 ? sum / count : 0.0);
    }
    return (float)(sum / ((double)nb * r->comm->data.size)); /* each a mean of B Tm tokens */
}

/* fp16 dynamic loss scaling after an overflow (a collective verdict): halve the
 * scale on every rank, or stop when that would take it below the minimum. */
int zt_tr_loss_scale_overflow(run_t *r)
{
    const double S = r->loss_scale, next = S / 2;
    if (next < r->cfg->train.min_loss_scale) {
        zt_log_error("step %ld: gradient overflow at loss scale %.9g, and halving it would go below "
                     "train.min_loss_scale (%.9g); stopping", r->step + 1, S, r->cfg->train.min_loss_scale);
        return -1;
    }
    zt_log("step %ld: gradient overflow, loss scale %.9g -> %.9g", r->step + 1, S, next);
    r->loss_scale = next;
    return 0;
}
