/* test_optim.c — learning-rate schedules and clipping factor against hand-computed values. */
#include <math.h>

#include "zt_optim.h"
#include "zt_test.h"

static void t_parse(void)
{
    CU_ASSERT_EQUAL(zt_sched_parse("constant"), ZT_SCHED_CONSTANT);
    CU_ASSERT_EQUAL(zt_sched_parse("linear"), ZT_SCHED_LINEAR);
    CU_ASSERT_EQUAL(zt_sched_parse("cosine"), ZT_SCHED_COSINE);
    CU_ASSERT_EQUAL(zt_sched_parse("cosin"), -1);
}

static void t_warmup(void)
{
    /* linear warmup reaches the base lr at the last warmup step */
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, 1e-3, 4, 0.1, 0, 100), 2.5e-4, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, 1e-3, 4, 0.1, 3, 100), 1e-3, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_CONSTANT, 1e-3, 0, 0.1, 50, 100), 1e-3, 1e-12);
}

/* optim.warmup_ratio: the values of transformers' get_warmup_steps,
 * math.ceil(num_training_steps * warmup_ratio), computed with Python */
static void t_warmup_ratio(void)
{
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.1, 375), 38);
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.5, 12), 6);
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.07, 100), 8); /* 7.000000000000001: not rounded to 7 */
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.28, 375), 106);
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.01, 3), 1);
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 1.0, 7), 7);
    CU_ASSERT_EQUAL(zt_warmup_steps(0, 0.0, 100), 0);
    CU_ASSERT_EQUAL(zt_warmup_steps(5, 0.0, 100), 5);
    CU_ASSERT_EQUAL(zt_warmup_steps(5, 0.5, 100), 5); /* warmup_steps > 0 wins, as in transformers */
}

static void t_cosine(void)
{
    /* W=10, S=110: p=0.5 at step 60 -> floor + (lr-floor)/2 */
    double lr = 1.0, fl = 0.1;
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, lr, 10, fl, 10, 110), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, lr, 10, fl, 60, 110), 0.55, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, lr, 10, fl, 110, 110), 0.1, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_COSINE, lr, 10, fl, 35, 110),
                           0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
}

static void t_linear(void)
{
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_LINEAR, 2.0, 0, 0.0, 25, 100), 1.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(zt_lr_at(ZT_SCHED_LINEAR, 2.0, 0, 0.5, 100, 100), 1.0, 1e-12);
}

static void t_clip(void)
{
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(0.5, 1.0), 1.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(1e9, 0.0), 1.0, 0); /* 0 = clipping off */
}

static const zt_test_t tests[] = {
    {"schedule names", t_parse}, {"warmup", t_warmup}, {"warmup ratio", t_warmup_ratio}, {"cosine", t_cosine},
    {"linear", t_linear}, {"clip factor", t_clip}, {NULL, NULL}};
ZT_TEST_MAIN("optim", tests)
