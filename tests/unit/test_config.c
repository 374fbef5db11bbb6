/* test_config.c — the configuration schema: defaults, parsing, overrides, the
 * exact error messages users see (file:line, key, did-you-mean), validation,
 * print/parse round trip, and that help and the markdown reference list every
 * key. Also parses the shipped inputs/ files so they cannot rot. */
#include "zt_backend.h"
#include "zt_common.h"
#include "zt_config.h"
#include "zt_test.h"
#include "zt_watchdog.h"

#include <string.h>

#ifndef ZT_SRCDIR
#define ZT_SRCDIR "."
#endif

static zt_config_t cfg, cfg2; /* large (two 64-path lists): keep off the stack */
static char err[512];

static int parse(const char *text, int n, char *const ov[])
{
    err[0] = '\0';
    return zt_config_parse(&cfg, text, "in.cfg", n, ov, err, sizeof err);
}

#define ASSERT_ERR(needle)                                                        \
    do {                                                                          \
        CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));                              \
        if (!strstr(err, needle)) printf("\n  expected '%s' in '%s'\n", needle, err); \
    } while (0)

static void t_defaults_valid(void)
{
    zt_config_defaults(&cfg);
    CU_ASSERT_EQUAL(zt_config_validate(&cfg, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(cfg.model.arch, "gpt2");
    CU_ASSERT_EQUAL(cfg.model.n_layer, 4);
    CU_ASSERT_EQUAL(cfg.model.vocab_size, 257);
    CU_ASSERT_EQUAL(cfg.data.n_train_files, 1);
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[0], "data/train.h5");
    CU_ASSERT_STRING_EQUAL(cfg.data.val_files[0], "data/val.h5");
    CU_ASSERT_EQUAL(cfg.data.shuffle, 1);
    CU_ASSERT_EQUAL(cfg.train.seed, 42); /* transformers' default */
    /* transformers' TrainingArguments defaults for the keys with its names */
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.learning_rate, 5e-5, 1e-18);
    CU_ASSERT_STRING_EQUAL(cfg.optim.lr_scheduler_type, "linear");
    CU_ASSERT_EQUAL(cfg.optim.warmup_steps, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.weight_decay, 0.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.adam_beta1, 0.9, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.adam_beta2, 0.999, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.max_grad_norm, 1.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.train.num_train_epochs, 3.0, 0);
    CU_ASSERT_EQUAL(cfg.train.logging_steps, 500);
    CU_ASSERT_EQUAL(cfg.checkpoint.save_steps, 500);
    CU_ASSERT_EQUAL(cfg.train.per_device_train_batch_size, 8);
    CU_ASSERT_EQUAL(cfg.train.gradient_accumulation_steps, 1);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.adam_epsilon, 1e-8, 1e-20);
    CU_ASSERT_EQUAL(cfg.parallel.strategy, ZT_DDP);
    CU_ASSERT_EQUAL(cfg.parallel.reshard_after_forward, 1);
    CU_ASSERT_STRING_EQUAL(cfg.checkpoint.resume, "none");
    CU_ASSERT_EQUAL(cfg.fault.rank, -1);
    CU_ASSERT_EQUAL(cfg.fault.kind, ZT_FAULT_NONE);
    /* NULL text = defaults only */
    CU_ASSERT_EQUAL(parse(NULL, 0, NULL), 0);
    CU_ASSERT_STRING_EQUAL(cfg.source, "in.cfg");
}

static void t_parse_valid(void)
{
    const char *text = "# comment\n"
                       "model = { n_layer = 2; n_head = 2; n_embd = 32; block_size = 32; init_std = 0.01; };\n"
                       "data: { seq_len = 16; shuffle = false; train_files = \"a.h5\"; seed = 7; };\n"
                       "optim = { learning_rate = 3; lr_scheduler_type = \"linear\"; warmup_steps = 5; };\n"
                       "train = { max_steps = 10000000000L; output_dir = \"out\"; };\n"
                       "parallel = { strategy = \"full_shard\"; bucket_size_mb = 4.5; };\n";
    CU_ASSERT_EQUAL_FATAL(parse(text, 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.model.n_layer, 2);
    CU_ASSERT_EQUAL(cfg.model.n_embd, 32);
    CU_ASSERT_DOUBLE_EQUAL(cfg.model.init_std, 0.01, 1e-15);
    CU_ASSERT_EQUAL(cfg.data.seq_len, 16);
    CU_ASSERT_EQUAL(cfg.data.shuffle, 0);
    CU_ASSERT_EQUAL(cfg.data.seed, 7);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.learning_rate, 3.0, 0); /* int accepted for a double */
    CU_ASSERT_STRING_EQUAL(cfg.optim.lr_scheduler_type, "linear");
    CU_ASSERT_EQUAL(cfg.train.max_steps, 10000000000L);
    CU_ASSERT_EQUAL(cfg.parallel.strategy, ZT_ZERO3); /* an alias: one value */
    CU_ASSERT_DOUBLE_EQUAL(cfg.parallel.bucket_size_mb, 4.5, 0);
    CU_ASSERT_EQUAL(cfg.model.n_head, 2);
    CU_ASSERT_EQUAL(cfg.model.vocab_size, 257); /* untouched keys keep defaults */
}

static void t_override(void)
{
    char *ov[] = {"optim.learning_rate=3e-4", "model.n_layer = 6", "data.shuffle=off",
                  "train.output_dir=\"runs/x y\"", "parallel.strategy=zero2", "checkpoint.resume=auto",
                  "train.max_steps=1e3"};
    CU_ASSERT_EQUAL_FATAL(parse("optim = { learning_rate = 0.1; }; model = { n_layer = 3; };", 7, ov), 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.learning_rate, 3e-4, 1e-18); /* override wins over the file */
    CU_ASSERT_EQUAL(cfg.model.n_layer, 6);
    CU_ASSERT_EQUAL(cfg.data.shuffle, 0);
    CU_ASSERT_STRING_EQUAL(cfg.train.output_dir, "runs/x y");
    CU_ASSERT_EQUAL(cfg.parallel.strategy, ZT_ZERO2);
    CU_ASSERT_STRING_EQUAL(cfg.checkpoint.resume, "auto");
    CU_ASSERT_EQUAL(cfg.train.max_steps, 1000);
}

/* Keys the input gave, even at their default value, are known as given (the GPU's
 * bf16 default depends on it); defaults and unknown names are not. */
static void t_given(void)
{
    char *ov[] = {"train.fp16=false"};
    CU_ASSERT_EQUAL_FATAL(parse("train = { bf16 = false; }; model = { n_layer = 3; };", 1, ov), 0);
    CU_ASSERT(zt_config_given(&cfg, "train.bf16"));     /* in the file, = its default */
    CU_ASSERT(zt_config_given(&cfg, "train.fp16"));     /* by an override */
    CU_ASSERT(zt_config_given(&cfg, "model.n_layer"));
    CU_ASSERT(!zt_config_given(&cfg, "model.n_head"));  /* a default */
    CU_ASSERT(!zt_config_given(&cfg, "train.nonexistent"));
    CU_ASSERT_EQUAL_FATAL(parse("", 0, NULL), 0);       /* a fresh parse forgets */
    CU_ASSERT(!zt_config_given(&cfg, "train.bf16"));
}

static void t_override_errors(void)
{
    char *bad_type[] = {"optim.learning_rate=fast"};
    CU_ASSERT_EQUAL(parse(NULL, 1, bad_type), -1);
    ASSERT_ERR("command line: optim.learning_rate: expected a number, got 'fast'");

    char *frac[] = {"model.n_layer=2.5"};
    CU_ASSERT_EQUAL(parse(NULL, 1, frac), -1);
    ASSERT_ERR("command line: model.n_layer: expected an integer");

    char *bad_bool[] = {"data.shuffle=maybe"};
    CU_ASSERT_EQUAL(parse(NULL, 1, bad_bool), -1);
    ASSERT_ERR("command line: data.shuffle: expected a boolean");

    char *unknown[] = {"optim.learnin_rate=1"};
    CU_ASSERT_EQUAL(parse(NULL, 1, unknown), -1);
    ASSERT_ERR("command line: unknown key 'optim.learnin_rate' (did you mean 'optim.learning_rate'?)");

    char *noeq[] = {"optim.learning_rate"};
    CU_ASSERT_EQUAL(parse(NULL, 1, noeq), -1);
    ASSERT_ERR("not of the form section.key=value");

    char *range[] = {"optim.min_lr_ratio=1.5"};
    CU_ASSERT_EQUAL(parse(NULL, 1, range), -1);
    ASSERT_ERR("command line: optim.min_lr_ratio: 1.5 is out of range [0, 1]");

    char *en[] = {"parallel.strategy=zero4"};
    CU_ASSERT_EQUAL(parse(NULL, 1, en), -1);
    ASSERT_ERR("command line: parallel.strategy: 'zero4' must be one of: ddp, zero0,");
}

static void t_unknown_key(void)
{
    CU_ASSERT_EQUAL(parse("model = { n_layer = 2; };\noptim = {\n  learnin_rate = 1e-3;\n};\n", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:3: unknown key 'optim.learnin_rate' (did you mean 'optim.learning_rate'?)");

    /* right key in the wrong section */
    CU_ASSERT_EQUAL(parse("train = { learning_rate = 1e-3; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: unknown key 'train.learning_rate' (did you mean 'optim.learning_rate'?)");

    /* top-level key outside any section */
    CU_ASSERT_EQUAL(parse("\nmax_steps = 10;", 0, NULL), -1);
    ASSERT_ERR("in.cfg:2: unknown key 'max_steps' (did you mean 'train.max_steps'?)");

    CU_ASSERT_EQUAL(parse("optimm = { learning_rate = 1e-3; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: unknown section 'optimm' (did you mean 'optim'?)");

    /* shorthands */
    CU_ASSERT_EQUAL(parse("optim = { warmup = 10; };", 0, NULL), -1);
    ASSERT_ERR("(did you mean 'optim.warmup_steps'?)");
    CU_ASSERT_EQUAL(parse("train = { batch_size = 10; };", 0, NULL), -1);
    ASSERT_ERR("(did you mean 'train.per_device_train_batch_size'?)");

    /* nothing close: no suggestion, still names the key */
    CU_ASSERT_EQUAL(parse("model = { zzzzzzzzzzzzzzzz = 1; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: unknown key 'model.zzzzzzzzzzzzzzzz'");
    CU_ASSERT_PTR_NULL(strstr(err, "did you mean"));
}

static void t_wrong_type(void)
{
    CU_ASSERT_EQUAL(parse("optim = {\n  weight_decay = 0.1;\n  learning_rate = \"big\";\n};", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:3: optim.learning_rate: expected a number, got a string");

    CU_ASSERT_EQUAL(parse("data = { shuffle = 1; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: data.shuffle: expected a boolean (true or false), got an integer");

    CU_ASSERT_EQUAL(parse("model = { n_layer = 2.5; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: model.n_layer: expected an integer, got 2.5");

    CU_ASSERT_EQUAL(parse("model = 3;", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: model: expected a group");

    CU_ASSERT_EQUAL(parse("data = { train_files = (\"a\", 3); };", 0, NULL), -1);
    ASSERT_ERR("data.train_files: element 1: expected a string, got an integer");
}

static void t_out_of_range(void)
{
    /* libconfig would wrap these to 32 bits without a word */
    CU_ASSERT_EQUAL(parse("# 9999999999 in a comment is fine\ntrain = {\n output_dir = \"r9999999999\";\n"
                          " max_steps = 3000000000; };", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:4: integer 3000000000 does not fit in 32 bits; write it as 3000000000L");
    CU_ASSERT_EQUAL(parse("fault = { rank = -2147483649; };", 0, NULL), -1);
    ASSERT_ERR("integer -2147483649 does not fit");
    CU_ASSERT_EQUAL(parse("train = { max_steps = 3000000000L; num_train_epochs = 1.5e+2; }; "
                          "fault = { rank = 0x10; kind = \"nan\"; };", 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.train.max_steps, 3000000000L);
    CU_ASSERT_EQUAL(cfg.fault.rank, 16);

    CU_ASSERT_EQUAL(parse("model = {\n n_layer = 0;\n};", 0, NULL), -1);
    ASSERT_ERR("in.cfg:2: model.n_layer: 0 is out of range [1, ");
    CU_ASSERT_EQUAL(parse("optim = { min_lr_ratio = -0.5; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: optim.min_lr_ratio: -0.5 is out of range [0, 1]");
    CU_ASSERT_EQUAL(parse("optim = { warmup_steps = -1; };", 0, NULL), -1);
    ASSERT_ERR("optim.warmup_steps: -1 is out of range");
}

static void t_bad_enum(void)
{
    CU_ASSERT_EQUAL(parse("\n\nparallel = { strategy = \"zero4\"; };", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:3: parallel.strategy: 'zero4' must be one of: ddp, zero0, no_shard, zero1, "
                                "zero2, shard_grad_op, zero3, full_shard, hybrid_shard, hybrid_shard_zero2, auto");
    CU_ASSERT_EQUAL(parse("optim = { lr_scheduler_type = \"Cosine\"; };", 0, NULL), -1);
    ASSERT_ERR("must be one of: linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, "
               "inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, warmup_stable_decay");
    /* every alias is accepted */
    const char *ok[] = {"ddp", "zero0", "no_shard", "zero1", "zero2", "shard_grad_op", "zero3", "full_shard",
                        "hybrid_shard", "hybrid_shard_zero2", "auto"};
    const zt_strategy_t val[] = {ZT_DDP, ZT_DDP, ZT_DDP, ZT_ZERO1, ZT_ZERO2, ZT_SHARD_GRAD_OP, ZT_ZERO3, ZT_ZERO3,
                                 ZT_HYBRID, ZT_HYBRID_ZERO2, ZT_STRATEGY_AUTO};
    for (int i = 0; i < 11; i++) {
        char t[128];
        snprintf(t, sizeof t, "parallel = { strategy = \"%s\"; };", ok[i]);
        CU_ASSERT_EQUAL(parse(t, 0, NULL), 0);
        CU_ASSERT_EQUAL(cfg.parallel.strategy, val[i]);
    }
}

/* Keys with a fixed set of values are typed at parsing: each name and alias becomes
 * its enum value, printed by its first name, which parses back to the same value */
static void t_enum_values(void)
{
    char *ov[] = {"parallel.strategy=no_shard", "parallel.shard_layout=per_param", "parallel.sp_mode=\"ring\"",
                  "parallel.reduce_dtype=bf16", "parallel.backend=cpu", "parallel.offload_optimizer=cpu",
                  "parallel.offload_param=cpu", "parallel.nonfinite=skip", "train.matmul_precision=medium",
                  "train.finetuning_type=lora", "checkpoint.format=sharded", "checkpoint.hf_dtype=fp32"};
    CU_ASSERT_EQUAL_FATAL(parse(NULL, 12, ov), 0);
    CU_ASSERT_EQUAL(cfg.parallel.strategy, ZT_DDP);
    CU_ASSERT_EQUAL(cfg.parallel.shard_layout, ZT_LAYOUT_PER_PARAM);
    CU_ASSERT_EQUAL(cfg.parallel.sp_mode, ZT_SP_RING);
    CU_ASSERT_EQUAL(cfg.parallel.reduce_dtype, ZT_PREC_BF16);
    CU_ASSERT_EQUAL(cfg.parallel.backend, ZT_BACKEND_CPU);
    CU_ASSERT_EQUAL(cfg.parallel.offload_optimizer, ZT_OFFLOAD_CPU);
    CU_ASSERT_EQUAL(cfg.parallel.offload_param, ZT_OFFLOAD_CPU);
    CU_ASSERT_EQUAL(cfg.parallel.nonfinite, ZT_NONFINITE_SKIP);
    CU_ASSERT_EQUAL(cfg.train.matmul_precision, ZT_MATMUL_MEDIUM);
    CU_ASSERT_EQUAL(cfg.train.finetuning_type, ZT_FT_LORA);
    CU_ASSERT_EQUAL(cfg.checkpoint.format, ZT_CKPT_SHARDED);
    CU_ASSERT_EQUAL(cfg.checkpoint.hf_dtype, ZT_HF_DTYPE_FP32);
    char *text = zt_config_to_string(&cfg);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "  strategy = \"ddp\";\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "  matmul_precision = \"medium\";\n"));
    CU_ASSERT_EQUAL(zt_config_parse(&cfg2, text, "in.cfg", 0, NULL, err, sizeof err), 0);
    CU_ASSERT_EQUAL(cfg2.parallel.strategy, ZT_DDP);
    CU_ASSERT_EQUAL(cfg2.train.matmul_precision, ZT_MATMUL_MEDIUM);
    free(text);
    char buf[64];
    CU_ASSERT_EQUAL(zt_config_value_text(&cfg, "parallel.sp_mode", buf, sizeof buf), 0);
    CU_ASSERT_STRING_EQUAL(buf, "\"ring\"");
    CU_ASSERT_STRING_EQUAL(zt_config_enum_name("parallel.strategy", ZT_ZERO3), "zero3");
    CU_ASSERT_PTR_NULL(zt_config_enum_name("parallel.strategy", 99));
    CU_ASSERT_PTR_NULL(zt_config_enum_name("train.seed", 0));
    /* the default of auto is its own value, not highest */
    CU_ASSERT_EQUAL(parse(NULL, 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.train.matmul_precision, ZT_MATMUL_AUTO);
    /* not a string */
    CU_ASSERT_EQUAL(parse("parallel = { sp_mode = 2; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: parallel.sp_mode: expected a string, got an integer");
    char *bad[] = {"checkpoint.hf_dtype=fp16"};
    CU_ASSERT_EQUAL(parse(NULL, 1, bad), -1);
    CU_ASSERT_STRING_EQUAL(err, "command line: checkpoint.hf_dtype: 'fp16' must be one of: auto, bf16, fp32");
    /* fault.kind: the watchdog's kinds and the checkpoint writer's */
    char *fk[] = {"fault.rank=0", "fault.kind=save_kill"};
    CU_ASSERT_EQUAL(parse(NULL, 2, fk), 0);
    CU_ASSERT_EQUAL(cfg.fault.kind, ZT_FAULT_SAVE_KILL);
    char *stal[] = {"fault.rank=0", "fault.kind=stal"};
    CU_ASSERT_EQUAL(parse(NULL, 2, stal), -1);
    ASSERT_ERR("fault.kind: 'stal' must be one of: none, stall, kill, nan, data, save_kill");
}

/* train.stage and pref.*: LLaMA-Factory's defaults; typed at parsing; the rules
 * LLaMA-Factory has; dpo refused in one line until the loop trains it */
static void t_pref(void)
{
    zt_config_defaults(&cfg);
    CU_ASSERT_EQUAL(cfg.train.stage, ZT_STAGE_SFT);
    CU_ASSERT_EQUAL(cfg.pref.fn.loss, ZT_PREF_SIGMOID);
    CU_ASSERT_EQUAL(cfg.pref.fn.beta, 0.1);
    CU_ASSERT_EQUAL(cfg.pref.fn.ftx, 0.0);
    CU_ASSERT_EQUAL(cfg.pref.fn.label_smoothing, 0.0);
    CU_ASSERT_EQUAL(cfg.pref.fn.simpo_gamma, 0.5);
    CU_ASSERT_STRING_EQUAL(cfg.pref.ref_model, "");
    char *dpo[] = {"train.stage=dpo", "pref.loss=simpo", "pref.beta=2.5", "pref.ftx=0.25", "pref.simpo_gamma=0.8"};
    CU_ASSERT_EQUAL(parse(NULL, 5, dpo), -1);
    ASSERT_ERR("set data.shuffle = false");
    CU_ASSERT_EQUAL(cfg.train.stage, ZT_STAGE_DPO);
    CU_ASSERT_EQUAL(cfg.pref.fn.loss, ZT_PREF_SIMPO);
    CU_ASSERT_EQUAL(cfg.pref.fn.beta, 2.5);
    CU_ASSERT_EQUAL(cfg.pref.fn.ftx, 0.25);
    CU_ASSERT_EQUAL(cfg.pref.fn.simpo_gamma, 0.8);
    CU_ASSERT_STRING_EQUAL(zt_config_enum_name("pref.loss", ZT_PREF_HINGE), "hinge");
    CU_ASSERT_STRING_EQUAL(zt_config_enum_name("train.stage", ZT_STAGE_DPO), "dpo");
    char *ls[] = {"pref.loss=orpo", "pref.label_smoothing=0.1"};
    CU_ASSERT_EQUAL(parse(NULL, 2, ls), -1);
    CU_ASSERT_STRING_EQUAL(err, "pref.label_smoothing (0.1) applies to pref.loss = sigmoid only, not orpo (as in "
                                "LLaMA-Factory)");
    char *ref[] = {"pref.loss=simpo", "pref.ref_model=/models/ref"};
    CU_ASSERT_EQUAL(parse(NULL, 2, ref), -1);
    CU_ASSERT_STRING_EQUAL(err, "pref.ref_model is set but pref.loss = simpo uses no reference model");
    char *kto[] = {"pref.loss=kto_pair"};
    CU_ASSERT_EQUAL(parse(NULL, 1, kto), -1);
    CU_ASSERT_STRING_EQUAL(err, "command line: pref.loss: 'kto_pair' must be one of: sigmoid, ipo, hinge, orpo, simpo");
    char *sft[] = {"pref.loss=ipo", "pref.ref_model=/models/ref"}; /* stage sft: accepted */
    CU_ASSERT_EQUAL(parse(NULL, 2, sft), 0);
    char *full[] = {"train.stage=dpo", "data.shuffle=false"}; /* full fine-tuning, sigmoid */
    CU_ASSERT_EQUAL(parse(NULL, 2, full), -1);
    ASSERT_ERR("train.stage = dpo with full fine-tuning copies its reference from model.name_or_path");
    char *shuf[] = {"train.stage=dpo", "train.finetuning_type=lora"};
    CU_ASSERT_EQUAL(parse(NULL, 2, shuf), -1);
    ASSERT_ERR("set data.shuffle = false");
    char *drop[] = {"train.stage=dpo", "train.finetuning_type=lora", "data.shuffle=false", "lora.dropout=0.1"};
    CU_ASSERT_EQUAL(parse(NULL, 4, drop), -1);
    ASSERT_ERR("LLaMA-Factory's DPO trainer turns dropout off");
    char *ok[] = {"train.stage=dpo", "train.finetuning_type=lora", "data.shuffle=false",
                  "train.per_device_train_batch_size=3"};
    CU_ASSERT_EQUAL(parse(NULL, 4, ok), 0);
    CU_ASSERT_EQUAL(zt_config_batch_rows(&cfg), 6); /* a batch element is a pair */
    cfg.train.stage = ZT_STAGE_SFT;
    CU_ASSERT_EQUAL(zt_config_batch_rows(&cfg), 3);
}

static void t_syntax_error(void)
{
    CU_ASSERT_EQUAL(parse("model = {\n  n_layer = 2;\n  n_head 4;\n};\n", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:3: syntax error");
    CU_ASSERT_EQUAL(parse("model = { n_layer = 2;\n", 0, NULL), -1);
    ASSERT_ERR("in.cfg:");
}

static void t_validate(void)
{
    CU_ASSERT_EQUAL(parse("model = { block_size = 64; }; data = { seq_len = 128; };", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "data.seq_len (128) exceeds model.block_size (64)");

    zt_config_defaults(&cfg);
    cfg.data.seq_len = cfg.model.block_size + 1;
    CU_ASSERT_EQUAL(zt_config_validate(&cfg, err, sizeof err), -1);
    ASSERT_ERR("exceeds model.block_size");

    char *heads[] = {"model.n_head=3"};
    CU_ASSERT_EQUAL(parse(NULL, 1, heads), -1);
    ASSERT_ERR("model.n_embd (128) must be divisible by model.n_head (3)");

    char *nofiles[] = {"data.train_files="};
    CU_ASSERT_EQUAL(parse(NULL, 1, nofiles), -1);
    ASSERT_ERR("data.train_files: at least one training file is required");

    char *nosteps[] = {"train.max_steps=0", "train.num_train_epochs=0"};
    CU_ASSERT_EQUAL(parse(NULL, 2, nosteps), -1);
    ASSERT_ERR("train.max_steps and train.num_train_epochs are both 0");

    char *neat[] = {"data.neat_packing=true"}; /* data.format = tokens */
    CU_ASSERT_EQUAL(parse(NULL, 1, neat), -1);
    ASSERT_ERR("data.neat_packing applies to instruction data");

    char *fault[] = {"fault.kind=nan"};
    CU_ASSERT_EQUAL(parse(NULL, 1, fault), -1);
    ASSERT_ERR("fault.rank is -1");

    zt_config_defaults(&cfg);
    cfg.optim.min_lr_ratio = 2.0; /* set in code, bypassing the parser */
    CU_ASSERT_EQUAL(zt_config_validate(&cfg, err, sizeof err), -1);
    ASSERT_ERR("optim.min_lr_ratio");
    char *q8[] = {"model.quantization_bit=8"};
    CU_ASSERT_EQUAL(parse(NULL, 1, q8), -1);
    ASSERT_ERR("model.quantization_bit = 8 is not supported: ztrain has no 8-bit (LLM.int8) path");
    char *q5[] = {"model.quantization_bit=5"};
    CU_ASSERT_EQUAL(parse(NULL, 1, q5), -1);
    ASSERT_ERR("model.quantization_bit = 5: must be 0 (none) or 4");
    char *q4full[] = {"model.quantization_bit=4"};
    CU_ASSERT_EQUAL(parse(NULL, 1, q4full), -1);
    ASSERT_ERR("model.quantization_bit = 4 needs train.finetuning_type = lora");
    char *q4lora[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.quantization_type=fp4",
                      "model.double_quantization=false"};
    CU_ASSERT_EQUAL(parse(NULL, 4, q4lora), -1);
    ASSERT_ERR("model.quantization_bit = 4 needs model.name_or_path");
    CU_ASSERT_STRING_EQUAL(cfg.model.quantization_type, "fp4");
    CU_ASSERT_EQUAL(cfg.model.double_quantization, 0);
    char *q4ok[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.name_or_path=dir",
                    "checkpoint.save_hf=false"};
    CU_ASSERT_EQUAL(parse(NULL, 4, q4ok), 0);
    /* bf16 compute (bitsandbytes' compute dtype bfloat16) and tp (split at whole 4-bit blocks,
     * checked against the shapes at load) are accepted; fp16 compute is not */
    char *q4bf[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.name_or_path=dir",
                    "checkpoint.save_hf=false", "train.bf16=true"};
    CU_ASSERT_EQUAL(parse(NULL, 5, q4bf), 0);
    char *q4fp16[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.name_or_path=dir",
                      "checkpoint.save_hf=false", "train.fp16=true"};
    CU_ASSERT_EQUAL(parse(NULL, 5, q4fp16), -1);
    ASSERT_ERR("model.quantization_bit = 4 computes in float32 or bf16 (bitsandbytes' compute dtype float32 or "
               "bfloat16), not fp16: set train.fp16 = false");
    char *q4tp[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.name_or_path=dir",
                    "checkpoint.save_hf=false", "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL(parse(NULL, 5, q4tp), 0);
    /* the merged export of a 4-bit base is written (dequantized, doc/quantization.md) */
    char *q4hf[] = {"model.quantization_bit=4", "train.finetuning_type=lora", "model.name_or_path=dir",
                    "checkpoint.save_hf=true"};
    CU_ASSERT_EQUAL(parse(NULL, 4, q4hf), 0);
    char *qbad[] = {"model.quantization_type=int4"};
    CU_ASSERT_EQUAL(parse(NULL, 1, qbad), -1);
    ASSERT_ERR("model.quantization_type: 'int4' must be one of: nf4, fp4");
    zt_config_defaults(&cfg);
    CU_ASSERT_EQUAL(cfg.model.quantization_bit, 0);
    CU_ASSERT_STRING_EQUAL(cfg.model.quantization_type, "nf4");
    CU_ASSERT_EQUAL(cfg.model.double_quantization, 1);

    zt_config_defaults(&cfg);
    cfg.parallel.strategy = (zt_strategy_t)99;
    CU_ASSERT_EQUAL(zt_config_validate(&cfg, err, sizeof err), -1);
    ASSERT_ERR("parallel.strategy: 99 is not the value of one of: ddp, zero0,");
}

/* LLaMA-Factory's warmup_ratio and max_samples: ranges, what they may be combined with,
 * and a ratio given alone replacing warmup_steps' default in a config that parses back */
static void t_lf_keys(void)
{
    CU_ASSERT_EQUAL(parse("optim = {\n warmup_ratio = 1.5; };", 0, NULL), -1);
    CU_ASSERT_STRING_EQUAL(err, "in.cfg:2: optim.warmup_ratio: 1.5 is out of range [0, 1]");
    char *neg[] = {"optim.warmup_ratio=-0.1"};
    CU_ASSERT_EQUAL(parse(NULL, 1, neg), -1);
    ASSERT_ERR("optim.warmup_ratio: -0.1 is out of range [0, 1]");
    CU_ASSERT_PTR_NULL(strchr(err, '\n'));

    char *ratio[] = {"optim.warmup_ratio=0.1"};
    CU_ASSERT_EQUAL_FATAL(parse(NULL, 1, ratio), 0);
    CU_ASSERT_EQUAL(cfg.optim.warmup_steps, 0); /* not the default 20, which would override it */
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.warmup_ratio, 0.1, 0);
    char *text = zt_config_to_string(&cfg);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "warmup_steps = 0;"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "warmup_ratio = 0.1;"));
    CU_ASSERT_EQUAL(zt_config_parse(&cfg2, text, "stored", 0, NULL, err, sizeof err), 0);
    CU_ASSERT(cfg2.optim.warmup_steps == 0 && cfg2.optim.warmup_ratio == 0.1);
    free(text);
    char *zero[] = {"optim.warmup_ratio=0.1", "optim.warmup_steps=0"};
    CU_ASSERT_EQUAL(parse(NULL, 2, zero), 0);
    char *both[] = {"optim.warmup_ratio=0.1", "optim.warmup_steps=5"};
    CU_ASSERT_EQUAL(parse(NULL, 2, both), -1);
    CU_ASSERT_STRING_EQUAL(err, "optim.warmup_ratio (0.1) and optim.warmup_steps (5) are both set: give one "
                                "(optim.warmup_steps = 0 warms up for the ratio)");
    CU_ASSERT_EQUAL(parse("optim = { warmup_steps = 7; };", 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.optim.warmup_steps, 7);

    char *tokens[] = {"data.max_samples=1000"};
    CU_ASSERT_EQUAL(parse(NULL, 1, tokens), -1);
    CU_ASSERT_STRING_EQUAL(err, "data.max_samples (1000) applies to instruction data (data.format = alpaca, "
                                "sharegpt or messages), not to token files");
    char *sft[] = {"data.format=alpaca", "data.template=qwen", "data.max_samples=1000"};
    CU_ASSERT_EQUAL(parse(NULL, 3, sft), 0);
    CU_ASSERT_EQUAL(cfg.data.max_samples, 1000);
    /* data.ranking: preference pairs of instruction files, which no SFT step may take */
    char *ranked_tokens[] = {"data.ranking=true"};
    CU_ASSERT_EQUAL(parse(NULL, 1, ranked_tokens), -1);
    CU_ASSERT_STRING_EQUAL(err, "data.ranking applies to data.format alpaca, sharegpt or messages (a "
                                "dataset_info.json entry says \"ranking\": true itself)");
    char *ranked[] = {"data.format=sharegpt", "data.template=qwen", "data.ranking=true"};
    CU_ASSERT_EQUAL(parse(NULL, 3, ranked), -1);
    CU_ASSERT_STRING_EQUAL(err, "data.ranking: preference pairs need train.stage = dpo");
    CU_ASSERT_EQUAL(parse("data = { format = \"alpaca\"; template = \"qwen\"; max_samples = -1; };", 0, NULL), -1);
    ASSERT_ERR("in.cfg:1: data.max_samples: -1 is out of range [0, ");
    CU_ASSERT_EQUAL(parse(NULL, 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.data.max_samples, 0);
    CU_ASSERT_DOUBLE_EQUAL(cfg.optim.warmup_ratio, 0.0, 0);

    /* data.dataset: dataset_info.json's entries, not with the keys of data.train_files */
    char *ds[] = {"data.dataset=a, b", "data.template=qwen", "data.max_samples=5", "data.neat_packing=true",
                  "data.eval_dataset=c", "data.dataset_dir=here", "data.train_files=", "data.val_files="};
    CU_ASSERT_EQUAL(parse(NULL, 8, ds), 0); /* [] clears the files a config file gives */
    CU_ASSERT(!strcmp(cfg.data.dataset, "a, b") && !strcmp(cfg.data.eval_dataset, "c") &&
              !strcmp(cfg.data.dataset_dir, "here"));
    static const char *const bad[][4] = {
        {"data.dataset=a", "data.template=qwen", "data.train_files=x.json",
         "data.dataset and data.train_files are exclusive"},
        {"data.dataset=a", "data.template=qwen", "data.val_files=v.json", "data.dataset and data.val_files are "
                                                                          "exclusive"},
        {"data.dataset=a", "data.template=qwen", "data.format=alpaca", "data.format (alpaca) is for "
                                                                       "data.train_files"},
        {"data.dataset=a", "data.seed=1", "data.shuffle=true", "data.dataset needs data.template"},
        {"data.eval_dataset=a", "data.seed=1", "data.shuffle=true", "data.eval_dataset needs data.dataset"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(parse(NULL, 3, (char **)bad[i]), -1);
        ASSERT_ERR(bad[i][3]);
        CU_ASSERT_PTR_NULL(strchr(err, '\n'));
    }
    CU_ASSERT_EQUAL(parse(NULL, 0, NULL), 0);
    CU_ASSERT_STRING_EQUAL(cfg.data.dataset_dir, "data"); /* LLaMA-Factory's default */
}

/* fp16 and loss scaling: exclusive with bf16, fp16 reductions only with fp16, and
 * a minimum scale the dynamic scale can start from */
static void t_validate_fp16(void)
{
    char *both[] = {"train.fp16=true", "train.bf16=true"};
    CU_ASSERT_EQUAL(parse(NULL, 2, both), -1);
    CU_ASSERT_STRING_EQUAL(err, "train.fp16 and train.bf16 are both true: choose one working precision");
    /* parallel.reduce_dtype = fp16 without train.fp16: the plan's rule (test_plan) */
    char *ok[] = {"train.fp16=true", "parallel.reduce_dtype=fp16", "train.initial_scale_power=20",
                  "train.loss_scale_window=5", "train.min_loss_scale=0.25"};
    CU_ASSERT_EQUAL(parse(NULL, 5, ok), 0);
    CU_ASSERT(cfg.train.fp16 == 1 && cfg.train.initial_scale_power == 20 && cfg.train.loss_scale_window == 5 &&
              cfg.train.min_loss_scale == 0.25 && cfg.train.loss_scale == 0);
    char *minhi[] = {"train.fp16=true", "train.initial_scale_power=4", "train.min_loss_scale=32"};
    CU_ASSERT_EQUAL(parse(NULL, 3, minhi), -1);
    ASSERT_ERR("train.min_loss_scale (32) exceeds the initial loss scale 2^4");
    /* a static scale is not bound by the dynamic settings */
    char *stat[] = {"train.fp16=true", "train.loss_scale=8", "train.initial_scale_power=4", "train.min_loss_scale=32"};
    CU_ASSERT_EQUAL(parse(NULL, 4, stat), 0);
    char *zero[] = {"train.min_loss_scale=0"};
    CU_ASSERT_EQUAL(parse(NULL, 1, zero), -1);
    ASSERT_ERR("train.min_loss_scale (0) must be > 0");
    char *power[] = {"train.initial_scale_power=128"};
    CU_ASSERT_EQUAL(parse(NULL, 1, power), -1);
    ASSERT_ERR("train.initial_scale_power");
    char *neg[] = {"train.loss_scale=-1"};
    CU_ASSERT_EQUAL(parse(NULL, 1, neg), -1);
    ASSERT_ERR("train.loss_scale");
}

static void t_round_trip(void)
{
    /* Non-default values of every type, including awkward doubles and strings. */
    char *ov[] = {"optim.learning_rate=0.1", "optim.adam_epsilon=1.2345678901234567e-9", "model.init_std=1e-300",
                  "train.sample_prompt=\"He said \\\"hi\\\"\\\\ \"", "data.train_files=a.h5, b c.h5,c.bin",
                  "data.val_files=[]", "train.max_steps=5000000000", "data.shuffle=false",
                  "parallel.strategy=hybrid_shard_zero2", "fault.rank=1", "fault.kind=stall", "fault.step=3",
                  "parallel.timeout_s=0.3", "model.init_from=/tmp/ck pt.h5"};
    CU_ASSERT_EQUAL_FATAL(parse(NULL, 14, ov), 0);
    CU_ASSERT_STRING_EQUAL(cfg.train.sample_prompt, "He said \"hi\"\\ ");
    CU_ASSERT_EQUAL(cfg.data.n_train_files, 3);
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[1], "b c.h5");
    CU_ASSERT_EQUAL(cfg.data.n_val_files, 0);
    char *text = zt_config_to_string(&cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    int rc = zt_config_parse(&cfg2, text, "in.cfg", 0, NULL, err, sizeof err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) printf("\n  reparse failed: %s\n%s\n", err, text);
    /* the values, not which keys the input gave (the printed text gives them all) */
    memset(cfg.given, 0, sizeof cfg.given);
    memset(cfg2.given, 0, sizeof cfg2.given);
    CU_ASSERT_EQUAL(memcmp(&cfg, &cfg2, sizeof cfg), 0);
    /* and once more from defaults */
    zt_config_defaults(&cfg);
    strcpy(cfg.source, "in.cfg");
    free(text);
    text = zt_config_to_string(&cfg);
    CU_ASSERT_EQUAL(zt_config_parse(&cfg2, text, "in.cfg", 0, NULL, err, sizeof err), 0);
    memset(cfg2.given, 0, sizeof cfg2.given);
    CU_ASSERT_EQUAL(memcmp(&cfg, &cfg2, sizeof cfg), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "learning_rate = 5e-05;"));
    free(text);
}

static void t_string_list(void)
{
    CU_ASSERT_EQUAL_FATAL(parse("data = { train_files = \"one.h5\"; };", 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.data.n_train_files, 1);
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[0], "one.h5");

    CU_ASSERT_EQUAL_FATAL(parse("data = { train_files = [\"a.h5\", \"b.h5\"]; val_files = (\"v.bin\"); };", 0, NULL),
                          0);
    CU_ASSERT_EQUAL(cfg.data.n_train_files, 2);
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[0], "a.h5");
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[1], "b.h5");
    CU_ASSERT_EQUAL(cfg.data.n_val_files, 1);
    CU_ASSERT_STRING_EQUAL(cfg.data.val_files[0], "v.bin");

    CU_ASSERT_EQUAL_FATAL(parse("data = { val_files = []; };", 0, NULL), 0);
    CU_ASSERT_EQUAL(cfg.data.n_val_files, 0);

    char *ov[] = {"data.train_files=x.h5,\"y.h5\""};
    CU_ASSERT_EQUAL_FATAL(parse(NULL, 1, ov), 0);
    CU_ASSERT_EQUAL(cfg.data.n_train_files, 2);
    CU_ASSERT_STRING_EQUAL(cfg.data.train_files[1], "y.h5");

    CU_ASSERT_EQUAL(parse("data = { train_files = 3; };", 0, NULL), -1);
    ASSERT_ERR("data.train_files: expected a string or a list of strings, got an integer");
}

static char *capture(void (*fn)(FILE *))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fn(f);
    fclose(f);
    return buf;
}

/* doc/config-reference.md is generated from the schema; a schema change without
 * `make update-docs` leaves the documentation wrong, so it is a test failure. */
static void t_reference_current(void)
{
    const char *src = getenv("ZT_SRCDIR");
#ifdef ZT_SRCDIR
    if (!src) src = ZT_SRCDIR;
#endif
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/doc/config-reference.md", src ? src : ".");
    char *committed = zt_read_file(path, NULL, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(committed);
    char *md = capture(zt_config_markdown);
    CU_ASSERT_STRING_EQUAL(committed, md);
    if (strcmp(committed, md) != 0) printf("\n  %s is stale: run `make update-docs`\n", path);
    free(committed);
    free(md);
}

static void t_help_markdown_complete(void)
{
    char *help = capture(zt_config_help), *md = capture(zt_config_markdown);
    zt_config_defaults(&cfg);
    char *printed = zt_config_to_string(&cfg);
    CU_ASSERT(zt_config_nkeys() >= 55);
    CU_ASSERT_PTR_NULL(zt_config_key_name(zt_config_nkeys()));
    for (int i = 0; i < zt_config_nkeys(); i++) {
        const char *k = zt_config_key_name(i);
        char cell[128], line[128];
        snprintf(cell, sizeof cell, "| `%s` |", k);
        snprintf(line, sizeof line, "  %s (", k);
        CU_ASSERT_PTR_NOT_NULL(strstr(md, cell));
        CU_ASSERT_PTR_NOT_NULL(strstr(help, line));
        /* every key is printed inside its section */
        char kv[128];
        snprintf(kv, sizeof kv, "  %s = ", strchr(k, '.') + 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(printed, kv));
        if (!strstr(md, cell) || !strstr(help, line)) printf("\n  missing %s\n", k);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(help, "hybrid_shard_zero2"));
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "## `parallel`"));
    free(help);
    free(md);
    free(printed);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static void t_shipped_inputs(void)
{
    const char *files[] = {"inputs/default.cfg", "inputs/tiny.cfg", "inputs/gpt2-124m.cfg",
                           "inputs/llama-3.2-1b.cfg", "inputs/qwen3-0.6b.cfg", "inputs/qwen3_lora_sft.cfg",
                           "inputs/gemma-3-1b.cfg", "inputs/gemma3_lora_sft.cfg"};
    for (int i = 0; i < (int)(sizeof files / sizeof *files); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", ZT_SRCDIR, files[i]);
        char *text = slurp(path);
        CU_ASSERT_PTR_NOT_NULL_FATAL(text);
        int rc = zt_config_parse(&cfg, text, path, 0, NULL, err, sizeof err);
        CU_ASSERT_EQUAL(rc, 0);
        if (rc) printf("\n  %s\n", err);
        free(text);
        if (i == 1) {
            CU_ASSERT_EQUAL(cfg.model.n_layer, 2);
            CU_ASSERT_EQUAL(cfg.data.seq_len, 16);
            CU_ASSERT_STRING_EQUAL(cfg.data.train_files[0], "data/tiny-train.h5");
        }
        if (i == 2) {
            CU_ASSERT_EQUAL(cfg.model.n_embd, 768);
            CU_ASSERT_EQUAL(cfg.model.vocab_size, 50257);
        }
    }
}

static const zt_test_t tests[] = {
    {"defaults are valid", t_defaults_valid},
    {"parse a valid file", t_parse_valid},
    {"overrides applied", t_override},
    {"enum values", t_enum_values},
    {"train.stage and pref keys", t_pref},
    {"override errors", t_override_errors},
    {"given keys", t_given},
    {"unknown key suggests", t_unknown_key},
    {"wrong type has line", t_wrong_type},
    {"out of range", t_out_of_range},
    {"bad enum value", t_bad_enum},
    {"syntax error has line", t_syntax_error},
    {"cross-field validation", t_validate},
    {"fp16 and loss-scale validation", t_validate_fp16},
    {"warmup_ratio, max_samples, dataset", t_lf_keys},
    {"print/parse round trip", t_round_trip},
    {"string list forms", t_string_list},
    {"help and markdown list every key", t_help_markdown_complete},
    {"doc/config-reference.md is current", t_reference_current},
    {"shipped inputs parse", t_shipped_inputs},
    {NULL, NULL},
};
ZT_TEST_MAIN("test_config", tests)
