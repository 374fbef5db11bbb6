/* test_pref.c — the preference losses (zt_pref.h) against LLaMA-Factory 0.9.5's trainer.
 *
 * tests/reference/pref/losses.json comes from tests/reference/make_pref_fixtures.py: the
 * trainer's own get_batch_loss_metrics on fixed float64 logits, per case the per-sequence
 * log-prob sums and counts it computed, its loss, metrics, and d loss / d sum (autograd).
 * Here: the loss and every metric to 1e-12 relative (accuracies to float32's rounding: the
 * trainer takes their mean in float32), the derivatives against the trainer's autograd and
 * against central finite differences of zt_pref_loss itself, and policy = reference; and the
 * reference pass's shared-prompt batch (zt_pref_ref.h): which positions it computes and the
 * maps to and from the full rows. */
#include "zt_pref.h"
#include "zt_pref_ref.h"
#include "zt_test.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static json_t *doc;

static json_t *fixture_cases(void)
{
    if (!doc) {
        json_error_t je;
        doc = json_load_file(ZT_SRCDIR "/tests/reference/pref/losses.json", 0, &je);
        if (!doc) printf("\n  losses.json:%d: %s\n", je.line, je.text);
    }
    return doc ? json_object_get(doc, "cases") : NULL;
}

#define NP 8 /* pairs at most */

typedef struct {
    zt_pref_cfg_t cfg;
    int n;
    double c[NP], r[NP], rc[NP], rr[NP], lc[NP], lr[NP], gc[NP], gr[NP], cnt[NP];
    zt_pref_batch_t b;
} one_case_t;

static void vec(json_t *o, const char *k, double *out, int n)
{
    json_t *a = json_object_get(o, k);
    for (int i = 0; i < n; i++) out[i] = a ? json_number_value(json_array_get(a, (size_t)i)) : 0.0;
}

static zt_pref_loss_t loss_of(const char *s)
{
    const char *names[] = {"sigmoid", "ipo", "hinge", "orpo", "simpo"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) return (zt_pref_loss_t)i;
    CU_FAIL("unknown loss in the fixture");
    return ZT_PREF_SIGMOID;
}

static void load(json_t *j, one_case_t *k)
{
    memset(k, 0, sizeof *k);
    k->cfg.loss = loss_of(json_string_value(json_object_get(j, "pref_loss")));
    k->cfg.beta = json_number_value(json_object_get(j, "beta"));
    k->cfg.ftx = json_number_value(json_object_get(j, "ftx"));
    k->cfg.label_smoothing = json_number_value(json_object_get(j, "label_smoothing"));
    k->cfg.simpo_gamma = json_number_value(json_object_get(j, "simpo_gamma"));
    k->n = (int)json_integer_value(json_object_get(j, "pairs"));
    CU_ASSERT_FATAL(k->n > 0 && k->n <= NP);
    vec(j, "policy_chosen", k->c, k->n);
    vec(j, "policy_rejected", k->r, k->n);
    vec(j, "ref_chosen", k->rc, k->n);
    vec(j, "ref_rejected", k->rr, k->n);
    vec(j, "len_chosen", k->lc, k->n);
    vec(j, "len_rejected", k->lr, k->n);
    vec(j, "logits_sum_chosen", k->gc, k->n);
    vec(j, "logits_sum_rejected", k->gr, k->n);
    for (int i = 0; i < k->n; i++) k->cnt[i] = json_number_value(json_object_get(j, "logits_count"));
    const int ref = zt_pref_uses_ref(k->cfg.loss);
    k->b = (zt_pref_batch_t){k->n, k->c, k->r, ref ? k->rc : NULL, ref ? k->rr : NULL, k->lc, k->lr,
                             k->gc, k->gr, k->cnt, k->cnt};
}

static int close_to(const char *what, int ci, double got, double want, double tol)
{
    if (zt_relerr(got, want, 1e-3) <= tol) return 1;
    printf("\n  case %d %s: %.17g, LLaMA-Factory %.17g\n", ci, what, got, want);
    return 0;
}

static void test_matches_llamafactory(void)
{
    json_t *cs = fixture_cases();
    CU_ASSERT_FATAL(cs && json_array_size(cs) >= 10);
    for (size_t ci = 0; ci < json_array_size(cs); ci++) {
        json_t *j = json_array_get(cs, ci);
        one_case_t k;
        load(j, &k);
        double met[ZT_PREF_NMETRICS], dc[NP], dr[NP], wc[NP], wr[NP];
        const double loss = zt_pref_loss(&k.cfg, &k.b, met, dc, dr);
        CU_ASSERT(close_to("loss", (int)ci, loss, json_number_value(json_object_get(j, "loss")), 1e-12));
        json_t *jm = json_object_get(j, "metrics");
        CU_ASSERT(json_object_size(jm) == (size_t)zt_pref_nmetrics(k.cfg.loss));
        for (int m = 0; m < zt_pref_nmetrics(k.cfg.loss); m++) {
            json_t *v = json_object_get(jm, zt_pref_metric_name(m));
            CU_ASSERT_FATAL(v != NULL);
            const double tol = m == ZT_PREF_REWARDS_ACCURACIES ? 1e-7 : 1e-12;
            CU_ASSERT(close_to(zt_pref_metric_name(m), (int)ci, met[m], json_number_value(v), tol));
        }
        vec(j, "dloss_dchosen", wc, k.n);
        vec(j, "dloss_drejected", wr, k.n);
        for (int i = 0; i < k.n; i++) {
            CU_ASSERT(close_to("d/dchosen", (int)ci, dc[i], wc[i], 1e-10));
            CU_ASSERT(close_to("d/drejected", (int)ci, dr[i], wr[i], 1e-10));
        }
    }
}

/* Central differences of the loss in each sequence's sum, step 1e-5 * (1 + |sum|) */
static void test_finite_differences(void)
{
    json_t *cs = fixture_cases();
    CU_ASSERT_FATAL(cs != NULL);
    for (size_t ci = 0; ci < json_array_size(cs); ci++) {
        one_case_t k;
        load(json_array_get(cs, ci), &k);
        double dc[NP], dr[NP];
        zt_pref_loss(&k.cfg, &k.b, NULL, dc, dr);
        for (int side = 0; side < 2; side++)
            for (int i = 0; i < k.n; i++) {
                double *x = side ? &k.r[i] : &k.c[i];
                const double x0 = *x, h = 1e-5 * (1.0 + fabs(x0));
                *x = x0 + h;
                const double lp = zt_pref_loss(&k.cfg, &k.b, NULL, NULL, NULL);
                *x = x0 - h;
                const double lm = zt_pref_loss(&k.cfg, &k.b, NULL, NULL, NULL);
                *x = x0;
                const double fd = (lp - lm) / (2 * h), an = side ? dr[i] : dc[i];
                if (fabs(fd - an) > 1e-7 * (1.0 + fabs(an))) {
                    printf("\n  case %zu %s %d: analytic %.12g, finite differences %.12g\n", ci,
                           side ? "rejected" : "chosen", i, an, fd);
                    CU_FAIL("derivative off its finite differences");
                }
            }
    }
}

/* Sigmoid DPO at the first step (policy = reference): ln 2 exactly, margins and rewards 0,
 * and each sequence's weight -beta/2/n (chosen) and +beta/2/n (rejected). */
static void test_policy_is_reference(void)
{
    const double c[3] = {-12.5, -3.25, -40.0}, r[3] = {-7.0, -19.5, -2.0}, len[3] = {5, 9, 17};
    const zt_pref_cfg_t cfg = {ZT_PREF_SIGMOID, 0.1, 0.0, 0.0, 0.5};
    const zt_pref_batch_t b = {3, c, r, c, r, len, len, NULL, NULL, NULL, NULL};
    double met[ZT_PREF_NMETRICS], dc[3], dr[3];
    const double loss = zt_pref_loss(&cfg, &b, met, dc, dr);
    CU_ASSERT_EQUAL(loss, log(2.0));
    CU_ASSERT_EQUAL(met[ZT_PREF_REWARDS_MARGINS], 0.0);
    CU_ASSERT_EQUAL(met[ZT_PREF_REWARDS_CHOSEN], 0.0);
    CU_ASSERT_EQUAL(met[ZT_PREF_REWARDS_ACCURACIES], 0.0);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(dc[i], -0.1 * 0.5 / 3);
        CU_ASSERT_EQUAL(dr[i], 0.1 * 0.5 / 3);
    }
}

/* The reference's compact batch (zt_pref_ref.h) of two pairs of 8 positions: pair 0 shares a
 * 2-token prefix (position 2, the prompt's last, carries each row's first response target),
 * pair 1 none (its first ids differ); the positions after a row's last target are padding. */
static void test_shared_prompt_batch(void)
{
    enum { B = 4, T = 8 };
    const int32_t inp[B * T] = {10, 11, 12, 20, 21, 22, 0,  0, 10, 11, 12, 30, 31, 0, 0, 0,
                                40, 41, 42, 43, 0,  0,  0,  0, 50, 41, 42, 44, 45, 46, 47, 48};
    const int32_t tgt[B * T] = {-1, -1, 20, 21, 22, 99, -1, -1, -1, -1, 30, 31, 98, -1, -1, -1,
                                -1, 42, 43, 97, -1, -1, -1, -1, -1, -1, 44, 45, 46, 47, 48, 96};
    zt_pref_share_t sh;
    zt_pref_share_make(&sh, inp, tgt, B, T);
    /* row 0: 0..5; row 1: 2..4 (0, 1 from row 0); row 2: 0..3; row 3: 0..7 */
    CU_ASSERT_EQUAL(sh.n, 6 + 3 + 4 + 8);
    CU_ASSERT_EQUAL(sh.B, B);
    CU_ASSERT_EQUAL(sh.T, 6); /* ceil(21 / 4) */
    const int32_t full[B * T] = {0,  1,  2,  3,  4,  5,  -1, -1, 0,  1,  6,  7,  8,  -1, -1, -1,
                                 9,  10, 11, 12, -1, -1, -1, -1, 13, 14, 15, 16, 17, 18, 19, 20};
    for (int i = 0; i < B * T; i++) CU_ASSERT_EQUAL(sh.full[i], full[i]);
    for (int j = 0; j < sh.n; j++) {
        const int i = sh.own[j];
        CU_ASSERT_EQUAL(sh.full[i], j);
        CU_ASSERT_EQUAL(sh.row[j], i / T);
        CU_ASSERT_EQUAL(sh.pos[j], i % T);
        CU_ASSERT_EQUAL(sh.inp[j], inp[i]);
        CU_ASSERT_EQUAL(sh.tgt[j], tgt[i]);
    }
    for (int j = sh.n; j < sh.B * sh.T; j++) CU_ASSERT(sh.row[j] == -1 && sh.tgt[j] == -1);
    /* each row's sum of minus its tokens' losses */
    float loss[24];
    for (int j = 0; j < sh.B * sh.T; j++) loss[j] = sh.tgt[j] >= 0 ? 0.5f * (float)(j + 1) : 0.0f;
    double sum[B], want[B] = {0};
    zt_pref_share_sums(&sh, loss, B, sum);
    for (int j = 0; j < sh.n; j++) want[sh.row[j]] -= loss[j];
    for (int b = 0; b < B; b++) CU_ASSERT_EQUAL(sum[b], want[b]);
    CU_ASSERT_EQUAL(sum[1], -0.5 * (7 + 8 + 9));
    zt_pref_share_free(&sh);
}

static const zt_test_t tests[] = {
    {"loss, metrics and derivatives equal LLaMA-Factory's trainer", test_matches_llamafactory},
    {"derivatives equal finite differences", test_finite_differences},
    {"sigmoid with policy = reference: ln 2, margins 0", test_policy_is_reference},
    {"the reference's shared-prompt batch and its maps", test_shared_prompt_batch},
    {NULL, NULL},
};

ZT_TEST_MAIN("pref", tests)
