/* zt_train.c — the SPMD training loop (see zt_train.h).
 *
 * Sample order (the contract every strategy and world size shares): with G =
 * B * dp * A samples per optimizer step, step s covers global samples
 * [s*G, (s+1)*G) (offset by the resumed sampler position); micro-step m of rank
 * r takes rows g = base + m*(dp*B) + r*B + b, b < B. One rank with A' = A*dp
 * micro-steps therefore sees exactly the same samples per step, and each micro
 * gradient is scaled by 1/(B*T*A*dp) so the reduced sum is the global mean.
 *
 * fp16 loss scaling: the loss scale S multiplies that gradient scale, so every
 * gradient is S times the true one; the norm is divided by S and AdamW's gradient
 * factor becomes clip / S (the unscale costs no pass). S is a power of two in
 * dynamic mode, so scaling and unscaling are exact in fp32. An overflow (a finite
 * loss with a non-finite gradient anywhere, agreed collectively) skips the step on
 * every rank and halves S; loss_scale_window good steps in a row double it. The
 * learning-rate schedule follows optimizer steps (Adam t), so a skipped step does
 * not advance it, as in DeepSpeed and the HF Trainer.
 *
 * This file sets a run up, runs its loop and tears it down. The loop's other concerns
 * live beside it, sharing the run's state (run_t, zt_train_internal.h): preference
 * training's micro-step and its reference table (zt_train_pref.c), the memory
 * estimate, the auto mesh and the fits check (zt_train_estimate.c), a micro-batch's
 * passes, evaluation and the loss scale (zt_train_micro.c), generation's logits
 * callbacks and KV cache (zt_train_gen.c), checkpoints, HF export and resume
 * (zt_train_ckpt.c), the start-up report, metrics records and summaries
 * (zt_train_report.c), the datasets and the rows a rank reads (zt_train_data.c). */
#include "config.h"
#include "zt_train.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_arch.h"
#include "zt_backend.h"
#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_data.h"
#include "zt_generate.h"
#include "zt_hf_model.h"
#include "zt_log.h"
#include "zt_metrics.h"
#include "zt_pref.h"
#include "zt_pref_ref.h"
#include "zt_pref_table.h"
#include "zt_mfu.h"
#include "zt_model.h"
#include "zt_optim.h"
#include "zt_run.h"
#include "zt_shard.h"
#include "zt_step.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

#ifdef ZT_HAVE_CUDA
#include "zt_cuda.h"
#endif

/* train.threads resolved (see its schema text) */
static int cpu_threads(const zt_config_t *cfg, const zt_backend_t *be, int local_size)
{
    if (cfg->train.threads > 0) return cfg->train.threads;
    if (strcmp(be->name, "cpu") != 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        return (int)ZT_MAX(1L, cores / (local_size > 0 ? local_size : 1));
    }
    const char *env = getenv("OMP_NUM_THREADS");
    int n = env ? atoi(env) : 1;
    return n > 0 ? n : 1;
}

/* ---- the loop ----------------------------------------------------------------------- */

/* A frozen reference model, as LLaMA-Factory loads one (pref.ref_model, or with full
 * fine-tuning a second copy of model_name_or_path): the base model's table on this rank
 * (without LoRA's adapter units) with every unit frozen, an engine of its own (parameters
 * only, sharded as the strategy shards frozen units), the directory's weights, which must
 * have the model's shapes. A resumed run loads them again, as LLaMA-Factory does. */
int zt_tr_ref_create(run_t *r)
{
    const char *dir = r->cfg->pref.ref_model[0] ? r->cfg->pref.ref_model : r->cfg->model.name_or_path;
    char err[ZT_ERRLEN] = "";
    zt_param_table_t *t = zt_tr_ref_table_of(r->table, r->comm->mesh_tp, r->comm->tp.rank, err, sizeof err);
    int rc = t ? 0 : -1;
    if (t) {
        r->ref_table = t;
        r->ref_shard = zt_shard_create(t, r->comm, r->be, &r->sopts);
        double bytes = 0;
        /* the global table: names and whole shapes; the base parameters are its first ones */
        rc = zt_hf_model_load(dir, r->ref_shard, r->table, r->comm, &bytes, err, sizeof err);
    }
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("dpo reference: %s", err);
        return -1;
    }
    zt_shard_mem_t mem;
    zt_shard_memory(r->ref_shard, &mem);
    char b[32];
    zt_log("dpo: the reference is a frozen copy of %s (%s of parameters per rank)", dir,
           zt_fmt_bytes((double)(mem.params + mem.host), b, sizeof b));
    return 0;
}


/* The logging window: the steps since the last log line, or since a pause the training's
 * figures leave out (an evaluation, a generation, a save), their time and their work */
typedef struct window {
    double t_start;  /* the loop's start (a record's elapsed_s) */
    double t0;       /* the window's start */
    long steps;
    double computed; /* positions the window's steps computed, over the data ranks (MFU) */
    /* train.stage = dpo: the preference metrics summed over the logging window's
     * micro-steps (LLaMA-Factory averages what it stored since its last log) */
    double pref[ZT_PREF_NMETRICS];
    long pref_micros;
} window_t;

/* What an optimizer step leaves for its log line */
typedef struct step_out {
    int skipped;     /* a non-finite step skipped (fp16 overflow, parallel.nonfinite = skip) */
    double loss, lr, norm;
    double S;        /* the loss scale the step ran at */
} step_out_t;


static void window_restart(window_t *w)
{
    w->t0 = zt_now();
    w->steps = 0;
    w->computed = 0;
}

/* This rank's rows of every micro-step of the step, read, then errors agreed: 0, or -1
 * (logged) on every rank */
static int read_step(run_t *r, int injected)
{
    const size_t BT = (size_t)r->B * r->Tm, BTs = (size_t)r->B * r->T; /* BTs: a micro-step's segments */
    char err[ZT_ERRLEN];
    int rc = 0;
    err[0] = 0;
    for (int m = 0; m < r->A && rc == 0; m++) {
        int64_t g0 = r->samples_seen + (int64_t)m * r->dp * r->B + (int64_t)r->drank * r->B;
        rc = zt_tr_read_rows(r, r->train, g0, r->cfg->data.shuffle, r->inp + m * BT, r->tgt + m * BT,
                       r->seg ? r->seg + m * BTs : NULL, r->pos ? r->pos + m * BT : NULL, err, sizeof err);
    }
    if (injected == ZT_FAULT_DATA)
        rc = zt_err(err, sizeof err, "fault injection: data error on rank %d at step %ld", r->rank, r->step + 1);
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        return -1;
    }
    return 0;
}

/* One optimizer step on the rows read: the micro-batches' passes (the step's schedule),
 * the gradients' reduction, the verdict on non-finite values, clipping and the optimizer,
 * and the fp16 loss scale's growth. ZT_EXIT_OK, or the code to stop with. */
static int train_step(run_t *r, window_t *w, int injected, step_out_t *o)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    const size_t BT = (size_t)r->B * r->Tm;
    /* a token stream: every position carries a loss */
    const int sft = zt_data_is_sft(r->train), dpo = cfg->train.stage == ZT_STAGE_DPO;
    float dscale = 1.0f / (float)((double)BT * r->A * r->comm->data.size);
    memset(o, 0, sizeof *o);
    /* SFT: the loss is the mean over the tokens that carry one in the whole global
     * batch, counted across ranks and micro-steps (transformers' num_items_in_batch),
     * so world size and accumulation do not change it */
    double count = (double)BT * r->A * c->data.size;
    if (sft && !dpo) {
        count = zt_sum_double(c, &c->data, (double)zt_tr_loss_tokens(r->tgt, BT * (size_t)r->A));
        dscale = count > 0 ? (float)(1.0 / count) : 0.0f;
    }
    double t0 = zt_now();
    zt_shard_begin_step(r->shard);
    long computed = 0; /* this rank's row positions, padding trimmed (trim_padding) */
    /* the injected NaN enters through the gradient scale, so only the gradients
     * (not the loss) carry it: the path a real overflow takes */
    const float ds = injected == ZT_FAULT_NAN ? NAN : (float)(dscale * r->loss_scale);
    /* dpo: each micro-batch's mean over its pairs, averaged over micro-steps and data-parallel
     * replicas (the sp ranks of a replica each add their tokens' part of one gradient) */
    const float pf = injected == ZT_FAULT_NAN ? NAN : (float)(r->loss_scale / ((double)r->A * r->dp));
    zt_watchdog_mark("pipeline", -1, r->step + 1);
    zt_tr_pref_table_begin_step(r);
    double loss_sum = r->plan.pp > 1 ? zt_tr_run_pipeline(r, sft, ds, pf, w->pref, &w->pref_micros, &computed)
                                     : zt_tr_run_schedule(r, sft, ds, pf, w->pref, &w->pref_micros, &computed);
    zt_tr_pref_table_end_step(r);
    /* MFU counts the work done: the trimmed rows of every data rank (sp ranks hold parts
     * of the same rows, tp ranks the same rows) */
    w->computed += sft ? zt_tr_step_sum(r, (double)computed) * r->comm->mesh_sp
                       : (double)r->G * r->T;
    zt_watchdog_mark("gradient reduction", -1, r->step + 1);
    double norm2 = zt_shard_finish_grads(r->shard);
    double loss = sft && !dpo ? zt_tr_step_sum(r, loss_sum) / (count > 0 ? count : 1.0)
                              : zt_tr_step_sum(r, loss_sum) / ((double)r->A * c->data.size);
    /* a NaN or Inf in any gradient reaches norm2: it is a sum of squares over every
     * owned element, reduced over the shard group, after the gradient reduction has
     * spread it to every replica */
    int bad = !isfinite(loss_sum) || !isfinite(norm2);
    if (zt_any(c, bad)) {
        /* a finite loss (the world's sum: the same verdict everywhere) with a
         * non-finite gradient is an fp16 overflow */
        const int overflow = r->dynamic_scale && isfinite(loss);
        if (overflow || cfg->parallel.nonfinite == ZT_NONFINITE_SKIP) {
            zt_metrics_record_skipped(r->step + 1, overflow ? "overflow" : "nonfinite", r->loss_scale,
                                      zt_now() - w->t_start);
            if (overflow && zt_tr_loss_scale_overflow(r) != 0) return ZT_EXIT_NONFINITE;
            if (!overflow)
                zt_log("step %ld: non-finite loss or gradient; step skipped (parallel.nonfinite = skip)", r->step + 1);
            r->good_steps = 0;
            zt_shard_zero_grads(r->shard);
            r->samples_seen += r->G;
            r->step++;
            w->steps++; /* its time is in the window: so are its tokens (processed, not learnt) */
            o->skipped = 1; /* a skipped step still evaluates and checkpoints on schedule */
            return ZT_EXIT_OK;
        }
        zt_log_error("step %ld: non-finite loss or gradient (loss %g); stopping (parallel.nonfinite = abort)",
                     r->step + 1, loss);
        return ZT_EXIT_NONFINITE;
    }
    const long adam_t = zt_shard_adam_step(r->shard); /* optimizer steps so far */
    const double S = r->loss_scale, norm = sqrt(norm2) / S;
    double lr = zt_lr_at(&r->sched, adam_t);
    zt_adamw_hp_t hp = {
        .lr = (float)lr, .beta1 = (float)cfg->optim.adam_beta1, .beta2 = (float)cfg->optim.adam_beta2,
        .eps = (float)cfg->optim.adam_epsilon, .weight_decay = (float)cfg->optim.weight_decay,
        .grad_scale = (float)(zt_clip_scale(norm, cfg->optim.max_grad_norm) / S),
        .step = adam_t + 1,
    };
    zt_watchdog_mark("optimizer", -1, r->step + 1);
    zt_shard_optimizer_step(r->shard, &hp);
    double dt = zt_now() - t0;
    r->train_seconds += dt;
    r->samples_seen += r->G;
    r->tokens_seen += (double)r->G * r->T;
    r->step++;
    w->steps++;
    r->last_loss = (float)loss;
    if (r->dynamic_scale && ++r->good_steps == cfg->train.loss_scale_window) {
        zt_log("step %ld: %d steps without overflow, loss scale %.9g -> %.9g", r->step,
               cfg->train.loss_scale_window, S, 2 * S);
        r->loss_scale = 2 * S;
        r->good_steps = 0;
    }
    o->loss = loss, o->lr = lr, o->norm = norm, o->S = S;
    return ZT_EXIT_OK;
}

/* A step's log line and metrics record, over the window (tokens/s, MFU, the DPO metrics'
 * means), and the loss history; the window starts again */
static void log_step(run_t *r, window_t *w, const step_out_t *o)
{
    const zt_config_t *cfg = r->cfg;
    const int dpo = cfg->train.stage == ZT_STAGE_DPO;
    const double loss = o->loss, lr = o->lr, norm = o->norm, S = o->S;
    double now = zt_now(), wdt = now - w->t0;
    double tps = (double)w->steps * r->G * r->T / wdt;
    double flops = w->computed / wdt * r->flops_per_token;
    double eta = (double)(r->total_steps - r->step) * wdt / (double)w->steps;
    char etab[32], memb[32];
    zt_tr_format_eta(eta, etab, sizeof etab);
    zt_fmt_bytes((double)zt_current_rss(), memb, sizeof memb);
    char scaleb[48] = "";
    if (cfg->train.fp16) snprintf(scaleb, sizeof scaleb, " | scale %.9g", S);
    /* the preference metrics: means over the window's micro-steps and the data ranks */
    double pref[ZT_PREF_NMETRICS];
    char prefb[768] = "";
    const int npref = dpo ? zt_pref_nmetrics(cfg->pref.fn.loss) : 0;
    /* under a pipeline the last stage's ranks hold them: step_sum adds the others' 0 */
    const double nmicro = zt_tr_step_sum(r, (double)w->pref_micros);
    for (int k = 0; k < npref; k++) {
        pref[k] = zt_tr_step_sum(r, w->pref[k]) / (nmicro > 0 ? nmicro : 1.0);
        const size_t at = strlen(prefb);
        snprintf(prefb + at, sizeof prefb - at, " | %s %.4f", zt_pref_metric_name(k), pref[k]);
    }
    memset(w->pref, 0, sizeof w->pref);
    w->pref_micros = 0;
    zt_log("step %5ld/%ld | loss %.4f%s | lr %.2e | norm %.4f%s | %.0f tok/s | %.3f TFLOP/s | MFU %.1f%% | mem %s | ETA %s",
           r->step, r->total_steps, loss, prefb, lr, norm, scaleb, tps, flops / 1e12,
           100.0 * flops / r->peak_flops, memb, etab);
    const zt_metrics_step_t rec = {
        .step = r->step, .loss = loss, .lr = lr, .grad_norm = norm, .loss_scale = S,
        .tokens_per_s = tps, .tflops = flops / 1e12, .mfu = flops / r->peak_flops,
        .elapsed_s = now - w->t_start, .step_s = wdt / w->steps, .tokens_seen = r->tokens_seen,
        .rss_bytes = zt_current_rss(), .comm = zt_comm_stats(r->comm), .npref = npref, .pref = pref,
    };
    zt_metrics_record_step(&rec);
    zt_tr_hist_push(&r->train_hist, r->step, (float)loss);
    if (dpo) zt_tr_hist_push(&r->margin_hist, r->step, (float)pref[ZT_PREF_REWARDS_MARGINS]);
    zt_tr_fold_comm(r);
    window_restart(w);
}

/* After a step, trained or skipped: the evaluation, the generations (generate.at_eval) and
 * the checkpoint on their schedules. Each is a pause: its collectives and its time leave
 * the training's figures (the window starts again after it). ZT_EXIT_OK, or the code to
 * stop with. */
static int step_hooks(run_t *r, window_t *w)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    char err[ZT_ERRLEN];
    int last = r->step == r->total_steps;
    if (r->val && ((cfg->train.eval_steps > 0 && r->step % cfg->train.eval_steps == 0) || last)) {
        zt_tr_fold_comm(r); /* keep the training traffic, then discard the evaluation's */
        int failed = 0;
        float vl = zt_tr_evaluate(r, &failed);
        if (failed) return ZT_EXIT_ERROR;
        r->last_val = vl;
        zt_log("step %5ld/%ld | validation loss %.4f", r->step, r->total_steps, vl);
        zt_metrics_record_eval(r->step, vl, zt_now() - w->t_start);
        zt_tr_hist_push(&r->val_hist, r->step, vl);
        window_restart(w);
        zt_comm_stats_reset(c);
    }
    if (cfg->generate.at_eval && ((cfg->train.eval_steps > 0 && r->step % cfg->train.eval_steps == 0) || last)) {
        /* the evaluation prompts, completed with the model as it is now */
        zt_tr_fold_comm(r);
        char name[64];
        snprintf(name, sizeof name, "generations-%ld.jsonl", r->step);
        zt_tr_generation_begin(r, cfg->generate.batch_size);
        const int grc = zt_generate_run(cfg, name, r->T, r->gen_batch, r->table->dims.V, zt_tr_batch_logits, r, c, err,
                                        sizeof err);
        zt_tr_generation_end(r);
        if (grc) {
            zt_log_error("%s", err);
            return ZT_EXIT_ERROR;
        }
        zt_log("step %5ld/%ld | generations: %s/%s", r->step, r->total_steps, cfg->train.output_dir, name);
        window_restart(w);
        zt_comm_stats_reset(c);
    }
    if ((cfg->checkpoint.save_steps > 0 && r->step % cfg->checkpoint.save_steps == 0 && !last) ||
        (last && cfg->checkpoint.save_at_end)) {
        zt_tr_fold_comm(r);
        if (zt_tr_save_checkpoint(r) != 0) return ZT_EXIT_ERROR;
        window_restart(w);
        zt_comm_stats_reset(c);
    }
    return ZT_EXIT_OK;
}

/* The steps, from r->step (a resumed run's) to total_steps: at each boundary a signal
 * (agreed by every rank) checkpoints and stops; then the step's rows, the optimizer step,
 * its log line where logging_steps puts one, and the step's hooks. */
static int run_loop(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    const int fault = cfg->fault.kind;
    if (fault == ZT_FAULT_SAVE_KILL) zt_ckpt_fault_save_kill(cfg->fault.rank, cfg->fault.step);
    window_t w = {.t_start = zt_now()};
    w.t0 = w.t_start;
    zt_comm_stats_reset(c);

    while (r->step < r->total_steps) {
        /* step boundary: signals are agreed before anyone acts */
        zt_watchdog_mark("step boundary", -1, r->step + 1);
        if (zt_any(c, zt_signal_pending())) {
            zt_log("signal received: checkpointing at step %ld and stopping (exit %d)", r->step, ZT_EXIT_SIGNAL);
            if (zt_tr_save_checkpoint(r) != 0) return ZT_EXIT_ERROR;
            return ZT_EXIT_SIGNAL;
        }
        int injected = zt_fault_check(fault, cfg->fault.rank, cfg->fault.step, r->rank, r->step + 1);
        if (read_step(r, injected) != 0) return ZT_EXIT_ERROR;
        step_out_t o;
        int rc = train_step(r, &w, injected, &o);
        if (rc != ZT_EXIT_OK) return rc;
        if (!o.skipped && (r->step % cfg->train.logging_steps == 0 || r->step == r->total_steps || r->step == 1))
            log_step(r, &w, &o);
        rc = step_hooks(r, &w);
        if (rc != ZT_EXIT_OK) return rc;
    }
    zt_tr_fold_comm(r);
    return ZT_EXIT_OK;
}

static const zt_backend_t *pick_backend(const zt_config_t *cfg, char *err, size_t errlen)
{
    const zt_backend_choice_t want = cfg->parallel.backend;
    if (want == ZT_BACKEND_CPU) return &zt_backend_cpu;
#ifdef ZT_HAVE_CUDA
    char cerr[ZT_ERRLEN] = "";
    if (zt_cuda_available(cerr, sizeof cerr)) return zt_backend_get("cuda");
    if (want == ZT_BACKEND_CUDA) {
        zt_err(err, errlen, "parallel.backend = \"cuda\": no usable GPU: %s", cerr);
        return NULL;
    }
    zt_log("parallel.backend = auto: no usable GPU (%s); using the CPU backend", cerr);
    return &zt_backend_cpu;
#else
    if (want == ZT_BACKEND_CUDA) {
        zt_err(err, errlen, "parallel.backend = \"cuda\": this ztrain was built without CUDA (configure --with-cuda)");
        return NULL;
    }
    return &zt_backend_cpu;
#endif
}

int zt_train(const zt_config_t *cfg, const zt_parallel_plan_t *plan, zt_comm_t *comm)
{
    run_t run, *r = &run;
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->comm = comm;
    r->rank = comm->world.rank;
    r->dp = comm->mesh_dp;
    r->drank = comm->dp_rank;
    r->B = zt_config_batch_rows(cfg);
    r->T = cfg->data.seq_len;
    r->Tm = r->T / comm->mesh_sp;
    r->A = cfg->train.gradient_accumulation_steps;
    r->G = (long)r->B * r->dp * r->A;
    char err[ZT_ERRLEN] = "";
    int rc = 0;

    r->be = pick_backend(cfg, err, sizeof err);
    rc = r->be ? 0 : -1;
    /* bf16 is the default on a GPU (fp32 GEMMs would leave its tensor cores idle): the
     * run, its saved config.cfg and its checkpoints' metadata say so */
    zt_config_t *gpu_cfg = NULL;
    if (rc == 0 && !r->be->host_memory && !zt_config_given(cfg, "train.bf16") &&
        !zt_config_given(cfg, "train.fp16") && cfg->model.quantization_bit != 4 /* QLoRA computes in fp32 */) {
        gpu_cfg = zt_malloc(sizeof *gpu_cfg);
        *gpu_cfg = *cfg;
        gpu_cfg->train.bf16 = 1;
        cfg = r->cfg = gpu_cfg;
        zt_log("train.bf16 = true: the default on a GPU (train.bf16 = false trains in fp32)");
    }
    if (rc == 0) {
        r->threads = cpu_threads(cfg, r->be, comm->local_size);
        zt_cpu_set_threads(r->threads);
    }
    if (rc == 0) rc = r->rank == 0 ? zt_mkdir_p(cfg->train.output_dir, err, sizeof err) : 0;
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    /* device buffers need a comm backend that moves them (and the GPU chosen) before the first alloc */
    if (zt_comm_set_backend(comm, zt_comm_backend_for(r->be->name), err, sizeof err) != 0) {
        zt_log_error("%s", err);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    char path[ZT_STRLEN + 64];
    if (cfg->log.all_ranks) {
        snprintf(path, sizeof path, "%s/rank-%d.log", cfg->train.output_dir, r->rank);
        zt_log_init(r->rank, path);
    }
    /* the data decides the number of steps, so it is opened first (generation needs none); the
     * schedule comes from the steps of this run, as transformers does: a resumed run that
     * derives the same total_steps (its checkpoint's config) warms up the same */
    rc = cfg->mode_generate ? 0 : zt_tr_open_data(r, err, sizeof err);
    if (rc == 0 && r->val && cfg->train.stage == ZT_STAGE_DPO) /* it would report an SFT loss */
        rc = zt_err(err, sizeof err, "train.stage = dpo: evaluation on pairs is not wired yet; give no validation "
                                     "data (data.val_files = [], no eval_dataset)");
    if (rc == 0) {
        /* a pairs file counts pairs; the batch (r->G) counts rows, two a pair */
        const int64_t S = r->train ? zt_data_num_samples(r->train) * (zt_data_is_pairs(r->train) ? 2 : 1) : 1;
        r->total_steps = cfg->train.max_steps > 0
                             ? cfg->train.max_steps
                             : (long)ceil(cfg->train.num_train_epochs * (double)S / (double)r->G);
        if (r->total_steps < 1) r->total_steps = 1;
        rc = zt_config_lr_schedule(cfg, r->total_steps, &r->sched, err, sizeof err);
    }
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        zt_data_close(r->train);
        zt_data_close(r->val);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }

    r->table = zt_arch_table_from_config(cfg, err, sizeof err);
    /* the plan of the mesh, again from this config: on a GPU train.bf16 may have
     * become the default above, which sets the working and GEMM precisions */
    const zt_plan_shape_t sh = r->table ? zt_tr_shape_of(r->table) : (zt_plan_shape_t){0};
    rc = r->table ? zt_plan_build(&r->plan, cfg, &sh, plan->world, plan->per_node, err, sizeof err) : -1;
    /* a pipeline: an untied head in a unit of its own, held by the last stage alone */
    if (rc == 0 && r->plan.pp > 1) zt_params_split_head(r->table);
    if (rc == 0 && r->plan.sp > 1 && r->plan.sp_mode == ZT_SP_RING && !r->be->attention_block_forward)
        rc = zt_err(err, sizeof err, "parallel.sp_mode = ring: the %s backend has no ring attention kernels yet "
                    "(parallel.sp_mode = ulysses works there)", r->be->name);
    if (rc == 0 && r->plan.optimizer == ZT_OPTIM_ONEBIT_ADAM && !r->be->host_memory)
        rc = zt_err(err, sizeof err, "optim.type = onebit_adam: the %s backend has no 1-bit compression kernels "
                    "(they run on host memory: parallel.backend = cpu)", r->be->name);
    /* the plan checked the schedule's rules; this cannot fail where it passed */
    if (rc == 0) /* --generate runs only the stages: a schedule of pp micro-batches is valid for every kind */
        rc = zt_tr_build_steps(cfg, &r->plan, cfg->mode_generate ? r->plan.pp : r->A, &r->steps, err, sizeof err);
    /* NCCL runs a communicator's operations in issue order on one stream: the step's
     * messages go in the batches this plans (the same on every rank), not all receives at
     * its start, which would hold back its sends */
    if (rc == 0 && r->plan.pp > 1 && zt_p2p_in_order(comm)) {
        rc = zt_schedule_plan_in_order(&r->steps, err, sizeof err);
        int moved = 0, nb = 0;
        for (int k = 0; rc == 0 && k < r->plan.pp; k++) {
            int mk;
            nb += zt_schedule_batches(&r->steps, k, &mk);
            moved += mk;
        }
        if (rc == 0)
            zt_log("pipeline: %s messages in stream order, %d batches a step over the pp ranks, %d receives "
                   "issued a batch early", comm->backend, nb, moved);
    }
    if (rc == 0) r->micro_T = zt_calloc((size_t)r->A, sizeof *r->micro_T);
    if (rc == 0) r->micro_Tp = zt_calloc((size_t)r->A, sizeof *r->micro_Tp);
    if (rc == 0) r->micro_seg = zt_calloc((size_t)r->A, sizeof *r->micro_seg);
    if (rc == 0) r->be->set_matmul_precision(r->plan.matmul);
    if (rc == 0 && (comm->mesh_tp > 1 || comm->mesh_sp > 1)) {
        r->ltable = zt_params_tp_local(r->table, comm->mesh_tp, comm->tp.rank, err, sizeof err);
        if (r->ltable) {
            zt_tr_mesh_local(r->ltable, &r->plan);
            r->ltable->dims.sp_rank = comm->sp.rank;
        }
    } else if (rc == 0) {
        r->ltable = r->table;
    }
    if (zt_agree_error(comm, r->table && r->ltable ? 0 : -1, err, sizeof err)) {
        zt_log_error("%s", err);
        zt_data_close(r->train);
        zt_data_close(r->val);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    char why[256] = "";
    if (r->plan.strategy == ZT_STRATEGY_AUTO)
        zt_plan_resolve(&r->plan, zt_tr_pick_auto(cfg, &r->plan, r->be, r->table, r->ltable, comm->data.size, comm->local_size, why,
                                            sizeof why));
    const zt_strategy_t st = r->plan.strategy;
    zt_tr_fill_opts(cfg, &r->plan, st, &r->sopts);
    r->loss_scale = 1.0;
    if (cfg->train.fp16) {
        r->dynamic_scale = cfg->train.loss_scale == 0;
        r->loss_scale = r->dynamic_scale ? ldexp(1.0, cfg->train.initial_scale_power) : cfg->train.loss_scale;
    }
    r->config_text = zt_config_to_string(cfg);
    zt_tr_startup_report(r);
    if (why[0]) zt_log("strategy auto -> %s: %s", zt_strategy_name(st), why);
    if (r->plan.optimizer == ZT_OPTIM_ONEBIT_ADAM)
        zt_log("optim.type = onebit_adam: Adam without bias correction for %ld steps, then the variance frozen and "
               "the momentum exchanged as sign bits and scales (DeepSpeed's 1-bit Adam)", r->plan.freeze_step);
    if (r->plan.offload_param != ZT_OFFLOAD_NONE && !zt_strategy_shards_params(st))
        zt_log("parallel.offload_param = cpu has no effect: %s keeps parameters whole on every rank",
               zt_strategy_name(st));
    if (cfg->train.fp16 && r->dynamic_scale)
        zt_log("fp16: dynamic loss scale from %.9g, doubled after %d steps without overflow, at least %.9g",
               r->loss_scale, cfg->train.loss_scale_window, cfg->train.min_loss_scale);
    else if (cfg->train.fp16)
        zt_log("fp16: static loss scale %.9g", r->loss_scale);
    int exit_code = ZT_EXIT_OK;
    rc = zt_tr_check_fits(cfg, &r->plan, r->be, r->table, r->ltable, st, comm, err, sizeof err);
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        exit_code = ZT_EXIT_ERROR;
        goto done;
    }

    r->rss0 = zt_current_rss();
    /* under a pipeline each model holds the activations of this rank's stages' layers only */
    unsigned char *layers = zt_tr_stage_layers(&r->plan, r->ltable->dims.L, comm->pp.rank);
    r->model = zt_model_create_layers(r->ltable, r->be, r->B, r->Tm, cfg->train.gradient_checkpointing, layers);
    if (comm->mesh_tp > 1 || comm->mesh_sp > 1) {
        zt_actcoll_t ac;
        zt_comm_actcoll(comm, &ac);
        zt_model_set_collectives(r->model, &ac);
        r->tp_logits = zt_malloc((size_t)r->table->dims.V * sizeof(float));
        r->row_tmp = zt_malloc(3 * (size_t)r->T * sizeof(int32_t)); /* inputs, targets, positions */
    }
    /* the pipeline: a model per slot of this rank's schedule (one at pp 1) */
    r->slot = zt_calloc((size_t)r->A, sizeof *r->slot);
    r->nslots = zt_schedule_slots(&r->steps, comm->pp.rank, r->slot);
    r->models = zt_calloc((size_t)r->nslots, sizeof *r->models);
    r->models[0] = r->model;
    if (comm->mesh_pp > 1 && !r->tp_logits) /* generation: the last stage's logits reach every rank */
        r->tp_logits = zt_malloc((size_t)r->table->dims.V * sizeof(float));
    for (int k = 1; k < r->nslots; k++) {
        r->models[k] =
            zt_model_create_layers(r->ltable, r->be, r->B, r->Tm, cfg->train.gradient_checkpointing, layers);
        if (comm->mesh_tp > 1 || comm->mesh_sp > 1) {
            zt_actcoll_t ac;
            zt_comm_actcoll(comm, &ac);
            zt_model_set_collectives(r->models[k], &ac);
        }
    }
    for (int k = 0; k < r->nslots && r->steps.head_split; k++) zt_model_hold_dlogits(r->models[k]);
    free(layers);
    const char *trace = comm->mesh_pp > 1 ? getenv("ZT_PP_TRACE") : NULL; /* a diagnostic, not a setting */
    if (trace && *trace) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", trace, comm->world.rank);
        r->pp_trace = fopen(path, "w");
        rc = r->pp_trace ? 0 : -1;
        if (rc) snprintf(err, sizeof err, "ZT_PP_TRACE: cannot write %.400s", path);
        if (zt_agree_error(comm, rc, err, sizeof err)) {
            zt_log_error("%s", err);
            exit_code = ZT_EXIT_ERROR;
            goto done;
        }
    }
    const int nmsg = zt_schedule_messages(&r->steps, comm->pp.rank) + 1; /* each send and receive of the list */
    r->pp_req = zt_calloc((size_t)nmsg, sizeof *r->pp_req);
    r->pp_buf = zt_calloc((size_t)nmsg, sizeof *r->pp_buf);
    unsigned char *lay = zt_tr_stage_layers(&r->plan, r->ltable->dims.L, comm->pp.rank);
    r->held = lay ? zt_params_units_of_layers(r->ltable, lay) : NULL;
    free(lay);
    if (r->held) zt_tr_stage_opts(&r->sopts, &r->plan, r->ltable, r->held);
    r->shard = zt_shard_create_err(r->ltable, comm, r->be, &r->sopts, err, sizeof err);
    if (!r->shard) { /* the nvme tier's path or space, agreed on every rank */
        zt_log_error("%s", err);
        exit_code = ZT_EXIT_ERROR;
        goto done;
    }
    zt_nvme_stats_t nvs;
    if (zt_shard_nvme_stats(r->shard, &nvs)) {
        char fb[32], bb[32];
        zt_log("offload: nvme, %s of state per rank in %s (%s), %d buffers of %s", zt_fmt_bytes(nvs.file_bytes, fb, 32),
               nvs.dir, nvs.engine, nvs.buffers, zt_fmt_bytes(nvs.buffer_bytes, bb, 32));
    }
    if (zt_tr_has_ref_copy(cfg) && zt_tr_ref_create(r) != 0)
        exit_code = ZT_EXIT_ERROR;
    if (exit_code == ZT_EXIT_OK && zt_tr_pref_table_setup(r) != 0) exit_code = ZT_EXIT_ERROR;
    /* the backend's host memory (pinned on a GPU): an upload from pageable memory
     * would wait for the compute stream, once per micro-step */
    r->inp = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
    if (r->table->lora_dropout > 0) r->keys = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(uint64_t));
    r->tgt = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
    if ((r->train && zt_data_has_segments(r->train)) || (r->val && zt_data_has_segments(r->val))) {
        /* neat-packed rows: their segments (whole rows: attention sees every position of a
         * sequence) and positions (this rank's tokens) go to the model beside the tokens */
        r->seg = r->be->alloc_host((size_t)r->A * r->B * r->T * sizeof(int32_t));
        r->pos = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
        zt_log("data: neat-packed rows: packed samples attend within themselves, positions from 0");
    }
    r->flops_per_token = zt_model_flops_per_token(r->table, r->T);
    r->peak_flops = cfg->train.peak_tflops > 0 ? cfg->train.peak_tflops * 1e12
                                              : zt_max_double(comm, &comm->world, zt_mfu_measure_peak(r->be));
    r->peak_flops *= comm->world.size;
    zt_log("MFU denominator: %.1f GFLOP/s over all ranks (%s)", r->peak_flops / 1e9,
           cfg->train.peak_tflops > 0 ? "train.peak_tflops" : "measured matmul peak of this backend");

    if (zt_tr_maybe_resume(r) != 0) exit_code = ZT_EXIT_ERROR;
    /* a generation leaves the run's config.cfg and metrics.jsonl alone */
    if (exit_code == ZT_EXIT_OK && r->rank == 0 && !cfg->mode_generate) {
        snprintf(path, sizeof path, "%s/config.cfg", cfg->train.output_dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(r->config_text, f);
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->train.output_dir);
        zt_metrics_open(path, r->step > 0);
        zt_tr_start_record(r);
    }
    zt_watchdog_start(cfg->parallel.timeout_s, r->rank, zt_hostname());
    double t0 = zt_now();
    if (exit_code == ZT_EXIT_OK && cfg->mode_generate) {
        /* --generate: the loaded model completes the prompts, nothing trains or is saved */
        zt_tr_generation_begin(r, cfg->generate.batch_size);
        char kvb[32];
        zt_fmt_bytes((double)zt_model_kv_bytes(r->model), kvb, sizeof kvb);
        const char *why = cfg->generate.use_cache ? "off (sequence parallelism or tp_sequence_parallel)" : "off";
        zt_log("generate: %d prompts at once per rank, KV cache %s%s%s", r->gen_batch, r->kv_on ? "on (" : why,
               r->kv_on ? kvb : "", r->kv_on ? " per rank)" : "");
        const double tg = zt_now();
        rc = zt_generate_run(cfg, "generations.jsonl", r->T, r->gen_batch, r->table->dims.V, zt_tr_batch_logits, r, comm,
                             err, sizeof err);
        zt_tr_generation_end(r);
        if (rc) zt_log_error("%s", err);
        else zt_log("generate: %s/generations.jsonl (%.1f s)", cfg->train.output_dir, zt_now() - tg);
        exit_code = rc ? ZT_EXIT_ERROR : ZT_EXIT_OK;
        zt_watchdog_stop();
        goto done;
    }
    if (exit_code == ZT_EXIT_OK) exit_code = run_loop(r);
    double wall = zt_now() - t0;

    if (exit_code == ZT_EXIT_OK && r->table->first_adapter_unit >= 0 && zt_tr_save_hf(r, 1) != 0) exit_code = ZT_EXIT_ERROR;
    if (exit_code == ZT_EXIT_OK && cfg->checkpoint.save_hf && zt_tr_save_hf(r, 0) != 0) exit_code = ZT_EXIT_ERROR;
    if (exit_code == ZT_EXIT_OK) {
        zt_tr_generate_sample(r);
        zt_watchdog_idle();
        const size_t hwm = zt_peak_rss();
        double peak = zt_max_double(comm, &comm->world, (double)hwm);
        /* what ztrain itself added on top of its start: the figure an estimate predicts */
        const double growth = zt_max_double(comm, &comm->world, (double)hwm - (double)r->rss0);
        double dev_peak = 0.0;
#ifdef ZT_HAVE_CUDA
        if (!r->be->host_memory) dev_peak = (double)zt_cuda_memory_peak();
#endif
        dev_peak = zt_max_double(comm, &comm->world, dev_peak);
        zt_shard_mem_t mm, mref = {0};
        zt_tr_rank_memory(r, &mm);
        if (r->ref_shard) zt_shard_memory(r->ref_shard, &mref);
        char b[9][32];
        zt_log("memory (rank 0, measured): params %s, grads %s, optimizer %s, buffers %s, gathered peak %s, "
               "activations %s, offloaded to host %s; peak RSS over ranks %s (%s above the process before the model)",
               zt_fmt_bytes(mm.params, b[0], 32), zt_fmt_bytes(mm.grads, b[1], 32),
               zt_fmt_bytes(mm.optim, b[2], 32), zt_fmt_bytes(mm.comm_buffers, b[3], 32),
               zt_fmt_bytes(mm.gathered_peak, b[4], 32),
               zt_fmt_bytes((double)zt_tr_activation_bytes(r), b[5], 32), zt_fmt_bytes(mm.host, b[6], 32),
               zt_fmt_bytes(peak, b[7], 32), zt_fmt_bytes(growth, b[8], 32));
        zt_nvme_stats_t nvs;
        if (zt_shard_nvme_stats(r->shard, &nvs))
            zt_log("nvme (rank 0): read %s, written %s, %.3f s waiting for I/O in %.1f s", zt_fmt_bytes(nvs.bytes_read, b[0], 32),
                   zt_fmt_bytes(nvs.bytes_written, b[1], 32), nvs.io_wait_s, wall);
        if (dev_peak > 0)
            zt_log("memory: device peak over ranks %s (the CUDA memory pool's high-water mark)",
                   zt_fmt_bytes(dev_peak, b[0], 32));
#ifdef ZT_HAVE_CUDA
        if (!r->be->host_memory) {
            char where[256];
            long fused = 0;
            zt_cuda_gelu_epilogue(where, sizeof where, &fused);
            zt_log("gelu: %s (rank 0: %ld fused GEMMs)", where, fused);
        }
#endif
        if (r->rank == 0 && cfg->log.plot && r->train_hist.n > 0) {
            snprintf(path, sizeof path, "%s/loss.svg", cfg->train.output_dir);
            zt_tr_write_plot(r, path);
            zt_log("loss plot: %s", path);
        }
        zt_log("summary: %ld steps, %.0f tokens in %.1f s (%.1f s training, %.0f tokens/s), final loss %.4f%s",
               r->step, r->tokens_seen, wall, r->train_seconds,
               r->train_seconds > 0 ? r->tokens_seen / r->train_seconds : 0.0, r->last_loss,
               r->val ? "" : ", no validation set");
        if (r->val) zt_log("summary: final validation loss %.4f", r->last_val);
        zt_tr_comm_summary(r);
        zt_tr_pp_summary(r);
        if (r->plan.pp > 1) zt_tr_stage_memory(r);
        if (cfg->train.stage == ZT_STAGE_DPO && r->pref_seconds[PT_FWD] > 0) {
            const double *p = r->pref_seconds, ref = p[PT_REF_BLOCKS] + p[PT_REF_HEAD],
                         pol = p[PT_FWD] + p[PT_HEAD] + p[PT_LOSS] + p[PT_BWD];
            const double *c = r->pref_cpu, cref = c[PT_REF_BLOCKS] + c[PT_REF_HEAD],
                         cpol = c[PT_FWD] + c[PT_HEAD] + c[PT_LOSS] + c[PT_BWD];
            zt_log("summary: dpo reference passes %.2f s, policy forward + backward %.2f s (reference %.3fx); "
                   "reference blocks %.2f s, head %.2f s; policy blocks %.2f s, head %.2f s, loss %.2f s, "
                   "backward %.2f s; main thread's CPU time: reference %.2f s, policy %.2f s (%.3fx)",
                   ref, pol, ref / pol, p[PT_REF_BLOCKS], p[PT_REF_HEAD], p[PT_FWD], p[PT_HEAD], p[PT_LOSS],
                   p[PT_BWD], cref, cpol, cpol > 0 ? cref / cpol : 0.0);
            if (r->pref_ref_pos[1] > 0)
                zt_log("summary: dpo reference positions computed %.0f of the rows' %.0f (%.1f%%; pref.share_prompt %s)",
                       r->pref_ref_pos[0], r->pref_ref_pos[1], 100.0 * r->pref_ref_pos[0] / r->pref_ref_pos[1],
                       cfg->pref.share_prompt ? "true" : "false");
            if (r->pref_table)
                zt_log("summary: dpo reference table: %lld of %lld pairs; %ld of %ld micro-batches read it instead of "
                       "a reference pass (pref.precompute_ref_log_probs)", (long long)r->pref_table->filled,
                       (long long)r->pref_table->n, r->pref_table_micros[0], r->pref_table_micros[1]);
        }
        if (r->rank == 0) {
            const zt_metrics_summary_t rec = {
                .steps = r->step, .tokens = r->tokens_seen, .wall_s = wall, .train_s = r->train_seconds,
                .final_loss = r->last_loss, .final_val_loss = r->val ? r->last_val : -1.0,
                .peak_rss_bytes = peak, .peak_rss_growth_bytes = growth, .device_peak_bytes = dev_peak, .mem = &mm,
                .activations = zt_tr_activation_bytes(r), .ref = r->ref_shard ? &mref : NULL,
            };
            zt_metrics_record_summary(&rec);
        }
    }
    zt_watchdog_stop();
done:
    zt_metrics_close();
    zt_shard_free(r->shard);
    zt_shard_free(r->ref_shard);
    zt_param_table_free(r->ref_table);
    zt_pref_table_free(r->pref_table);
    free(r->pref_rec);
    free(r->pref_new);
    for (int k = 1; k < r->nslots; k++) zt_model_free(r->models[k]);
    free(r->models);
    free(r->slot);
    free(r->pp_req);
    free(r->pp_buf);
    if (r->pp_trace) fclose(r->pp_trace);
    free(r->held);
    zt_model_free(r->model);
    zt_schedule_free(&r->steps);
    free(r->micro_T);
    free(r->micro_Tp);
    free(r->micro_seg);
    if (r->ltable != r->table) zt_param_table_free(r->ltable);
    free(r->tp_logits);
    free(r->row_tmp);
    zt_param_table_free(r->table);
    zt_data_close(r->train);
    zt_data_close(r->val);
    if (r->inp) r->be->free_host(r->inp);
    if (r->keys) r->be->free_host(r->keys);
    if (r->tgt) r->be->free_host(r->tgt);
    if (r->seg) r->be->free_host(r->seg);
    if (r->pos) r->be->free_host(r->pos);
    if (r->pref_seg) r->be->free_host(r->pref_seg);
    free(r->config_text);
    free(gpu_cfg);
    free(r->train_hist.step);
    free(r->train_hist.val);
    free(r->margin_hist.step);
    free(r->margin_hist.val);
    free(r->val_hist.step);
    free(r->val_hist.val);
    zt_log_close();
    return exit_code;
}
