/* zt_optim.c — learning-rate schedules and the clipping factor (formulas in zt_optim.h). */
#include "zt_optim.h"

#include <math.h>
#include <string.h>

int zt_sched_parse(const char *name)
{
    if (strcmp(name, "constant") == 0) return ZT_SCHED_CONSTANT;
    if (strcmp(name, "linear") == 0) return ZT_SCHED_LINEAR;
    if (strcmp(name, "cosine") == 0) return ZT_SCHED_COSINE;
    return -1;
}

double zt_lr_at(int sched, double lr, long warmup, double min_lr_ratio, long step, long total)
{
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (sched == ZT_SCHED_CONSTANT) return lr;
    const double floor_lr = min_lr_ratio * lr;
    long span = total - warmup;
    if (span < 1) span = 1;
    double p = (double)(step - warmup) / (double)span;
    if (p > 1.0) p = 1.0;
    if (sched == ZT_SCHED_LINEAR) return floor_lr + (lr - floor_lr) * (1.0 - p);
    return floor_lr + (lr - floor_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

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
