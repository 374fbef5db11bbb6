/* zt_train_ckpt.c — the run's state on disk: checkpoints (zt_ckpt.h's format, with the
 * loop's counters and the fp16 loss scale), the HF and PEFT directories of
 * checkpoint.save_hf and LoRA runs, and at the start the weights a run begins from
 * (model.name_or_path, a checkpoint to resume, model.init_from, lora.adapter_name_or_path).
 * The loop decides when; the formats are zt_ckpt.c's and zt_hf_model.c's. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_hf_model.h"
#include "zt_log.h"
#include "zt_qlora.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

int zt_tr_save_checkpoint(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_ckpt_meta_t meta;
    memset(&meta, 0, sizeof meta);
    meta.step = r->step;
    meta.tokens_seen = r->tokens_seen;
    meta.samples_seen = r->samples_seen;
    meta.adam_step = zt_shard_adam_step(r->shard);
    meta.world_size = r->comm->world.size;
    snprintf(meta.strategy, sizeof meta.strategy, "%s", zt_strategy_name(r->sopts.strategy));
    meta.data_seed = cfg->data.seed;
    meta.shuffle = cfg->data.shuffle;
    meta.lr = (float)cfg->optim.learning_rate;
    meta.beta1 = (float)cfg->optim.adam_beta1;
    meta.beta2 = (float)cfg->optim.adam_beta2;
    meta.eps = (float)cfg->optim.adam_epsilon;
    meta.weight_decay = (float)cfg->optim.weight_decay;
    if (cfg->train.fp16) {
        meta.loss_scale = r->loss_scale;
        meta.loss_scale_good_steps = r->good_steps;
    }
    char err[ZT_ERRLEN] = "";
    zt_watchdog_mark("checkpoint save", -1, r->step);
    if (zt_tr_pref_table_save(r, err, sizeof err) != 0) {
        zt_log_error("checkpoint at step %ld failed: %s", r->step, err);
        return -1;
    }
    if (zt_ckpt_save(cfg->train.output_dir, &meta, r->config_text, cfg->checkpoint.format == ZT_CKPT_SHARDED,
                     cfg->checkpoint.keep_last, r->shard, r->table, r->comm, err, sizeof err) != 0) {
        zt_log_error("checkpoint at step %ld failed: %s", r->step, err);
        return -1;
    }
    char b[32];
    zt_log("checkpoint: step %ld saved to %s (%s in %.2f s, %.1f MB/s)", r->step,
           cfg->train.output_dir, zt_fmt_bytes(meta.bytes, b, sizeof b), meta.save_seconds,
           meta.save_seconds > 0 ? meta.bytes / meta.save_seconds / 1e6 : 0.0);
    return 0;
}

/* checkpoint.save_hf: <output_dir>/hf (a LoRA run's merged model), every rank writing
 * what it owns; adapter: <output_dir>/adapter, PEFT's directory */
int zt_tr_save_hf(run_t *r, int adapter)
{
    const zt_config_t *cfg = r->cfg;
    char dir[ZT_STRLEN + 8], err[ZT_ERRLEN] = "";
    snprintf(dir, sizeof dir, "%s/%s", cfg->train.output_dir, adapter ? "adapter" : "hf");
    zt_watchdog_mark(adapter ? "PEFT export" : "HF export", -1, r->step);
    double sec = 0;
    if (zt_hf_model_save(dir, cfg, r->shard, r->table, adapter, zt_data_eot_token(r->train), r->comm, &sec, err,
                         sizeof err) != 0) {
        zt_log_error("%s export failed: %s", adapter ? "PEFT" : "HF", err);
        return -1;
    }
    if (adapter)
        zt_log("PEFT export: %s (LoRA r=%d, scale %g, adapters of %s, %.2f s)", dir, r->table->lora_rank,
               (double)r->table->lora_scale, cfg->model.name_or_path[0] ? cfg->model.name_or_path : "this run's base",
               sec);
    else
        zt_log("HF export: %s (%s%s, %.2f s)", dir, r->table->arch->hf_class,
               r->table->first_adapter_unit >= 0 ? ", LoRA merged" : "", sec);
    return 0;
}

int zt_tr_maybe_resume(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    char path[ZT_STRLEN] = "", err[ZT_ERRLEN] = "";
    int weights_only = 0;
    if (strcmp(cfg->checkpoint.resume, "auto") == 0) {
        int found = 0;
        if (r->rank == 0) found = zt_ckpt_find_latest(cfg->train.output_dir, path, sizeof path) == 0;
        zt_bcast(r->comm, &r->comm->world, &found, 1, ZT_I32, 0);
        zt_bcast(r->comm, &r->comm->world, path, sizeof path, ZT_U8, 0);
        if (!found) path[0] = 0;
    } else if (strcmp(cfg->checkpoint.resume, "none") != 0) {
        snprintf(path, sizeof path, "%s", cfg->checkpoint.resume);
    }
    if (!path[0] && cfg->model.init_from[0]) {
        snprintf(path, sizeof path, "%s", cfg->model.init_from);
        weights_only = 1;
    }
    /* a resumed run has its weights in the checkpoint, a fresh one from the directory;
     * a LoRA checkpoint holds only the adapters, so its base comes from the directory */
    const int lora = r->table->first_adapter_unit >= 0;
    if (cfg->model.name_or_path[0] && (!path[0] || lora)) {
        zt_watchdog_mark("model load", -1, 0);
        double t0 = zt_now(), bytes = 0;
        if (zt_hf_model_load(cfg->model.name_or_path, r->shard, r->table, r->comm, &bytes, err, sizeof err)) {
            zt_log_error("%s", err);
            return -1;
        }
        const double dt = zt_max_double(r->comm, &r->comm->world, zt_now() - t0);
        char b[32];
        zt_log("model: weights of %s loaded (%s read by %d ranks in %.2f s, %.1f MB/s); fresh optimizer",
               cfg->model.name_or_path, zt_fmt_bytes(bytes, b, sizeof b), r->comm->world.size, dt,
               dt > 0 ? bytes / dt / 1e6 : 0.0);
        char q[256];
        zt_qlora_describe(r->table, q, sizeof q);
        if (zt_qlora_count(r->table)) {
            /* what the load held at its peak (a 4-bit base: each rank's share of the float32
             * values it quantizes), beside what the rank keeps */
            const double grown = zt_max_double(r->comm, &r->comm->world, (double)zt_peak_rss() - (double)r->rss0);
            zt_log("qlora: %s; peak RSS by the end of the load %s above the process before the model (max over "
                   "ranks)", q, zt_fmt_bytes(grown, b, sizeof b));
        }
    }
    if (!path[0] && cfg->lora.adapter_name_or_path[0]) {
        if (zt_hf_model_load_adapter(cfg->lora.adapter_name_or_path, r->shard, r->table, r->comm, err, sizeof err)) {
            zt_log_error("%s", err);
            return -1;
        }
        zt_log("lora: adapters of %s loaded", cfg->lora.adapter_name_or_path);
    }
    if (!path[0]) return 0;
    zt_ckpt_meta_t meta;
    memset(&meta, 0, sizeof meta);
    zt_watchdog_mark("checkpoint load", -1, 0);
    if (zt_ckpt_load(path, &meta, weights_only, r->shard, r->table, r->comm, err, sizeof err) != 0) {
        zt_log_error("%s", err);
        return -1;
    }
    char b[32];
    if (weights_only) {
        zt_log("init_from: weights of %s loaded (%s in %.2f s); fresh optimizer", path,
               zt_fmt_bytes(meta.bytes, b, sizeof b), meta.load_seconds);
        return 0;
    }
    r->step = meta.step;
    r->samples_seen = meta.samples_seen;
    if (zt_tr_pref_table_resume(r, path, meta.step) != 0) return -1;
    r->tokens_seen = meta.tokens_seen;
    /* a dynamic loss scale continues where it was (a static one is the config's) */
    if (r->dynamic_scale && meta.loss_scale > 0) {
        r->loss_scale = meta.loss_scale;
        r->good_steps = meta.loss_scale_good_steps;
        zt_log("resumed fp16 loss scale %.9g (%ld steps since the last change)", r->loss_scale, r->good_steps);
    }
    zt_log("resumed from %s: step %ld, %.0f tokens seen, saved by %d ranks with %s (%s in %.2f s, %.1f MB/s)",
           path, meta.step, meta.tokens_seen, meta.world_size, meta.strategy,
           zt_fmt_bytes(meta.bytes, b, sizeof b), meta.load_seconds,
           meta.load_seconds > 0 ? meta.bytes / meta.load_seconds / 1e6 : 0.0);
    return 0;
}
