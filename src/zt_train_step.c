/* zt_train_step.c — one optimizer step's micro-batches as the train loop runs them: the
 * one-stage step (run_schedule) and a pipeline rank's action list (run_pipeline, with DPO's
 * reference pass through the stages), and the pipeline's end-of-run figures (the bubble,
 * each pipeline rank's memory beside its estimate). The list itself is zt_step.c's; the run's
 * state is zt_train_internal.h's. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                loss_sum += zt_tr_pref_micro(r, m, inp, tgt, pf, pref_window, &T);
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

/* The step's schedule for the plan (r->steps, and the estimate's dry run): the plan's
 * pp_schedule over micro micro-batches; under a pipeline, DPO with a reference gets the
 * reference's forwards as actions of it (zt_schedule_add_reference, run by ref_forward),
 * and gpipe the head's forward in the last stage's F (head_split, parallel.pp_head_split).
 * 0, or -1 with one line in err. */
int zt_tr_build_steps(const zt_config_t *cfg, const zt_parallel_plan_t *p, int micro, zt_schedule_t *s, char *err,
                      size_t len)
{
    if (zt_schedule_build(s, p->pp_schedule, p->pp, p->pp_v, micro, err, len)) return -1;
    /* DPO's last-stage head (pref_policy_head: the head, the loss and its factors) stays whole in B */
    s->head_split = p->pp > 1 && cfg->parallel.pp_head_split && p->pp_schedule == ZT_PP_GPIPE &&
                    cfg->train.stage != ZT_STAGE_DPO && !cfg->mode_generate;
    if (p->pp > 1 && cfg->train.stage == ZT_STAGE_DPO && zt_pref_uses_ref(cfg->pref.fn.loss)) zt_schedule_add_reference(s);
    return 0;
}

/* FR m s (pp > 1, train.stage = dpo with a reference): the reference's forward of micro-batch
 * m through stage s, as pref_micro's reference pass, on the frozen copy or LoRA's base with
 * the adapters off. It runs in the micro-batch's slot model m, whose policy forward on s
 * comes next in the list and overwrites what this one writes there (the stage's blocks'
 * buffers and its input and output residual), so the reference holds no activations of its
 * own; its input and output travel as SR/RR messages. The last stage's head gives the micro-batch's per-sequence
 * sums into ref (B), which its backward action's loss reads. */
static void ref_forward(run_t *r, zt_model_t *m, const zt_action_t *a, double *ref)
{
    const zt_param_table_t *t = r->table;
    zt_shard_t *s = r->ref_shard ? r->ref_shard : r->shard;
    const int L = t->dims.L, root = t->root_unit, head = zt_params_head_unit(t), mi = a->micro;
    const int first = r->plan.stage_first[a->stage], end = r->plan.stage_first[a->stage + 1];
    const int frozen_head = t->unit_frozen && t->unit_frozen[head];
    const size_t BT = (size_t)r->B * r->Tm;
    const int32_t *tgt = r->tgt + mi * BT;
    double now[2] = {zt_now(), zt_thread_seconds()};
    if (r->ref_shard) zt_shard_begin_inference(s);
    zt_model_set_batch(m, r->inp + mi * BT, tgt, r->B, r->micro_T[mi]);
    if (r->micro_seg[mi]) zt_model_set_segments(m, r->micro_seg[mi], NULL); /* pref_lf_rows */
    if (first == 0) {
        zt_watchdog_mark("reference forward", root, r->step + 1);
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
        zt_tr_row_sums(r, zt_model_token_losses(m), 1, tgt, r->micro_T[mi], ref, NULL);
    }
    if (r->ref_shard) zt_shard_end_inference(s);
    if (end == L + 2) zt_tr_pref_lap(r, PT_REF_HEAD, now);
}

/* Where a send's message comes from: the output of its stage (the residual entering the
 * next stage's first layer), or the gradient of its stage's input */
static const float *send_source(run_t *r, const zt_action_t *a)
{
    zt_model_t *m = r->models[r->slot[a->micro]];
    const int end = r->plan.stage_first[a->stage + 1];
    return a->kind == ZT_ACT_SEND_GRAD ? zt_model_residual_grad(m) : zt_model_residual(m, end - 1);
}

/* Stream-ordered messages: the batch the plan issues before action i of this rank's list
 * (order: its messages in issue order, from *next on; buf_of: each action's message buffer
 * index), as one zt_p2p_batch with tag 0 (the pair's issue order is the match, as NCCL's),
 * each message into a buffer of its own (a send's a copy of its source), then waited for
 * whole: a batch ends before the compute after it, as the plan's check assumes. The bytes
 * of the buffers go to *held. */
static void issue_batch(run_t *r, const int *order, int norder, int *next, int i, const int *buf_of, size_t *held)
{
    zt_comm_t *c = r->comm;
    const int me = c->pp.rank;
    int e = *next;
    while (e < norder && r->steps.post[me][order[e]] == i) e++;
    const int n = e - *next;
    if (n == 0) return;
    zt_p2p_op_t *ops = zt_malloc((size_t)n * sizeof *ops);
    zt_request_t *req = zt_malloc((size_t)n * sizeof *req);
    for (int k = 0; k < n; k++) {
        const zt_action_t *a = &r->steps.a[me][order[*next + k]];
        const int send = zt_action_is_send(a);
        const size_t count = zt_tr_residual_floats(r, r->micro_T[a->micro]);
        float *buf = r->be->alloc(count * sizeof *buf);
        *held += count * sizeof *buf;
        if (send) r->be->copy(buf, send_source(r, a), count * sizeof *buf);
        r->pp_buf[buf_of[order[*next + k]]] = buf;
        ops[k] = (zt_p2p_op_t){.send = send, .buf = buf, .peer = a->peer, .tag = 0, .count = count, .t = ZT_F32};
    }
    zt_p2p_batch(c, &c->pp, ops, n, req);
    const double tw = zt_now();
    for (int k = 0; k < n; k++) {
        zt_wait(c, &req[k]);
        r->pp_req[buf_of[order[*next + k]]] = req[k]; /* accounted: a wait there returns at once */
    }
    r->pp_recv_wait += zt_now() - tw;
    free(ops);
    free(req);
    *next = e;
}

/* pp > 1: this pipeline rank's actions of one step up to its R, on the layers of each
 * action's stage (plan.stage_first): the embedding (layer 0) and the head (L + 1) use the
 * root unit, the blocks their units; the residual stream and its gradient cross the stage
 * boundaries through the pp group. Receives are posted at the start and waited for where
 * the schedule puts them; a send goes from a copy and completes at R, so compute runs
 * while both travel. Stream-ordered messages (zt_p2p_in_order: NCCL) go instead in the
 * batches the schedule's plan gives (zt_schedule_plan_in_order), each waited for whole
 * before the next compute (issue_batch); a receive is still copied where the model reads
 * it at its own action. ds: a token's
 * gradient scale. DPO (pf, pref_window, pref_micros: run_schedule's): the reference's
 * forwards are actions of the list (FR, ref_forward, with their messages SR/RR), the last
 * stage's backward runs the head, the loss and its factors (pref_policy_head); the parts'
 * time goes to the DPO profile (pref_seconds: the reference's FR, the policy's F and B), which
 * pp_summary reports per rank. Returns the loss
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
    /* the reference's per-sequence sums of each micro-batch (A B), on the last stage's rank */
    double *ref = r->steps.ref ? zt_calloc((size_t)r->A * r->B, sizeof *ref) : NULL;
    /* every receive of the step is posted now, into its own buffer, so a message travels
     * while this rank computes whatever comes before it in the list; at its action it is
     * waited for and copied where the model reads it */
    int nmsg = 0;
    size_t held = 0; /* the bytes of the step's message buffers */
    /* stream-ordered: each message's buffer index, receives first as below, and the
     * messages in issue order */
    const int in_order = r->steps.post != NULL;
    int *buf_of = NULL, *order = NULL, norder = 0, next = 0;
    if (in_order) {
        buf_of = zt_malloc((size_t)r->steps.n[me] * sizeof *buf_of);
        order = zt_malloc((size_t)r->steps.n[me] * sizeof *order);
        norder = zt_schedule_issue_order(&r->steps, me, order);
    }
    for (int i = 0; i < r->steps.n[me]; i++) {
        const zt_action_t *a = &r->steps.a[me][i];
        if (a->kind != ZT_ACT_RECV_ACT && a->kind != ZT_ACT_RECV_GRAD && a->kind != ZT_ACT_RECV_REF) continue;
        if (in_order) {
            buf_of[i] = nmsg++;
            continue;
        }
        const size_t n = zt_tr_residual_floats(r, r->micro_T[a->micro]);
        r->pp_buf[nmsg] = r->be->alloc(n * sizeof(float));
        held += n * sizeof(float);
        zt_irecv(c, &c->pp, r->pp_buf[nmsg], a->peer, zt_schedule_tag(&r->steps, a), n, ZT_F32, &r->pp_req[nmsg]);
        nmsg++;
    }
    for (int i = 0, k = nmsg; in_order && i < r->steps.n[me]; i++)
        if (zt_action_is_send(&r->steps.a[me][i])) buf_of[i] = k++;
    double loss_sum = 0.0;
    int nrecv = 0, nsend = nmsg;
    const double t_span = zt_now();
    for (int i = 0; i < r->steps.n[me]; i++) {
        const zt_action_t *a = &r->steps.a[me][i];
        if (a->kind == ZT_ACT_REDUCE) break;
        if (in_order) issue_batch(r, order, norder, &next, i, buf_of, &held);
        const int mi = a->micro, first = r->plan.stage_first[a->stage], end = r->plan.stage_first[a->stage + 1];
        zt_model_t *m = r->models[r->slot[mi]];
        const int T = r->micro_T[mi];
        const size_t n = zt_tr_residual_floats(r, T);
        const double t_act = r->pp_trace ? zt_now() : 0.0, c_act = r->pp_trace ? zt_thread_seconds() : 0.0;
        switch (a->kind) {
        case ZT_ACT_RECV_ACT:
        case ZT_ACT_RECV_REF:
        case ZT_ACT_RECV_GRAD: {
            zt_watchdog_mark(a->kind == ZT_ACT_RECV_ACT   ? "pipeline receive"
                             : a->kind == ZT_ACT_RECV_REF ? "pipeline reference receive"
                                                          : "pipeline gradient receive",
                             -1, r->step + 1);
            /* a stage's input enters its first block (the reference's too: its forward comes
             * next); its output's gradient is where its backward starts */
            float *dst = a->kind == ZT_ACT_RECV_GRAD ? zt_model_residual_grad(m) : zt_model_residual(m, first - 1);
            const double tw = zt_now();
            zt_wait(c, &r->pp_req[nrecv]);
            r->pp_recv_wait += zt_now() - tw;
            r->be->copy(dst, r->pp_buf[nrecv], n * sizeof *dst);
            nrecv++;
            break;
        }
        case ZT_ACT_SEND_ACT:
        case ZT_ACT_SEND_REF:
        case ZT_ACT_SEND_GRAD: {
            if (in_order) { /* gone with its batch */
                nsend++;
                break;
            }
            const float *src = send_source(r, a);
            float *buf = r->be->alloc(n * sizeof *buf);
            held += n * sizeof *buf;
            r->be->copy(buf, src, n * sizeof *buf);
            r->pp_buf[nsend] = buf;
            zt_isend(c, &c->pp, buf, a->peer, zt_schedule_tag(&r->steps, a), n, ZT_F32, &r->pp_req[nsend]);
            nsend++;
            break;
        }
        case ZT_ACT_REF_FWD: ref_forward(r, m, a, ref + (size_t)mi * r->B); break;
        case ZT_ACT_FWD: {
            double now[2] = {zt_now(), zt_thread_seconds()};
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
            if (end == L + 2 && r->steps.head_split) {
                zt_watchdog_mark("forward head", head, r->step + 1);
                zt_model_train_head_forward(m, zt_shard_params(s, head), ds);
                zt_shard_release(s, head);
            }
            if (dpo) zt_tr_pref_lap(r, PT_FWD, now);
            break;
        }
        case ZT_ACT_BWD: {
            double now[2] = {zt_now(), zt_thread_seconds()};
            /* the unit reductions start at the last micro-batch's backward, whatever ran between */
            zt_shard_begin_micro(s, mi, r->A);
            if (end == L + 2) {
                zt_watchdog_mark(r->steps.head_split ? "backward head" : "forward head", head, r->step + 1);
                if (dpo) {
                    loss_sum += zt_tr_pref_policy_head(r, m, zt_shard_params(s, head), head, r->tgt + mi * BT, T, r->micro_Tp[mi],
                                                 ref ? ref + (size_t)mi * r->B : NULL, pf, pref_window, now);
                    (*pref_micros)++;
                } else {
                    if (r->steps.head_split) /* its forward ran in F (the losses are its) */
                        zt_model_train_head_backward(m, zt_shard_params(s, head), zt_shard_grads(s, head));
                    else
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
            if (dpo) zt_tr_pref_lap(r, PT_BWD, now);
            break;
        }
        default: break;
        }
        if (r->pp_trace) {
            char act[64];
            zt_action_format(a, act, sizeof act);
            fprintf(r->pp_trace, "%ld %s %.6f %.6f %.6f\n", r->step + 1, act, t_act - t_span, zt_now() - t_span,
                    zt_thread_seconds() - c_act);
        }
    }
    const double ts = zt_now();
    r->pp_msg_bytes = ZT_MAX(r->pp_msg_bytes, held); /* every buffer of the step is still held here, at R */
    for (int k = 0; k < nsend; k++) {
        if (k >= nmsg) zt_wait(c, &r->pp_req[k]);
        r->be->free(r->pp_buf[k]);
    }
    r->pp_send_wait += zt_now() - ts;
    if (r->pp_trace) fprintf(r->pp_trace, "%ld R %.6f %.6f 0\n", r->step + 1, ts - t_span, zt_now() - t_span);
    /* The run's first schedule is warm-up (first touches of every buffer, the peer's as much as
     * this rank's), left out of the figures as the benchmarks leave its step time out */
    if (r->pp_warm) {
        r->pp_span += zt_now() - t_span;
        r->pp_steps++;
    } else {
        r->pp_recv_wait = r->pp_send_wait = 0.0;
        r->pp_warm = 1;
    }
    free(ref);
    free(buf_of);
    free(order);
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

/* pp > 1, at the end of a run: per pipeline rank the time its schedules took (from the run's
 * second step: the first is warm-up), the share of it blocked in receives, the sends' wait
 * at R, and its bubble: the share of the slowest
 * rank's schedule time it spends not computing (with any transfer not hidden), beside
 * (pp - 1) / (m + pp - 1) / v.
 * The sends' wait belongs in it: over shared memory a large send completes only once its
 * receiver reaches the receive, so a rank whose last backward ends before its peer's waits
 * there, as a first stage waits in its receives; DPO:
 * of its compute, the reference's forwards (FR) and the policy's forwards and backwards (F,
 * B; the loss with the head), from the DPO profile (pref_part_t). It then leaves in the
 * profile (pref_seconds, pref_cpu) its sums over the pipeline ranks, so the DPO summary
 * that follows gives the whole model's parts as a one-stage run's does. Every rank calls it. */
void zt_tr_pp_summary(run_t *r)
{
    zt_comm_t *c = r->comm;
    const int pp = r->plan.pp, K = 3 + 2 * PT_N;
    if (pp == 1 || r->pp_steps == 0) return;
    double mine[3 + 2 * PT_N] = {r->pp_span, r->pp_recv_wait, r->pp_send_wait};
    memcpy(mine + 3, r->pref_seconds, sizeof r->pref_seconds);
    memcpy(mine + 3 + PT_N, r->pref_cpu, sizeof r->pref_cpu);
    double *all = zt_malloc((size_t)pp * sizeof mine);
    zt_allgather(c, &c->pp, mine, all, (size_t)K, ZT_F64);
    const int m = r->A, v = r->plan.pp_v, dpo = r->cfg->train.stage == ZT_STAGE_DPO;
    const double n = (double)r->pp_steps, n_dpo = n + 1.0; /* the DPO profile has the warm-up step too */
    char line[4096];
    size_t o = (size_t)snprintf(line, sizeof line, "summary: pipeline %s, pp %d x v %d, m %d: ideal bubble %.3f;",
                                zt_config_enum_name("parallel.pp_schedule", (int)r->plan.pp_schedule), pp, v, m,
                                (double)(pp - 1) / (m + pp - 1) / v);
    /* The ranks start a step's schedule together (R's collectives end the one before), so
     * the step lasts as long as the slowest rank's schedule: a rank whose schedule ends
     * earlier idles until then in R's first collective, as a first stage idles in its
     * receives. A rank's bubble is the share of that span it does not compute. */
    double span = 0.0;
    for (int k = 0; k < pp; k++) span = ZT_MAX(span, all[K * k]);
    double bubble = 0.0;
    for (int k = 0; k < pp && o < sizeof line; k++) {
        const double *x = all + K * k, b = x[0] > 0 ? x[1] / x[0] : 0.0, *p = x + 3;
        const double idle = span > 0 ? 1.0 - (x[0] - x[1] - x[2]) / span : 0.0;
        bubble += idle / pp;
        o += (size_t)snprintf(line + o, sizeof line - o,
                              " rank %d: schedule %.3f s/step, receive wait %.3f s/step (%.3f), send wait %.4f s/step, "
                              "bubble %.3f",
                              k, x[0] / n, x[1] / n, b, x[2] / n, idle);
        if (dpo && o < sizeof line)
            o += (size_t)snprintf(line + o, sizeof line - o, ", dpo reference %.3f s/step, policy %.3f s/step",
                                  (p[PT_REF_BLOCKS] + p[PT_REF_HEAD]) / n_dpo,
                                  (p[PT_FWD] + p[PT_HEAD] + p[PT_LOSS] + p[PT_BWD]) / n_dpo);
        if (o < sizeof line) o += (size_t)snprintf(line + o, sizeof line - o, ";");
    }
    if (o < sizeof line) snprintf(line + o, sizeof line - o, " measured bubble (mean) %.3f", bubble);
    zt_log("%s", line);
    for (int j = 0; dpo && j < 2 * PT_N; j++) {
        double sum = 0.0;
        for (int k = 0; k < pp; k++) sum += all[K * k + 3 + j];
        if (j < PT_N) r->pref_seconds[j] = sum;
        else r->pref_cpu[j - PT_N] = sum;
    }
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
