/* test_step.c — step schedules as data: the lists each schedule gives every pipeline
 * rank, printed and checked (order, counts, every send received, no deadlock in a
 * simulated run), the micro-batches each holds in flight (1F1B: at most pp on rank 0,
 * GPipe: all of them), the checker catching a deadlock and a send before its compute,
 * DPO's reference forwards inserted into every schedule, and the stream-ordered (NCCL) issue
 * plan of every schedule checked deadlock-free, with its checker catching faults. */
#include "zt_step.h"
#include "zt_test.h"

#include <stdio.h>
#include <string.h>

static char err[256], text[8192];

static zt_schedule_t build(zt_pp_schedule_t kind, int pp, int v, int M)
{
    zt_schedule_t s;
    err[0] = '\0';
    const int rc = zt_schedule_build(&s, kind, pp, v, M, err, sizeof err);
    if (rc) printf("\n  build: %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return s;
}

static void print(const zt_schedule_t *s, const char *name)
{
    printf("\n  %s pp %d v %d M %d:", name, s->pp, s->v, s->micro);
    for (int r = 0; r < s->pp; r++) {
        zt_schedule_format(s, r, text, sizeof text);
        printf("\n    rank %d: %s", r, text);
    }
}

#define EXPECT_LIST(s, r, want)                                                           \
    do {                                                                                  \
        zt_schedule_format(&(s), r, text, sizeof text);                                   \
        CU_ASSERT_STRING_EQUAL(text, want);                                               \
        if (strcmp(text, want)) printf("\n  rank %d\n  want %s\n  got  %s\n", r, want, text); \
    } while (0)

static int count(const zt_schedule_t *s, int r, zt_action_kind_t k)
{
    int n = 0;
    for (int i = 0; i < s->n[r]; i++) n += s->a[r][i].kind == k;
    return n;
}

/* pp = 1: the one-stage step, whatever the schedule's name */
static void t_one_stage(void)
{
    for (int k = ZT_PP_GPIPE; k <= ZT_PP_INTERLEAVED_1F1B; k++) {
        zt_schedule_t s = build(k, 1, 2, 3);
        EXPECT_LIST(s, 0, "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 R");
        int in[1];
        CU_ASSERT_EQUAL(zt_schedule_check(&s, in, err, sizeof err), 0);
        CU_ASSERT_EQUAL(in[0], 1);
        zt_schedule_free(&s);
    }
}

static void t_gpipe(void)
{
    zt_schedule_t s = build(ZT_PP_GPIPE, 2, 1, 3);
    print(&s, "gpipe");
    EXPECT_LIST(s, 0, "F0.0 SA0.0>1 F1.0 SA1.0>1 F2.0 SA2.0>1 RG0.0<1 B0.0 RG1.0<1 B1.0 RG2.0<1 B2.0 R");
    EXPECT_LIST(s, 1, "RA0.1<0 F0.1 RA1.1<0 F1.1 RA2.1<0 F2.1 B0.1 SG0.1>0 B1.1 SG1.1>0 B2.1 SG2.1>0 R");
    int in[2];
    CU_ASSERT_EQUAL(zt_schedule_check(&s, in, err, sizeof err), 0);
    CU_ASSERT(in[0] == 3 && in[1] == 3); /* every micro-batch at once, on every stage */
    zt_schedule_free(&s);
}

static void t_1f1b(void)
{
    zt_schedule_t s = build(ZT_PP_1F1B, 2, 1, 4);
    print(&s, "1f1b");
    EXPECT_LIST(s, 0, "F0.0 SA0.0>1 F1.0 SA1.0>1 RG0.0<1 B0.0 F2.0 SA2.0>1 RG1.0<1 B1.0 F3.0 SA3.0>1 RG2.0<1 B2.0 "
                      "RG3.0<1 B3.0 R");
    EXPECT_LIST(s, 1, "RA0.1<0 F0.1 B0.1 SG0.1>0 RA1.1<0 F1.1 B1.1 SG1.1>0 RA2.1<0 F2.1 B2.1 SG2.1>0 RA3.1<0 F3.1 "
                      "B3.1 SG3.1>0 R");
    zt_schedule_free(&s);
}

/* every schedule over a range of sizes: the simulation passes, counts are right, and the
 * micro-batches in flight are GPipe's M, 1F1B's min(pp - r, M) */
static void t_sizes(void)
{
    for (int k = ZT_PP_GPIPE; k <= ZT_PP_INTERLEAVED_1F1B; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int v = 1; v <= (k == ZT_PP_INTERLEAVED_1F1B ? 3 : 1); v++)
                for (int M = 1; M <= 16; M++) {
                    if (k == ZT_PP_INTERLEAVED_1F1B && M % pp) continue;
                    zt_schedule_t s = build(k, pp, v, M);
                    int in[8], sends = 0, recvs = 0;
                    const int rc = zt_schedule_check(&s, in, err, sizeof err);
                    if (rc) print(&s, "failing"), printf("\n  %s\n", err);
                    CU_ASSERT_EQUAL_FATAL(rc, 0);
                    for (int r = 0; r < pp; r++) {
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_FWD), M * v);
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_BWD), M * v);
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_REDUCE), 1);
                        CU_ASSERT_EQUAL(s.a[r][s.n[r] - 1].kind, ZT_ACT_REDUCE);
                        sends += count(&s, r, ZT_ACT_SEND_ACT) + count(&s, r, ZT_ACT_SEND_GRAD);
                        recvs += count(&s, r, ZT_ACT_RECV_ACT) + count(&s, r, ZT_ACT_RECV_GRAD);
                        if (k == ZT_PP_GPIPE) CU_ASSERT_EQUAL(in[r], M);
                        if (k == ZT_PP_1F1B) CU_ASSERT_EQUAL(in[r], M < pp - r ? M : pp - r);
                    }
                    /* one activation and one gradient per micro-batch across each boundary */
                    CU_ASSERT_EQUAL(sends, 2 * M * (pp * v - 1));
                    CU_ASSERT_EQUAL(recvs, sends);
                    if (k == ZT_PP_1F1B && M >= pp) CU_ASSERT_EQUAL(in[0], pp);
                    zt_schedule_free(&s);
                }
}

/* Megatron's interleaved order at pp 2, v 2, M 4: rank r holds stages r and r + 2 */
static void t_interleaved(void)
{
    zt_schedule_t s = build(ZT_PP_INTERLEAVED_1F1B, 2, 2, 4);
    print(&s, "interleaved_1f1b");
    CU_ASSERT_EQUAL(s.stages, 4);
    EXPECT_LIST(s, 0, "F0.0 SA0.0>1 F1.0 SA1.0>1 RA0.2<1 F0.2 SA0.2>1 RA1.2<1 F1.2 SA1.2>1 F2.0 SA2.0>1 RG0.2<1 "
                      "B0.2 SG0.2>1 F3.0 SA3.0>1 RG1.2<1 B1.2 SG1.2>1 RA2.2<1 F2.2 SA2.2>1 RG0.0<1 B0.0 "
                      "RA3.2<1 F3.2 SA3.2>1 RG1.0<1 B1.0 RG2.2<1 B2.2 SG2.2>1 RG3.2<1 B3.2 SG3.2>1 RG2.0<1 B2.0 "
                      "RG3.0<1 B3.0 R");
    int in[2];
    CU_ASSERT_EQUAL(zt_schedule_check(&s, in, err, sizeof err), 0);
    printf("\n  in flight: rank 0 %d, rank 1 %d", in[0], in[1]);
    CU_ASSERT(in[0] < 2 * 4); /* fewer than GPipe's M v */
    zt_schedule_free(&s);
}

/* model slots: a micro-batch's activations from its first action on a rank to its last
 * backward there: one for the one-stage step, pp - r under 1F1B, M under GPipe */
static void t_slots(void)
{
    int slot[8];
    zt_schedule_t s = build(ZT_PP_1F1B, 1, 1, 4);
    CU_ASSERT_EQUAL(zt_schedule_slots(&s, 0, slot), 1);
    CU_ASSERT(slot[0] == 0 && slot[3] == 0);
    zt_schedule_free(&s);
    s = build(ZT_PP_1F1B, 2, 1, 4);
    CU_ASSERT_EQUAL(zt_schedule_slots(&s, 0, slot), 2);
    CU_ASSERT(slot[0] == 0 && slot[1] == 1 && slot[2] == 0 && slot[3] == 1);
    CU_ASSERT_EQUAL(zt_schedule_slots(&s, 1, slot), 1);
    zt_schedule_free(&s);
    s = build(ZT_PP_GPIPE, 2, 1, 4);
    CU_ASSERT_EQUAL(zt_schedule_slots(&s, 0, slot), 4);
    CU_ASSERT_EQUAL(zt_schedule_slots(&s, 1, slot), 4);
    CU_ASSERT(slot[0] == 0 && slot[3] == 3);
    zt_schedule_free(&s);
    /* interleaved: a micro-batch keeps its slot over both of the rank's stages */
    s = build(ZT_PP_INTERLEAVED_1F1B, 2, 2, 4);
    const int n = zt_schedule_slots(&s, 0, slot);
    printf("\n  interleaved pp 2 v 2 M 4: rank 0 uses %d slots", n);
    CU_ASSERT(n >= 2 && n <= 4);
    zt_schedule_free(&s);
}

static void t_refusals(void)
{
    zt_schedule_t s;
    CU_ASSERT_EQUAL(zt_schedule_build(&s, ZT_PP_INTERLEAVED_1F1B, 2, 2, 3, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "schedule interleaved_1f1b: the micro-batches (3) must be a multiple of the "
                                "pipeline ranks (2)");
    CU_ASSERT_EQUAL(zt_schedule_build(&s, ZT_PP_1F1B, 2, 2, 4, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "schedule: 2 stages per rank need the interleaved_1f1b schedule");
}

/* the checker itself: a deadlock (rank 0 waits for a gradient before sending the
 * activation that produces it), a send before its compute, a missing receive */
static void t_checker_faults(void)
{
    zt_schedule_t s = build(ZT_PP_1F1B, 2, 1, 1);
    EXPECT_LIST(s, 0, "F0.0 SA0.0>1 RG0.0<1 B0.0 R");
    zt_action_t *a = s.a[0], t = a[1];
    a[1] = a[2], a[2] = t; /* F0.0 RG0.0<1 SA0.0>1 B0.0 */
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "deadlock: rank 0 waits at RG0.0<1 (action 2 of 5)");
    a[2] = a[1], a[1] = t;
    t = a[0], a[0] = a[1], a[1] = t; /* SA0.0>1 F0.0 ... */
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "rank 0: SA0.0>1 before the compute that makes it");
    t = a[0], a[0] = a[1], a[1] = t;
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), 0);
    /* rank 1 drops its last send: rank 0 waits for it forever */
    s.n[1]--;
    s.a[1][s.n[1] - 1] = (zt_action_t){ZT_ACT_REDUCE, -1, -1, -1};
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "deadlock: rank 0 waits at RG0.0<1 (action 3 of 5)");
    s.n[1]++;
    zt_schedule_free(&s);
}

/* DPO's reference under a pipeline: its forwards (FR) and their messages (SR/RR) just before
 * each policy forward, on every schedule and size: the simulation passes, every stage runs
 * FR of every micro-batch once before F, the messages are the policy's activations' again,
 * and the slots and micro-batches in flight are the schedule's without a reference; pp 1
 * is left alone; the checker refuses a forward before its reference's */
static void t_reference(void)
{
    zt_schedule_t s = build(ZT_PP_1F1B, 2, 1, 2);
    zt_schedule_add_reference(&s);
    print(&s, "1f1b with a reference");
    EXPECT_LIST(s, 0, "FR0.0 SR0.0>1 F0.0 SA0.0>1 FR1.0 SR1.0>1 F1.0 SA1.0>1 RG0.0<1 B0.0 RG1.0<1 B1.0 R");
    EXPECT_LIST(s, 1, "RR0.1<0 FR0.1 RA0.1<0 F0.1 B0.1 SG0.1>0 RR1.1<0 FR1.1 RA1.1<0 F1.1 B1.1 SG1.1>0 R");
    CU_ASSERT_EQUAL(zt_schedule_messages(&s, 0), 6);
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), 0);
    zt_schedule_free(&s);
    for (int k = ZT_PP_GPIPE; k <= ZT_PP_INTERLEAVED_1F1B; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int v = 1; v <= (k == ZT_PP_INTERLEAVED_1F1B ? 3 : 1); v++)
                for (int M = 1; M <= 12; M++) {
                    if (k == ZT_PP_INTERLEAVED_1F1B && M % pp) continue;
                    zt_schedule_t p = build(k, pp, v, M);
                    s = build(k, pp, v, M);
                    zt_schedule_add_reference(&s);
                    int in[8], in0[8], slot[12], slot0[12], msgs = 0, msgs0 = 0;
                    const int rc = zt_schedule_check(&s, in, err, sizeof err);
                    if (rc) print(&s, "failing"), printf("\n  %s\n", err);
                    CU_ASSERT_EQUAL_FATAL(rc, 0);
                    CU_ASSERT_EQUAL(zt_schedule_check(&p, in0, err, sizeof err), 0);
                    for (int r = 0; r < pp; r++) {
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_REF_FWD), M * v);
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_SEND_REF), count(&s, r, ZT_ACT_SEND_ACT));
                        CU_ASSERT_EQUAL(count(&s, r, ZT_ACT_RECV_REF), count(&s, r, ZT_ACT_RECV_ACT));
                        CU_ASSERT_EQUAL(in[r], in0[r]);
                        CU_ASSERT_EQUAL(zt_schedule_slots(&s, r, slot), zt_schedule_slots(&p, r, slot0));
                        CU_ASSERT_EQUAL(memcmp(slot, slot0, (size_t)M * sizeof *slot), 0);
                        msgs += zt_schedule_messages(&s, r), msgs0 += zt_schedule_messages(&p, r);
                    }
                    /* a send and a receive more per micro-batch and boundary */
                    CU_ASSERT_EQUAL(msgs - msgs0, 2 * M * (pp * v - 1));
                    zt_schedule_free(&p);
                    zt_schedule_free(&s);
                }
    s = build(ZT_PP_GPIPE, 1, 1, 2);
    zt_schedule_add_reference(&s);
    CU_ASSERT_EQUAL(s.ref, 0);
    EXPECT_LIST(s, 0, "F0.0 B0.0 F1.0 B1.0 R");
    zt_schedule_free(&s);
    s = build(ZT_PP_1F1B, 2, 1, 1);
    zt_schedule_add_reference(&s);
    EXPECT_LIST(s, 0, "FR0.0 SR0.0>1 F0.0 SA0.0>1 RG0.0<1 B0.0 R");
    zt_action_t *a = s.a[0], t = a[0];
    a[0] = a[2], a[2] = t; /* F0.0 SR0.0>1 FR0.0 */
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "rank 0: F0.0 before the reference's forward of it");
    a[2] = a[0], a[0] = t;
    t = a[0], a[0] = a[1], a[1] = t; /* SR0.0>1 FR0.0 */
    CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "rank 0: SR0.0>1 before the compute that makes it");
    zt_schedule_free(&s);
}

/* Stream-ordered messages (NCCL): every schedule, pp 2 and 4, v 1 and 2, M = pp .. 2 pp + 1,
 * with and without the reference's actions, issued as zt_schedule_plan_in_order plans (a
 * batch between two computes, a receive moved into an earlier batch where the peer waits
 * for it) runs without a deadlock, its messages matched in issue order; 1F1B needs no
 * receive moved, the interleaved schedule's deeper warm-up does */
static void t_in_order(void)
{
    int moved[3] = {0, 0, 0}, stuck[3] = {0, 0, 0};
    for (int k = ZT_PP_GPIPE; k <= ZT_PP_INTERLEAVED_1F1B; k++)
        for (int pp = 2; pp <= 4; pp *= 2)
            for (int v = 1; v <= (k == ZT_PP_INTERLEAVED_1F1B ? 2 : 1); v++)
                for (int M = pp; M <= 2 * pp + 1; M++)
                    for (int ref = 0; ref < 2; ref++) {
                        if (k == ZT_PP_INTERLEAVED_1F1B && M % pp) continue;
                        zt_schedule_t s = build(k, pp, v, M);
                        if (ref) zt_schedule_add_reference(&s);
                        /* unplanned: each message in the batch between its computes */
                        stuck[k] += zt_schedule_check_in_order(&s, err, sizeof err) != 0;
                        int rc = zt_schedule_plan_in_order(&s, err, sizeof err);
                        if (rc == 0) rc = zt_schedule_check_in_order(&s, err, sizeof err);
                        if (rc) {
                            printf("\n  schedule %d, %s reference", k, ref ? "with" : "without");
                            print(&s, "failing in issue order");
                            printf("\n  %s\n", err);
                        }
                        CU_ASSERT_EQUAL_FATAL(rc, 0);
                        CU_ASSERT_EQUAL(zt_schedule_check(&s, NULL, err, sizeof err), 0);
                        for (int r = 0, mv; r < pp; r++) {
                            CU_ASSERT(zt_schedule_batches(&s, r, &mv) > 0);
                            moved[k] += mv;
                        }
                        zt_schedule_free(&s);
                    }
    /* 1F1B and GPipe run as batched; the interleaved schedule needs receives moved */
    CU_ASSERT_EQUAL(moved[ZT_PP_1F1B] + stuck[ZT_PP_1F1B] + moved[ZT_PP_GPIPE] + stuck[ZT_PP_GPIPE], 0);
    CU_ASSERT(moved[ZT_PP_INTERLEAVED_1F1B] > 0 && stuck[ZT_PP_INTERLEAVED_1F1B] > 0);
    printf("\n  interleaved: %d configurations would deadlock unplanned, %d receives moved", stuck[2], moved[2]);
    /* the faults it exists for: every receive posted at the step's start (MPI's order) holds
     * back the sends behind it; two messages of a pair swapped meet the wrong partners */
    zt_schedule_t s = build(ZT_PP_1F1B, 2, 1, 2);
    EXPECT_LIST(s, 0, "F0.0 SA0.0>1 F1.0 SA1.0>1 RG0.0<1 B0.0 RG1.0<1 B1.0 R");
    CU_ASSERT_EQUAL(zt_schedule_plan_in_order(&s, err, sizeof err), 0);
    CU_ASSERT_EQUAL(zt_schedule_check_in_order(&s, err, sizeof err), 0);
    s.post[0][4] = s.post[0][6] = 0;
    CU_ASSERT_EQUAL(zt_schedule_check_in_order(&s, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "deadlock in issue order: rank 0 waits at batch [RG0.0<1 RG1.0<1] (action 1 of 9)");
    s.post[0][3] = 0; /* a send before the forward that makes it */
    CU_ASSERT_EQUAL(zt_schedule_check_in_order(&s, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "rank 0: SA1.0>1 issued before action 1");
    zt_schedule_free(&s);
    s = build(ZT_PP_1F1B, 2, 1, 2);
    zt_action_t *a = s.a[1], t = a[3];
    EXPECT_LIST(s, 1, "RA0.1<0 F0.1 B0.1 SG0.1>0 RA1.1<0 F1.1 B1.1 SG1.1>0 R");
    a[3] = a[7], a[7] = t;
    CU_ASSERT_EQUAL(zt_schedule_check_in_order(&s, err, sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "rank 0: RG0.0<1 would meet rank 1's SG1.1>0 (messages between two ranks match in "
                                "issue order)");
    CU_ASSERT_EQUAL(zt_schedule_plan_in_order(&s, err, sizeof err), -1);
    CU_ASSERT_PTR_NULL(s.post);
    zt_schedule_free(&s);
}

static const zt_test_t tests[] = {
    {"one_stage", t_one_stage}, {"gpipe", t_gpipe}, {"1f1b", t_1f1b}, {"sizes", t_sizes},
    {"interleaved", t_interleaved}, {"slots", t_slots}, {"refusals", t_refusals}, {"checker_faults", t_checker_faults},
    {"reference", t_reference}, {"in_order", t_in_order}, {NULL, NULL},
};
ZT_TEST_MAIN("step", tests)
