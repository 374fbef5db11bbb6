/* zt_import.c — LLaMA-Factory training YAML (and its DeepSpeed JSON) to ztrain keys.
 *
 * One table (`yaml_keys`, `ds_keys`) says what each key of the users' files becomes; the
 * YAML is read with libyaml, the JSON with jansson. The values go through the config
 * module (zt_config_set) into a scratch configuration, so a bad value is reported here
 * with the YAML's file:line, and the text handed back holds only the keys the files gave:
 * the keys they leave out keep ztrain's defaults, which are transformers' where the name
 * is transformers'. */
#define _GNU_SOURCE /* open_memstream */
#include "zt_import.h"

#include "zt_common.h"
#include "zt_config.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* what a key of the user's file does */
typedef enum {
    MAP,    /* the value is ztrain's key's value */
    NOTE,   /* accepted with a printed line: it cannot change the result */
    REFUSE, /* one line saying why */
    CUSTOM, /* a handler below */
} how_t;

typedef struct {
    const char *name; /* the user's key */
    how_t how;
    const char *key;  /* MAP: ztrain's key */
    const char *why;  /* NOTE, REFUSE: the reason; MAP, CUSTOM: a remark for the table (or NULL) */
} entry_t;

/* LLaMA-Factory 0.9.5's training arguments (model, data, finetuning, training) that its
 * examples for the stages and families ztrain has use, and their neighbours */
static const entry_t yaml_keys[] = {
    {"model_name_or_path", MAP, "model.name_or_path", "a local directory (no hub download)"},
    {"adapter_name_or_path", MAP, "lora.adapter_name_or_path", "one PEFT adapter directory"},
    {"trust_remote_code", NOTE, NULL, "ztrain runs no code from the model directory: its families are built in"},
    {"stage", CUSTOM, "train.stage", "sft, dpo; pt reads token files (zt-prep-data); rm, ppo, kto are refused"},
    {"pref_beta", MAP, "pref.beta", NULL},
    {"pref_loss", MAP, "pref.loss", NULL},
    {"pref_ftx", MAP, "pref.ftx", NULL},
    {"dpo_label_smoothing", MAP, "pref.label_smoothing", NULL},
    {"simpo_gamma", MAP, "pref.simpo_gamma", NULL},
    {"ref_model", MAP, "pref.ref_model", "a local directory"},
    {"do_train", CUSTOM, NULL, "true; false is refused (ztrain trains)"},
    {"finetuning_type", CUSTOM, "train.finetuning_type", "full, lora; freeze and oft are refused"},
    {"lora_rank", MAP, "lora.rank", NULL},
    {"lora_alpha", MAP, "lora.alpha", NULL},
    {"lora_dropout", MAP, "lora.dropout", NULL},
    {"lora_target", MAP, "lora.target", "a comma-separated list, or all"},
    {"use_rslora", MAP, "lora.use_rslora", NULL},
    {"dataset", MAP, "data.dataset", "names in dataset_info.json"},
    {"eval_dataset", MAP, "data.eval_dataset", NULL},
    {"dataset_dir", MAP, "data.dataset_dir", NULL},
    {"template", MAP, "data.template", NULL},
    {"cutoff_len", MAP, "data.cutoff_len", "and data.seq_len: a row holds a whole sample of up to cutoff_len "
                                         "tokens (LLaMA-Factory's default 2048 when not given)"},
    {"max_samples", MAP, "data.max_samples", NULL},
    {"train_on_prompt", MAP, "data.train_on_prompt", NULL},
    {"mask_history", MAP, "data.mask_history", NULL},
    {"packing", MAP, "data.packing", NULL},
    {"neat_packing", MAP, "data.neat_packing", NULL},
    {"disable_shuffling", CUSTOM, "data.shuffle", "its negation: the samples in the files' order"},
    {"preprocessing_num_workers", NOTE, NULL, "every rank preprocesses a share of the records"},
    {"dataloader_num_workers", NOTE, NULL, "ztrain reads its samples without worker processes"},
    {"overwrite_cache", NOTE, NULL, "the preprocessed file is keyed by content and options, so a stale one is never read"},
    {"val_size", REFUSE, NULL, "splitting a validation share off the training data is not available: give data.eval_dataset"},
    {"output_dir", MAP, "train.output_dir", NULL},
    {"overwrite_output_dir", NOTE, NULL, "ztrain writes into output_dir as it is (checkpoint.resume decides what is read)"},
    {"logging_steps", MAP, "train.logging_steps", NULL},
    {"save_steps", MAP, "checkpoint.save_steps", NULL},
    {"save_total_limit", MAP, "checkpoint.keep_last", NULL},
    {"plot_loss", MAP, "log.plot", NULL},
    {"save_only_model", NOTE, NULL, "ztrain's checkpoints always hold the optimizer state; the result is the same"},
    {"report_to", NOTE, NULL, "ztrain writes metrics.jsonl (and loss.svg), whatever the logger named"},
    {"per_device_train_batch_size", MAP, "train.per_device_train_batch_size", NULL},
    {"gradient_accumulation_steps", MAP, "train.gradient_accumulation_steps", NULL},
    {"learning_rate", MAP, "optim.learning_rate", NULL},
    {"num_train_epochs", MAP, "train.num_train_epochs", NULL},
    {"max_steps", CUSTOM, "train.max_steps", "-1 (transformers' none) is 0"},
    {"lr_scheduler_type", MAP, "optim.lr_scheduler_type", NULL},
    {"lr_scheduler_kwargs", CUSTOM, NULL, "each keyword argument is the optim. key of its name"},
    {"warmup_ratio", MAP, "optim.warmup_ratio", NULL},
    {"warmup_steps", CUSTOM, "optim.warmup_steps", "a value below 1 is the ratio, as transformers 5 reads it"},
    {"weight_decay", MAP, "optim.weight_decay", NULL},
    {"adam_beta1", MAP, "optim.adam_beta1", NULL},
    {"adam_beta2", MAP, "optim.adam_beta2", NULL},
    {"adam_epsilon", MAP, "optim.adam_epsilon", NULL},
    {"max_grad_norm", MAP, "optim.max_grad_norm", NULL},
    {"seed", MAP, "train.seed", NULL},
    {"bf16", MAP, "train.bf16", NULL},
    {"fp16", MAP, "train.fp16", NULL},
    {"disable_gradient_checkpointing", CUSTOM, "train.gradient_checkpointing",
     "its negation; LLaMA-Factory recomputes activations unless it is true, and so does the import"},
    {"ddp_timeout", CUSTOM, "parallel.timeout_s", "seconds, at most 1e7 (the watchdog's bound)"},
    {"resume_from_checkpoint", CUSTOM, "checkpoint.resume", "null is none; a path must be a ztrain checkpoint"},
    {"eval_steps", MAP, "train.eval_steps", NULL},
    {"eval_strategy", CUSTOM, NULL, "no, steps; epoch is refused"},
    {"per_device_eval_batch_size", NOTE, NULL, "the validation loss is the mean over its tokens whatever the batch"},
    {"deepspeed", CUSTOM, NULL, "the DeepSpeed JSON it names (the table below)"},
    {"quantization_bit", CUSTOM, "model.quantization_bit",
     "4 is QLoRA (float32 compute), and then checkpoint.save_hf = false: the adapters are the result, as LLaMA-Factory "
     "saves them"},
    {"quantization_type", MAP, "model.quantization_type", NULL},
    {"double_quantization", MAP, "model.double_quantization", NULL},
    {"flash_attn", NOTE, NULL, "ztrain's attention is its own fused kernel, exact causal attention"},
    {"enable_liger_kernel", NOTE, NULL, "ztrain's kernels are its own; the maths is the same"},
};

/* DeepSpeed's config keys (as transformers' HfTrainerDeepSpeedConfig fills them) */
static const entry_t ds_keys[] = {
    {"train_batch_size", CUSTOM, NULL, "auto, or micro x accumulation x data ranks"},
    {"train_micro_batch_size_per_gpu", CUSTOM, NULL, "auto, or the YAML's per_device_train_batch_size"},
    {"gradient_accumulation_steps", CUSTOM, NULL, "auto, or the YAML's gradient_accumulation_steps"},
    {"gradient_clipping", CUSTOM, NULL, "auto, or the YAML's max_grad_norm"},
    {"zero_allow_untested_optimizer", NOTE, NULL, "ztrain's AdamW runs under every stage"},
    {"bf16", CUSTOM, NULL, "enabled: auto, or the YAML's bf16"},
    {"fp16", CUSTOM, NULL, "enabled: auto or the YAML's fp16; loss_scale, initial_scale_power, loss_scale_window, "
                           "min_loss_scale map to train.*"},
    {"zero_optimization.stage", CUSTOM, "parallel.strategy", "0 ddp, 1 zero1, 2 zero2, 3 zero3"},
    {"zero_optimization.offload_optimizer", CUSTOM, "parallel.offload_optimizer", "device cpu, nvme or none; its keys below"},
    {"zero_optimization.offload_param", CUSTOM, "parallel.offload_param", "device cpu, nvme or none; its keys below"},
    {"zero_optimization.offload_optimizer.device", CUSTOM, "parallel.offload_optimizer", "cpu, nvme, none"},
    {"zero_optimization.offload_param.device", CUSTOM, "parallel.offload_param", "cpu, nvme, none"},
    {"zero_optimization.offload_optimizer.nvme_path", CUSTOM, "parallel.offload_nvme_path",
     "one directory for both sections (different paths are refused)"},
    {"zero_optimization.offload_param.nvme_path", CUSTOM, "parallel.offload_nvme_path",
     "one directory for both sections (different paths are refused)"},
    {"zero_optimization.offload_optimizer.buffer_count", CUSTOM, "parallel.offload_nvme_buffer_count",
     "one set of buffers serves both sections: the larger count"},
    {"zero_optimization.offload_param.buffer_count", CUSTOM, "parallel.offload_nvme_buffer_count",
     "one set of buffers serves both sections: the larger count"},
    {"zero_optimization.offload_param.buffer_size", NOTE, NULL,
     "ztrain sizes its buffers to the largest unit's state itself"},
    {"zero_optimization.offload_param.max_in_cpu", NOTE, NULL, "ztrain keeps no parameter shard in memory beyond "
                                                               "its buffers"},
    {"zero_optimization.offload_optimizer.pin_memory", NOTE, NULL, "host offload's memory is pinned on the cuda "
                                                                   "backend; nvme buffers are page-aligned"},
    {"zero_optimization.offload_param.pin_memory", NOTE, NULL, "host offload's memory is pinned on the cuda "
                                                               "backend; nvme buffers are page-aligned"},
    {"zero_optimization.offload_optimizer.pipeline_read", NOTE, NULL,
     "ztrain always reads the next unit while one updates"},
    {"zero_optimization.offload_optimizer.pipeline_write", NOTE, NULL,
     "ztrain always writes the previous unit while one updates"},
    {"zero_optimization.offload_optimizer.pipeline", NOTE, NULL, "ztrain always overlaps reads and writes"},
    {"zero_optimization.offload_optimizer.fast_init", NOTE, NULL, "how DeepSpeed fills the files; the result is the same"},
    {"zero_optimization.offload_optimizer.ratio", NOTE, NULL, "ztrain offloads the whole shard (the result is the same)"},
    {"aio.block_size", MAP, "parallel.offload_nvme_block_size", "bytes per request"},
    {"aio.queue_depth", MAP, "parallel.offload_nvme_queue_depth", "requests in flight"},
    {"aio.thread_count", NOTE, NULL, "io_uring needs no I/O threads (ZT_NVME_IO=threads: queue_depth, at most 8)"},
    {"aio.intra_op_parallelism", NOTE, NULL, "io_uring needs no I/O threads"},
    {"aio.single_submit", NOTE, NULL, "ztrain submits as many requests as queue_depth allows"},
    {"aio.overlap_events", NOTE, NULL, "ztrain reaps completions while it submits"},
    {"aio.use_gds", NOTE, NULL, "GPUDirect Storage is not used: files move through host buffers"},
    {"zero_optimization.reduce_bucket_size", CUSTOM, "parallel.bucket_size_mb", "elements of fp32: x 4 bytes"},
    {"zero_optimization.overlap_comm", NOTE, NULL, "ztrain overlaps its collectives with compute as it can"},
    {"zero_optimization.allgather_partitions", NOTE, NULL, "how DeepSpeed gathers; the result is the same"},
    {"zero_optimization.allgather_bucket_size", NOTE, NULL, "ztrain gathers a unit at a time"},
    {"zero_optimization.reduce_scatter", NOTE, NULL, "ztrain reduce-scatters wherever gradients are sharded"},
    {"zero_optimization.contiguous_gradients", NOTE, NULL, "ztrain's gradients are contiguous per unit"},
    {"zero_optimization.round_robin_gradients", NOTE, NULL, "a DeepSpeed copy-order optimisation"},
    {"zero_optimization.sub_group_size", NOTE, NULL, "ztrain steps the optimizer a unit at a time"},
    {"zero_optimization.stage3_prefetch_bucket_size", NOTE, NULL, "ztrain prefetches the next unit"},
    {"zero_optimization.stage3_param_persistence_threshold", NOTE, NULL, "ztrain gathers every unit"},
    {"zero_optimization.stage3_max_live_parameters", NOTE, NULL, "ztrain holds one gathered unit and the next"},
    {"zero_optimization.stage3_max_reuse_distance", NOTE, NULL, "ztrain frees a unit after use"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", NOTE, NULL,
     "ztrain's HF export is always gathered (checkpoint.hf_dtype)"},
    {"optimizer", REFUSE, NULL, "ztrain runs transformers' AdamW with the YAML's arguments: remove the section"},
    {"scheduler", REFUSE, NULL, "ztrain runs the YAML's lr_scheduler_type: remove the section"},
};

/* accelerate's config file (`accelerate config`'s YAML; fsdp_config's keys by their names) */
static const entry_t accel_keys[] = {
    {"distributed_type", CUSTOM, NULL, "FSDP, or MULTI_GPU (ddp); DEEPSPEED goes through the YAML's deepspeed:"},
    {"num_processes", CUSTOM, NULL, "must equal the ranks mpirun started"},
    {"num_machines", CUSTOM, NULL, "must equal the nodes those ranks are on"},
    {"mixed_precision", CUSTOM, NULL, "bf16 train.bf16, fp16 train.fp16, no: neither; must agree with the YAML's"},
    {"fsdp_sharding_strategy", CUSTOM, "parallel.strategy",
     "FULL_SHARD full_shard, SHARD_GRAD_OP shard_grad_op, NO_SHARD ddp, HYBRID_SHARD hybrid_shard, "
     "HYBRID_SHARD_ZERO2 hybrid_shard_zero2 (or their numbers 1-5)"},
    {"fsdp_version", CUSTOM, "parallel.shard_layout", "1 flat, 2 per_param (FSDP2; its strategy full_shard unless "
                                                      "fsdp_reshard_after_forward is false: shard_grad_op)"},
    {"fsdp_reshard_after_forward", CUSTOM, "parallel.reshard_after_forward", NULL},
    {"fsdp_offload_params", CUSTOM, NULL, "true: parallel.offload_param and offload_optimizer cpu (FSDP's CPU "
                                          "offload moves parameters, gradients and the optimizer step)"},
    {"fsdp_state_dict_type", CUSTOM, "checkpoint.format", "FULL_STATE_DICT consolidated, SHARDED_STATE_DICT sharded"},
    {"fsdp_activation_checkpointing", MAP, "train.gradient_checkpointing", NULL},
    {"fsdp_cpu_ram_efficient_loading", NOTE, NULL, "every rank reads only the weights it owns"},
    {"fsdp_auto_wrap_policy", NOTE, NULL, "ztrain's units are the blocks (TRANSFORMER_BASED_WRAP's)"},
    {"fsdp_transformer_layer_cls_to_wrap", NOTE, NULL, "ztrain's units are the blocks"},
    {"fsdp_backward_prefetch", NOTE, NULL, "ztrain prefetches the next unit"},
    {"fsdp_forward_prefetch", NOTE, NULL, "ztrain prefetches the next unit"},
    {"fsdp_sync_module_states", NOTE, NULL, "every rank starts from the same weights"},
    {"fsdp_use_orig_params", NOTE, NULL, "how FSDP1 keeps parameters; the result is the same"},
    {"compute_environment", NOTE, NULL, "mpirun or srun starts the ranks"},
    {"debug", NOTE, NULL, "no effect on the result"},
    {"downcast_bf16", NOTE, NULL, "a TPU setting"},
    {"machine_rank", NOTE, NULL, "MPI gives each rank its place"},
    {"main_training_function", NOTE, NULL, "ztrain is the program"},
    {"rdzv_backend", NOTE, NULL, "MPI does the rendezvous"},
    {"same_network", NOTE, NULL, "MPI does the rendezvous"},
    {"tpu_env", NOTE, NULL, "a TPU setting"},
    {"tpu_use_cluster", NOTE, NULL, "a TPU setting"},
    {"tpu_use_sudo", NOTE, NULL, "a TPU setting"},
    {"use_cpu", NOTE, NULL, "the backend is parallel.backend's"},
    {"gpu_ids", NOTE, NULL, "each rank takes its node-local device"},
};

#define NYAML (sizeof yaml_keys / sizeof yaml_keys[0])
#define NDS (sizeof ds_keys / sizeof ds_keys[0])
#define NACCEL (sizeof accel_keys / sizeof accel_keys[0])

static const entry_t *lookup(const entry_t *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* the table's name nearest to `name` (edit distance), for did-you-mean */
static const char *nearest(const entry_t *t, size_t n, const char *name)
{
    const char *best = NULL;
    int bd = 4; /* farther than 3 edits suggests nothing */
    for (size_t i = 0; i < n; i++) {
        const int d = zt_levenshtein(name, t[i].name);
        if (d < bd) bd = d, best = t[i].name;
    }
    return best;
}

typedef struct {
    const char *path;
    zt_config_t *cfg; /* scratch: defaults plus what the files set */
    FILE *notes;
    char *err;
    size_t errlen;
    char deepspeed[ZT_STRLEN];
    char ds_where[ZT_STRLEN + 64];
    int gradient_checkpointing_given;
    int world, nodes;
    int nvme_buffers;   /* the larger buffer_count of the offload sections so far */
} imp_t;

static int fail(imp_t *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(imp_t *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(im->err, im->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void note(imp_t *im, const char *where, const char *name, const char *why)
{
    if (im->notes) fprintf(im->notes, "%s: %s accepted: %s\n", where, name, why);
}

static int set(imp_t *im, const char *key, const char *val, const char *where)
{
    return zt_config_set(im->cfg, key, val, where, im->err, im->errlen);
}

/* YAML's null (plain null, Null, NULL, ~ or nothing) */
static int is_null(const yaml_node_t *v)
{
    if (v->type != YAML_SCALAR_NODE || v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = (const char *)v->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static int truthy(const char *s) { return !strcasecmp(s, "true") || !strcmp(s, "1") || !strcasecmp(s, "yes"); }

static int custom_yaml(imp_t *im, yaml_document_t *doc, const entry_t *e, const yaml_node_t *v, const char *val,
                       const char *where)
{
    char buf[64];
    if (!strcmp(e->name, "stage")) {
        if (!strcmp(val, "sft") || !strcmp(val, "dpo")) return set(im, "train.stage", val, where);
        if (!strcmp(val, "pt"))
            return fail(im, "%s: stage: pt trains on text datasets; ztrain's pretraining reads token files "
                            "(zt-prep-data makes them; then data.train_files)", where);
        return fail(im, "%s: stage: %s is not available (ztrain trains sft, dpo and pretraining)", where, val);
    }
    if (!strcmp(e->name, "do_train")) {
        if (truthy(val)) return 0;
        return fail(im, "%s: do_train: %s: ztrain trains; evaluation or prediction alone is not available", where, val);
    }
    if (!strcmp(e->name, "finetuning_type")) {
        if (strcmp(val, "full") && strcmp(val, "lora"))
            return fail(im, "%s: finetuning_type: %s is not available (full, lora)", where, val);
        return set(im, e->key, val, where);
    }
    if (!strcmp(e->name, "quantization_bit")) {
        /* LLaMA-Factory's trainer saves the adapters alone, and its export refuses to merge into a
         * quantized model: no merged model either (ztrain can write one: doc/quantization.md) */
        if (atoi(val) == 4 && set(im, "checkpoint.save_hf", "false", where)) return -1;
        return set(im, e->key, val, where);
    }
    if (!strcmp(e->name, "max_steps")) return set(im, e->key, atof(val) < 0 ? "0" : val, where);
    if (!strcmp(e->name, "warmup_steps")) {
        const double w = atof(val);
        if (w > 0 && w < 1) return set(im, "optim.warmup_ratio", val, where);
        return set(im, e->key, val, where);
    }
    if (!strcmp(e->name, "disable_shuffling")) return set(im, e->key, truthy(val) ? "false" : "true", where);
    if (!strcmp(e->name, "disable_gradient_checkpointing")) {
        im->gradient_checkpointing_given = 1;
        return set(im, e->key, truthy(val) ? "false" : "true", where);
    }
    if (!strcmp(e->name, "ddp_timeout")) {
        snprintf(buf, sizeof buf, "%.17g", fmin(atof(val), 1e7));
        return set(im, e->key, buf, where);
    }
    if (!strcmp(e->name, "resume_from_checkpoint")) return set(im, e->key, is_null(v) ? "none" : val, where);
    if (!strcmp(e->name, "eval_strategy")) {
        if (!strcmp(val, "no") || !strcmp(val, "steps")) return 0;
        return fail(im, "%s: eval_strategy: %s is not available (no, steps: train.eval_steps)", where, val);
    }
    if (!strcmp(e->name, "deepspeed")) {
        snprintf(im->deepspeed, sizeof im->deepspeed, "%s", val);
        snprintf(im->ds_where, sizeof im->ds_where, "%s", where);
        return 0;
    }
    if (!strcmp(e->name, "lr_scheduler_kwargs")) {
        if (v->type != YAML_MAPPING_NODE) return fail(im, "%s: lr_scheduler_kwargs: not a mapping", where);
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(doc, p->key), *x = yaml_document_get_node(doc, p->value);
            char key[128];
            if (k->type != YAML_SCALAR_NODE || x->type != YAML_SCALAR_NODE)
                return fail(im, "%s: lr_scheduler_kwargs: not a mapping of scalars", where);
            snprintf(key, sizeof key, "optim.%s", (const char *)k->data.scalar.value);
            if (set(im, key, (const char *)x->data.scalar.value, where)) return -1;
        }
        return 0;
    }
    return fail(im, "%s: %s: no handler", where, e->name); /* a table row without one: a bug */
}

/* ---- DeepSpeed JSON -------------------------------------------------------------- */

/* a stated DeepSpeed value against the YAML's (transformers' fill_match refuses a
 * mismatch); "auto" takes the YAML's */
static int ds_match(imp_t *im, const char *where, const char *dskey, json_t *v, double yaml, const char *yamlkey)
{
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) return 0;
    if (!json_is_number(v)) return fail(im, "%s: %s: expected a number or \"auto\"", where, dskey);
    if (json_number_value(v) != yaml)
        return fail(im, "%s: %s is %g but the YAML's %s gives %g (DeepSpeed refuses the mismatch; use \"auto\")",
                    where, dskey, json_number_value(v), yamlkey, yaml);
    return 0;
}

/* "enabled" of a bf16/fp16 section against the YAML's flag */
static int ds_enabled(imp_t *im, const char *where, const char *sec, json_t *o, int yaml)
{
    json_t *en = json_object_get(o, "enabled");
    if (!en || (json_is_string(en) && !strcmp(json_string_value(en), "auto"))) return 0;
    if (!json_is_boolean(en)) return fail(im, "%s: %s.enabled: expected true, false or \"auto\"", where, sec);
    if (json_is_true(en) != yaml)
        return fail(im, "%s: %s.enabled is %s but the YAML's %s is %s (use \"auto\")", where, sec,
                    json_is_true(en) ? "true" : "false", sec, yaml ? "true" : "false");
    return 0;
}

/* the table's row of a DeepSpeed key; NULL with a did-you-mean line for one it lacks */
static const entry_t *ds_entry(imp_t *im, const char *where, const char *name)
{
    const entry_t *e = lookup(ds_keys, NDS, name);
    if (e) return e;
    const char *near = nearest(ds_keys, NDS, name);
    fail(im, "%s: %s is not read by ztrain%s%s%s", where, name, near ? " (did you mean " : "", near ? near : "",
         near ? ")" : "");
    return NULL;
}

/* a JSON scalar as the text zt_config_set reads */
static const char *json_text(json_t *v, char *buf, size_t len)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_integer(v)) snprintf(buf, len, "%lld", (long long)json_integer_value(v));
    else if (json_is_number(v)) snprintf(buf, len, "%.17g", json_number_value(v));
    else if (json_is_boolean(v)) snprintf(buf, len, "%s", json_is_true(v) ? "true" : "false");
    else return NULL;
    return buf;
}

/* the keys of a DeepSpeed section `sec` (zero_optimization.offload_*, aio) by the table */
static int ds_section(imp_t *im, const char *where, const char *sec, json_t *o)
{
    const char *k;
    json_t *v;
    char name[160], buf[64];
    if (!json_is_object(o)) return fail(im, "%s: %s: expected an object", where, sec);
    json_object_foreach(o, k, v)
    {
        snprintf(name, sizeof name, "%s.%s", sec, k);
        const entry_t *e = ds_entry(im, where, name);
        if (!e) return -1;
        if (e->how == NOTE) {
            note(im, where, name, e->why);
            continue;
        }
        const char *val = json_text(v, buf, sizeof buf);
        if (!val) return fail(im, "%s: %s: expected a number, a string or a boolean", where, name);
        if (!strcmp(k, "nvme_path")) {
            /* one directory serves both offload sections */
            const char *had = im->cfg->parallel.offload_nvme_path;
            if (had[0] && strcmp(had, val))
                return fail(im, "%s: %s: %s differs from the other section's %s (ztrain keeps both in one "
                            "directory)", where, name, val, had);
        } else if (!strcmp(k, "buffer_count")) {
            if (json_is_integer(v) && json_integer_value(v) < im->nvme_buffers) continue;
            im->nvme_buffers = json_is_integer(v) ? (int)json_integer_value(v) : im->nvme_buffers;
        }
        if (set(im, e->key, val, where)) return -1;
    }
    return 0;
}

static int ds_offload(imp_t *im, const char *where, const char *name, json_t *o, const char *key)
{
    const char *dev = json_string_value(json_object_get(o, "device"));
    char sec[96];
    if (!dev) return fail(im, "%s: zero_optimization.%s: no \"device\"", where, name);
    snprintf(sec, sizeof sec, "zero_optimization.%s", name);
    return set(im, key, dev, where) || ds_section(im, where, sec, o);
}

static int ds_zero(imp_t *im, const char *where, json_t *z)
{
    const char *k;
    json_t *v;
    char name[128], buf[64];
    json_object_foreach(z, k, v)
    {
        snprintf(name, sizeof name, "zero_optimization.%s", k);
        const entry_t *e = ds_entry(im, where, name);
        if (!e) return -1;
        if (e->how == NOTE) {
            note(im, where, name, e->why);
        } else if (!strcmp(k, "stage")) {
            static const char *const st[] = {"ddp", "zero1", "zero2", "zero3"};
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 3)
                return fail(im, "%s: zero_optimization.stage: expected 0, 1, 2 or 3", where);
            if (set(im, e->key, st[json_integer_value(v)], where)) return -1;
        } else if (!strcmp(k, "offload_optimizer") || !strcmp(k, "offload_param")) {
            if (ds_offload(im, where, k, v, e->key)) return -1;
        } else if (!strcmp(k, "reduce_bucket_size")) {
            if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) continue;
            if (!json_is_number(v)) return fail(im, "%s: %s: expected a number or \"auto\"", where, name);
            snprintf(buf, sizeof buf, "%.17g", json_number_value(v) * 4.0 / 1e6);
            if (set(im, e->key, buf, where)) return -1;
        }
    }
    return 0;
}

static int ds_import(imp_t *im, int world)
{
    json_error_t je;
    json_t *root = json_load_file(im->deepspeed, 0, &je);
    char where[ZT_STRLEN + 64];
    if (!root)
        return fail(im, "%s: deepspeed: %s:%d: %s", im->ds_where, im->deepspeed, je.line, je.text);
    snprintf(where, sizeof where, "%s", im->deepspeed);
    int rc = 0;
    const zt_config_t *c = im->cfg;
    const int data_ranks = ZT_MAX(1, world / (c->parallel.tensor_parallel_size * c->parallel.sequence_parallel_size));
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        const entry_t *e = lookup(ds_keys, NDS, k);
        if (!strcmp(k, "zero_optimization")) rc = ds_zero(im, where, v);
        else if (!strcmp(k, "aio")) rc = ds_section(im, where, "aio", v);
        else if (!e) {
            const char *near = nearest(ds_keys, NDS, k);
            rc = fail(im, "%s: %s is not read by ztrain%s%s%s", where, k, near ? " (did you mean " : "",
                      near ? near : "", near ? ")" : "");
        } else if (e->how == NOTE) note(im, where, k, e->why);
        else if (e->how == REFUSE) rc = fail(im, "%s: %s: %s", where, k, e->why);
        else if (!strcmp(k, "train_micro_batch_size_per_gpu"))
            rc = ds_match(im, where, k, v, c->train.per_device_train_batch_size, "per_device_train_batch_size");
        else if (!strcmp(k, "gradient_accumulation_steps"))
            rc = ds_match(im, where, k, v, c->train.gradient_accumulation_steps, "gradient_accumulation_steps");
        else if (!strcmp(k, "train_batch_size"))
            rc = ds_match(im, where, k, v,
                          (double)c->train.per_device_train_batch_size * c->train.gradient_accumulation_steps *
                              data_ranks,
                          "per_device_train_batch_size x gradient_accumulation_steps x data ranks");
        else if (!strcmp(k, "gradient_clipping")) rc = ds_match(im, where, k, v, c->optim.max_grad_norm, "max_grad_norm");
        else if (!strcmp(k, "bf16")) rc = ds_enabled(im, where, k, v, c->train.bf16);
        else if (!strcmp(k, "fp16")) {
            rc = ds_enabled(im, where, k, v, c->train.fp16);
            /* the loss-scale settings mean something only when fp16 trains */
            static const struct { const char *ds, *zt; } ls[] = {{"loss_scale", "train.loss_scale"},
                                                                 {"initial_scale_power", "train.initial_scale_power"},
                                                                 {"loss_scale_window", "train.loss_scale_window"},
                                                                 {"min_loss_scale", "train.min_loss_scale"}};
            for (size_t i = 0; !rc && c->train.fp16 && i < sizeof ls / sizeof ls[0]; i++) {
                json_t *x = json_object_get(v, ls[i].ds);
                char buf[64];
                if (!json_is_number(x)) continue;
                snprintf(buf, sizeof buf, "%.17g", json_number_value(x));
                rc = set(im, ls[i].zt, buf, where);
            }
            json_t *h = json_object_get(v, "hysteresis");
            if (!rc && c->train.fp16 && json_is_number(h) && json_number_value(h) != 1)
                rc = fail(im, "%s: fp16.hysteresis %g: ztrain lowers the loss scale at the first overflow "
                              "(hysteresis 1)", where, json_number_value(h));
        }
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

/* ---- accelerate's config ---------------------------------------------------------- */

static int want_int(imp_t *im, const char *where, const char *name, const char *val, int have, const char *what)
{
    char *end;
    long v = strtol(val, &end, 10);
    if (*end || v != have)
        return fail(im, "%s: %s is %s, but %s %d (ztrain takes the mesh from MPI)", where, name, val, what, have);
    return 0;
}

static int custom_accel(imp_t *im, const entry_t *e, const char *val, const char *where)
{
    const char *n = e->name;
    if (!strcmp(n, "distributed_type")) {
        if (!strcmp(val, "FSDP")) return 0;
        if (!strcmp(val, "MULTI_GPU") || !strcmp(val, "MULTI_CPU")) return set(im, "parallel.strategy", "ddp", where);
        return fail(im, "%s: distributed_type: %s is not read by ztrain (FSDP, MULTI_GPU; DeepSpeed through the "
                        "training YAML's deepspeed:)", where, val);
    }
    if (!strcmp(n, "num_processes")) return want_int(im, where, n, val, im->world, "mpirun started");
    if (!strcmp(n, "num_machines")) return want_int(im, where, n, val, im->nodes, "its ranks are on nodes:");
    if (!strcmp(n, "mixed_precision")) {
        const int bf = !strcmp(val, "bf16"), fp = !strcmp(val, "fp16");
        if (!bf && !fp && strcmp(val, "no"))
            return fail(im, "%s: mixed_precision: %s is not available (bf16, fp16, no)", where, val);
        /* the training YAML says bf16/fp16 too: the two must agree */
        if ((zt_config_given(im->cfg, "train.bf16") && im->cfg->train.bf16 != bf) ||
            (zt_config_given(im->cfg, "train.fp16") && im->cfg->train.fp16 != fp))
            return fail(im, "%s: mixed_precision %s disagrees with the training YAML's bf16/fp16", where, val);
        return set(im, "train.bf16", bf ? "true" : "false", where) || set(im, "train.fp16", fp ? "true" : "false", where);
    }
    if (!strcmp(n, "fsdp_sharding_strategy")) {
        static const char *const fsdp[][2] = {{"FULL_SHARD", "full_shard"},       {"1", "full_shard"},
                                              {"SHARD_GRAD_OP", "shard_grad_op"}, {"2", "shard_grad_op"},
                                              {"NO_SHARD", "ddp"},                {"3", "ddp"},
                                              {"HYBRID_SHARD", "hybrid_shard"},   {"4", "hybrid_shard"},
                                              {"HYBRID_SHARD_ZERO2", "hybrid_shard_zero2"},
                                              {"5", "hybrid_shard_zero2"}};
        for (size_t i = 0; i < sizeof fsdp / sizeof fsdp[0]; i++)
            if (!strcmp(val, fsdp[i][0])) return set(im, e->key, fsdp[i][1], where);
        return fail(im, "%s: fsdp_sharding_strategy: %s is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                        "HYBRID_SHARD, HYBRID_SHARD_ZERO2", where, val);
    }
    if (!strcmp(n, "fsdp_version")) {
        if (!strcmp(val, "1")) return set(im, e->key, "flat", where);
        if (strcmp(val, "2")) return fail(im, "%s: fsdp_version: %s (1 or 2)", where, val);
        /* FSDP2 has no sharding strategy: fully sharded, resharded after forward unless told */
        if (!zt_config_given(im->cfg, "parallel.strategy") && set(im, "parallel.strategy", "full_shard", where))
            return -1;
        return set(im, e->key, "per_param", where);
    }
    if (!strcmp(n, "fsdp_reshard_after_forward")) return set(im, e->key, val, where);
    if (!strcmp(n, "fsdp_offload_params")) {
        const char *dev = truthy(val) ? "cpu" : "none";
        return set(im, "parallel.offload_param", dev, where) || set(im, "parallel.offload_optimizer", dev, where);
    }
    if (!strcmp(n, "fsdp_state_dict_type")) {
        if (!strcmp(val, "FULL_STATE_DICT")) return set(im, e->key, "consolidated", where);
        if (!strcmp(val, "SHARDED_STATE_DICT")) return set(im, e->key, "sharded", where);
        return fail(im, "%s: fsdp_state_dict_type: %s (FULL_STATE_DICT, SHARDED_STATE_DICT)", where, val);
    }
    return fail(im, "%s: %s: no handler", where, n);
}

/* one mapping of accelerate's file (its top level, or fsdp_config) */
static int accel_mapping(imp_t *im, yaml_document_t *doc, const yaml_node_t *m, const char *path)
{
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        char where[ZT_STRLEN + 64];
        snprintf(where, sizeof where, "%s:%zu", path, k->start_mark.line + 1);
        const char *name = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        if (!strcmp(name, "fsdp_config") && v->type == YAML_MAPPING_NODE) {
            if (accel_mapping(im, doc, v, path)) return -1;
            continue;
        }
        const entry_t *e = lookup(accel_keys, NACCEL, name);
        if (!e) {
            const char *near = nearest(accel_keys, NACCEL, name);
            return fail(im, "%s: %s is not a key ztrain reads from an accelerate config%s%s%s", where, name,
                        near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
        }
        if (e->how == NOTE) {
            note(im, where, name, e->why);
            continue;
        }
        if (v->type != YAML_SCALAR_NODE) return fail(im, "%s: %s: expected a single value", where, name);
        const char *val = (const char *)v->data.scalar.value;
        if (e->how == MAP ? set(im, e->key, val, where) : custom_accel(im, e, val, where)) return -1;
    }
    return 0;
}

/* ---- the YAML -------------------------------------------------------------------- */

static int yaml_import(imp_t *im, yaml_document_t *doc)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root) return fail(im, "%s: empty YAML document", im->path);
    if (root->type != YAML_MAPPING_NODE)
        return fail(im, "%s:%zu: a LLaMA-Factory training YAML is a mapping of keys", im->path,
                    root->start_mark.line + 1);
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        char where[ZT_STRLEN + 64];
        snprintf(where, sizeof where, "%s:%zu", im->path, k->start_mark.line + 1);
        if (k->type != YAML_SCALAR_NODE) return fail(im, "%s: a key that is not a scalar", where);
        const char *name = (const char *)k->data.scalar.value;
        const entry_t *e = lookup(yaml_keys, NYAML, name);
        if (!e) {
            const char *near = nearest(yaml_keys, NYAML, name);
            return fail(im, "%s: %s is not a key ztrain reads from a LLaMA-Factory YAML%s%s%s", where, name,
                        near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
        }
        const char *val = v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : "";
        if (e->how != CUSTOM && v->type != YAML_SCALAR_NODE)
            return fail(im, "%s: %s: expected a single value", where, name);
        int rc = 0;
        switch (e->how) {
        case MAP: rc = is_null(v) ? 0 : set(im, e->key, val, where); break;
        case NOTE: note(im, where, name, e->why); break;
        case REFUSE: rc = fail(im, "%s: %s: %s", where, name, e->why); break;
        case CUSTOM: rc = custom_yaml(im, doc, e, v, val, where); break;
        }
        if (rc) return -1;
    }
    /* LLaMA-Factory recomputes activations unless disable_gradient_checkpointing says not */
    if (!im->gradient_checkpointing_given && set(im, "train.gradient_checkpointing", "true", im->path)) return -1;
    /* LLaMA-Factory's samples are up to cutoff_len tokens, each trained whole: ztrain's rows must
     * hold one (a shorter row would cut its tail) */
    char buf[32];
    snprintf(buf, sizeof buf, "%d", im->cfg->data.cutoff_len);
    if (set(im, "data.seq_len", buf, im->path)) return -1;
    return 0;
}

/* the keys the files set, as libconfig text, section by section */
static char *config_text(const imp_t *im)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) zt_fatal("open_memstream failed");
    fprintf(f, "# imported from %s\n", im->path);
    char open_sec[64] = "";
    for (int i = 0; i < zt_config_nkeys(); i++) {
        const char *key = zt_config_key_name(i), *dot = strchr(key, '.');
        if (!zt_config_given(im->cfg, key) || !dot) continue;
        char value[ZT_STRLEN * 4];
        zt_config_value_text(im->cfg, key, value, sizeof value);
        const size_t sl = (size_t)(dot - key);
        if (strlen(open_sec) != sl || strncmp(open_sec, key, sl)) {
            if (open_sec[0]) fprintf(f, "};\n");
            snprintf(open_sec, sizeof open_sec, "%.*s", (int)sl, key);
            fprintf(f, "%s = {\n", open_sec);
        }
        fprintf(f, "  %s = %s;\n", dot + 1, value);
    }
    if (open_sec[0]) fprintf(f, "};\n");
    if (fclose(f) != 0) zt_fatal("writing the imported config to memory failed");
    return buf;
}

int zt_import_is_yaml(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot && (!strcmp(dot, ".yaml") || !strcmp(dot, ".yml"));
}

/* parses YAML `text` of `path` into doc; -1 with file:line:column and libyaml's words */
static int load_yaml(yaml_document_t *doc, const char *text, const char *path, char *err, size_t errlen)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) zt_fatal("libyaml: cannot initialise a parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    int rc = 0;
    if (!yaml_parser_load(&parser, doc))
        rc = zt_err(err, errlen, "%s:%zu:%zu: %s%s%s", path, parser.problem_mark.line + 1,
                    parser.problem_mark.column + 1, parser.problem ? parser.problem : "YAML syntax error",
                    parser.context ? " " : "", parser.context ? parser.context : "");
    yaml_parser_delete(&parser);
    return rc;
}

char *zt_import_yaml(const char *text, const char *path, const char *accel_text, const char *accel_path, int world,
                     int nodes, FILE *notes, char *err, size_t errlen)
{
    yaml_document_t doc, adoc;
    if (load_yaml(&doc, text, path, err, errlen)) return NULL;
    if (accel_text && load_yaml(&adoc, accel_text, accel_path, err, errlen)) {
        yaml_document_delete(&doc);
        return NULL;
    }
    imp_t im = {.path = path, .cfg = zt_calloc(1, sizeof(zt_config_t)), .notes = notes, .err = err, .errlen = errlen,
                .world = world, .nodes = nodes};
    zt_config_defaults(im.cfg);
    int rc = yaml_import(&im, &doc);
    if (!rc && im.deepspeed[0] && accel_text)
        rc = fail(&im, "%s: deepspeed: and the accelerate config %s both choose the engine: give one", im.ds_where,
                  accel_path);
    if (!rc && im.deepspeed[0]) rc = ds_import(&im, world);
    if (!rc && accel_text) {
        yaml_node_t *root = yaml_document_get_root_node(&adoc);
        rc = root && root->type == YAML_MAPPING_NODE ? accel_mapping(&im, &adoc, root, accel_path)
                                                     : fail(&im, "%s: an accelerate config is a mapping", accel_path);
    }
    char *out = rc ? NULL : config_text(&im);
    yaml_document_delete(&doc);
    if (accel_text) yaml_document_delete(&adoc);
    free(im.cfg);
    return out;
}

static void table_md(FILE *out, const entry_t *t, size_t n)
{
    fprintf(out, "| key | ztrain | note |\n|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const char *what = t[i].how == MAP || (t[i].how == CUSTOM && t[i].key) ? t[i].key
                           : t[i].how == NOTE                                   ? "accepted, no effect"
                           : t[i].how == REFUSE                                 ? "refused"
                                                                                : "see note";
        fprintf(out, "| `%s` | %s%s%s | %s |\n", t[i].name, t[i].key ? "`" : "", what, t[i].key ? "`" : "",
                t[i].why ? t[i].why : "");
    }
}

void zt_import_markdown(FILE *out)
{
    fprintf(out,
            "# Migrating from LLaMA-Factory, DeepSpeed and accelerate\n\n"
            "<!-- generated by `ztrain --import-markdown` (make update-docs) from src/zt_import.c -->\n\n"
            "ztrain reads the files you have as they are:\n\n"
            "    mpirun -np 8 ztrain examples/train_lora/qwen3_lora_sft.yaml\n"
            "    mpirun -np 2 ztrain --accelerate-config examples/accelerate/fsdp_config.yaml qwen3_lora_sft.yaml\n"
            "    ztrain --print-config qwen3_lora_sft.yaml > qwen3_lora_sft.cfg   # convert once, keep the .cfg\n\n"
            "A `.yaml` input is a LLaMA-Factory training YAML; its `deepspeed:` key names a DeepSpeed JSON "
            "(read from the directory ztrain runs in, as LLaMA-Factory reads it). `section.key=value` overrides "
            "apply on top. Every key takes one of three paths: it maps to a ztrain key (doc/config-reference.md) "
            "with the meaning it has there, it is accepted with a printed line where it cannot change the "
            "result, or it is refused in one line naming the file, the line and why. Keys the files leave out "
            "keep ztrain's defaults, which are transformers' for the keys with transformers' names; LLaMA-Factory "
            "recomputes activations unless `disable_gradient_checkpointing: true`, and so does the import. "
            "libconfig stays ztrain's own format.\n\n"
            "## LLaMA-Factory training YAML\n\n");
    table_md(out, yaml_keys, NYAML);
    fprintf(out, "\nAny other key is refused in one line naming the file, the line and the nearest key above.\n\n"
                 "## DeepSpeed JSON (the YAML's `deepspeed:`)\n\n");
    table_md(out, ds_keys, NDS);
    fprintf(out, "\n\"auto\" takes the YAML's value, as transformers' DeepSpeed integration fills it; a stated value "
                 "that differs from the YAML's is refused.\n\n## accelerate config (`--accelerate-config FILE`)\n\n");
    table_md(out, accel_keys, NACCEL);
    fprintf(out, "\nThe keys of `fsdp_config:` are read by their names as listed. `num_processes` and "
                 "`num_machines` must describe the ranks mpirun or srun started: MPI, not accelerate, makes the "
                 "mesh.\n");
}
