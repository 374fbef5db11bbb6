/* test_optim.c — every learning-rate schedule against transformers' get_scheduler
 * (tests/reference/schedules.json, made by make_schedule_fixtures.py), read through the
 * config keys a user sets; the warm-up ratio's rounding; the refusals; the clipping factor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zt_config.h"
#include "zt_optim.h"
#include "zt_test.h"

static void t_names(void)
{
    for (int t = 0; t < ZT_SCHED_COUNT; t++) CU_ASSERT_EQUAL(zt_sched_parse(zt_sched_name((zt_sched_type_t)t)), t);
    CU_ASSERT_EQUAL(zt_sched_parse("cosin"), -1);
    CU_ASSERT_EQUAL(zt_sched_parse("reduce_lr_on_plateau"), -1);
    CU_ASSERT_EQUAL(zt_sched_shape_parse("1-sqrt"), ZT_SHAPE_1_SQRT);
    CU_ASSERT_EQUAL(zt_sched_shape_parse("sqrt"), -1);
}

/* the config a case's keys make: optim.<kwarg>=value overrides on the defaults */
static int case_config(json_t *c, zt_config_t *cfg, char *err, size_t errlen)
{
    char buf[16][96], *ov[16];
    int n = 0;
    snprintf(buf[n++], 96, "optim.lr_scheduler_type=%s", json_string_value(json_object_get(c, "type")));
    snprintf(buf[n++], 96, "optim.learning_rate=%.17g", json_real_value(json_object_get(c, "lr")));
    snprintf(buf[n++], 96, "optim.warmup_steps=%lld", (long long)json_integer_value(json_object_get(c, "warmup_steps")));
    snprintf(buf[n++], 96, "optim.warmup_ratio=%.17g", json_number_value(json_object_get(c, "warmup_ratio")));
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(c, "kwargs"), k, v)
    {
        if (json_is_string(v)) snprintf(buf[n++], 96, "optim.%s=\"%s\"", k, json_string_value(v));
        else if (json_is_integer(v) && strstr(k, "steps")) snprintf(buf[n++], 96, "optim.%s=%lld", k, (long long)json_integer_value(v));
        else snprintf(buf[n++], 96, "optim.%s=%.17g", k, json_number_value(v));
    }
    for (int i = 0; i < n; i++) ov[i] = buf[i];
    return zt_config_parse(cfg, "", "schedules.json", n, ov, err, errlen);
}

static void t_transformers(void)
{
    json_error_t je;
    json_t *doc = json_load_file(ZT_SRCDIR "/tests/reference/schedules.json", 0, &je);
    CU_ASSERT_PTR_NOT_NULL_FATAL(doc);
    json_t *cases = json_object_get(doc, "cases");
    size_t i, checked = 0, types = 0;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        zt_config_t cfg;
        char err[512];
        if (case_config(c, &cfg, err, sizeof err) != 0) {
            printf("\n    case %zu: %s\n", i, err);
            CU_FAIL("a fixture case is refused");
            continue;
        }
        zt_lr_schedule_t s;
        const long S = (long)json_integer_value(json_object_get(c, "S"));
        CU_ASSERT_EQUAL_FATAL(zt_config_lr_schedule(&cfg, S, &s, err, sizeof err), 0);
        CU_ASSERT_EQUAL(s.warmup, json_integer_value(json_object_get(c, "W")));
        types |= 1u << s.type;
        json_t *lrs = json_object_get(c, "lrs");
        for (size_t k = 0; k < json_array_size(lrs); k++) {
            const double want = json_real_value(json_array_get(lrs, k)), got = zt_lr_at(&s, (long)k);
            /* the same double operations as transformers' lambdas: bit for bit */
            if (got != want) {
                printf("\n    %s W=%ld step %zu: %.17g, transformers %.17g\n", zt_sched_name(s.type), s.warmup, k, got,
                       want);
                CU_FAIL("learning rate differs from transformers'");
            }
            checked++;
        }
    }
    printf("(%zu learning rates) ", checked);
    CU_ASSERT_EQUAL(types, (1u << ZT_SCHED_COUNT) - 1); /* every type has a case */
    CU_ASSERT(checked >= 300);
    json_decref(doc);
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

static int refused(const char *a, const char *b, const char *want)
{
    zt_config_t cfg;
    char err[512] = "", *ov[2] = {(char *)a, (char *)b};
    int rc = zt_config_parse(&cfg, "", "in.cfg", b ? 2 : 1, ov, err, sizeof err);
    if (rc == 0 || !strstr(err, want)) {
        printf("\n    %s %s: rc %d, '%s' (want '%s')\n", a, b ? b : "", rc, err, want);
        return 0;
    }
    return 1;
}

static void t_refusals(void)
{
    CU_ASSERT(refused("optim.lr_scheduler_type=reduce_lr_on_plateau", NULL, "optim.lr_scheduler_type"));
    CU_ASSERT(refused("optim.lr_scheduler_type=cosine", "optim.power=2", "optim.power is not an argument of "
                                                                         "lr_scheduler_type cosine"));
    CU_ASSERT(refused("optim.lr_scheduler_type=linear", "optim.num_cycles=1", "optim.num_cycles is not an argument"));
    CU_ASSERT(refused("optim.lr_scheduler_type=cosine", "optim.min_lr_ratio=0.1", "use lr_scheduler_type = "
                                                                                  "\"cosine_with_min_lr\""));
    CU_ASSERT(refused("optim.lr_scheduler_type=cosine_with_min_lr", NULL, "needs exactly one of optim.min_lr"));
    CU_ASSERT(refused("optim.min_lr=1e-5", "optim.lr_scheduler_type=cosine_with_min_lr optim.min_lr_rate=0.1",
                      "optim.lr_scheduler_type")); /* a malformed override names the key */
    CU_ASSERT(refused("optim.lr_scheduler_type=warmup_stable_decay", NULL, "needs optim.num_decay_steps"));
    CU_ASSERT(refused("optim.lr_scheduler_type=constant", "optim.warmup_steps=3", "use \"constant_with_warmup\""));
    CU_ASSERT(refused("optim.lr_scheduler_type=polynomial", "optim.lr_end=0.1", "must be smaller than "
                                                                                "optim.learning_rate"));
    CU_ASSERT(refused("optim.warmup_type=cosine", NULL, "optim.warmup_type is not an argument of lr_scheduler_type "
                                                        "linear"));
    /* and a run-time one: a polynomial decay with no step left after its warm-up */
    zt_config_t cfg;
    char err[512], *ov[] = {"optim.lr_scheduler_type=polynomial", "optim.warmup_steps=12"};
    CU_ASSERT_EQUAL_FATAL(zt_config_parse(&cfg, "", "in.cfg", 2, ov, err, sizeof err), 0);
    zt_lr_schedule_t s;
    CU_ASSERT_EQUAL(zt_config_lr_schedule(&cfg, 12, &s, err, sizeof err), -1);
    CU_ASSERT(strstr(err, "no steps to decay over") != NULL);
    CU_ASSERT_EQUAL(zt_config_lr_schedule(&cfg, 13, &s, err, sizeof err), 0);
}

static void t_clip(void)
{
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(0.5, 1.0), 1.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(zt_clip_scale(1e9, 0.0), 1.0, 0); /* 0 = clipping off */
}

static const zt_test_t tests[] = {{"schedule names", t_names},
                                  {"every schedule = transformers' get_scheduler", t_transformers},
                                  {"warmup ratio", t_warmup_ratio},
                                  {"schedule refusals", t_refusals},
                                  {"clip factor", t_clip},
                                  {NULL, NULL}};
ZT_TEST_MAIN("optim", tests)
