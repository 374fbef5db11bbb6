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

static void free_post(zt_schedule_t *s);

void zt_schedule_free(zt_schedule_t *s)
{
    if (!s->a) return;
    free_post(s);
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


/* ---- stream-ordered messages (zt_schedule_plan_in_order) --------------------------- */

static int is_message(const zt_action_t *a)
{
    return a->kind == ZT_ACT_SEND_ACT || a->kind == ZT_ACT_RECV_ACT || a->kind == ZT_ACT_SEND_GRAD ||
           a->kind == ZT_ACT_RECV_GRAD || a->kind == ZT_ACT_SEND_REF || a->kind == ZT_ACT_RECV_REF;
}

int zt_action_is_send(const zt_action_t *a)
{
    return a->kind == ZT_ACT_SEND_ACT || a->kind == ZT_ACT_SEND_GRAD || a->kind == ZT_ACT_SEND_REF;
}

/* The first of the run of messages action i of rank r sits in (the batch between two computes) */
static int run_first(const zt_schedule_t *s, int r, int i)
{
    while (i > 0 && is_message(&s->a[r][i - 1])) i--;
    return i;
}

/* The action message i of rank r is issued before: planned, or the first of its run */
static int post_of(const zt_schedule_t *s, int r, int i) { return s->post ? s->post[r][i] : run_first(s, r, i); }

static void free_post(zt_schedule_t *s)
{
    for (int r = 0; s->post && r < s->pp; r++) free(s->post[r]);
    free(s->post);
    s->post = NULL;
}

int zt_schedule_issue_order(const zt_schedule_t *s, int rank, int *order)
{
    int n = 0;
    for (int i = 0; i < s->n[rank]; i++)
        if (is_message(&s->a[rank][i])) order[n++] = i;
    for (int k = 1; k < n; k++) { /* stable: list order within a batch; nearly sorted already */
        const int x = order[k], px = post_of(s, rank, x);
        int j = k;
        while (j > 0 && post_of(s, rank, order[j - 1]) > px) order[j] = order[j - 1], j--;
        order[j] = x;
    }
    return n;
}

int zt_schedule_batches(const zt_schedule_t *s, int rank, int *moved)
{
    int n = 0, mv = 0;
    for (int i = 0, first = 0; i < s->n[rank]; i++) {
        if (!is_message(&s->a[rank][i])) {
            first = i + 1;
            continue;
        }
        mv += post_of(s, rank, i) < first;
        int k = 0; /* a batch counts at its first message in list order */
        while (k < i && !(is_message(&s->a[rank][k]) && post_of(s, rank, k) == post_of(s, rank, i))) k++;
        n += k == i;
    }
    if (moved) *moved = mv;
    return n;
}

/* A run of the lists under stream order: per rank its messages in issue order, each
 * message's partner (its action index on the peer), what is posted, and where each rank is */
typedef struct {
    zt_schedule_t *s;
    int **order, *norder, **partner, **posted, **seq, *pc, *cur;
} ordered_t;

static void ordered_free(ordered_t *o)
{
    for (int r = 0; r < o->s->pp; r++) free(o->order[r]), free(o->partner[r]), free(o->posted[r]), free(o->seq[r]);
    free(o->order), free(o->partner), free(o->posted), free(o->seq), free(o->norder), free(o->pc), free(o->cur);
}

/* Matches the k-th message issued from r to q with q's k-th receive issued from r, which
 * must carry the same message (tag); -1 with err where one has no partner or another's */
static int ordered_init(ordered_t *o, zt_schedule_t *s, char *err, size_t errlen)
{
    const int pp = s->pp;
    o->s = s;
    o->order = zt_calloc((size_t)pp, sizeof *o->order), o->partner = zt_calloc((size_t)pp, sizeof *o->partner);
    o->posted = zt_calloc((size_t)pp, sizeof *o->posted), o->seq = zt_calloc((size_t)pp, sizeof *o->seq);
    o->norder = zt_calloc((size_t)pp, sizeof *o->norder);
    o->pc = zt_calloc((size_t)pp, sizeof *o->pc), o->cur = zt_calloc((size_t)pp, sizeof *o->cur);
    /* per rank, per (peer, direction): its messages' action indices in issue order */
    int **chan = zt_calloc((size_t)pp, sizeof *chan), **off = zt_calloc((size_t)pp, sizeof *off);
    char what[48], other[48];
    int rc = 0;
    for (int r = 0; r < pp && rc == 0; r++) {
        const int n = s->n[r];
        o->order[r] = zt_malloc((size_t)(n + 1) * sizeof **o->order);
        o->partner[r] = zt_malloc((size_t)(n + 1) * sizeof **o->partner);
        o->posted[r] = zt_calloc((size_t)n + 1, sizeof **o->posted);
        o->seq[r] = zt_malloc((size_t)(n + 1) * sizeof **o->seq);
        o->norder[r] = zt_schedule_issue_order(s, r, o->order[r]);
        off[r] = zt_calloc((size_t)2 * pp + 1, sizeof **off);
        int *cnt = zt_calloc((size_t)2 * pp, sizeof *cnt);
        for (int k = 0; k < o->norder[r] && rc == 0; k++) {
            const zt_action_t *a = &s->a[r][o->order[r][k]];
            zt_action_format(a, what, sizeof what);
            if (a->peer < 0 || a->peer >= pp || a->peer == r)
                rc = zt_err(err, errlen, "rank %d: %s names no other rank", r, what);
            else o->seq[r][o->order[r][k]] = cnt[2 * a->peer + zt_action_is_send(a)]++;
        }
        for (int c = 0; c < 2 * pp; c++) off[r][c + 1] = off[r][c] + cnt[c];
        chan[r] = zt_malloc((size_t)(off[r][2 * pp] + 1) * sizeof **chan);
        for (int k = 0; k < o->norder[r] && rc == 0; k++) {
            const int i = o->order[r][k];
            const zt_action_t *a = &s->a[r][i];
            chan[r][off[r][2 * a->peer + zt_action_is_send(a)] + o->seq[r][i]] = i;
        }
        free(cnt);
    }
    for (int r = 0; r < pp && rc == 0; r++)
        for (int k = 0; k < o->norder[r] && rc == 0; k++) {
            const int i = o->order[r][k], q = s->a[r][i].peer, c = 2 * r + !zt_action_is_send(&s->a[r][i]);
            zt_action_format(&s->a[r][i], what, sizeof what);
            if (off[q][c] + o->seq[r][i] >= off[q][c + 1]) {
                rc = zt_err(err, errlen, "rank %d: %s has no partner on rank %d (message %d of the pair)", r, what, q,
                            o->seq[r][i] + 1);
                break;
            }
            const int j = chan[q][off[q][c] + o->seq[r][i]];
            if (zt_schedule_tag(s, &s->a[r][i]) != zt_schedule_tag(s, &s->a[q][j])) {
                zt_action_format(&s->a[q][j], other, sizeof other);
                rc = zt_err(err, errlen, "rank %d: %s would meet rank %d's %s (messages between two ranks match in "
                            "issue order)", r, what, q, other);
            }
            o->partner[r][i] = j;
        }
    for (int r = 0; r < pp; r++) free(chan[r]), free(off[r]);
    free(chan), free(off);
    return rc;
}

/* The end of rank r's batch at its current action (entries cur .. end of its order) */
static int batch_end(const ordered_t *o, int r)
{
    int e = o->cur[r];
    while (e < o->norder[r] && post_of(o->s, r, o->order[r][e]) == o->pc[r]) e++;
    return e;
}

/* A stuck rank r's send whose receive is not posted: that receive, and every receive of
 * the same channel before it not yet posted, join the batch the peer waits in (posted
 * there, in the channel's order, so the matching stays); 1 when one moved */
static int hoist(ordered_t *o, int r)
{
    zt_schedule_t *s = o->s;
    for (int k = o->cur[r], e = batch_end(o, r); k < e; k++) {
        const int i = o->order[r][k], q = s->a[r][i].peer, j = o->partner[r][i];
        if (!zt_action_is_send(&s->a[r][i]) || o->posted[q][j]) continue;
        for (int x = 0; x <= j; x++) {
            const zt_action_t *b = &s->a[q][x];
            if (is_message(b) && !zt_action_is_send(b) && b->peer == r && !o->posted[q][x])
                s->post[q][x] = o->pc[q], o->posted[q][x] = 1;
        }
        o->norder[q] = zt_schedule_issue_order(s, q, o->order[q]); /* entries before cur keep their places */
        return 1;
    }
    return 0;
}

/* Runs the lists: a rank posts the batch at its action and moves on once every partner of
 * it is posted; a compute (or R) is done once reached. repair: a deadlock moves receives
 * (hoist) while it can. 0, or -1 with the deadlock in err. */
static int ordered_run(ordered_t *o, int repair, char *err, size_t errlen)
{
    const zt_schedule_t *s = o->s;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < s->pp; r++)
            while (o->pc[r] < s->n[r]) {
                const int e = batch_end(o, r);
                int ready = 1;
                for (int k = o->cur[r]; k < e; k++) {
                    const int i = o->order[r][k];
                    if (!o->posted[r][i]) o->posted[r][i] = 1, moved = 1;
                    ready &= o->posted[s->a[r][i].peer][o->partner[r][i]];
                }
                if (!ready) break;
                o->cur[r] = e, o->pc[r]++, moved = 1;
            }
        for (int r = 0; repair && !moved && r < s->pp; r++)
            if (o->pc[r] < s->n[r]) moved = hoist(o, r);
    }
    for (int r = 0; r < s->pp; r++)
        if (o->pc[r] < s->n[r]) {
            char batch[256];
            size_t at = 0;
            batch[0] = '\0';
            for (int k = o->cur[r], e = batch_end(o, r); k < e && at + 1 < sizeof batch; k++) {
                if (k > o->cur[r]) batch[at++] = ' ', batch[at] = '\0';
                const int w = zt_action_format(&s->a[r][o->order[r][k]], batch + at, sizeof batch - at);
                at = ZT_MIN(at + (size_t)(w > 0 ? w : 0), sizeof batch - 1);
            }
            return zt_err(err, errlen, "deadlock in issue order: rank %d waits at batch [%s] (action %d of %d)", r,
                          batch, o->pc[r] + 1, s->n[r]);
        }
    return 0;
}

int zt_schedule_plan_in_order(zt_schedule_t *s, char *err, size_t errlen)
{
    free_post(s);
    int **post = zt_calloc((size_t)s->pp, sizeof *post);
    for (int r = 0; r < s->pp; r++) {
        post[r] = zt_malloc((size_t)(s->n[r] + 1) * sizeof **post);
        for (int i = 0; i < s->n[r]; i++) post[r][i] = is_message(&s->a[r][i]) ? post_of(s, r, i) : -1;
    }
    s->post = post;
    ordered_t o;
    int rc = ordered_init(&o, s, err, errlen);
    if (rc == 0) rc = ordered_run(&o, 1, err, errlen);
    ordered_free(&o);
    if (rc) free_post(s);
    return rc;
}

int zt_schedule_check_in_order(const zt_schedule_t *s, char *err, size_t errlen)
{
    char what[48];
    /* a planned message is issued no later than its action, and a send after the compute
     * that makes it (in the batch right before its action) */
    for (int r = 0; s->post && r < s->pp; r++)
        for (int i = 0; i < s->n[r]; i++) {
            if (!is_message(&s->a[r][i])) continue;
            const int first = run_first(s, r, i), p = s->post[r][i];
            if (p < 0 || p > i || (zt_action_is_send(&s->a[r][i]) && p < first)) {
                zt_action_format(&s->a[r][i], what, sizeof what);
                return zt_err(err, errlen, "rank %d: %s issued before action %d", r, what, p + 1);
            }
        }
    ordered_t o;
    int rc = ordered_init(&o, (zt_schedule_t *)s, err, errlen); /* no repair: s stays as it is */
    if (rc == 0) rc = ordered_run(&o, 0, err, errlen);
    ordered_free(&o);
    return rc;
}
