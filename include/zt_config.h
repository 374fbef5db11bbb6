/* zt_config.h — the resolved run configuration.
 *
 * One schema table in zt_config.c (name, type, default, range or allowed values,
 * help, offset into zt_config_t) drives parsing of the libconfig input file,
 * `section.key=value` overrides, validation, `ztrain --help`, `--print-config`
 * and the generated config reference in doc/. Nothing else in ztrain parses
 * configuration. */
#ifndef ZT_CONFIG_H
#define ZT_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "zt_plan.h"
#include "zt_pref.h"

#define ZT_MAX_FILES 64
#define ZT_STRLEN 1024
#define ZT_CONFIG_MAX_KEYS 256

/* Keys with a fixed set of values are these enums from parsing on (the parallel ones
 * are the plan's, zt_plan.h); the schema maps each name and alias to its value. */
typedef enum { ZT_BACKEND_AUTO = 0, ZT_BACKEND_CPU, ZT_BACKEND_CUDA } zt_backend_choice_t; /* parallel.backend */
typedef enum { ZT_NONFINITE_ABORT = 0, ZT_NONFINITE_SKIP } zt_nonfinite_t;                 /* parallel.nonfinite */
typedef enum { ZT_FT_FULL = 0, ZT_FT_LORA } zt_finetuning_t;                       /* train.finetuning_type */
typedef enum { ZT_STAGE_SFT = 0, ZT_STAGE_DPO } zt_stage_t;                         /* train.stage */
typedef enum { ZT_CKPT_CONSOLIDATED = 0, ZT_CKPT_SHARDED } zt_ckpt_format_t;       /* checkpoint.format */
typedef enum { ZT_HF_DTYPE_AUTO = 0, ZT_HF_DTYPE_BF16, ZT_HF_DTYPE_FP32 } zt_hf_dtype_t; /* checkpoint.hf_dtype */
/* train.matmul_precision: ZT_MATMUL_HIGHEST, _HIGH, _MEDIUM (zt_backend.h) or auto */
#define ZT_MATMUL_AUTO (-1)

typedef struct zt_config {
    struct {
        char arch[64];          /* gpt2 | llama | qwen2 | qwen3 | mistral | gemma3 */
        char name_or_path[ZT_STRLEN]; /* HF model directory ("" = none) */
        int n_layer, n_head, n_embd;
        int vocab_size, block_size;
        int n_kv_head;          /* 0 = n_head */
        int head_dim;           /* 0 = n_embd / n_head */
        int intermediate_size;  /* 0 = the family's default */
        double rope_theta, rms_norm_eps;
        int tie_word_embeddings, attention_bias; /* bools */
        char rope_type[16];     /* default | llama3 | linear */
        double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
        int rope_original_max_position_embeddings;
        int sliding_window;     /* mistral, gemma3; 0 = none */
        int sliding_window_pattern; /* gemma3: layer l is full attention when (l + 1) % pattern == 0 */
        double rope_local_base_freq; /* gemma3: the sliding layers' rope_theta */
        double init_std;        /* N(0, init_std) for matrices and embeddings */
        char init_from[ZT_STRLEN]; /* checkpoint to take weights from ("" = none) */
        int quantization_bit;   /* 0 = none, 4 = bitsandbytes 4-bit base (QLoRA) */
        char quantization_type[8]; /* nf4 | fp4 */
        int double_quantization; /* bool: absmax double-quantized */
    } model;
    struct {
        char train_files[ZT_MAX_FILES][ZT_STRLEN];
        int n_train_files;
        char val_files[ZT_MAX_FILES][ZT_STRLEN];
        int n_val_files;
        int seq_len;
        int shuffle;            /* bool */
        long seed;
        char vocab_file[ZT_STRLEN];  /* GPT-2 vocab.json, to decode samples of BPE data */
        char merges_file[ZT_STRLEN]; /* GPT-2 merges.txt */
        char tokenizer[ZT_STRLEN];   /* HF tokenizer dir or tokenizer.json ("" = model.name_or_path) */
        char format[16];             /* tokens | alpaca | sharegpt | messages */
        char template_name[32];      /* data.template: chat template (zt_template.h) */
        int cutoff_len;              /* LLaMA-Factory's cutoff_len */
        int train_on_prompt, mask_history, packing; /* bools */
        int neat_packing;            /* bool: packing whose samples do not see each other */
        long max_samples;            /* LLaMA-Factory's max_samples: first records of each file (0 = all) */
        int ranking;                 /* bool: data.format's files hold preference pairs (chosen, rejected) */
        char dataset[ZT_STRLEN];     /* LLaMA-Factory's dataset: dataset_info.json names, comma-separated ("" = none) */
        char eval_dataset[ZT_STRLEN]; /* likewise, for validation */
        char dataset_dir[ZT_STRLEN]; /* the folder of dataset_info.json */
    } data;
    struct {
        int per_device_train_batch_size;
        int gradient_accumulation_steps;
        long max_steps;         /* 0 = derive from num_train_epochs */
        double num_train_epochs;
        int logging_steps;
        int eval_steps;         /* 0 = only at the end */
        int eval_batches;       /* validation batches per evaluation */
        char output_dir[ZT_STRLEN];
        long seed;
        int bf16;               /* bool */
        int fp16;               /* bool, exclusive with bf16 */
        double loss_scale;      /* fp16: 0 = dynamic, > 0 = static */
        int initial_scale_power; /* fp16 dynamic: start at 2^this */
        int loss_scale_window;  /* fp16 dynamic: good steps before the scale doubles */
        double min_loss_scale;  /* fp16 dynamic: an overflow below this aborts */
        int gradient_checkpointing; /* bool */
        int sample_tokens;      /* tokens generated at the end (0 = none) */
        char sample_prompt[ZT_STRLEN];
        double peak_tflops;     /* per rank, for MFU; 0 = measure sgemm peak at start */
        int threads;            /* threads per rank (0 = OMP_NUM_THREADS or 1) */
        int matmul_precision;      /* ZT_MATMUL_*: auto | highest | high | medium */
        zt_finetuning_t finetuning_type; /* full | lora */
        zt_stage_t stage;       /* sft | dpo */
    } train;
    struct zt_config_optim {
        double learning_rate;
        char lr_scheduler_type[32]; /* transformers' SchedulerType (zt_optim.h) */
        long warmup_steps;
        double warmup_ratio;    /* warm-up as a fraction of the run's steps, when warmup_steps is 0 */
        /* lr_scheduler_kwargs (-1, or timescale 0: not given) */
        double num_cycles, power, lr_end, timescale, min_lr, min_lr_rate, warmup_lr_rate;
        long num_stable_steps, num_decay_steps;
        char warmup_type[8], decay_type[8]; /* linear | cosine | 1-sqrt */
        double min_lr_ratio;    /* warmup_stable_decay */
        double weight_decay;
        double adam_beta1, adam_beta2, adam_epsilon;
        double max_grad_norm;   /* 0 = no clipping */
        zt_optimizer_t type;    /* adamw | onebit_adam */
        long freeze_step;       /* onebit_adam: uncompressed warm-up steps (DeepSpeed's freeze_step) */
    } optim;
    struct {
        zt_strategy_t strategy; /* ddp|zero0|no_shard|zero1|zero2|shard_grad_op|zero3|full_shard|hybrid_shard|hybrid_shard_zero2|auto */
        zt_layout_t shard_layout; /* flat | per_param */
        int shard_group_size;   /* 0 = ranks of one node */
        int tensor_parallel_size, sequence_parallel_size;
        int pipeline_parallel_size;
        zt_pp_schedule_t pp_schedule; /* gpipe | 1f1b | interleaved_1f1b */
        int pp_stages_per_rank; /* v: interleaved_1f1b's looped stages per pipeline rank */
        int pp_layers_per_stage[ZT_MAX_PP_STAGES]; /* layers of each stage, embedding and head counted */
        int n_pp_layers_per_stage; /* 0: even split */
        int pp_head_split; /* gpipe: the head's forward in the last stage's F (zt_step.h) */
        zt_sp_mode_t sp_mode;   /* ulysses | ring */
        int tp_sequence_parallel; /* bool */
        int reshard_after_forward; /* bool (zero3 family) */
        double bucket_size_mb;
        zt_precision_t reduce_dtype; /* fp32 | bf16 | fp16 */
        zt_backend_choice_t backend; /* auto | cpu | cuda */
        double memory_limit_gb; /* 0 = physical memory / ranks per node */
        double timeout_s;       /* watchdog; 0 = off */
        zt_offload_t offload_optimizer; /* none | cpu | nvme */
        zt_offload_t offload_param; /* none | cpu | nvme */
        char offload_nvme_path[ZT_STRLEN]; /* offload = nvme: where the scratch files go */
        int offload_nvme_buffer_count; /* host buffers the files stream through */
        long offload_nvme_block_size; /* bytes per I/O request */
        int offload_nvme_queue_depth; /* requests in flight */
        zt_nonfinite_t nonfinite; /* abort | skip : what a NaN/Inf loss or gradient does */
    } parallel;
    struct {
        int save_steps;         /* 0 = only at the end */
        int save_at_end;        /* bool */
        int keep_last;          /* 0 = keep all */
        zt_ckpt_format_t format; /* consolidated | sharded */
        char resume[ZT_STRLEN]; /* auto | none | <path> */
        int save_hf;            /* bool: <output_dir>/hf at the end */
        zt_hf_dtype_t hf_dtype; /* auto | bf16 | fp32 */
        char hf_max_shard_size[32]; /* "5GB" */
    } checkpoint;
    struct {
        int all_ranks;          /* bool: one log file per rank */
        int plot;               /* bool: loss plot at the end */
    } log;
    struct {
        int rank;               /* r */
        double alpha;           /* 0 = 2 * rank (LLaMA-Factory's default) */
        double dropout;
        char target[ZT_MAX_FILES][64]; /* "all" or module names (q_proj, c_attn, ...) */
        int n_target;
        int use_rslora;         /* bool: scale alpha / sqrt(r) */
        char adapter_name_or_path[ZT_STRLEN]; /* PEFT adapter directory to start from */
    } lora;
    struct {                    /* train.stage = dpo */
        zt_pref_cfg_t fn;       /* the loss and its parameters (zt_pref.h) */
        char ref_model[ZT_STRLEN]; /* HF model directory of the reference ("" = the default) */
        int share_prompt;       /* bool: the reference pass computes each pair's prompt once */
        int precompute_ref;     /* bool: each pair's reference log-probs computed once (zt_pref_table.h) */
    } pref;
    struct {
        char prompt[ZT_STRLEN];     /* one user message */
        char prompts_file[ZT_STRLEN]; /* JSON Lines of messages or alpaca records */
        int max_new_tokens;
        double temperature;         /* 0 = greedy */
        double top_p;
        int top_k;                  /* 0 = all */
        int at_eval;                /* bool: complete prompts_file at each evaluation */
        int use_cache;              /* bool: a KV cache for generation */
        int batch_size;             /* prompts one rank completes at once */
    } generate;
    struct {                    /* for testing only */
        int rank;               /* -1 = off */
        long step;
        int kind;               /* ZT_FAULT_* (zt_watchdog.h): none | stall | kill | nan | data | save_kill */
    } fault;

    char source[ZT_STRLEN];     /* file the config came from */
    int mode_generate;          /* ztrain --generate (not a key: the command line's mode) */
    int model_prequantized;     /* model.name_or_path holds a bitsandbytes 4-bit base (its config.json's
                                 * quantization_config; set by zt_hf_model_resolve, not a key) */
    /* which keys the file or an override gave (by schema index), for defaults that
     * depend on the machine (train.bf16 on a GPU) */
    unsigned char given[ZT_CONFIG_MAX_KEYS];
} zt_config_t;

/* Fills cfg with every schema default. */
void zt_config_defaults(zt_config_t *cfg);
/* 1 when the input file or an override set `key` (even to its default value). */
int zt_config_given(const zt_config_t *cfg, const char *key);

/* Parses libconfig text (the contents of `filename`, which is only used in
 * messages) and then applies `section.key=value` overrides. Validates all of it.
 * Returns 0, or -1 with a one-line message in err ("input.cfg:12: unknown key
 * 'optim.learnin_rate' (did you mean 'optim.learning_rate'?)"). */
int zt_config_parse(zt_config_t *cfg, const char *text, const char *filename,
                    int noverrides, char *const overrides[], char *err, size_t errlen);

/* The run's learning-rate schedule (zt_optim.h) for `total` optimizer steps: get_scheduler's
 * arguments from optim.*, its warm-up from optim.warmup_steps or warmup_ratio. Returns 0, or
 * -1 with a one-line message where transformers would raise (polynomial's lr_end not below
 * the learning rate, or no steps to decay over). */
struct zt_lr_schedule;
int zt_config_lr_schedule(const zt_config_t *cfg, long total, struct zt_lr_schedule *s, char *err, size_t errlen);

/* Sets `key` from `value` as a `section.key=value` override spells it; errors name `where`
 * (an input's file:line). Marks the key given. 0, or -1 with a one-line message. */
int zt_config_set(zt_config_t *cfg, const char *key, const char *value, const char *where, char *err,
                  size_t errlen);

/* Cross-field validation that needs only the config (seq_len <= block_size, ...). */
int zt_config_validate(const zt_config_t *cfg, char *err, size_t errlen);

/* Writes the resolved config as valid libconfig text. */
void zt_config_print(const zt_config_t *cfg, FILE *out);
/* The value of `key` as the config file would spell it ("4", "true", "\"gpt2\""); -1 if
 * there is no such key. */
int zt_config_value_text(const zt_config_t *cfg, const char *key, char *buf, size_t len);
/* The name of value v of an enum key as the config file spells it ("zero3"); NULL if
 * the key has no such value. */
const char *zt_config_enum_name(const char *key, int v);
/* Rows (sequences) of a micro-batch per rank: train.per_device_train_batch_size, whose
 * elements are pairs of rows (chosen, rejected) under train.stage = dpo, as LLaMA-Factory's */
int zt_config_batch_rows(const zt_config_t *cfg);
/* Same, into a malloc'd string (for checkpoints). */
char *zt_config_to_string(const zt_config_t *cfg);

/* `ztrain --help` listing of every key with type, default and help. */
void zt_config_help(FILE *out);
/* Markdown reference generated from the schema (doc/config-reference.md). */
void zt_config_markdown(FILE *out);

/* The schema's keys ("section.key"), for tests and tools; NULL out of range. */
int zt_config_nkeys(void);
const char *zt_config_key_name(int i);

#endif
