/* zt_optim.h — learning-rate schedules (AdamW itself is a backend kernel run by
 * the shard engine on the owned shard).
 *
 * lr(step) for 0-based step s, warmup W, total S, base lr, floor = min_lr_ratio*lr:
 *   s < W:       lr * (s + 1) / W                       (linear warmup)
 *   constant:    lr
 *   linear:      floor + (lr - floor) * (1 - p)         p = (s - W) / max(1, S - W)
 *   cosine:      floor + (lr - floor) * 0.5 (1 + cos(pi p))
 * Gradient clipping: scale = min(1, max_grad_norm / (norm + 1e-6)) (PyTorch). */
#ifndef ZT_OPTIM_H
#define ZT_OPTIM_H

enum { ZT_SCHED_CONSTANT = 0, ZT_SCHED_LINEAR = 1, ZT_SCHED_COSINE = 2 };

int zt_sched_parse(const char *name);   /* -1 if unknown */
double zt_lr_at(int sched, double lr, long warmup, double min_lr_ratio, long step, long total);
/* The warm-up W of a run of total steps: warmup_steps when > 0, else ceil(total * ratio)
 * in doubles, as transformers' get_warmup_steps (100 steps at 0.07 warm up for 8: the
 * product is 7.000000000000001). */
long zt_warmup_steps(long warmup_steps, double warmup_ratio, long total);
double zt_clip_scale(double grad_norm, double max_norm);

#endif
