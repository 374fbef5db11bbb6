/* zt_optim.c — transformers' learning-rate schedules and the clipping factor.
 *
 * Each lambda is transformers/optimization.py's, in the same operations and the same
 * order (Python floats are C doubles), so lr * lambda(k) is the value torch's LambdaLR
 * hands AdamW, to the last bit. That needs no fused multiply-adds (the build's
 * -march=native would contract a * b + c into one, rounding once where Python rounds twice). */
#pragma GCC optimize("fp-contract=off")
#include "zt_optim.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    unsigned kwargs;
} types[ZT_SCHED_COUNT] = {
    [ZT_SCHED_LINEAR] = {"linear", 0},
    [ZT_SCHED_COSINE] = {"cosine", ZT_KW_NUM_CYCLES},
    [ZT_SCHED_COSINE_WITH_RESTARTS] = {"cosine_with_restarts", ZT_KW_NUM_CYCLES},
    [ZT_SCHED_POLYNOMIAL] = {"polynomial", ZT_KW_POWER | ZT_KW_LR_END},
    [ZT_SCHED_CONSTANT] = {"constant", 0},
    [ZT_SCHED_CONSTANT_WITH_WARMUP] = {"constant_with_warmup", 0},
    [ZT_SCHED_INVERSE_SQRT] = {"inverse_sqrt", ZT_KW_TIMESCALE},
    [ZT_SCHED_COSINE_WITH_MIN_LR] = {"cosine_with_min_lr", ZT_KW_NUM_CYCLES | ZT_KW_MIN_LR | ZT_KW_MIN_LR_RATE},
    [ZT_SCHED_COSINE_WARMUP_WITH_MIN_LR] = {"cosine_warmup_with_min_lr",
                                            ZT_KW_NUM_CYCLES | ZT_KW_MIN_LR | ZT_KW_MIN_LR_RATE |
                                                ZT_KW_WARMUP_LR_RATE},
    [ZT_SCHED_WARMUP_STABLE_DECAY] = {"warmup_stable_decay", ZT_KW_NUM_CYCLES | ZT_KW_NUM_STABLE_STEPS |
                                                                 ZT_KW_NUM_DECAY_STEPS | ZT_KW_WARMUP_TYPE |
                                                                 ZT_KW_DECAY_TYPE | ZT_KW_MIN_LR_RATIO},
};

const char *zt_sched_name(zt_sched_type_t t) { return (unsigned)t < ZT_SCHED_COUNT ? types[t].name : "?"; }

int zt_sched_parse(const char *name)
{
    for (int i = 0; i < ZT_SCHED_COUNT; i++)
        if (strcmp(name, types[i].name) == 0) return i;
    return -1;
}

unsigned zt_sched_kwargs(zt_sched_type_t t) { return (unsigned)t < ZT_SCHED_COUNT ? types[t].kwargs : 0; }

int zt_sched_shape_parse(const char *name)
{
    static const char *const shapes[] = {[ZT_SHAPE_LINEAR] = "linear", [ZT_SHAPE_COSINE] = "cosine",
                                         [ZT_SHAPE_1_SQRT] = "1-sqrt"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, shapes[i]) == 0) return i;
    return -1;
}

static double dmax(double a, double b) { return a > b ? a : b; }

/* every type's warm-up but cosine_warmup_with_min_lr's and wsd's:
 * float(current_step) / float(max(1, num_warmup_steps)) */
static double warmup_lambda(long k, long W) { return (double)k / (double)(W > 1 ? W : 1); }

/* float(current_step - W) / float(max(1, S - W)) */
static double progress_of(long k, long W, long S)
{
    long span = S - W;
    return (double)(k - W) / (double)(span > 1 ? span : 1);
}

static double wsd_lambda(const zt_lr_schedule_t *s, long k)
{
    const long W = s->warmup, stable = s->num_stable, decay = s->num_decay;
    const double r = s->min_lr_ratio;
    if (k < W) {
        double p = (double)k / (double)(W > 1 ? W : 1), f = p;
        if (s->warmup_shape == ZT_SHAPE_COSINE) f = 0.5 * (1.0 - cos(M_PI * p));
        else if (s->warmup_shape == ZT_SHAPE_1_SQRT) f = 1.0 - sqrt(1.0 - p);
        return dmax(0.0, f * (1.0 - r) + r);
    }
    if (k < W + stable) return 1.0;
    if (k < W + stable + decay) {
        double p = (double)(k - W - stable) / (double)(decay > 1 ? decay : 1), f = 1.0 - p;
        if (s->decay_shape == ZT_SHAPE_COSINE) f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * p));
        else if (s->decay_shape == ZT_SHAPE_1_SQRT) f = 1.0 - sqrt(p);
        return dmax(0.0, f * (1.0 - r) + r);
    }
    return r;
}

static double lambda_at(const zt_lr_schedule_t *s, long k)
{
    const long W = s->warmup, S = s->total;
    switch (s->type) {
    case ZT_SCHED_CONSTANT: return 1.0;
    case ZT_SCHED_WARMUP_STABLE_DECAY: return wsd_lambda(s, k);
    case ZT_SCHED_COSINE_WARMUP_WITH_MIN_LR: {
        const double kd = (double)k, Wd = (double)W, Sd = (double)S;
        if (kd < Wd) {
            if (s->warmup_lr_rate < 0) return (kd + 1.0) / dmax(1.0, Wd);
            return s->warmup_lr_rate + (1.0 - s->warmup_lr_rate) * kd / (double)(W - 1 > 1 ? W - 1 : 1);
        }
        double p = (kd - Wd + 1.0) / dmax(1.0, Sd - Wd);
        double f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * p));
        return dmax(0.0, f * (1 - s->min_lr_rate) + s->min_lr_rate);
    }
    default: break;
    }
    if (k < W) return s->type == ZT_SCHED_CONSTANT_WITH_WARMUP ? (double)k / dmax(1.0, (double)W)
                                                               : warmup_lambda(k, W);
    switch (s->type) {
    case ZT_SCHED_LINEAR: return dmax(0.0, (double)(S - k) / (double)(S - W > 1 ? S - W : 1));
    case ZT_SCHED_COSINE:
        return dmax(0.0, 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress_of(k, W, S))));
    case ZT_SCHED_COSINE_WITH_RESTARTS: {
        double p = progress_of(k, W, S);
        if (p >= 1.0) return 0.0;
        return dmax(0.0, 0.5 * (1.0 + cos(M_PI * fmod(s->num_cycles * p, 1.0))));
    }
    case ZT_SCHED_POLYNOMIAL: {
        if (k > S) return s->lr_end / s->lr;
        double range = s->lr - s->lr_end, rem = 1 - (double)(k - W) / (double)(S - W);
        return (range * pow(rem, s->power) + s->lr_end) / s->lr;
    }
    case ZT_SCHED_CONSTANT_WITH_WARMUP: return 1.0;
    case ZT_SCHED_INVERSE_SQRT: {
        double shift = s->timescale - (double)W;
        return 1.0 / sqrt(((double)k + shift) / s->timescale);
    }
    case ZT_SCHED_COSINE_WITH_MIN_LR: {
        double f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress_of(k, W, S)));
        return dmax(0.0, f * (1 - s->min_lr_rate) + s->min_lr_rate);
    }
    default: return 1.0;
    }
}

double zt_lr_at(const zt_lr_schedule_t *s, long step) { return s->lr * lambda_at(s, step); }

long zt_warmup_steps(long warmup_steps, double warmup_ratio, long total)
{
    if (warmup_steps > 0 || !(warmup_ratio > 0)) return warmup_steps;
    return (long)ceil((double)total * warmup_ratio);
}

double zt_clip_scale(double grad_norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0;
    double s = max_norm / (grad_norm + 1e-6);
    return s < 1.0 ? s : 1.0;
}
