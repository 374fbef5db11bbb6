/* zt_optim.h — learning-rate schedules as transformers has them, and the clipping factor
 * (AdamW itself is a backend kernel run by the shard engine on the owned shard).
 *
 * Every schedule is transformers' get_scheduler(name, num_warmup_steps=W,
 * num_training_steps=S, scheduler_specific_kwargs): a LambdaLR, so optimizer step k
 * (k = 0 for the first step, counting only steps the optimizer took) runs at
 * lr * lambda(k), with lambda(k) = k / max(1, W) during warm-up: the first step has
 * learning rate 0 and the peak comes at step W + 1 (1-based). The formulas, each as
 * transformers/optimization.py writes it, are in zt_optim.c; a float64 replay of that file
 * made the fixture tests/reference/schedules.json that test_optim checks every type
 * against.
 *
 * Gradient clipping: scale = min(1, max_grad_norm / (norm + 1e-6)) (PyTorch). */
#ifndef ZT_OPTIM_H
#define ZT_OPTIM_H

/* transformers' SchedulerType values ztrain runs (reduce_lr_on_plateau and greedy follow
 * evaluation metrics and are refused by the config) */
typedef enum {
    ZT_SCHED_LINEAR,
    ZT_SCHED_COSINE,
    ZT_SCHED_COSINE_WITH_RESTARTS,
    ZT_SCHED_POLYNOMIAL,
    ZT_SCHED_CONSTANT,
    ZT_SCHED_CONSTANT_WITH_WARMUP,
    ZT_SCHED_INVERSE_SQRT,
    ZT_SCHED_COSINE_WITH_MIN_LR,
    ZT_SCHED_COSINE_WARMUP_WITH_MIN_LR,
    ZT_SCHED_WARMUP_STABLE_DECAY,
    ZT_SCHED_COUNT
} zt_sched_type_t;

/* warmup_stable_decay's warmup_type / decay_type */
typedef enum { ZT_SHAPE_LINEAR, ZT_SHAPE_COSINE, ZT_SHAPE_1_SQRT } zt_sched_shape_t;

/* The scheduler's keyword arguments (transformers' lr_scheduler_kwargs), each a bit: which
 * ones a type takes is zt_sched_kwargs(type). */
enum {
    ZT_KW_NUM_CYCLES = 1 << 0,
    ZT_KW_POWER = 1 << 1,
    ZT_KW_LR_END = 1 << 2,
    ZT_KW_TIMESCALE = 1 << 3,
    ZT_KW_MIN_LR = 1 << 4,
    ZT_KW_MIN_LR_RATE = 1 << 5,
    ZT_KW_WARMUP_LR_RATE = 1 << 6,
    ZT_KW_NUM_STABLE_STEPS = 1 << 7,
    ZT_KW_NUM_DECAY_STEPS = 1 << 8,
    ZT_KW_WARMUP_TYPE = 1 << 9,
    ZT_KW_DECAY_TYPE = 1 << 10,
    ZT_KW_MIN_LR_RATIO = 1 << 11,
};

/* One run's schedule, resolved: what get_scheduler would build. */
typedef struct zt_lr_schedule {
    zt_sched_type_t type;
    double lr;              /* the optimizer's learning rate (LambdaLR's base_lr) */
    long warmup, total;     /* num_warmup_steps, num_training_steps */
    double num_cycles;      /* cosine family, wsd's cosine decay */
    double power, lr_end;   /* polynomial */
    double timescale;       /* inverse_sqrt */
    double min_lr_rate;     /* cosine_with_min_lr, cosine_warmup_with_min_lr */
    double warmup_lr_rate;  /* cosine_warmup_with_min_lr; < 0 = None */
    long num_stable, num_decay; /* warmup_stable_decay */
    zt_sched_shape_t warmup_shape, decay_shape;
    double min_lr_ratio;    /* warmup_stable_decay */
} zt_lr_schedule_t;

/* transformers' name of a type, and back (-1 if unknown) */
const char *zt_sched_name(zt_sched_type_t t);
int zt_sched_parse(const char *name);
/* the ZT_KW_* bits a type takes (transformers raises TypeError on any other) */
unsigned zt_sched_kwargs(zt_sched_type_t t);
/* "linear" | "cosine" | "1-sqrt" -> zt_sched_shape_t, -1 if unknown */
int zt_sched_shape_parse(const char *name);

/* lr at optimizer step `step` (0-based: the optimizer steps already taken) */
double zt_lr_at(const zt_lr_schedule_t *s, long step);
/* The warm-up W of a run of total steps: warmup_steps when > 0, else ceil(total * ratio)
 * in doubles, as transformers' get_warmup_steps (100 steps at 0.07 warm up for 8: the
 * product is 7.000000000000001). */
long zt_warmup_steps(long warmup_steps, double warmup_ratio, long total);
double zt_clip_scale(double grad_norm, double max_norm);

#endif
