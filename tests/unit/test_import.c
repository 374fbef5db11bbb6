/* test_import.c — LLaMA-Factory 0.9.5's own example files (tests/reference/llamafactory/,
 * copied from its repository at tag v0.9.5) resolve to the ztrain configuration a table
 * here states; the DeepSpeed JSONs of its examples/deepspeed map to the strategy and
 * offload they mean; every refusal is one line naming the file, the line or key and why. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_config.h"
#include "zt_import.h"
#include "zt_test.h"

static char err[ZT_ERRLEN];
static zt_config_t cfg;

/* imports `yaml` (as read from `path`) on `world` ranks and parses the result into cfg */
static int import_text(const char *yaml, const char *path, int world)
{
    char *text = zt_import_yaml(yaml, path, NULL, NULL, world, 1, NULL, err, sizeof err);
    if (!text) return -1;
    int rc = zt_config_parse(&cfg, text, path, 0, NULL, err, sizeof err);
    if (rc) printf("\n    %s\n%s\n", err, text);
    free(text);
    return rc;
}

static int import_file(const char *path)
{
    char *yaml = zt_read_file(path, NULL, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(yaml);
    int rc = import_text(yaml, path, 2);
    free(yaml);
    return rc;
}

static void want(const char *key, const char *value)
{
    char got[ZT_STRLEN * 2];
    CU_ASSERT_EQUAL_FATAL(zt_config_value_text(&cfg, key, got, sizeof got), 0);
    if (strcmp(got, value)) {
        printf("\n    %s = %s, want %s", key, got, value);
        CU_FAIL("an imported key differs from the table");
    }
}

/* the keys every one of the three example YAMLs states the same way */
static void want_common(void)
{
    static const char *const rows[][2] = {
        {"model.name_or_path", "\"Qwen/Qwen3-4B-Instruct-2507\""},
        {"data.dataset", "\"identity,alpaca_en_demo\""},
        {"data.template", "\"qwen3_nothink\""},
        {"data.cutoff_len", "2048"},
        {"data.seq_len", "2048"}, /* a row holds a whole sample */
        {"data.max_samples", "1000"},
        {"train.logging_steps", "10"},
        {"checkpoint.save_steps", "500"},
        {"log.plot", "true"},
        {"train.per_device_train_batch_size", "1"},
        {"train.num_train_epochs", "3.0"},
        {"optim.lr_scheduler_type", "\"cosine\""},
        {"optim.warmup_ratio", "0.1"},
        {"train.bf16", "true"},
        {"parallel.timeout_s", "1e+07"}, /* ddp_timeout 180000000, at the watchdog's bound */
        {"checkpoint.resume", "\"none\""},
        {"train.gradient_checkpointing", "true"}, /* LLaMA-Factory's default */
        /* not in the files: transformers' defaults */
        {"optim.weight_decay", "0.0"},
        {"optim.adam_beta2", "0.999"},
        {"optim.max_grad_norm", "1.0"},
        {"train.seed", "42"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) want(rows[i][0], rows[i][1]);
}

static void t_examples(void)
{
    CU_ASSERT_EQUAL_FATAL(chdir(ZT_SRCDIR "/tests/reference/llamafactory"), 0);
    CU_ASSERT_EQUAL_FATAL(import_file("examples/train_lora/qwen3_lora_sft.yaml"), 0);
    want_common();
    want("train.finetuning_type", "\"lora\"");
    want("lora.rank", "8");
    want("lora.target", "[ \"all\" ]");
    want("train.output_dir", "\"saves/qwen3-4b/lora/sft\"");
    want("train.gradient_accumulation_steps", "8");
    want("optim.learning_rate", "0.0001");
    want("parallel.strategy", "\"ddp\"");

    CU_ASSERT_EQUAL_FATAL(import_file("examples/train_lora/qwen3_lora_sft_ds3.yaml"), 0);
    want_common();
    want("train.finetuning_type", "\"lora\"");
    want("train.gradient_accumulation_steps", "2");
    want("parallel.strategy", "\"zero3\"");
    want("parallel.offload_param", "\"none\"");

    CU_ASSERT_EQUAL_FATAL(import_file("examples/train_lora/qwen3_lora_dpo.yaml"), 0);
    want("train.stage", "\"dpo\"");
    want("pref.beta", "0.1");
    want("pref.loss", "\"sigmoid\"");
    want("data.dataset", "\"dpo_en_demo\"");
    want("optim.learning_rate", "5e-06");
    want("train.output_dir", "\"saves/qwen3-4b/lora/dpo\"");

    CU_ASSERT_EQUAL_FATAL(import_file("examples/train_full/qwen3_full_sft.yaml"), 0);
    want_common();
    want("train.finetuning_type", "\"full\"");
    want("train.stage", "\"sft\"");
    want("train.output_dir", "\"saves/qwen3-4b/full/sft\"");
    want("optim.learning_rate", "1e-05");
    want("parallel.strategy", "\"zero3\"");
}

/* QLoRA: LLaMA-Factory's quantization keys, and no merged export of the 4-bit base */
static void t_qlora(void)
{
    CU_ASSERT_EQUAL_FATAL(import_text("model_name_or_path: m\nfinetuning_type: lora\nquantization_bit: 4\n"
                                      "quantization_type: fp4\ndouble_quantization: false\n", "q.yaml", 1), 0);
    want("model.quantization_bit", "4");
    want("model.quantization_type", "\"fp4\"");
    want("model.double_quantization", "false");
    want("checkpoint.save_hf", "false");
    /* QLoRA's bf16 compute (LLaMA-Factory's usual bf16: true) trains; fp16 compute is the
     * config's own refusal */
    CU_ASSERT_EQUAL(import_text("model_name_or_path: m\nfinetuning_type: lora\nquantization_bit: 4\nbf16: true\n",
                                "q.yaml", 1), 0);
    want("train.bf16", "true");
    CU_ASSERT(import_text("model_name_or_path: m\nfinetuning_type: lora\nquantization_bit: 4\nfp16: true\n", "q.yaml",
                          1) == -1 && strstr(err, "model.quantization_bit = 4 computes in float32 or bf16"));
}

/* ZeRO-Infinity as DeepSpeed's documentation configures it (deepspeed.ai/docs/config-json,
 * "NVMe offload" and "Asynchronous I/O"): both offloads on nvme, their buffers, aio */
static void t_deepspeed_nvme(void)
{
    CU_ASSERT_EQUAL_FATAL(chdir(ZT_SRCDIR "/tests/reference/llamafactory"), 0);
    FILE *f = fopen("/tmp/zt_test_ds.json", "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("{\"zero_optimization\": {\"stage\": 3,\n"
          "  \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", \"pin_memory\": true,\n"
          "    \"buffer_count\": 4, \"fast_init\": false},\n"
          "  \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", \"pin_memory\": true,\n"
          "    \"buffer_count\": 5, \"buffer_size\": 1e8, \"max_in_cpu\": 1e9}},\n"
          " \"aio\": {\"block_size\": 262144, \"queue_depth\": 32, \"thread_count\": 1, \"single_submit\": false,\n"
          "  \"overlap_events\": true}}", f);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(import_text("cutoff_len: 64\ndeepspeed: /tmp/zt_test_ds.json\n", "ds.yaml", 2), 0);
    want("parallel.strategy", "\"zero3\"");
    want("parallel.offload_optimizer", "\"nvme\"");
    want("parallel.offload_param", "\"nvme\"");
    want("parallel.offload_nvme_path", "\"/local_nvme\"");
    want("parallel.offload_nvme_buffer_count", "5"); /* one set of buffers: the larger count */
    want("parallel.offload_nvme_block_size", "262144");
    want("parallel.offload_nvme_queue_depth", "32");
    unlink("/tmp/zt_test_ds.json");
}

/* each of examples/deepspeed named by a YAML */
static void t_deepspeed(void)
{
    static const struct {
        const char *file, *strategy, *offload_optimizer, *offload_param, *bucket;
    } rows[] = {
        {"ds_z0_config.json", "\"ddp\"", "\"none\"", "\"none\"", "2e+03"}, /* 5e8 elements x 4 bytes: 2000 MB */
        {"ds_z2_config.json", "\"zero2\"", "\"none\"", "\"none\"", "2e+03"},
        {"ds_z2_offload_config.json", "\"zero2\"", "\"cpu\"", "\"none\"", "2e+03"},
        {"ds_z3_config.json", "\"zero3\"", "\"none\"", "\"none\"", "25.0"}, /* "auto": ztrain's */
        {"ds_z3_offload_config.json", "\"zero3\"", "\"cpu\"", "\"cpu\"", "25.0"},
    };
    CU_ASSERT_EQUAL_FATAL(chdir(ZT_SRCDIR "/tests/reference/llamafactory"), 0);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml, "finetuning_type: lora\nbf16: true\ncutoff_len: 64\ndeepspeed: examples/deepspeed/%s\n",
                 rows[i].file);
        CU_ASSERT_EQUAL_FATAL(import_text(yaml, "ds.yaml", 4), 0);
        want("parallel.strategy", rows[i].strategy);
        want("parallel.offload_optimizer", rows[i].offload_optimizer);
        want("parallel.offload_param", rows[i].offload_param);
        want("parallel.bucket_size_mb", rows[i].bucket);
    }
}

static int refused(const char *yaml, const char *msg)
{
    CU_ASSERT_EQUAL_FATAL(chdir(ZT_SRCDIR "/tests/reference/llamafactory"), 0);
    err[0] = 0;
    char *text = zt_import_yaml(yaml, "in.yaml", NULL, NULL, 2, 1, NULL, err, sizeof err);
    free(text);
    if (text || !strstr(err, msg)) {
        printf("\n    want '%s', got '%s'", msg, text ? "(accepted)" : err);
        return 0;
    }
    return 1;
}

static void t_refusals(void)
{
    CU_ASSERT(refused("learning_rat: 1.0e-4\n", "in.yaml:1: learning_rat is not a key ztrain reads from a "
                                                "LLaMA-Factory YAML (did you mean learning_rate?)"));
    CU_ASSERT(refused("lr: [1, 2\n", "in.yaml:2:1:"));
    CU_ASSERT(refused("stage: kto\n", "in.yaml:1: stage: kto is not available"));
    CU_ASSERT(refused("stage: pt\n", "ztrain's pretraining reads token files"));
    CU_ASSERT(refused("finetuning_type: freeze\n", "finetuning_type: freeze is not available"));
    CU_ASSERT(refused("do_train: false\n", "do_train: false"));
    CU_ASSERT(refused("val_size: 0.1\n", "in.yaml:1: val_size: splitting a validation share"));
    CU_ASSERT(refused("eval_strategy: epoch\n", "eval_strategy: epoch is not available"));
    CU_ASSERT(refused("\nlearning_rate: fast\n", "in.yaml:2: optim.learning_rate: expected"));
    CU_ASSERT(refused("lora_target: [q_proj]\n", "in.yaml:1: lora_target: expected a single value"));
    CU_ASSERT(refused("deepspeed: missing.json\n", "in.yaml:1: deepspeed: missing.json"));
    /* DeepSpeed: a stated value that disagrees with the YAML, and what ztrain does not read */
    FILE *f = fopen("/tmp/zt_test_ds.json", "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2}}", f);
    fclose(f);
    CU_ASSERT(refused("per_device_train_batch_size: 2\ndeepspeed: /tmp/zt_test_ds.json\n",
                      "train_micro_batch_size_per_gpu is 4 but the YAML's per_device_train_batch_size gives 2"));
    f = fopen("/tmp/zt_test_ds.json", "w");
    fputs("{\"train_batch_size\": 16, \"gradient_accumulation_steps\": \"auto\"}", f);
    fclose(f);
    /* 2 ranks x 2 x 2 = 8 */
    CU_ASSERT(refused("per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\ndeepspeed: "
                      "/tmp/zt_test_ds.json\n", "train_batch_size is 16 but"));
    f = fopen("/tmp/zt_test_ds.json", "w");
    fputs("{\"optimizer\": {\"type\": \"AdamW\"}}", f);
    fclose(f);
    CU_ASSERT(refused("deepspeed: /tmp/zt_test_ds.json\n", "/tmp/zt_test_ds.json: optimizer: ztrain runs"));
    f = fopen("/tmp/zt_test_ds.json", "w");
    fputs("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
          "\"/a\"}, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/b\"}}}", f);
    fclose(f);
    CU_ASSERT(refused("deepspeed: /tmp/zt_test_ds.json\n", "nvme_path: /b differs from the other section's /a"));
    f = fopen("/tmp/zt_test_ds.json", "w");
    fputs("{\"aio\": {\"block_size\": 1048576, \"queue_dept\": 8}}", f);
    fclose(f);
    CU_ASSERT(refused("deepspeed: /tmp/zt_test_ds.json\n", "aio.queue_dept is not read by ztrain (did you mean "
                      "aio.queue_depth)"));
    f = fopen("/tmp/zt_test_ds.json", "w");
    fputs("{\"zero_optimization\": {\"stages\": 3}}", f);
    fclose(f);
    CU_ASSERT(refused("deepspeed: /tmp/zt_test_ds.json\n",
                      "zero_optimization.stages is not read by ztrain (did you mean zero_optimization.stage)"));
    unlink("/tmp/zt_test_ds.json");
}

/* examples/accelerate beside qwen3_lora_sft.yaml, as accelerate launch --config_file runs it */
static int import_accel(const char *accel, int world, int nodes)
{
    char *yaml = zt_read_file("examples/train_lora/qwen3_lora_sft.yaml", NULL, err, sizeof err);
    char *atext = zt_read_file(accel, NULL, err, sizeof err);
    CU_ASSERT_FATAL(yaml && atext);
    char *text = zt_import_yaml(yaml, "qwen3_lora_sft.yaml", atext, accel, world, nodes, NULL, err, sizeof err);
    free(yaml);
    free(atext);
    int rc = text ? zt_config_parse(&cfg, text, "qwen3_lora_sft.yaml", 0, NULL, err, sizeof err) : -1;
    free(text);
    return rc;
}

static void t_accelerate(void)
{
    CU_ASSERT_EQUAL_FATAL(chdir(ZT_SRCDIR "/tests/reference/llamafactory"), 0);
    CU_ASSERT_EQUAL_FATAL(import_accel("examples/accelerate/fsdp_config.yaml", 2, 1), 0);
    want("parallel.strategy", "\"zero3\""); /* full_shard, canonically */
    want("parallel.shard_layout", "\"flat\"");
    want("parallel.offload_param", "\"none\"");
    want("checkpoint.format", "\"consolidated\"");
    want("train.bf16", "true");
    want("lora.rank", "8"); /* the training YAML's keys stay */
    CU_ASSERT_EQUAL_FATAL(import_accel("examples/accelerate/fsdp2_config.yaml", 2, 1), 0);
    want("parallel.strategy", "\"zero3\""); /* full_shard, canonically */
    want("parallel.shard_layout", "\"per_param\"");
    want("parallel.reshard_after_forward", "true");
    CU_ASSERT_EQUAL_FATAL(import_accel("examples/accelerate/fsdp_config_offload.yaml", 2, 1), 0);
    want("parallel.offload_param", "\"cpu\"");
    want("parallel.offload_optimizer", "\"cpu\"");
    /* refusals: the mesh MPI started, a precision that disagrees, two engines, a typo */
    CU_ASSERT_EQUAL(import_accel("examples/accelerate/fsdp_config.yaml", 4, 1), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "fsdp_config.yaml:19: num_processes is 2, but mpirun started 4"));
    CU_ASSERT_EQUAL(import_accel("examples/accelerate/fsdp_config.yaml", 2, 2), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "num_machines is 1"));
    const char *yaml = "bf16: true\ndeepspeed: examples/deepspeed/ds_z3_config.json\n";
    char *text = zt_import_yaml(yaml, "a.yaml", "mixed_precision: bf16\n", "acc.yaml", 2, 1, NULL, err, sizeof err);
    CU_ASSERT_PTR_NULL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "both choose the engine"));
    text = zt_import_yaml("bf16: true\n", "a.yaml", "mixed_precision: fp16\n", "acc.yaml", 2, 1, NULL, err, sizeof err);
    CU_ASSERT_PTR_NULL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "acc.yaml:1: mixed_precision fp16 disagrees"));
    text = zt_import_yaml("bf16: true\n", "a.yaml", "fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n", "acc.yaml",
                          2, 1, NULL, err, sizeof err);
    CU_ASSERT_PTR_NULL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "acc.yaml:2: fsdp_sharding_stratgy is not a key ztrain reads from an "
                                       "accelerate config (did you mean fsdp_sharding_strategy?)"));
    text = zt_import_yaml("bf16: true\n", "a.yaml", "distributed_type: DEEPSPEED\n", "acc.yaml", 2, 1, NULL, err,
                          sizeof err);
    CU_ASSERT_PTR_NULL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "distributed_type: DEEPSPEED is not read by ztrain"));
}

/* doc/migrating.md is what --import-markdown prints, and every ztrain key it names exists */
static void t_markdown(void)
{
    char *md = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&md, &len);
    zt_import_markdown(f);
    fclose(f);
    char *committed = zt_read_file(ZT_SRCDIR "/doc/migrating.md", NULL, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(committed);
    CU_ASSERT_STRING_EQUAL(committed, md); /* else: make -C build update-docs */
    int keys = 0;
    for (const char *p = md; (p = strstr(p, "| `")) != NULL; p++) {
        const char *cell = strstr(p + 3, "| `"), *line_end = strchr(p, '\n');
        if (!cell || cell > line_end) continue;
        char key[96];
        if (sscanf(cell + 3, "%95[a-z_0-9.]`", key) != 1 || !strchr(key, '.')) continue;
        char value[ZT_STRLEN * 2];
        zt_config_defaults(&cfg);
        if (zt_config_value_text(&cfg, key, value, sizeof value) != 0) {
            printf("\n    %s is no ztrain key", key);
            CU_FAIL("the import table names a key the schema lacks");
        }
        keys++;
    }
    CU_ASSERT(keys >= 40);
    free(committed);
    free(md);
}

/* the notes: keys accepted without effect are said, one line each */
static void t_notes(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char *text = zt_import_yaml("dataloader_num_workers: 4\nreport_to: none\nlearning_rate: 2e-5\n", "n.yaml", NULL, NULL, 1,
                                1, f, err, sizeof err);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "n.yaml:1: dataloader_num_workers accepted:"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "n.yaml:2: report_to accepted:"));
    CU_ASSERT_PTR_NULL(strstr(buf, "learning_rate"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "learning_rate = 2e-05;"));
    free(text);
    free(buf);
}

static const zt_test_t tests[] = {{"LLaMA-Factory 0.9.5 examples", t_examples},
                                  {"DeepSpeed JSONs", t_deepspeed},
                                  {"DeepSpeed ZeRO-Infinity (nvme)", t_deepspeed_nvme},
                                  {"refusals", t_refusals},
                                  {"accelerate configs", t_accelerate},
                                  {"notes", t_notes},
                                  {"QLoRA keys", t_qlora},
    {"doc/migrating.md", t_markdown},
                                  {NULL, NULL}};
ZT_TEST_MAIN("import", tests)
