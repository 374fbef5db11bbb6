/* zt_train_step.c — one optimizer step's micro-batches as the train loop runs them: the
 * one-stage step (run_schedule) and a pipeline rank's action list (run_pipeline, with DPO's
 * reference pass through the stages), and the pipeline's end-of-run figures (the bubble,
 * each pipeline rank's memory beside its estimate). The list itself is zt_step.c's; the run's
 * state is zt_train_internal.h's. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "zt_common.h"
#include "zt_log.h"
#include "zt_metrics.h"
#include "zt_pref.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

/* This rank's actions of one step (r->steps, zt_step.h) up to its R, which the caller
 * runs (gradient reduction, clipping, optimizer): the micro-batches' forward and backward
 * passes. ds: the gradient scale of a token; pf: a DPO micro-batch's share. A DPO
 * micro-step runs whole in its forward action (the reference's pass, the policy's forward
 * and head, then its backward), its backward action does nothing. Returns the loss summed
 * over this rank's micro-batches (SFT: over its tokens); computed += the positions run. */
double zt_tr_run_schedule(run_t *r, int sft, float ds, float pf, double *pref_window, long *pref_micros,
                           long *computed)
{
    const size_t BT = (size_t)r->B * r->Tm, BTs = (size_t)r->B * r->T;
    const int dpo = r->cfg->train.stage == ZT_STAGE_DPO, me = 0; /* this rank's place on the pipeline axis */
    const float *root = NULL;
    double loss_sum = 0.0;
    for (int i = 0; i < r->steps.n[me]; i++) {
        const zt_action_t *a = &r->steps.a[me][i];
        const int m = a->micro;
        int32_t *inp = r->inp + m * BT, *tgt = r->tgt + m * BT;
        switch (a->kind) {
        case ZT_ACT_FWD: {
            zt_shard_begin_micro(r->shard, m, r->A);
            uint64_t *keys = r->keys ? r->keys + m * BT : NULL;
            if (keys) zt_tr_dropout_keys(r, m, keys);
            if (dpo) {
                int T;
                loss_sum += zt_tr_pref_micro(r, inp, tgt, pf, pref_window, &T);
                (*pref_micros)++;
                *computed += (long)r->B * T;
                break;
            }
            r->micro_T[m] = sft ? zt_tr_trim_padding(r, inp, tgt, keys) : r->Tm;
            root = zt_tr_train_forward(r, r->shard, inp, tgt, r->seg ? r->seg + m * BTs : NULL,
                                 r->pos ? r->pos + m * BT : NULL, keys, 1, r->micro_T[m]);
            break;
        }
        case ZT_ACT_BWD: {
            if (dpo) break;
            const float l = zt_tr_train_backward(r, root, ds);
            loss_sum += sft ? zt_model_loss_sum(r->model) : l;
            *computed += (long)r->B * r->micro_T[m];
            break;
        }
        case ZT_ACT_REDUCE: return loss_sum;
        default: zt_fatal("step: action %d needs a pipeline (parallel.pipeline_parallel_size > 1)", (int)a->kind);
        }
    }
    return loss_sum;
}

/* pp > 1, train.stage = dpo with a reference: the step's micro-batches forward through the
 * reference on this rank's stages (the frozen copy, or LoRA's base with the adapters off),
 * before the policy's schedule and as pref_micro's reference pass: forward only, in slot 0's
 * model, free until the policy's first forward, so no micro-batch's activations are held.
 * Stage by stage, every micro-batch each: the stages run at once on different micro-batches.
 * The residual stream crosses a boundary tagged past the policy's messages (zt_schedule_tag);
 * the last stage's rank keeps each micro-batch's row sums in ref (A B). */
static void pref_ref_stages(run_t *r, double *ref)
{
    zt_comm_t *c = r->comm;
    const zt_parallel_plan_t *p = &r->plan;
    const zt_param_table_t *t = r->table;
    zt_shard_t *s = r->ref_shard ? r->ref_shard : r->shard;
    zt_model_t *m = r->models[0];
    const int L = t->dims.L, root = t->root_unit, head = zt_params_head_unit(t), A = r->A;
    const int frozen_head = t->unit_frozen && t->unit_frozen[head], tag0 = 2 * A * p->stages;
    const size_t BT = (size_t)r->B * r->Tm;
    float **out = zt_calloc((size_t)A * p->pp_v, sizeof *out);
    zt_request_t *req = zt_calloc((size_t)A * p->pp_v, sizeof *req);
    int nsend = 0;
    double now[2] = {zt_now(), zt_thread_seconds()};
    if (r->ref_shard) zt_shard_begin_inference(s);
    for (int st = c->pp.rank; st < p->stages; st += p->pp) {
        const int first = p->stage_first[st], end = p->stage_first[st + 1];
        for (int mi = 0; mi < A; mi++) {
            const int32_t *tgt = r->tgt + mi * BT;
            const size_t n = zt_tr_residual_floats(r, r->micro_T[mi]);
            zt_model_set_batch(m, r->inp + mi * BT, tgt, r->B, r->micro_T[mi]);
            if (r->micro_seg[mi]) zt_model_set_segments(m, r->micro_seg[mi], NULL); /* pref_lf_rows */
            if (first > 0) {
                zt_watchdog_mark("pipeline reference receive", -1, r->step + 1);
                zt_request_t rq = {.req = MPI_REQUEST_NULL};
                zt_irecv(c, &c->pp, zt_model_residual(m, first - 1), (st - 1) % p->pp, tag0 + mi * p->stages + st - 1,
                         n, ZT_F32, &rq);
                const double tw = zt_now();
                zt_wait(c, &rq);
                r->pp_recv_wait += zt_now() - tw;
            } else {
                zt_model_forward_embed(m, zt_shard_params(s, root));
                zt_shard_release(s, root);
            }
            zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 0);
            zt_tr_pref_lap(r, PT_REF_BLOCKS, now);
            if (end == L + 2) {
                const float *hw = zt_shard_params(s, head);
                if (frozen_head) zt_model_pref_head(m, hw, 1);
                else zt_model_forward_head(m, hw);
                zt_shard_release(s, head);
                zt_tr_row_sums(r, zt_model_token_losses(m), 1, tgt, r->micro_T[mi], ref + (size_t)mi * r->B, NULL);
                zt_tr_pref_lap(r, PT_REF_HEAD, now);
                continue;
            }
            /* from a copy: the next micro-batch overwrites the model's buffer */
            out[nsend] = r->be->alloc(n * sizeof(float));
            r->be->copy(out[nsend], zt_model_residual(m, end - 1), n * sizeof(float));
            req[nsend].req = MPI_REQUEST_NULL;
            zt_isend(c, &c->pp, out[nsend], (st + 1) % p->pp, tag0 + mi * p->stages + st, n, ZT_F32, &req[nsend]);
            nsend++;
        }
    }
    if (r->ref_shard) zt_shard_end_inference(s);
    for (int k = 0; k < nsend; k++) {
        zt_wait(c, &req[k]);
        r->be->free(out[k]);
    }
    free(out);
    free(req);
}

/* pp > 1: this pipeline rank's actions of one step up to its R, on the layers of each
 * action's stage (plan.stage_first): the embedding (layer 0) and the head (L + 1) use the
 * root unit, the blocks their units; the residual stream and its gradient cross the stage
 * boundaries through the pp group. Receives are posted at the start and waited for where
 * the schedule puts them; a send goes from a copy and completes at R, so compute runs
 * while both travel. ds: a token's
 * gradient scale. DPO (pf, pref_window, pref_micros: run_schedule's): the reference's pass
 * through the stages first (pref_ref_stages), then the policy's schedule, the last stage's
 * backward running the head, the loss and its factors (pref_policy_head). Returns the loss
 * summed over the micro-batches whose head this rank runs (SFT: over their tokens), 0
 * elsewhere; computed += the positions it ran there. */
double zt_tr_run_pipeline(run_t *r, int sft, float ds, float pf, double *pref_window, long *pref_micros,
                           long *computed)
{
    zt_comm_t *c = r->comm;
    zt_shard_t *s = r->shard;
    const zt_param_table_t *t = r->table;
    const int L = t->dims.L, root = t->root_unit, head = zt_params_head_unit(t), me = c->pp.rank;
    const size_t BT = (size_t)r->B * r->Tm, BTs = (size_t)r->B * r->T;
    /* every stage runs a micro-batch at the same length: the rows are the same on each (DPO:
     * padded as LLaMA-Factory pads them, pref_lf_rows) */
    const int dpo = r->cfg->train.stage == ZT_STAGE_DPO;
    for (int m = 0; m < r->A; m++) {
        uint64_t *keys = r->keys ? r->keys + m * BT : NULL;
        if (keys) zt_tr_dropout_keys(r, m, keys);
        if (dpo) r->micro_T[m] = zt_tr_pref_lf_rows(r, r->inp + m * BT, r->tgt + m * BT, m, &r->micro_seg[m], &r->micro_Tp[m]);
        else r->micro_T[m] = sft ? zt_tr_trim_padding(r, r->inp + m * BT, r->tgt + m * BT, keys) : r->Tm;
    }
    const int uses_ref = dpo && zt_pref_uses_ref(r->cfg->pref.fn.loss);
    double *ref = uses_ref ? zt_calloc((size_t)r->A * r->B, sizeof *ref) : NULL;
    if (ref) { /* its time is the schedule's too (pp_summary) */
        const double t_ref = zt_now();
        pref_ref_stages(r, ref);
        r->pp_span += zt_now() - t_ref;
    }
    /* every receive of the step is posted now, into its own buffer, so a message travels
     * while this rank computes whatever comes before it in the list; at its action it is
     * waited for and copied where the model reads it */
    int nmsg = 0;
    size_t held = 0; /* the bytes of the step's message buffers */
    for (int i = 0; i < r->steps.n[me]; i++) {
        const zt_action_t *a = &r->steps.a[me][i];
        if (a->kind != ZT_ACT_RECV_ACT && a->kind != ZT_ACT_RECV_GRAD) continue;
        const size_t n = zt_tr_residual_floats(r, r->micro_T[a->micro]);
        r->pp_buf[nmsg] = r->be->alloc(n * sizeof(float));
        held += n * sizeof(float);
        zt_irecv(c, &c->pp, r->pp_buf[nmsg], a->peer, zt_schedule_tag(&r->steps, a), n, ZT_F32, &r->pp_req[nmsg]);
        nmsg++;
    }
    double loss_sum = 0.0;
    int nrecv = 0, nsend = nmsg;
    const double t_span = zt_now();
    for (int i = 0; i < r->steps.n[me]; i++) {
        const zt_action_t *a = &r->steps.a[me][i];
        if (a->kind == ZT_ACT_REDUCE) break;
        const int mi = a->micro, first = r->plan.stage_first[a->stage], end = r->plan.stage_first[a->stage + 1];
        zt_model_t *m = r->models[r->slot[mi]];
        const int T = r->micro_T[mi];
        const size_t n = zt_tr_residual_floats(r, T);
        switch (a->kind) {
        case ZT_ACT_RECV_ACT:
        case ZT_ACT_RECV_GRAD: {
            zt_watchdog_mark(a->kind == ZT_ACT_RECV_ACT ? "pipeline receive" : "pipeline gradient receive", -1,
                             r->step + 1);
            /* a stage's input enters its first block; its output's gradient is where its backward starts */
            float *dst = a->kind == ZT_ACT_RECV_ACT ? zt_model_residual(m, first - 1) : zt_model_residual_grad(m);
            const double tw = zt_now();
            zt_wait(c, &r->pp_req[nrecv]);
            r->pp_recv_wait += zt_now() - tw;
            r->be->copy(dst, r->pp_buf[nrecv], n * sizeof *dst);
            nrecv++;
            break;
        }
        case ZT_ACT_SEND_ACT:
        case ZT_ACT_SEND_GRAD: {
            const float *src = a->kind == ZT_ACT_SEND_ACT ? zt_model_residual(m, end - 1) : zt_model_residual_grad(m);
            float *buf = r->be->alloc(n * sizeof *buf);
            held += n * sizeof *buf;
            r->be->copy(buf, src, n * sizeof *buf);
            r->pp_buf[nsend] = buf;
            zt_isend(c, &c->pp, buf, a->peer, zt_schedule_tag(&r->steps, a), n, ZT_F32, &r->pp_req[nsend]);
            nsend++;
            break;
        }
        case ZT_ACT_FWD:
            zt_model_set_batch(m, r->inp + mi * BT, r->tgt + mi * BT, r->B, T);
            if (r->seg) zt_model_set_segments(m, r->seg + mi * BTs, r->pos ? r->pos + mi * BT : NULL);
            else if (dpo && r->micro_seg[mi]) zt_model_set_segments(m, r->micro_seg[mi], NULL);
            if (r->keys) zt_model_set_row_keys(m, r->keys + mi * BT);
            if (first == 0) {
                zt_watchdog_mark("forward", root, r->step + 1);
                zt_model_forward_embed(m, zt_shard_params(s, root));
                zt_shard_release(s, root);
            }
            zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 1);
            break;
        case ZT_ACT_BWD:
            /* the unit reductions start at the last micro-batch's backward, whatever ran between */
            zt_shard_begin_micro(s, mi, r->A);
            if (end == L + 2) {
                zt_watchdog_mark("forward head", head, r->step + 1);
                if (dpo) {
                    double now[2] = {zt_now(), zt_thread_seconds()};
                    loss_sum += zt_tr_pref_policy_head(r, m, zt_shard_params(s, head), head, r->tgt + mi * BT, T, r->micro_Tp[mi],
                                                 ref ? ref + (size_t)mi * r->B : NULL, pf, pref_window, now);
                    (*pref_micros)++;
                } else {
                    zt_model_train_head(m, zt_shard_params(s, head), zt_shard_grads(s, head), ds);
                    loss_sum += sft ? zt_model_loss_sum(m) : zt_model_loss(m);
                }
                *computed += (long)r->B * T;
                if (first > 0) zt_shard_grads_ready(s, head); /* the embedding's part is another rank's */
                zt_shard_release(s, head);
            }
            zt_tr_backward_range(r, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1);
            if (first == 0) {
                zt_watchdog_mark("backward", root, r->step + 1);
                zt_model_backward_embed(m, zt_shard_grads(s, root));
                zt_shard_grads_ready(s, root);
            }
            break;
        default: break;
        }
    }
    const double ts = zt_now();
    r->pp_msg_bytes = ZT_MAX(r->pp_msg_bytes, held); /* every buffer of the step is still held here, at R */
    for (int k = 0; k < nsend; k++) {
        if (k >= nmsg) zt_wait(c, &r->pp_req[k]);
        r->be->free(r->pp_buf[k]);
    }
    r->pp_send_wait += zt_now() - ts;
    r->pp_span += zt_now() - t_span;
    r->pp_steps++;
    free(ref);
    return loss_sum;
}

/* The activations this rank allocated: its pipeline slots' models (one at pp 1) */
size_t zt_tr_activation_bytes(const run_t *r)
{
    size_t n = 0;
    for (int k = 0; k < r->nslots; k++) n += zt_model_activation_bytes(r->models[k]);
    return n;
}

/* x summed over the ranks that hold parts of the step: the data ranks, and under a pipeline
 * its ranks (the loss and the positions run exist on the last stage only) */
double zt_tr_step_sum(run_t *r, double x)
{
    x = zt_sum_double(r->comm, &r->comm->data, x);
    return r->plan.pp > 1 ? zt_sum_double(r->comm, &r->comm->pp, x) : x;
}

/* pp > 1, at the end of a run: per pipeline rank the time its schedules took, the share of
 * it blocked in receives (the measured bubble, with any transfer not hidden) beside
 * (pp - 1) / (m + pp - 1) / v, and the sends' wait at R (their transfer not hidden) */
void zt_tr_pp_summary(run_t *r)
{
    zt_comm_t *c = r->comm;
    const int pp = r->plan.pp;
    if (pp == 1 || r->pp_steps == 0) return;
    const double mine[3] = {r->pp_span, r->pp_recv_wait, r->pp_send_wait};
    double *all = zt_malloc((size_t)pp * sizeof mine);
    zt_allgather(c, &c->pp, mine, all, 3, ZT_F64);
    const int m = r->A, v = r->plan.pp_v;
    char line[1024];
    size_t o = (size_t)snprintf(line, sizeof line, "summary: pipeline %s, pp %d x v %d, m %d: ideal bubble %.3f;",
                                zt_config_enum_name("parallel.pp_schedule", (int)r->plan.pp_schedule), pp, v, m,
                                (double)(pp - 1) / (m + pp - 1) / v);
    double bubble = 0.0;
    for (int k = 0; k < pp && o < sizeof line; k++) {
        const double *x = all + 3 * k, b = x[0] > 0 ? x[1] / x[0] : 0.0;
        bubble += b / pp;
        o += (size_t)snprintf(line + o, sizeof line - o,
                              " rank %d: schedule %.3f s/step, receive wait %.3f s/step (%.3f), send wait %.4f s/step;",
                              k, x[0] / r->pp_steps, x[1] / r->pp_steps, b, x[2] / r->pp_steps);
    }
    if (o < sizeof line) snprintf(line + o, sizeof line - o, " measured bubble (mean) %.3f", bubble);
    zt_log("%s", line);
    free(all);
}

/* This rank's measured memory: the engine's, its buffers with a pipeline's message buffers
 * (their high-water mark over the steps; the estimate counts them the same way) */
void zt_tr_rank_memory(const run_t *r, zt_shard_mem_t *mm)
{
    zt_shard_memory(r->shard, mm);
    mm->comm_buffers += r->pp_msg_bytes;
}

/* pp > 1, on every rank: each pipeline rank's measured memory (the ranks at this rank's
 * data and tp position) beside its estimate, logged and recorded by rank 0 */
void zt_tr_stage_memory(run_t *r)
{
    zt_comm_t *c = r->comm;
    const int pp = c->pp.size, K = 15;
    zt_shard_mem_t mm, mr = {0};
    zt_tr_rank_memory(r, &mm);
    if (r->ref_shard) zt_shard_memory(r->ref_shard, &mr); /* DPO's frozen copy: its stages' units */
    const double mine[15] = {(double)mm.params, (double)mm.grads, (double)mm.optim, (double)mm.comm_buffers,
                             (double)mm.gathered_peak, (double)zt_tr_activation_bytes(r), (double)mm.host, (double)mm.nvme,
                             (double)mr.params, (double)mr.grads, (double)mr.optim, (double)mr.comm_buffers,
                             (double)mr.gathered_peak, (double)mr.host, (double)mr.nvme};
    double *all = zt_malloc((size_t)K * pp * sizeof *all);
    zt_allgather(c, &c->pp, mine, all, (size_t)K, ZT_F64);
    for (int k = 0; c->world.rank == 0 && k < pp; k++) {
        const double *x = all + K * k, *y = x + 8;
        const zt_shard_mem_t meas = {(size_t)x[0], (size_t)x[1], (size_t)x[2], (size_t)x[3], (size_t)x[4],
                                     (size_t)x[6], (size_t)x[7]};
        const zt_shard_mem_t mref = {(size_t)y[0], (size_t)y[1], (size_t)y[2], (size_t)y[3], (size_t)y[4],
                                     (size_t)y[5], (size_t)y[6]};
        estimate_t e;
        zt_tr_estimate_rank(r->cfg, &r->plan, r->table, r->ltable, r->sopts.strategy, c->data.size, c->shard.size, k, &e);
        char b[2][32];
        zt_log("memory (pp rank %d): estimated %s, measured %s", k, zt_fmt_bytes((double)e.total, b[0], 32),
               zt_fmt_bytes((double)(zt_tr_mem_total(&meas) + zt_tr_mem_total(&mref)) + x[5], b[1], 32));
        zt_metrics_record_stage_memory(k, &e.mem, e.activations, r->ref_shard ? &e.ref : NULL, &meas, (size_t)x[5],
                                       r->ref_shard ? &mref : NULL);
    }
    free(all);
}
