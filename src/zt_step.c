/* zt_step.c — step schedules as data (see zt_step.h).
 *
 * A generator first writes each rank's compute order (F and B of (micro-batch, stage)),
 * the only thing the schedules differ in; the messages follow from it: a forward on a
 * stage after the first receives its input just before it runs and a forward before the
 * last stage sends its output just after; the backward mirrors it with the gradients.
 * Sends being non-blocking, placing each receive as late as possible and each send as
 * early as possible is what lets a rank's compute run while its messages travel. DPO's
 * reference forwards are inserted into built lists (zt_schedule_add_reference), each with
 * its messages placed by the same rule. */
#include "zt_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

typedef struct { int fwd, micro, stage; } op_t;

/* Megatron's interleaved order: the k-th forward (or backward) of a rank runs micro-batch
 * group k / (pp v), chunk (k / pp) mod v (reversed for the backward) */
static op_t interleaved_op(int k, int fwd, int rank, int pp, int v)
{
    const int in_group = k % (pp * v);
    int chunk = in_group / pp;
    if (!fwd) chunk = v - 1 - chunk;
    return (op_t){fwd, (k / (pp * v)) * pp + in_group % pp, chunk * pp + rank};
}

/* rank r's compute order into ops (2 M v entries) */
static void compute_order(zt_pp_schedule_t kind, int pp, int v, int M, int r, op_t *ops)
{
    int n = 0;
    if (pp == 1) { /* the one-stage step: one micro-batch's activations at a time */
        for (int m = 0; m < M; m++) ops[n++] = (op_t){1, m, 0}, ops[n++] = (op_t){0, m, 0};
        return;
    }
    if (kind == ZT_PP_GPIPE) {
        for (int m = 0; m < M; m++) ops[n++] = (op_t){1, m, r};
        for (int m = 0; m < M; m++) ops[n++] = (op_t){0, m, r};
        return;
    }
    const int total = M * v;
    int warm;
    if (kind == ZT_PP_1F1B) warm = ZT_MIN(pp - 1 - r, M);
    else warm = M == pp ? total : ZT_MIN((pp - r - 1) * 2 + (v - 1) * pp, total);
    int f = 0, b = 0;
    for (; f < warm; f++) ops[n++] = interleaved_op(f, 1, r, pp, v);
    for (; f < total; f++, b++) {
        ops[n++] = interleaved_op(f, 1, r, pp, v);
        ops[n++] = interleaved_op(b, 0, r, pp, v);
    }
    for (; b < total; b++) ops[n++] = interleaved_op(b, 0, r, pp, v);
}

int zt_schedule_build(zt_schedule_t *s, zt_pp_schedule_t kind, int pp, int v, int M, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (pp < 1 || v < 1 || M < 1) return zt_err(err, errlen, "schedule: pp (%d), v (%d) and micro-batches (%d) must be >= 1", pp, v, M);
    if (pp == 1) v = 1; /* one rank: every schedule is the one-stage step */
    if (v > 1 && kind != ZT_PP_INTERLEAVED_1F1B)
        return zt_err(err, errlen, "schedule: %d stages per rank need the interleaved_1f1b schedule", v);
    if (kind == ZT_PP_INTERLEAVED_1F1B && pp > 1 && M % pp)
        return zt_err(err, errlen, "schedule interleaved_1f1b: the micro-batches (%d) must be a multiple of the "
                      "pipeline ranks (%d)", M, pp);
    *s = (zt_schedule_t){.kind = kind, .pp = pp, .v = v, .stages = pp * v, .micro = M};
    s->n = zt_calloc((size_t)pp, sizeof *s->n);
    s->a = zt_calloc((size_t)pp, sizeof *s->a);
    const int S = s->stages, nops = 2 * M * v;
    op_t *ops = zt_malloc((size_t)nops * sizeof *ops);
    for (int r = 0; r < pp; r++) {
        compute_order(kind, pp, v, M, r, ops);
        /* each op with at most a message before and one after it, and the final R */
        zt_action_t *a = zt_malloc((size_t)(3 * nops + 1) * sizeof *a);
        int n = 0;
        for (int i = 0; i < nops; i++) {
            const op_t o = ops[i];
            if (o.fwd) {
                if (o.stage > 0) a[n++] = (zt_action_t){ZT_ACT_RECV_ACT, o.micro, o.stage, (o.stage - 1) % pp};
                a[n++] = (zt_action_t){ZT_ACT_FWD, o.micro, o.stage, -1};
                if (o.stage < S - 1) a[n++] = (zt_action_t){ZT_ACT_SEND_ACT, o.micro, o.stage, (o.stage + 1) % pp};
            } else {
                if (o.stage < S - 1) a[n++] = (zt_action_t){ZT_ACT_RECV_GRAD, o.micro, o.stage, (o.stage + 1) % pp};
                a[n++] = (zt_action_t){ZT_ACT_BWD, o.micro, o.stage, -1};
                if (o.stage > 0) a[n++] = (zt_action_t){ZT_ACT_SEND_GRAD, o.micro, o.stage, (o.stage - 1) % pp};
            }
        }
        a[n++] = (zt_action_t){ZT_ACT_REDUCE, -1, -1, -1};
        s->a[r] = a;
        s->n[r] = n;
    }
    free(ops);
    return 0;
}

void zt_schedule_add_reference(zt_schedule_t *s)
{
    if (s->pp == 1 || s->ref) return;
    const int S = s->stages, pp = s->pp;
    for (int r = 0; r < pp; r++) {
        int nf = 0;
        for (int i = 0; i < s->n[r]; i++) nf += s->a[r][i].kind == ZT_ACT_FWD;
        zt_action_t *a = zt_malloc((size_t)(s->n[r] + 3 * nf) * sizeof *a);
        int n = 0;
        for (int i = 0; i < s->n[r]; i++) {
            const zt_action_t o = s->a[r][i];
            if (o.kind == ZT_ACT_FWD) {
                /* before the policy's receive of this forward's input, where it has one */
                const int ra = n > 0 && a[n - 1].kind == ZT_ACT_RECV_ACT && a[n - 1].micro == o.micro &&
                               a[n - 1].stage == o.stage;
                n -= ra;
                if (o.stage > 0) a[n++] = (zt_action_t){ZT_ACT_RECV_REF, o.micro, o.stage, (o.stage - 1) % pp};
                a[n++] = (zt_action_t){ZT_ACT_REF_FWD, o.micro, o.stage, -1};
                if (o.stage < S - 1) a[n++] = (zt_action_t){ZT_ACT_SEND_REF, o.micro, o.stage, (o.stage + 1) % pp};
                if (ra) a[n++] = (zt_action_t){ZT_ACT_RECV_ACT, o.micro, o.stage, (o.stage - 1) % pp};
            }
            a[n++] = o;
        }
        free(s->a[r]);
        s->a[r] = a;
        s->n[r] = n;
    }
    s->ref = 1;
}

int zt_schedule_messages(const zt_schedule_t *s, int rank)
{
    int n = 0;
    for (int i = 0; i < s->n[rank]; i++) n += zt_schedule_tag(s, &s->a[rank][i]) >= 0;
    return n;
}

void zt_schedule_free(zt_schedule_t *s)
{
    if (!s->a) return;
    for (int r = 0; r < s->pp; r++) free(s->a[r]);
    free(s->a);
    free(s->n);
    memset(s, 0, sizeof *s);
}

/* (direction, micro-batch, sending stage); the reference's direction (2) comes after the
 * policy's two, so a schedule without one keeps its tags */
int zt_schedule_tag(const zt_schedule_t *s, const zt_action_t *a)
{
    int dir = 0, from = a->stage;
    switch (a->kind) {
    case ZT_ACT_SEND_ACT: break;
    case ZT_ACT_RECV_ACT: from = a->stage - 1; break;
    case ZT_ACT_SEND_GRAD: dir = 1; break;
    case ZT_ACT_RECV_GRAD: dir = 1, from = a->stage + 1; break;
    case ZT_ACT_SEND_REF: dir = 2; break;
    case ZT_ACT_RECV_REF: dir = 2, from = a->stage - 1; break;
    default: return -1;
    }
    return (dir * s->micro + a->micro) * s->stages + from;
}

int zt_action_format(const zt_action_t *a, char *buf, size_t len)
{
    static const char *names[ZT_ACT_N] = {"F", "B", "SA", "RA", "SG", "RG", "R", "FR", "SR", "RR"};
    if (a->kind == ZT_ACT_REDUCE) return snprintf(buf, len, "R");
    if (a->peer < 0) return snprintf(buf, len, "%s%d.%d", names[a->kind], a->micro, a->stage);
    const int send = a->kind == ZT_ACT_SEND_ACT || a->kind == ZT_ACT_SEND_GRAD || a->kind == ZT_ACT_SEND_REF;
    return snprintf(buf, len, "%s%d.%d%c%d", names[a->kind], a->micro, a->stage, send ? '>' : '<', a->peer);
}

void zt_schedule_format(const zt_schedule_t *s, int rank, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < s->n[rank] && at + 1 < len; i++) {
        if (i) buf[at++] = ' ', buf[at] = '\0';
        const int w = zt_action_format(&s->a[rank][i], buf + at, len - at);
        at = ZT_MIN(at + (size_t)(w > 0 ? w : 0), len - 1);
    }
}

int zt_schedule_check(const zt_schedule_t *s, int *inflight, char *err, size_t errlen)
{
    const int pp = s->pp, S = s->stages, M = s->micro, ntag = 3 * M * S;
    /* per message: 0 not sent, 1 + the destination rank once sent, -1 received */
    int *msg = zt_calloc((size_t)ntag, sizeof *msg);
    /* per (stage, micro): 1 forward done, 2 backward done, and the reference's forward done;
     * per (stage, micro, dir) received */
    int *done = zt_calloc((size_t)S * M, sizeof *done), *got = zt_calloc((size_t)3 * S * M, sizeof *got);
    int *refd = zt_calloc((size_t)S * M, sizeof *refd);
    int *pc = zt_calloc((size_t)pp, sizeof *pc), *live = zt_calloc((size_t)pp, sizeof *live);
    int rc = 0;
    char what[48];
    if (inflight) memset(inflight, 0, (size_t)pp * sizeof *inflight);
    for (int moved = 1; moved && rc == 0;) {
        moved = 0;
        for (int r = 0; r < pp && rc == 0; r++) {
            const int before = pc[r];
            while (pc[r] < s->n[r] && rc == 0) {
                const zt_action_t *a = &s->a[r][pc[r]];
                zt_action_format(a, what, sizeof what);
                if (a->kind == ZT_ACT_REDUCE) {
                    if (pc[r] != s->n[r] - 1) rc = zt_err(err, errlen, "rank %d: R before the end of its list", r);
                    pc[r]++;
                    continue;
                }
                if (a->micro < 0 || a->micro >= M || a->stage < 0 || a->stage >= S) {
                    rc = zt_err(err, errlen, "rank %d: %s out of range", r, what);
                    break;
                }
                int *st = &done[(size_t)a->stage * M + a->micro], *rd = &refd[(size_t)a->stage * M + a->micro];
                const int fwd = a->kind == ZT_ACT_FWD;
                if (a->kind == ZT_ACT_REF_FWD) {
                    if (zt_schedule_stage_rank(s, a->stage) != r)
                        rc = zt_err(err, errlen, "rank %d: %s runs a stage of rank %d", r, what,
                                    zt_schedule_stage_rank(s, a->stage));
                    else if (!s->ref) rc = zt_err(err, errlen, "rank %d: %s in a schedule without a reference", r, what);
                    else if (*rd) rc = zt_err(err, errlen, "rank %d: %s runs twice", r, what);
                    else if (a->stage > 0 && !got[((size_t)a->stage * M + a->micro) * 3 + 2])
                        rc = zt_err(err, errlen, "rank %d: %s before its input arrived", r, what);
                    if (rc) break;
                    *rd = 1;
                    pc[r]++;
                    continue;
                }
                if (fwd || a->kind == ZT_ACT_BWD) {
                    if (zt_schedule_stage_rank(s, a->stage) != r)
                        rc = zt_err(err, errlen, "rank %d: %s runs a stage of rank %d", r, what,
                                    zt_schedule_stage_rank(s, a->stage));
                    else if (*st != (fwd ? 0 : 1))
                        rc = zt_err(err, errlen, "rank %d: %s %s", r, what, fwd ? "runs twice" : "without its forward or twice");
                    else if (fwd && s->ref && !*rd)
                        rc = zt_err(err, errlen, "rank %d: %s before the reference's forward of it", r, what);
                    else if (fwd && a->stage > 0 && !got[((size_t)a->stage * M + a->micro) * 3])
                        rc = zt_err(err, errlen, "rank %d: %s before its input arrived", r, what);
                    else if (!fwd && a->stage < S - 1 && !got[((size_t)a->stage * M + a->micro) * 3 + 1])
                        rc = zt_err(err, errlen, "rank %d: %s before its gradient arrived", r, what);
                    if (rc) break;
                    *st = fwd ? 1 : 2;
                    live[r] += fwd ? 1 : -1;
                    if (inflight && live[r] > inflight[r]) inflight[r] = live[r];
                    pc[r]++;
                    continue;
                }
                const int tag = zt_schedule_tag(s, a);
                const int send = a->kind == ZT_ACT_SEND_ACT || a->kind == ZT_ACT_SEND_GRAD || a->kind == ZT_ACT_SEND_REF;
                const int grad = a->kind == ZT_ACT_SEND_GRAD || a->kind == ZT_ACT_RECV_GRAD;
                const int dir = grad ? 1 : a->kind == ZT_ACT_SEND_REF || a->kind == ZT_ACT_RECV_REF ? 2 : 0;
                const int other = send ? (grad ? a->stage - 1 : a->stage + 1) : (grad ? a->stage + 1 : a->stage - 1);
                if (other < 0 || other >= S || a->peer != zt_schedule_stage_rank(s, other)) {
                    rc = zt_err(err, errlen, "rank %d: %s names the wrong peer", r, what);
                    break;
                }
                if (send) {
                    if (dir == 2 ? !*rd : *st != (dir == 0 ? 1 : 2))
                        rc = zt_err(err, errlen, "rank %d: %s before the compute that makes it", r, what);
                    else if (msg[tag] != 0) rc = zt_err(err, errlen, "rank %d: %s sent twice", r, what);
                    if (rc) break;
                    msg[tag] = 1 + a->peer;
                } else {
                    if (msg[tag] == 0) break; /* blocks until sent */
                    if (msg[tag] < 0) rc = zt_err(err, errlen, "rank %d: %s received twice", r, what);
                    else if (msg[tag] - 1 != r) rc = zt_err(err, errlen, "rank %d: %s was sent to rank %d", r, what, msg[tag] - 1);
                    if (rc) break;
                    msg[tag] = -1;
                    got[((size_t)a->stage * M + a->micro) * 3 + dir] = 1;
                }
                pc[r]++;
            }
            moved |= pc[r] > before;
        }
    }
    for (int r = 0; r < pp && rc == 0; r++)
        if (pc[r] < s->n[r]) {
            zt_action_format(&s->a[r][pc[r]], what, sizeof what);
            rc = zt_err(err, errlen, "deadlock: rank %d waits at %s (action %d of %d)", r, what, pc[r] + 1, s->n[r]);
        }
    for (int i = 0; i < ntag && rc == 0; i++)
        if (msg[i] > 0) rc = zt_err(err, errlen, "message %d sent to rank %d never received", i, msg[i] - 1);
    for (int i = 0; i < S * M && rc == 0; i++)
        if (done[i] != 2) rc = zt_err(err, errlen, "stage %d: micro-batch %d not run forward and backward", i / M, i % M);
        else if (s->ref && !refd[i])
            rc = zt_err(err, errlen, "stage %d: micro-batch %d without the reference's forward", i / M, i % M);
    free(msg), free(done), free(got), free(pc), free(live), free(refd);
    return rc;
}

int zt_schedule_slots(const zt_schedule_t *s, int rank, int *slot)
{
    const int M = s->micro;
    int *last = zt_malloc((size_t)M * sizeof *last), *busy = zt_calloc((size_t)M, sizeof *busy), used = 0;
    for (int m = 0; m < M; m++) slot[m] = -1, last[m] = -1;
    for (int i = 0; i < s->n[rank]; i++)
        if (s->a[rank][i].kind == ZT_ACT_BWD) last[s->a[rank][i].micro] = i;
    for (int i = 0; i < s->n[rank]; i++) {
        const int m = s->a[rank][i].micro;
        if (m < 0) continue;
        if (slot[m] < 0) {
            int k = 0;
            while (busy[k]) k++;
            busy[k] = 1;
            slot[m] = k;
            used = ZT_MAX(used, k + 1);
        }
        if (i == last[m]) busy[slot[m]] = 0;
    }
    free(last);
    free(busy);
    return used;
}
