/* zt_train_internal.h — the training run's state, shared by the files of the train loop
 * (zt_train*.c and the step runners they call); not a public interface: include/zt_train.h is.
 * A function one of those files defines for another is declared here with the prefix zt_tr_. */
#ifndef ZT_TRAIN_INTERNAL_H
#define ZT_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zt_train.h"
#include "zt_backend.h"
#include "zt_comm.h"
#include "zt_config.h"
#include "zt_data.h"
#include "zt_model.h"
#include "zt_optim.h"
#include "zt_params.h"
#include "zt_plan.h"
#include "zt_shard.h"
#include "zt_step.h"

typedef struct hist { long *step; float *val; int n, cap; } hist_t;

/* The parts of a DPO micro-step, timed for the run's summary (the reference's share) */
typedef enum {
    PT_REF_BLOCKS, /* the reference's embedding and blocks */
    PT_REF_HEAD,   /* its head and per-sequence sums */
    PT_FWD,        /* the policy's embedding and blocks */
    PT_HEAD,       /* its head's forward and the sums (a frozen head: also its dL/dxf and backward) */
    PT_LOSS,       /* the loss and its per-token factors */
    PT_BWD,        /* the policy's backward (a trained head: its second pass too) */
    PT_N
} pref_part_t;

typedef struct run {
    const zt_config_t *cfg;
    zt_comm_t *comm;
    const zt_backend_t *be;
    zt_param_table_t *table;    /* the model's global tensors: checkpoints, HF directories, reports */
    zt_param_table_t *ltable;   /* this rank's tp share of it (= table without tp): engine, model */
    int drank;                  /* this rank's data-parallel position: which rows it reads */
    int Tm;                     /* positions the model runs of each sequence: T / sp */
    int32_t *row_tmp;           /* (3 T) sequence parallelism: a whole row before its chunk is taken */
    uint64_t *keys;             /* (A B Tm) lora.dropout's per-token counters (backend host memory) */
    float *tp_logits;           /* (V) a sampled row's logits where rank 0's are the ones used */
    /* generation's KV cache (generate.use_cache): on, the sequences it holds (kv_nseq:
     * generate.batch_size, and one more for the rounds a rank has nothing to run; slot
     * k holds kv_n[k] tokens of kv_tok + k T), the positions of a forward's tokens (T) */
    int kv_on, kv_nseq, gen_batch;
    int *kv_n, *kv_slot, *kv_past;
    int32_t *kv_tok, *kv_pos, *kv_inp; /* kv_inp (kv_nseq): a batch's new tokens */
    zt_model_t *model;
    zt_shard_t *shard;
    /* train.stage = dpo with full fine-tuning or pref.ref_model: the reference, a frozen
     * copy of a directory's weights sharded as the strategy shards frozen units (ref_create) */
    zt_shard_t *ref_shard;
    zt_param_table_t *ref_table;
    zt_dataset_t *train, *val;
    zt_shard_opts_t sopts;
    zt_parallel_plan_t plan;    /* the mesh and its options, strategy auto resolved */
    zt_schedule_t steps;        /* one optimizer step's actions per pipeline rank (zt_step.h) */
    int *micro_T;               /* (A) the positions each micro-batch runs (trim_padding) */
    int *micro_Tp;              /* (A) dpo under a pipeline: each micro-batch's padded length (pref_lf_rows) */
    int32_t **micro_seg;        /* (A) dpo under a pipeline: each micro-batch's segments (pref_lf_rows) */
    /* pp > 1: the models of this rank's slots (a micro-batch's activations from its first
     * action here to its last backward; models[0] = model), each micro-batch's slot, and
     * the step's messages in flight: its receives, posted at its start, then its sends,
     * each with a buffer of its own (freed at R) */
    zt_model_t **models;
    int nslots, *slot;
    zt_request_t *pp_req;
    /* pp > 1, over the run's steps: this rank's time in its schedule (the actions up to R),
     * blocked in receives (the bubble, and transfers not hidden) and in the sends' completion at R */
    double pp_span, pp_recv_wait, pp_send_wait;
    long pp_steps; /* the steps they are summed over: this run's after its first */
    int pp_warm;   /* the run's first schedule (warm-up, not summed) has run */
    /* pp > 1 with ZT_PP_TRACE=FILE in the environment: FILE.<world rank>, a line per action
     * of each step (step, the action as zt_action_format writes it, its start and end in
     * seconds from the step's start, the main thread's CPU seconds in it; R: the sends'
     * completion) for tools/pp-trace.py, which sums them per stage and phase; NULL otherwise */
    FILE *pp_trace;
    float **pp_buf;
    size_t pp_msg_bytes;        /* the most a step's message buffers held at once (all live until R) */
    unsigned char *held;        /* pp > 1: (nunits) the units of this rank's stages (sopts.held) */
    int B, T, A, dp, rank;
    long G, total_steps, step, samples_seen;
    zt_lr_schedule_t sched; /* transformers' schedule for total_steps (its warm-up: optim.warmup_steps, or
                             * optim.warmup_ratio of total_steps) */
    double tokens_seen;
    int32_t *inp, *tgt;     /* (A, B, T) host */
    int32_t *seg, *pos;     /* host, neat-packed rows' (NULL without): segments (A, B, T), positions (A, B, Tm) */
    int32_t *pref_seg;      /* host (A, B, T), dpo: each micro-batch's rows padded as LLaMA-Factory pads them (pref_lf_rows) */
    double flops_per_token, peak_flops;
    char *config_text;
    hist_t train_hist, val_hist;
    hist_t margin_hist;         /* train.stage = dpo: rewards/margins at each logged step */
    double pref_seconds[PT_N];  /* dpo: the micro-steps' time by part (pref_part_t) */
    double pref_cpu[PT_N];      /* and the main thread's CPU time (a loaded machine's figure) */
    double pref_ref_pos[2];     /* dpo: the reference's positions computed, and its rows' (pref.share_prompt) */
    /* pref.precompute_ref_log_probs: the reference's sums by pair (zt_pref_table.h, the same on
     * every rank); the step's pairs' records (G / 2, in the order of their global index) and the
     * sums this rank computed of them ((G / 2, 3): chosen, rejected, 1), shared after the step;
     * whether the step holds a pair the table lacks; the micro-batches that read the table
     * instead of a reference pass, and all of them */
    struct zt_pref_table *pref_table;
    int64_t *pref_rec;
    double *pref_new;
    int pref_step_new;
    long pref_table_micros[2];
    double train_seconds;
    float last_loss, last_val;
    zt_comm_stats_t comm_total; /* training collectives of the whole run (not eval, not saves) */
    int threads;                /* CPU threads per rank (train.threads resolved) */
    double loss_scale;          /* fp16: S (1 without fp16) */
    int dynamic_scale;          /* fp16 with train.loss_scale = 0 */
    long good_steps;            /* dynamic: steps since the last overflow or doubling */
    size_t rss0;                /* the process's resident memory before the model and the engine exist
                                 * (libraries, MPI, the data): what no estimate of ztrain's own counts */
} run_t;

typedef struct estimate {
    zt_shard_mem_t mem;
    zt_shard_mem_t ref;         /* DPO's frozen reference copy (zero without one) */
    size_t activations, kv, total;
    /* a step's bytes through the collectives and messages, as the dry step counted them
     * (zt_memplan_t.traffic): a 1-bit Adam compressed step's, and one of its warm-up
     * (equal without 1-bit Adam); by group (zt_group_id) the first */
    double traffic, traffic_warmup;
    double group_traffic[ZT_GRP_N];
} estimate_t;

/* Shared between the train loop's files (see each definition for what it does). */
void zt_tr_hist_push(hist_t *h, long step, float v);
void zt_tr_fill_opts(const zt_config_t *cfg, const zt_parallel_plan_t *p, zt_strategy_t st, zt_shard_opts_t *o);
unsigned char *zt_tr_stage_layers(const zt_parallel_plan_t *p, int L, int pp_rank);
void zt_tr_stage_opts(zt_shard_opts_t *o, const zt_parallel_plan_t *p, const zt_param_table_t *t, unsigned char *held);
zt_plan_shape_t zt_tr_shape_of(const zt_param_table_t *g);
size_t zt_tr_mem_total(const zt_shard_mem_t *m);
void zt_tr_mesh_local(zt_param_table_t *t, const zt_parallel_plan_t *p);
int zt_tr_has_ref_copy(const zt_config_t *cfg);
zt_param_table_t *zt_tr_ref_table_of(const zt_param_table_t *g, int tp, int rank, char *err, size_t errlen);
void zt_tr_estimate_rank(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g, const zt_param_table_t *t, zt_strategy_t st, int world, int shard_n, int pp_rank, estimate_t *e);
void zt_tr_estimate(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g, const zt_param_table_t *t, zt_strategy_t st, int world, int shard_n, estimate_t *e);
zt_strategy_t zt_tr_pick_auto(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_backend_t *be, const zt_param_table_t *g, const zt_param_table_t *t, int world, int per_node, char *why, size_t len);
int zt_tr_gen_batch_of(int batch, int T);
int zt_tr_kv_sequences(const zt_config_t *cfg, int sp, int tp_seq, int batch);
int zt_tr_check_fits(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_backend_t *be, const zt_param_table_t *g, const zt_param_table_t *t, zt_strategy_t st, const zt_comm_t *c, char *err, size_t errlen);
void zt_tr_dropout_keys(run_t *r, int m, uint64_t *keys);
int zt_tr_rows_trimmable(const run_t *r);
int zt_tr_trim_padding(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys);
int zt_tr_trim_rows(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys, int T);
void zt_tr_forward_range(run_t *r, zt_shard_t *s, zt_model_t *m, int l0, int l1, int adapters);
void zt_tr_backward_range(run_t *r, zt_model_t *m, int l0, int l1);
const float *zt_tr_forward_set_batch(run_t *r, zt_shard_t *s, int adapters);
const float *zt_tr_train_forward(run_t *r, zt_shard_t *s, const int32_t *inp, const int32_t *tgt, const int32_t *seg, const int32_t *pos, const uint64_t *keys, int adapters, int T);
void zt_tr_backward_from_head(run_t *r, float *droot);
float zt_tr_train_backward(run_t *r, const float *root, float dscale);
int zt_tr_token_row(const run_t *r, size_t i, int T);
int zt_tr_token_pos(const run_t *r, size_t i, int T);
int zt_tr_pref_lf_rows(run_t *r, int32_t *inp, int32_t *tgt, int mi, int32_t **seg, int *P);
void zt_tr_row_sums(run_t *r, const float *x, int tl, const int32_t *tgt, int T, double *sum, double *len);
void zt_tr_pref_lap(run_t *r, pref_part_t k, double *t);
double zt_tr_pref_policy_head(run_t *r, zt_model_t *m, const float *hw, int hu, const int32_t *tgt, int T, int Tp, const double *ref, float factor, double *metrics, double *now);
double zt_tr_pref_micro(run_t *r, int m, int32_t *inp, int32_t *tgt, float factor, double *metrics, int *Tout);
int zt_tr_pref_table_setup(run_t *r);
int zt_tr_pref_table_save(run_t *r, char *err, size_t errlen);
void zt_tr_pref_table_begin_step(run_t *r);
void zt_tr_pref_table_end_step(run_t *r);
int zt_tr_pref_table_resume(run_t *r, const char *ckpt, long step);
const float *zt_tr_forward_blocks(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, const int32_t *pos, int B, int T);
void zt_tr_sp_chunk(const run_t *r, const int32_t *row, int T, int b, int B, int32_t *dst);
int zt_tr_read_rows(run_t *r, zt_dataset_t *ds, int64_t g0, int shuffle, int32_t *inp, int32_t *tgt, int32_t *seg, int32_t *pos, char *err, size_t errlen);
long zt_tr_loss_tokens(const int32_t *tgt, size_t n);
size_t zt_tr_residual_floats(const run_t *r, int T);
float zt_tr_evaluate(run_t *r, int *failed);
void zt_tr_batch_logits(void *arg, int G, const int32_t *const *tokens, const int *n, float *logits);
void zt_tr_generation_begin(run_t *r, int batch);
void zt_tr_generation_end(run_t *r);
void zt_tr_generate_sample(run_t *r);
void zt_tr_write_plot(const run_t *r, const char *path);
int zt_tr_save_checkpoint(run_t *r);
int zt_tr_save_hf(run_t *r, int adapter);
int zt_tr_maybe_resume(run_t *r);
void zt_tr_startup_report(run_t *r);
void zt_tr_start_record(const run_t *r);
void zt_tr_format_eta(double s, char *buf, size_t len);
void zt_tr_fold_comm(run_t *r);
void zt_tr_comm_summary(const run_t *r);
int zt_tr_loss_scale_overflow(run_t *r);
int zt_tr_ref_create(run_t *r);
int zt_tr_build_steps(const zt_config_t *cfg, const zt_parallel_plan_t *p, int micro, zt_schedule_t *s, char *err, size_t len);
double zt_tr_run_schedule(run_t *r, int sft, float ds, float pf, double *pref_window, long *pref_micros, long *computed);
double zt_tr_run_pipeline(run_t *r, int sft, float ds, float pf, double *pref_window, long *pref_micros, long *computed);
size_t zt_tr_activation_bytes(const run_t *r);
double zt_tr_step_sum(run_t *r, double x);
void zt_tr_pp_summary(run_t *r);
void zt_tr_rank_memory(const run_t *r, zt_shard_mem_t *mm);
void zt_tr_stage_memory(run_t *r);
int zt_tr_open_data(run_t *r, char *err, size_t errlen);
void zt_tr_pref_reference(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, int T, double *ref, double *now);

#endif
