/* zt_config.c — the configuration schema and everything driven by it.
 *
 * One static table (`schema`) lists every `section.key`: its type, default,
 * range or allowed values, help text and where it lives in zt_config_t. Parsing
 * of the libconfig input, `section.key=value` overrides, validation, --help,
 * --print-config and doc/config-reference.md all walk that table, so a key
 * added there is parsed, checked, printed and documented at once, and the
 * printed config always parses back to the same struct (it is stored in
 * checkpoints and must reproduce the run).
 *
 * Errors are input errors: they are returned as one line naming the file and
 * line (or "command line") and the key, never printed or fatal here. */
#define _GNU_SOURCE /* strcasestr, open_memstream */
#include "zt_config.h"
#include "zt_optim.h"
#include "zt_backend.h"
#include "zt_template.h"
#include "zt_watchdog.h"

#include "zt_common.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { K_INT, K_LONG, K_DOUBLE, K_BOOL, K_STRING, K_STRLIST, K_ENUM, K_INTLIST } ktype_t;

/* One name of an enum key's value; a value's first name is how it is printed, the
 * others are aliases. A table ends with a NULL name. */
typedef struct { const char *name; int value; } zname_t;

typedef struct {
    const char *name;    /* "section.key" */
    ktype_t type;
    double def;          /* numeric and bool default */
    const char *sdef;    /* string default; string-list default (one element, "" = empty) */
    double min, max;     /* numeric range, inclusive */
    const char *allowed; /* "a|b|c" for strings, NULL = any */
    const zname_t *names; /* enums: the names of the values */
    size_t off;          /* offsetof the field (first element for string lists) */
    size_t size;         /* capacity of a string buffer / of one list element */
    size_t count_off;    /* string lists: offsetof the element count */
    const char *help;
} zkey_t;

/* Each macro checks the field's C type at compile time (a negative array
 * size is an error), so a schema row can never write an int into a long. */
#define FIELD(f) (((zt_config_t *)0)->f)
#define CHECK_TYPE(f, T) (0 * sizeof(char[_Generic(FIELD(f), T : 1, default : -1)]))
#define OFF(f) offsetof(zt_config_t, f)
#define KI(n, f, d, lo, hi, h) {n, K_INT, d, NULL, lo, hi, NULL, NULL, OFF(f) + CHECK_TYPE(f, int), sizeof(int), 0, h}
#define KL(n, f, d, lo, hi, h) {n, K_LONG, d, NULL, lo, hi, NULL, NULL, OFF(f) + CHECK_TYPE(f, long), sizeof(long), 0, h}
#define KD(n, f, d, lo, hi, h) \
    {n, K_DOUBLE, d, NULL, lo, hi, NULL, NULL, OFF(f) + CHECK_TYPE(f, double), sizeof(double), 0, h}
#define KB(n, f, d, h) {n, K_BOOL, d, NULL, 0, 1, NULL, NULL, OFF(f) + CHECK_TYPE(f, int), sizeof(int), 0, h}
#define KS(n, f, d, allow, h) \
    {n, K_STRING, 0, d, 0, 0, allow, NULL, OFF(f) + CHECK_TYPE(f[0], char), sizeof(FIELD(f)), 0, h}
#define KSL(n, f, cnt, d, h)                                                                   \
    {n, K_STRLIST, 0, d, 0, ZT_MAX_FILES, NULL, NULL, OFF(f) + CHECK_TYPE(f[0][0], char), sizeof(FIELD(f)[0]), \
     OFF(cnt) + CHECK_TYPE(cnt, int), h}
/* a list of up to ZT_MAX_PP_STAGES ints, each in [lo, hi] (empty by default) */
#define KIL(n, f, cnt, lo, hi, h)                                                                   \
    {n, K_INTLIST, 0, "", lo, hi, NULL, NULL, OFF(f) + CHECK_TYPE(f[0], int), sizeof(int), OFF(cnt) + CHECK_TYPE(cnt, int), h}
/* an enum field is stored as an int (d: the default's name, names: the value table) */
#define CHECK_INT_SIZED(f) (0 * sizeof(char[sizeof(FIELD(f)) == sizeof(int) ? 1 : -1]))
#define KE(n, f, d, tbl, h) {n, K_ENUM, 0, d, 0, 0, NULL, tbl, OFF(f) + CHECK_INT_SIZED(f), sizeof(int), 0, h}

#define BIG_INT 2147483647.0
#define BIG_LONG 9.0e15 /* exactly representable in the double the range check uses */

static const struct { const char *name, *help; } sections[] = {
    {"model", "Model architecture and initialisation."},
    {"data", "Training and validation token files and how they are cut into samples."},
    {"train", "Batch sizes, run length, evaluation, logging and sampling."},
    {"optim", "AdamW, learning-rate schedule and gradient clipping."},
    {"parallel", "How parameters, gradients and optimizer state are sharded across ranks, and where they live."},
    {"checkpoint", "Parallel-HDF5 checkpoints: when to write, how many to keep, resuming."},
    {"log", "Logging and plots."},
    {"pref", "Preference training (train.stage = dpo), as LLaMA-Factory's pref_* keys."},
    {"lora", "LoRA adapters (train.finetuning_type = lora), as PEFT's LoraConfig and LLaMA-Factory's lora_* keys."},
    {"generate", "ztrain --generate: prompts completed by the model, under any strategy."},
    {"fault", "Fault injection, for testing the failure paths only."},
};
#define NSECTIONS ((int)(sizeof sections / sizeof sections[0]))

#define SCHEDULERS                                                                                   \
    "linear|cosine|cosine_with_restarts|polynomial|constant|constant_with_warmup|inverse_sqrt|cosine_with_min_lr|" \
    "cosine_warmup_with_min_lr|warmup_stable_decay"
static const zname_t strategies[] = {
    {"ddp", ZT_DDP}, {"zero0", ZT_DDP}, {"no_shard", ZT_DDP}, {"zero1", ZT_ZERO1}, {"zero2", ZT_ZERO2},
    {"shard_grad_op", ZT_SHARD_GRAD_OP}, {"zero3", ZT_ZERO3}, {"full_shard", ZT_ZERO3}, {"hybrid_shard", ZT_HYBRID},
    {"hybrid_shard_zero2", ZT_HYBRID_ZERO2}, {"auto", ZT_STRATEGY_AUTO}, {NULL, 0},
};
static const zname_t layouts[] = {{"flat", ZT_LAYOUT_FLAT}, {"per_param", ZT_LAYOUT_PER_PARAM}, {NULL, 0}};
static const zname_t sp_modes[] = {{"ulysses", ZT_SP_ULYSSES}, {"ring", ZT_SP_RING}, {NULL, 0}};
static const zname_t reduce_dtypes[] = {{"fp32", ZT_PREC_FP32}, {"bf16", ZT_PREC_BF16}, {"fp16", ZT_PREC_FP16}, {NULL, 0}};
static const zname_t backends[] = {{"auto", ZT_BACKEND_AUTO}, {"cpu", ZT_BACKEND_CPU}, {"cuda", ZT_BACKEND_CUDA}, {NULL, 0}};
static const zname_t offloads[] = {{"none", ZT_OFFLOAD_NONE}, {"cpu", ZT_OFFLOAD_CPU}, {"nvme", ZT_OFFLOAD_NVME},
                                   {NULL, 0}};
static const zname_t nonfinites[] = {{"abort", ZT_NONFINITE_ABORT}, {"skip", ZT_NONFINITE_SKIP}, {NULL, 0}};
static const zname_t matmuls[] = {{"auto", ZT_MATMUL_AUTO}, {"highest", ZT_MATMUL_HIGHEST}, {"high", ZT_MATMUL_HIGH},
                                  {"medium", ZT_MATMUL_MEDIUM}, {NULL, 0}};
static const zname_t pp_schedules[] = {{"gpipe", ZT_PP_GPIPE}, {"1f1b", ZT_PP_1F1B},
                                       {"interleaved_1f1b", ZT_PP_INTERLEAVED_1F1B}, {NULL, 0}};
static const zname_t optimizers[] = {{"adamw", ZT_OPTIM_ADAMW}, {"onebit_adam", ZT_OPTIM_ONEBIT_ADAM}, {NULL, 0}};
static const zname_t finetunings[] = {{"full", ZT_FT_FULL}, {"lora", ZT_FT_LORA}, {NULL, 0}};
static const zname_t stages[] = {{"sft", ZT_STAGE_SFT}, {"dpo", ZT_STAGE_DPO}, {NULL, 0}};
static const zname_t pref_losses[] = {{"sigmoid", ZT_PREF_SIGMOID}, {"ipo", ZT_PREF_IPO}, {"hinge", ZT_PREF_HINGE},
                                      {"orpo", ZT_PREF_ORPO}, {"simpo", ZT_PREF_SIMPO}, {NULL, 0}};
static const zname_t ckpt_formats[] = {{"consolidated", ZT_CKPT_CONSOLIDATED}, {"sharded", ZT_CKPT_SHARDED}, {NULL, 0}};
static const zname_t fault_kinds[] = {{"none", ZT_FAULT_NONE}, {"stall", ZT_FAULT_STALL}, {"kill", ZT_FAULT_KILL},
                                      {"nan", ZT_FAULT_NAN}, {"data", ZT_FAULT_DATA},
                                      {"save_kill", ZT_FAULT_SAVE_KILL}, {NULL, 0}};
static const zname_t hf_dtypes[] = {{"auto", ZT_HF_DTYPE_AUTO}, {"bf16", ZT_HF_DTYPE_BF16}, {"fp32", ZT_HF_DTYPE_FP32},
                                    {NULL, 0}};

static const zkey_t schema[] = {
    /* model */
    KS("model.arch", model.arch, "gpt2", "gpt2|llama|qwen2|qwen3|mistral|gemma3",
       "Model family: gpt2 (GPT2LMHeadModel: learned positions, pre-LayerNorm, GELU MLP of 4*n_embd, tied head), "
       "llama (LlamaForCausalLM: RMSNorm, RoPE, grouped-query attention, SwiGLU), qwen2 (Qwen2ForCausalLM: llama "
       "with q/k/v biases), qwen3 (Qwen3ForCausalLM: llama with per-head q/k RMSNorm), mistral (MistralForCausalLM: llama without "
       "biases, with model.sliding_window), gemma3 (Gemma3ForCausalLM, Gemma 3 text: GeGLU, (1 + w) RMSNorms "
       "around attention and MLP, q/k norms, embeddings scaled by sqrt(n_embd), tied head, sliding-window layers "
       "with their own rope_local_base_freq). With model.name_or_path it comes from config.json."),
    KS("model.name_or_path", model.name_or_path, "", NULL,
       "Hugging Face model directory (config.json + model.safetensors or model.safetensors.index.json and its "
       "shards), as LLaMA-Factory's model_name_or_path: the family and every dimension come from config.json, the "
       "initial weights from the safetensors files (each rank reads only what it owns). \"\" = random "
       "initialisation from the model.* keys."),
    KI("model.n_layer", model.n_layer, 4, 1, 1024, "Number of transformer blocks."),
    KI("model.n_head", model.n_head, 4, 1, 1024, "Attention heads per block; must divide model.n_embd."),
    KI("model.n_embd", model.n_embd, 128, 1, 65536, "Width of the residual stream (hidden size)."),
    KI("model.vocab_size", model.vocab_size, 257, 2, 1 << 24,
       "Vocabulary size: 257 for the byte-level tokenizer (256 bytes + end-of-text), 50257 for GPT-2 BPE. "
       "Must match the vocab_size attribute of the token files."),
    KI("model.block_size", model.block_size, 128, 1, 1 << 20,
       "Maximum context length (rows of the positional embedding); data.seq_len may not exceed it."),
    KD("model.init_std", model.init_std, 0.02, 0.0, 10.0,
       "Standard deviation of the normal initialisation of matrices and embeddings (residual projections are "
       "additionally scaled by 1/sqrt(2*n_layer), as in GPT-2)."),
    KI("model.n_kv_head", model.n_kv_head, 0, 0, 1024,
       "Key/value heads (HF num_key_value_heads): grouped-query attention when below n_head, which it must "
       "divide; 0 = n_head."),
    KI("model.head_dim", model.head_dim, 0, 0, 256,
       "Size of one attention head; 0 = n_embd / n_head. Qwen3 sets it independently of the hidden size."),
    KI("model.intermediate_size", model.intermediate_size, 0, 0, 1 << 20,
       "Width of the MLP; 0 = the family's default (gpt2: 4*n_embd, which it requires; llama family: 8*n_embd/3 "
       "rounded up to a multiple of 32)."),
    KD("model.rope_theta", model.rope_theta, 10000.0, 1.0, 1e12, "Base of the rotary frequencies (llama family)."),
    KD("model.rms_norm_eps", model.rms_norm_eps, 1e-6, 1e-12, 1.0, "RMSNorm epsilon (llama family)."),
    KB("model.tie_word_embeddings", model.tie_word_embeddings, 0,
       "lm_head shares the token embedding (llama family; gpt2 is always tied)."),
    KB("model.attention_bias", model.attention_bias, 0,
       "Biases on q/k/v/o_proj (llama, qwen3; qwen2 always has q/k/v biases and no o_proj bias, mistral none)."),
    KS("model.rope_type", model.rope_type, "default", "default|llama3|linear",
       "rope_scaling's rope_type: llama3 divides the long-wavelength frequencies by rope_factor and interpolates "
       "between the two wavelength bounds (Llama 3.1/3.2); linear divides every frequency by rope_factor (gemma3: "
       "its full-attention layers only, as HF)."),
    KD("model.rope_factor", model.rope_factor, 8.0, 1e-6, 1e6, "llama3 and linear rope scaling: factor."),
    KD("model.rope_low_freq_factor", model.rope_low_freq_factor, 1.0, 1e-6, 1e6,
       "llama3 rope scaling: low_freq_factor."),
    KD("model.rope_high_freq_factor", model.rope_high_freq_factor, 4.0, 1e-6, 1e6,
       "llama3 rope scaling: high_freq_factor."),
    KI("model.rope_original_max_position_embeddings", model.rope_original_max_position_embeddings, 8192, 1,
       1 << 24, "llama3 rope scaling: original_max_position_embeddings."),
    KI("model.sliding_window", model.sliding_window, 0, 0, 1 << 24,
       "mistral, gemma3: HF's sliding_window: token t attends to positions t - sliding_window + 1 .. t (0 = null: "
       "all before it); every mistral layer, gemma3's sliding_attention layers."),
    KI("model.sliding_window_pattern", model.sliding_window_pattern, 6, 1, 1024,
       "gemma3: every sliding_window_pattern-th layer (layers p-1, 2p-1, ...) is full_attention, the others "
       "sliding_attention (HF's layer_types as Gemma3TextConfig builds them)."),
    KD("model.rope_local_base_freq", model.rope_local_base_freq, 10000.0, 1.0, 1e12,
       "gemma3: rope_theta of the sliding_attention layers (model.rope_theta is the full_attention layers')."),
    KS("model.init_from", model.init_from, "", NULL,
       "Checkpoint to take the initial weights from (fine-tuning); \"\" = random initialisation. Only the weights "
       "are read; the step count and optimizer state start fresh."),
    KI("model.quantization_bit", model.quantization_bit, 0, 0, 8,
       "LLaMA-Factory's quantization_bit: 0 = full-precision base; 4 = the frozen base weights held in "
       "bitsandbytes' 4-bit format (QLoRA, needs train.finetuning_type = lora). 8 is refused (no LLM.int8 path). "
       "A model.name_or_path saved 4-bit by transformers (a bitsandbytes quantization_config) sets this and the "
       "two keys below itself, and its 4-bit bytes are read as they are."),
    KS("model.quantization_type", model.quantization_type, "nf4", "nf4|fp4",
       "LLaMA-Factory's quantization_type: the 4-bit code, NormalFloat (nf4) or 4-bit float (fp4), in blocks "
       "of 64 weights each scaled by its absmax, as bitsandbytes."),
    KB("model.double_quantization", model.double_quantization, 1,
       "LLaMA-Factory's double_quantization: the per-block absmax themselves quantized to 8 bits in blocks of "
       "256 (bitsandbytes' compress_statistics), about 0.37 bits per weight saved."),
    /* data */
    KSL("data.train_files", data.train_files, data.n_train_files, "data/train.h5",
        "Training token files: one path or a list of paths (HDF5 with a 1-D /tokens dataset, or llm.c .bin shards), "
        "read in order as one stream."),
    KSL("data.val_files", data.val_files, data.n_val_files, "data/val.h5",
        "Validation token files (same formats); an empty list [] disables evaluation."),
    KI("data.seq_len", data.seq_len, 64, 1, 1 << 20,
       "Tokens per training sequence (T); each sample reads T+1 tokens for the shifted targets. "
       "At most model.block_size."),
    KB("data.shuffle", data.shuffle, 1,
       "Visit samples in a shuffled order that is a pure function of (data.seed, epoch); false = file order."),
    KL("data.seed", data.seed, 1337, 0, BIG_LONG, "Seed of the sample order (independent of train.seed)."),
    KS("data.vocab_file", data.vocab_file, "", NULL,
       "GPT-2 vocab.json (encoder.json). With data.merges_file, lets ztrain encode train.sample_prompt and "
       "print the end-of-run sample as text for GPT-2 BPE token files; without them the sample is printed "
       "as token ids. Byte-level data needs neither."),
    KS("data.merges_file", data.merges_file, "", NULL, "GPT-2 merges.txt, with data.vocab_file."),
    KS("data.tokenizer", data.tokenizer, "", NULL,
       "Tokenizer of the token files, to encode train.sample_prompt and print the end-of-run sample as text: "
       "a Hugging Face model directory (its tokenizer.json, else vocab.json + merges.txt) or a tokenizer.json "
       "file, as zt-prep-data --tokenizer takes. Empty: data.vocab_file + data.merges_file when set, else "
       "model.name_or_path when set. Byte-level data needs none."),
    KS("data.format", data.format, "tokens", "tokens|alpaca|sharegpt|messages",
       "What data.train_files / data.val_files hold: token files (tokens), or instruction data in JSON / JSON "
       "Lines (alpaca, sharegpt, messages), which rank 0 turns into SFT sample files as LLaMA-Factory's "
       "supervised processor does (data.template, data.cutoff_len, data.tokenizer) and caches beside each "
       "input as INPUT.<key>.sft.h5, remade when the file, tokenizer, template or options change."),
    KS("data.template", data.template_name, "", NULL,
       "Chat template of instruction data, as LLaMA-Factory names it: default, alpaca, qwen, qwen3, "
       "qwen3_nothink, llama3, llama2, mistral, gemma, gemma2, gemma3. Required when data.format is not tokens."),
    KI("data.cutoff_len", data.cutoff_len, 2048, 1, 1 << 24,
       "LLaMA-Factory's cutoff_len: the most tokens of one SFT sample; longer conversations are cut turn by "
       "turn (infer_seqlen). Rows are data.seq_len positions, so samples longer than data.seq_len + 1 lose "
       "their tail in training."),
    KB("data.train_on_prompt", data.train_on_prompt, 0,
       "Prompt tokens carry loss too (LLaMA-Factory's train_on_prompt); false: only the answers do."),
    KB("data.mask_history", data.mask_history, 0,
       "Only the last turn's answer carries loss, and truncation keeps the last turns first (LLaMA-Factory's "
       "mask_history; not with data.train_on_prompt)."),
    KB("data.packing", data.packing, 0,
       "Greedy-pack SFT samples into rows of data.cutoff_len tokens, as LLaMA-Factory's packing: attention "
       "crosses the packed samples, as there (data.neat_packing keeps them apart)."),
    KB("data.neat_packing", data.neat_packing, 0,
       "LLaMA-Factory's neat_packing: the rows of data.packing (it implies it), but a packed sample attends "
       "only to itself and its positions restart at 0, so each trains as it would in a row of its own; "
       "the SFT file keeps the boundaries (/segment_ids). For data.format alpaca, sharegpt or messages; a "
       "sample file made with zt-prep-data --neat-packing trains so by itself."),
    KL("data.max_samples", data.max_samples, 0, 0, BIG_LONG,
       "LLaMA-Factory's max_samples: each instruction file (training and validation) keeps only its first this "
       "many records, in file order, before preprocessing and before any shuffle; the rest are not read. 0 = "
       "every record. For data.format alpaca, sharegpt or messages (zt-prep-data --max-samples)."),
    KB("data.ranking", data.ranking, 0,
       "data.format's files hold preference pairs, LLaMA-Factory's \"ranking\": true: each record a prompt and "
       "two answers, chosen and rejected (alpaca: instruction, input, chosen, rejected; sharegpt / messages: the "
       "turns up to the user's last, chosen and rejected as assistant turns), made into pairs of samples as "
       "LLaMA-Factory's pairwise processor does (doc/data.md). Preference training is not available yet: the "
       "trainer refuses it; zt-prep-data --ranking makes the pairs file."),
    KS("data.dataset", data.dataset, "", NULL,
       "LLaMA-Factory's dataset: names of entries of data.dataset_dir/dataset_info.json, comma-separated, whose "
       "files are the training data in place of data.train_files, each read with its entry's formatting, columns "
       "and tags and made into SFT samples as data.format's files are (doc/data.md)."),
    KS("data.eval_dataset", data.eval_dataset, "", NULL,
       "LLaMA-Factory's eval_dataset: the validation datasets likewise, in place of data.val_files (\"\" with "
       "data.dataset: no evaluation)."),
    KS("data.dataset_dir", data.dataset_dir, "data", NULL,
       "LLaMA-Factory's dataset_dir: the folder of dataset_info.json, which its entries' file_name are relative to."),
    /* train */
    KI("train.per_device_train_batch_size", train.per_device_train_batch_size, 8, 1, 1 << 20,
       "Sequences per rank per micro-step (B). Global batch = B * gradient_accumulation_steps * world size "
       "sequences."),
    KI("train.gradient_accumulation_steps", train.gradient_accumulation_steps, 1, 1, 1 << 20,
       "Micro-steps whose gradients are summed before one optimizer step."),
    KL("train.max_steps", train.max_steps, 0, 0, BIG_LONG,
       "Optimizer steps to run; 0 = derive from train.num_train_epochs and the size of the training data."),
    KD("train.num_train_epochs", train.num_train_epochs, 3.0, 0.0, 1e9,
       "Passes over the training data (fractional allowed); used only when train.max_steps = 0 (transformers' "
       "default 3)."),
    KI("train.logging_steps", train.logging_steps, 500, 1, 1 << 30,
       "Log loss, learning rate, throughput and memory every this many steps (transformers' default 500)."),
    KI("train.eval_steps", train.eval_steps, 100, 0, 1 << 30,
       "Evaluate the validation loss every this many steps; 0 = only at the end."),
    KI("train.eval_batches", train.eval_batches, 8, 0, 1 << 30,
       "Validation batches (per rank) per evaluation; 0 = no evaluation."),
    KS("train.output_dir", train.output_dir, "runs/default", NULL,
       "Directory for the log, metrics.jsonl, plots, the resolved config and checkpoints."),
    KL("train.seed", train.seed, 42, 0, BIG_LONG,
       "Seed of the weight initialisation and of sampling (transformers' default 42); initial weights do not "
       "depend on the world size."),
    KB("train.bf16", train.bf16, 0,
       "bf16 working copies of the parameters (gathered and read by the GEMMs; with train.matmul_precision = "
       "auto the GEMMs and attention run on bf16 tensor cores on a GPU, and in bf16 through oneDNN on a CPU with "
       "AVX512-BF16 or AMX-BF16), fp32 master weights, Adam moments and "
       "gradient accumulators; false = fp32 throughout. Not given: true on the cuda backend (unless "
       "train.fp16 is given), false on the cpu backend."),
    KB("train.fp16", train.fp16, 0,
       "IEEE fp16 working parameters and gradients with fp32 master weights and Adam moments, and loss scaling "
       "(dynamic unless train.loss_scale > 0); exclusive with train.bf16."),
    KD("train.loss_scale", train.loss_scale, 0.0, 0.0, 1e38,
       "fp16: the loss scale; 0 = dynamic (start at 2^train.initial_scale_power, halve and skip the step on a "
       "gradient overflow, double after train.loss_scale_window good steps), > 0 = this fixed scale."),
    KI("train.initial_scale_power", train.initial_scale_power, 16, 0, 127,
       "fp16 dynamic loss scaling: the first loss scale is 2^this."),
    KI("train.loss_scale_window", train.loss_scale_window, 1000, 1, 1 << 30,
       "fp16 dynamic loss scaling: consecutive steps without overflow after which the scale doubles."),
    KD("train.min_loss_scale", train.min_loss_scale, 1.0, 0.0, 1e38,
       "fp16 dynamic loss scaling: an overflow that would halve the scale below this stops the run."),
    KB("train.gradient_checkpointing", train.gradient_checkpointing, 0,
       "Keep only each block's input in the forward pass and recompute the block in backward: less activation "
       "memory for about one extra forward pass."),
    KI("train.sample_tokens", train.sample_tokens, 200, 0, 1 << 20,
       "Tokens generated from the trained model at the end of the run; 0 = no sample."),
    KS("train.sample_prompt", train.sample_prompt, "", NULL,
       "Prompt for the final sample; \"\" = start from the end-of-text token."),
    KD("train.peak_tflops", train.peak_tflops, 0.0, 0.0, 1e6,
       "Peak TFLOP/s of one rank, the denominator of MFU; 0 = measure an sgemm at start-up."),
    KI("train.threads", train.threads, 0, 0, 4096,
       "CPU threads per rank (OpenMP loops and OpenBLAS). 0 = automatic: with the cpu backend OMP_NUM_THREADS, "
       "or 1 if unset (one single-threaded rank per core trains fastest); with a GPU backend the CPU does only "
       "host work (offloaded AdamW, data), so the node's cores divided by its ranks."),
    KE("train.finetuning_type", train.finetuning_type, "full", finetunings,
       "What trains, as LLaMA-Factory's finetuning_type: full = every parameter; lora = low-rank adapters on the "
       "lora.target linears of every block, the base frozen (no gradients, no optimizer state)."),
    KE("train.stage", train.stage, "sft", stages,
       "What the run trains, as LLaMA-Factory's stage: sft = next-token cross-entropy on the response tokens; "
       "dpo = a preference loss (pref.*) on pairs of responses, chosen and rejected."),
    KE("train.matmul_precision", train.matmul_precision, "auto", matmuls,
       "GEMM arithmetic on fp32 operands, as torch.set_float32_matmul_precision: highest = fp32, high = TF32 "
       "tensor cores, medium = bf16 tensor cores, all accumulating in fp32; auto = medium with 16-bit "
       "training (train.bf16 or train.fp16), highest otherwise. medium also runs the CUDA attention on bf16 tensor "
       "cores (head sizes that are multiples of 16 up to 128). On the cpu backend medium runs the GEMMs (attention's "
       "included) in bf16 through oneDNN where the CPU has AVX512-BF16 or AMX-BF16, and in fp32 otherwise (the "
       "startup line says which); high is fp32 there."),
    /* optim */
    KD("optim.learning_rate", optim.learning_rate, 5e-5, 0.0, 10.0,
       "Peak learning rate of AdamW (transformers' learning_rate, whose default it has)."),
    KS("optim.lr_scheduler_type", optim.lr_scheduler_type, "linear", SCHEDULERS,
       "transformers' lr_scheduler_type: the learning rate of every optimizer step is get_scheduler's for this "
       "type, optim.warmup_steps (or warmup_ratio) and the run's steps, with the scheduler's keyword arguments "
       "(lr_scheduler_kwargs) below. Warm-up, where the type has one, rises linearly from 0 at the first step to "
       "the peak at step warmup_steps + 1. linear and cosine decay to 0; cosine_with_min_lr to optim.min_lr or "
       "optim.min_lr_rate; constant ignores the warm-up (constant_with_warmup takes it); inverse_sqrt decays as "
       "1/sqrt past optim.timescale; warmup_stable_decay holds the peak, then decays over optim.num_decay_steps. "
       "reduce_lr_on_plateau and greedy follow evaluation metrics and are not available."),
    KL("optim.warmup_steps", optim.warmup_steps, 0, 0, BIG_LONG,
       "transformers' warmup_steps: steps of linear warm-up from 0 to the peak learning rate."),
    KD("optim.warmup_ratio", optim.warmup_ratio, 0.0, 0.0, 1.0,
       "Warm-up as a fraction of the run's optimizer steps, transformers' warmup_ratio: ceil(steps * ratio) "
       "steps (get_warmup_steps; transformers 5 reads a warmup_steps below 1 so). Exclusive with "
       "optim.warmup_steps."),
    /* lr_scheduler_kwargs, flat: transformers' names; -1 (or 0 for timescale) = the argument not given */
    KD("optim.num_cycles", optim.num_cycles, -1.0, -1.0, 1e6,
       "lr_scheduler_kwargs num_cycles (cosine, cosine_with_restarts, cosine_with_min_lr, "
       "cosine_warmup_with_min_lr, warmup_stable_decay's cosine decay): -1 = the type's default, 0.5 half a "
       "cosine wave (1 for cosine_with_restarts: restarts)."),
    KD("optim.power", optim.power, 1.0, 0.0, 1e6, "lr_scheduler_kwargs power (polynomial)."),
    KD("optim.lr_end", optim.lr_end, 1e-7, 0.0, 10.0,
       "lr_scheduler_kwargs lr_end (polynomial): the learning rate the decay ends at; below optim.learning_rate."),
    KD("optim.timescale", optim.timescale, 0.0, 0.0, 1e15,
       "lr_scheduler_kwargs timescale (inverse_sqrt); 0 = None: optim.warmup_steps, or 10000 without warm-up."),
    KD("optim.min_lr", optim.min_lr, -1.0, -1.0, 10.0,
       "lr_scheduler_kwargs min_lr (cosine_with_min_lr, cosine_warmup_with_min_lr): the floor as a learning "
       "rate; -1 = None. Exclusive with optim.min_lr_rate; one of them is required by those types."),
    KD("optim.min_lr_rate", optim.min_lr_rate, -1.0, -1.0, 1.0,
       "lr_scheduler_kwargs min_lr_rate (cosine_with_min_lr, cosine_warmup_with_min_lr): the floor as a "
       "fraction of optim.learning_rate; -1 = None."),
    KD("optim.warmup_lr_rate", optim.warmup_lr_rate, -1.0, -1.0, 1.0,
       "lr_scheduler_kwargs warmup_lr_rate (cosine_warmup_with_min_lr): the first step's learning rate as a "
       "fraction of the peak; -1 = None: the warm-up starts at 1/warmup_steps of it."),
    KL("optim.num_stable_steps", optim.num_stable_steps, -1, -1, BIG_LONG,
       "lr_scheduler_kwargs num_stable_steps (warmup_stable_decay); -1 = None: the run's steps less the warm-up "
       "and the decay."),
    KL("optim.num_decay_steps", optim.num_decay_steps, -1, -1, BIG_LONG,
       "lr_scheduler_kwargs num_decay_steps (warmup_stable_decay, which requires it); -1 = not given."),
    KS("optim.warmup_type", optim.warmup_type, "linear", "linear|cosine|1-sqrt",
       "lr_scheduler_kwargs warmup_type (warmup_stable_decay)."),
    KS("optim.decay_type", optim.decay_type, "cosine", "linear|cosine|1-sqrt",
       "lr_scheduler_kwargs decay_type (warmup_stable_decay)."),
    KD("optim.min_lr_ratio", optim.min_lr_ratio, 0.0, 0.0, 1.0,
       "lr_scheduler_kwargs min_lr_ratio (warmup_stable_decay): where its warm-up starts and its decay ends, as "
       "a fraction of the peak. For a floor under cosine, use cosine_with_min_lr and optim.min_lr_rate."),
    KD("optim.weight_decay", optim.weight_decay, 0.0, 0.0, 10.0,
       "Decoupled (AdamW) weight decay, applied to matrices and embeddings only, not to biases or LayerNorm "
       "parameters."),
    KD("optim.adam_beta1", optim.adam_beta1, 0.9, 0.0, 0.999999, "Adam first-moment decay."),
    KD("optim.adam_beta2", optim.adam_beta2, 0.999, 0.0, 0.999999999, "Adam second-moment decay."),
    KD("optim.adam_epsilon", optim.adam_epsilon, 1e-8, 0.0, 1.0, "Adam denominator epsilon."),
    KD("optim.max_grad_norm", optim.max_grad_norm, 1.0, 0.0, 1e9,
       "Clip the global gradient L2 norm (over all ranks' shards) to this value; 0 = no clipping."),
    KE("optim.type", optim.type, "adamw", optimizers,
       "adamw: PyTorch's AdamW. onebit_adam: DeepSpeed's 1-bit Adam: Adam without bias correction (weight decay "
       "added to the update) for optim.freeze_step steps, then the second moment frozen and the momentum, updated "
       "with each rank's own gradient, exchanged as sign bits plus one scale per parameter chunk, with worker and "
       "server error feedback. ddp, zero1 or zero2; after the freeze gradient clipping uses each rank's own gradient norm, as "
       "DeepSpeed does (see doc/user-guide.md, 1-bit Adam)."),
    KL("optim.freeze_step", optim.freeze_step, 100000, 1, BIG_LONG,
       "onebit_adam: the steps of uncompressed Adam before the variance freezes and the compressed momentum "
       "exchange starts (DeepSpeed's freeze_step, same default)."),
    /* parallel */
    KE("parallel.strategy", parallel.strategy, "ddp", strategies,
       "Sharding strategy. ddp (= zero0, no_shard): everything replicated, gradients all-reduced. zero1: optimizer "
       "state sharded. zero2: + gradients sharded. shard_grad_op: + parameters sharded at rest, gathered once per "
       "step. zero3 (= full_shard): parameters gathered per unit just in time and freed after use. hybrid_shard, "
       "hybrid_shard_zero2: full_shard / shard_grad_op inside a shard group, replicated across groups. "
       "auto: the least sharding that fits parallel.memory_limit_gb; where none fits at tp 1 x sp 1 and none of "
       "parallel.tensor_parallel_size, sequence_parallel_size and pipeline_parallel_size is given, the mesh (tp "
       "within a node, Ulysses sp) and strategy that fit with the least traffic per step; where no such mesh fits, "
       "the smallest pipeline_parallel_size that does (the same search inside it) under 1f1b, or gpipe where "
       "train.gradient_accumulation_steps is below pp (a pp_schedule given is kept). The log's first line says "
       "what it chose and why."),
    KE("parallel.shard_layout", parallel.shard_layout, "flat", layouts,
       "flat: each unit's parameters in one padded buffer, each rank owns a contiguous slice (ZeRO, FSDP1). "
       "per_param: every parameter split along dim 0 (FSDP2)."),
    KI("parallel.shard_group_size", parallel.shard_group_size, 0, 0, 1 << 24,
       "Ranks per shard group for the hybrid strategies, counted in the sp x dp ranks of one tp position; 0 = "
       "those of one node. Must divide them, and be a multiple of parallel.sequence_parallel_size."),
    KI("parallel.tensor_parallel_size", parallel.tensor_parallel_size, 1, 1, 1 << 16,
       "Tensor parallelism (Megatron, DeepSpeed AutoTP): ranks that split each block's GEMMs (q/k/v, gate/up, "
       "c_attn, c_fc by output; o, down, c_proj by input) and the vocabulary of the embedding and head. "
       "Consecutive ranks (innermost in the mesh, so inside a node); must divide the world, the heads, the KV "
       "heads, the intermediate size and the vocabulary. The strategy shards over the world / tp data ranks."),
    KB("parallel.tp_sequence_parallel", parallel.tp_sequence_parallel, 0,
       "Megatron's sequence parallelism inside tensor parallelism: between the row- and column-parallel GEMMs "
       "the residual stream is split over the tp ranks by tokens, so norms, residual adds and their activations "
       "take 1/tp; a reduce-scatter and an all-gather replace each all-reduce (the same bytes). Needs "
       "per_device_train_batch_size x seq_len / sp divisible by tp."),
    KI("parallel.sequence_parallel_size", parallel.sequence_parallel_size, 1, 1, 1 << 16,
       "Sequence parallelism: ranks that split each sequence (data.seq_len / sp positions each) and meet in "
       "attention (parallel.sp_mode). Inside tp in the mesh; the strategy shards over the sp x dp ranks, as "
       "DeepSpeed-Ulysses does."),
    KI("parallel.pipeline_parallel_size", parallel.pipeline_parallel_size, 1, 1, 1 << 16,
       "Pipeline parallelism: ranks that each hold a contiguous range of the model's layers (a stage; the "
       "embedding and the head count as a layer each, torchtitan's rule) and pass activations forward and their "
       "gradients back by point-to-point messages. The outermost axis of the mesh (pp, dp_replicate, dp_shard, "
       "sp, tp): the other axes repeat inside every stage. The pipeline's micro-batches are the "
       "gradient-accumulation steps, so the global batch stays micro-batch x data ranks x accumulation. Cheapest "
       "traffic of any axis (one activation per micro-batch per stage boundary); pick it across nodes whose links "
       "are too slow for tp, or for a model too deep for one node."),
    KE("parallel.pp_schedule", parallel.pp_schedule, "1f1b", pp_schedules,
       "The order of the pipeline's forward and backward passes (zt_step.h; doc/design.md). gpipe: every forward, "
       "then every backward (all micro-batches' activations held at once). 1f1b: pp - 1 - r warm-up forwards on "
       "rank r, then one forward, one backward (at most pp micro-batches in flight); needs "
       "train.gradient_accumulation_steps >= pp. interleaved_1f1b: 1F1B over parallel.pp_stages_per_rank looped "
       "stages per rank (Megatron's), a bubble v times smaller; needs the accumulation steps a multiple of pp."),
    KI("parallel.pp_stages_per_rank", parallel.pp_stages_per_rank, 1, 1, 64,
       "interleaved_1f1b: stages per pipeline rank (v), looped: rank r holds stages r, r + pp, ... ; 1 with the "
       "other schedules."),
    KIL("parallel.pp_layers_per_stage", parallel.pp_layers_per_stage, parallel.n_pp_layers_per_stage, 1, 1 << 20,
        "The layers of each stage, first to last, the embedding and the head counted as a layer each: one entry "
        "per stage (pp x pp_stages_per_rank), summing to model layers + 2. Empty: as even as possible, the "
        "earlier stages taking one more where it does not divide."),
    KB("parallel.pp_head_split", parallel.pp_head_split, 1,
       "gpipe: the last stage's forward runs the head's forward and the loss and holds the micro-batch's dlogits "
       "(micro-batch x seq_len x vocabulary floats) for its backward, which runs the head's two gradient GEMMs: "
       "each phase carries its share of the head, as the bubble's formula assumes (unsplit, the last stage's "
       "forwards are light and its backwards heavy, and all forwards then all backwards pays both differences "
       "in full). Costs the dlogits of every micro-batch on the last stage's rank (--estimate-memory counts "
       "them). false: the backward runs the whole head. 1f1b and interleaved_1f1b, whose forwards and backwards "
       "alternate and gain nothing measurable from it, and train.stage = dpo run it unsplit."),
    KE("parallel.sp_mode", parallel.sp_mode, "ulysses", sp_modes,
       "ulysses: an all-to-all from sequence-sharded to head-sharded around attention and back (the heads and "
       "key/value heads of a tp rank must divide by sp). ring: K/V blocks go round the sp ring and merge through "
       "the log-sum-exp, the next block's transfer overlapping the current one's compute; each rank holds "
       "chunks i and 2 sp - 1 - i of 2 sp (causal balance: data.seq_len must divide by 2 sp); any head count "
       "(cpu backend only for now)."),
    KB("parallel.reshard_after_forward", parallel.reshard_after_forward, 1,
       "zero3 family: free gathered parameters after a unit's forward and gather again in backward "
       "(false keeps them until backward, like shard_grad_op)."),
    KD("parallel.bucket_size_mb", parallel.bucket_size_mb, 25.0, 0.0, 1e6,
       "Gradient bucket size in MiB for overlapped reductions; 0 = one collective per unit."),
    KE("parallel.reduce_dtype", parallel.reduce_dtype, "fp32", reduce_dtypes,
       "Precision in which gradients are communicated and reduced; fp16 needs train.fp16 (loss scaling)."),
    KE("parallel.backend", parallel.backend, "auto", backends,
       "Compute backend; auto = cuda when a GPU is visible and ztrain was built with CUDA, else cpu."),
    KD("parallel.memory_limit_gb", parallel.memory_limit_gb, 0.0, 0.0, 1e6,
       "Memory budget per rank in GB: strategy = auto picks the least traffic within it, and a run whose "
       "memory estimate exceeds it is refused at start-up with the estimate; 0 = the free memory of the "
       "rank's GPU less 5% (at most 2 GiB) kept for NCCL and cuBLASLt (cuda backend), else the node's "
       "physical memory divided by its ranks."),
    KD("parallel.timeout_s", parallel.timeout_s, 1800.0, 0.0, 1e7,
       "Watchdog: abort the job with a report naming the stuck rank and operation when one operation (a "
       "unit's forward or backward, a reduction, the optimizer step, a checkpoint save or load, an "
       "evaluation batch) makes no progress for this many seconds, instead of hanging until the job's time "
       "limit; 0 = off. The default, 30 minutes, is DeepSpeed's collective timeout."),
    KE("parallel.offload_optimizer", parallel.offload_optimizer, "none", offloads,
       "Keep the optimizer shard (fp32 master weights, Adam moments) in (pinned) host memory and run AdamW "
       "there with the vectorized CPU kernel (ZeRO-Offload); where gradients are sharded (zero2, "
       "shard_grad_op, zero3) the owned gradient accumulators too, each unit's downloaded during the "
       "backward of the next. The device keeps the working parameters (and the gradients for ddp, zero1 "
       "and the hybrids). Saves 12 bytes per owned parameter of device memory, 16 where gradients are "
       "sharded; meant for the cuda backend (on the cpu backend it is the same memory, and results are "
       "bit-identical). nvme (ZeRO-Infinity): as cpu, but the fp32 master and the Adam moments live in "
       "scratch files under parallel.offload_nvme_path, each unit's read while the one before it steps and "
       "written back while the one after it steps, through parallel.offload_nvme_buffer_count host "
       "buffers as large as the largest unit's state; host memory then holds those buffers (and the "
       "gradient landings) instead of 12 bytes per owned parameter. The files are removed at exit and at "
       "abort: checkpoints remain the only saved state."),
    KE("parallel.offload_param", parallel.offload_param, "none", offloads,
       "Strategies that shard parameters (shard_grad_op, zero3, hybrid_shard, hybrid_shard_zero2; auto where it "
       "picks one), with offload_optimizer = cpu: keep the owned parameter shards in host memory too and "
       "upload each unit's shard just before it is gathered (ZeRO-Infinity's parameter offload). nvme, with "
       "offload_optimizer = nvme: the owned parameter shards live in the scratch files too, each read before "
       "its gather (the prefetched unit's ahead of time)."),
    KS("parallel.offload_nvme_path", parallel.offload_nvme_path, "", NULL,
       "offload = nvme: an existing, writable directory (DeepSpeed's nvme_path) on a fast local disk; each "
       "rank keeps its files in its own subdirectory ztrain.<host>.<pid>.rank<r>, removed at exit and at "
       "abort (one left by a killed run on the same host is removed at the next start)."),
    KI("parallel.offload_nvme_buffer_count", parallel.offload_nvme_buffer_count, 4, 3, 64,
       "offload = nvme: host buffers the files stream through (DeepSpeed's buffer_count). Each holds the "
       "largest unit's state (ztrain sizes them; no buffer_size to get wrong). At least 3: one unit being "
       "read, one updated, one written; a fourth lets the next read start before the last write ends."),
    KL("parallel.offload_nvme_block_size", parallel.offload_nvme_block_size, 1048576, 4096, 1073741824,
       "offload = nvme: bytes per I/O request (DeepSpeed's aio block_size): a transfer is split into "
       "requests of this size; a multiple of 4096 (O_DIRECT alignment)."),
    KI("parallel.offload_nvme_queue_depth", parallel.offload_nvme_queue_depth, 8, 1, 4096,
       "offload = nvme: I/O requests in flight per rank (DeepSpeed's aio queue_depth): the io_uring's size."),
    KE("parallel.nonfinite", parallel.nonfinite, "abort", nonfinites,
       "What a NaN/Inf loss or gradient norm does: abort the job (naming step and rank), or skip the optimizer "
       "step on every rank and continue."),
    /* checkpoint */
    KI("checkpoint.save_steps", checkpoint.save_steps, 500, 0, 1 << 30,
       "Write a checkpoint every this many steps (transformers' default 500); 0 = only at the end (see "
       "checkpoint.save_at_end)."),
    KB("checkpoint.save_at_end", checkpoint.save_at_end, 1, "Write a checkpoint when training finishes."),
    KI("checkpoint.keep_last", checkpoint.keep_last, 2, 0, 1 << 20,
       "Keep only the newest this many checkpoints in train.output_dir; 0 = keep all."),
    KE("checkpoint.format", checkpoint.format, "consolidated", ckpt_formats,
       "consolidated: one HDF5 file with full tensors, HF GPT-2 names, readable at any world size. sharded: each "
       "rank's flat shard as written (faster for very large runs; convert with zt-ckpt)."),
    KS("checkpoint.resume", checkpoint.resume, "none", NULL,
       "auto = resume from the newest checkpoint in train.output_dir if there is one; none = start fresh; "
       "anything else is the path of a checkpoint to resume from (any world size or strategy)."),
    KB("checkpoint.save_hf", checkpoint.save_hf, 1,
       "At the end of training write <output_dir>/hf: a Hugging Face model directory (config.json, "
       "generation_config.json, model.safetensors or shards and their index, the tokenizer files of "
       "model.name_or_path) that AutoModelForCausalLM.from_pretrained loads; every rank writes its own bytes."),
    KE("checkpoint.hf_dtype", checkpoint.hf_dtype, "auto", hf_dtypes,
       "Weights dtype of the HF export: auto = bf16 for bf16 runs, fp32 otherwise."),
    KS("checkpoint.hf_max_shard_size", checkpoint.hf_max_shard_size, "5GB", NULL,
       "Largest safetensors shard of the HF export, as transformers' max_shard_size (\"5GB\" = 5e9 bytes, "
       "\"500MB\", \"2GiB\"); above it the weights are split with model.safetensors.index.json."),
    /* log */
    KB("log.all_ranks", log.all_ranks, 0, "Every rank writes its own log file (rank 0 only otherwise)."),
    KB("log.plot", log.plot, 1, "Write <output_dir>/loss.svg (training and validation loss, and under train.stage = dpo the reward margin; plain SVG, no dependencies) at the end of the run."),
    /* lora */
    KI("lora.rank", lora.rank, 8, 1, 4096, "LoRA rank r (PEFT's r, LLaMA-Factory's lora_rank)."),
    KD("lora.alpha", lora.alpha, 0.0, 0.0, 1e6,
       "LoRA alpha; the update is scaled by alpha / r. 0 = 2 * rank, LLaMA-Factory's default."),
    KD("lora.dropout", lora.dropout, 0.0, 0.0, 0.95,
       "Dropout on the adapters' input (PEFT's lora_dropout: each target its own mask, kept inputs scaled "
       "by 1/(1-p)). The mask is a counter-based hash of (seed, step, sample, position, layer, target, "
       "channel), so every strategy and mesh drops the same elements; it is not torch's generator."),
    KSL("lora.target", lora.target, lora.n_target, "all",
        "Linears that get adapters: \"all\" = every linear of the blocks (not the embedding or the head), or a "
        "list of module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (llama family), "
        "c_attn, c_proj, c_fc (gpt2; c_proj is both attn.c_proj and mlp.c_proj, as PEFT matches a name at the "
        "end of a module path: attn.c_proj names one)."),
    KB("lora.use_rslora", lora.use_rslora, 0, "Rank-stabilised LoRA: scale alpha / sqrt(r) instead of alpha / r."),
    KS("lora.adapter_name_or_path", lora.adapter_name_or_path, "", NULL,
       "A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to start from, to continue an "
       "adapter trained elsewhere; its r, lora_alpha and target_modules must match lora.*."),
    /* pref */
    KE("pref.loss", pref.fn.loss, "sigmoid", pref_losses,
       "LLaMA-Factory's pref_loss. sigmoid = DPO; orpo and simpo need no reference model. As LLaMA-Factory 0.9.5 "
       "computes them with trl 0.24: ipo and hinge are the sigmoid loss too (trl's dpo_loss is called without its "
       "loss type), ipo on each response's mean log-prob instead of its sum; orpo and simpo use means as well."),
    KD("pref.beta", pref.fn.beta, 0.1, 1e-12, 1e6,
       "pref_beta: the inverse temperature of the preference loss (orpo: the odds-ratio term's weight)."),
    KD("pref.ftx", pref.fn.ftx, 0.0, 0.0, 1e6,
       "pref_ftx: weight of an SFT term added to each pair's loss, minus the chosen response's mean log-prob."),
    KD("pref.label_smoothing", pref.fn.label_smoothing, 0.0, 0.0, 0.5,
       "dpo_label_smoothing: conservative DPO's probability that a pair's labels are flipped (sigmoid only)."),
    KD("pref.simpo_gamma", pref.fn.simpo_gamma, 0.5, -1e6, 1e6, "simpo_gamma: SimPO's target reward margin."),
    KS("pref.ref_model", pref.ref_model, "", NULL,
       "ref_model: a HF model directory for the reference, frozen, of the model's shapes. \"\" = with LoRA the base "
       "with the adapters off, with full fine-tuning a frozen copy of model.name_or_path. Not read by orpo and "
       "simpo."),
    KB("pref.share_prompt", pref.share_prompt, 0,
       "The reference pass computes a pair's prompt once and no padding past a row's last response token: the same "
       "log-probs to fp32 rounding, not bit for bit (a GEMM's rows round by how many run), so a policy equal to its "
       "reference (fresh adapters, step 1) is ln 2 to rounding rather than exactly. Not under sequence parallelism "
       "or parallel.tp_sequence_parallel (every row's positions run there)."),
    KB("pref.precompute_ref_log_probs", pref.precompute_ref, 0,
       "TRL's precompute_ref_log_probs: each pair's reference log-probs are computed the first time the pair is "
       "seen (the first epoch runs as without it, bit for bit) and kept in a table by its record in the training "
       "set, every rank holding all of it; from then on (later epochs, resumed runs) the pair runs no reference "
       "pass. The table is saved beside each checkpoint (prefref-<step>.h5) and loaded on resume. Once every pair "
       "is in it, a frozen reference copy (full fine-tuning, pref.ref_model) is freed. Not under "
       "parallel.pipeline_parallel_size > 1 (the reference's forwards are actions of the schedule there); no "
       "effect with orpo and simpo, which use no reference."),
    /* generate */
    KS("generate.prompt", generate.prompt, "", NULL,
       "One user message to complete, rendered with data.template (\"\" = generate.prompts_file)."),
    KS("generate.prompts_file", generate.prompts_file, "", NULL,
       "JSON Lines of prompts: {\"messages\": [{\"role\", \"content\"}, ...]} ending with the user's turn, or "
       "alpaca records {\"instruction\", \"input\", \"system\"}."),
    KI("generate.max_new_tokens", generate.max_new_tokens, 64, 1, 1 << 20,
       "Most tokens generated per prompt; the template's eos and stop words end an answer earlier."),
    KD("generate.temperature", generate.temperature, 0.0, 0.0, 100.0,
       "Sampling temperature; 0 = greedy (argmax), the same output at every world size and strategy."),
    KD("generate.top_p", generate.top_p, 1.0, 1e-6, 1.0, "Nucleus sampling: the smallest set of probability >= top_p."),
    KI("generate.top_k", generate.top_k, 0, 0, 1 << 24, "Sample among the top_k most likely tokens (0 = all)."),
    KB("generate.use_cache", generate.use_cache, 1,
       "Keep each block's keys and values of a sequence (HF's use_cache): a new token runs alone against them "
       "instead of the whole sequence again. Used without sequence parallelism or tp_sequence_parallel, while the "
       "sequence fits data.seq_len."),
    KI("generate.batch_size", generate.batch_size, 1, 1, 1024,
       "Prompts each data-parallel rank completes at once (HF's generate on a batch): with the KV cache their new "
       "tokens run as one batch, one GEMM row each, which reads every weight once per step for all of them; a row "
       "whose answer ended takes the next prompt at once. Each "
       "holds its own cache (n_layer x data.seq_len x 2 x num_key_value_heads x head_dim floats). Outputs are the "
       "same as one at a time up to fp32 rounding: greedy output may differ where two tokens' logits nearly tie."),
    KB("generate.at_eval", generate.at_eval, 0,
       "While training, complete generate.prompts_file at every evaluation (train.eval_steps and the last step) into "
       "<output_dir>/generations-<step>.jsonl."),
    /* fault */
    KI("fault.rank", fault.rank, -1, -1, 1 << 24, "Rank that injects the fault; -1 = no fault injection."),
    KL("fault.step", fault.step, 0, 0, BIG_LONG, "Step at which the fault is injected (1-based, as numbered in the progress lines)."),
    KE("fault.kind", fault.kind, "none", fault_kinds,
       "stall: the rank stops responding (tests the watchdog); kill: the rank exits; nan: its gradients become "
       "NaN; data: its data file reads fail; save_kill: the rank is killed inside the save of the checkpoint of "
       "fault.step, after part of the temporary file was written."),
};
#define NKEYS ((int)(sizeof schema / sizeof schema[0]))
_Static_assert(sizeof schema / sizeof schema[0] <= ZT_CONFIG_MAX_KEYS, "raise ZT_CONFIG_MAX_KEYS");

int zt_config_nkeys(void) { return NKEYS; }
const char *zt_config_key_name(int i) { return (i >= 0 && i < NKEYS) ? schema[i].name : NULL; }

/* ---- field access ------------------------------------------------------ */

static void *field(zt_config_t *cfg, const zkey_t *k) { return (char *)cfg + k->off; }
static const void *cfield(const zt_config_t *cfg, const zkey_t *k) { return (const char *)cfg + k->off; }
static int *count_field(zt_config_t *cfg, const zkey_t *k) { return (int *)((char *)cfg + k->count_off); }
static int ccount(const zt_config_t *cfg, const zkey_t *k)
{
    return *(const int *)((const char *)cfg + k->count_off);
}
static char *list_elem(zt_config_t *cfg, const zkey_t *k, int i) { return (char *)field(cfg, k) + (size_t)i * k->size; }
static const char *clist_elem(const zt_config_t *cfg, const zkey_t *k, int i)
{
    return (const char *)cfield(cfg, k) + (size_t)i * k->size;
}

/* Copies and zero-fills the rest of the buffer, so equal configs are equal bytes. */
static void set_buf(char *dst, size_t cap, const char *src)
{
    memset(dst, 0, cap);
    memcpy(dst, src, strlen(src));
}

/* enums: the entry of a name (NULL: none), the first name of a value (NULL: none) */
static const zname_t *enum_by_name(const zkey_t *k, const char *v)
{
    for (const zname_t *e = k->names; e->name; e++)
        if (strcmp(e->name, v) == 0) return e;
    return NULL;
}

static const char *enum_name(const zkey_t *k, int v)
{
    for (const zname_t *e = k->names; e->name; e++)
        if (e->value == v) return e->name;
    return NULL;
}

/* "ddp, zero0, no_shard, ..." */
static void enum_list(const zkey_t *k, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (const zname_t *e = k->names; e->name && o < len; e++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", e == k->names ? "" : ", ", e->name);
}

void zt_config_defaults(zt_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < NKEYS; i++) {
        const zkey_t *k = &schema[i];
        switch (k->type) {
        case K_INT:
        case K_BOOL: *(int *)field(cfg, k) = (int)k->def; break;
        case K_LONG: *(long *)field(cfg, k) = (long)k->def; break;
        case K_DOUBLE: *(double *)field(cfg, k) = k->def; break;
        case K_STRING: set_buf(field(cfg, k), k->size, k->sdef); break;
        case K_ENUM: *(int *)field(cfg, k) = enum_by_name(k, k->sdef)->value; break;
        case K_INTLIST: *count_field(cfg, k) = 0; break;
        case K_STRLIST:
            *count_field(cfg, k) = k->sdef[0] ? 1 : 0;
            if (k->sdef[0]) set_buf(list_elem(cfg, k, 0), k->size, k->sdef);
            break;
        }
    }
}

/* ---- lookup and suggestions -------------------------------------------- */

static const zkey_t *find_key(const char *name)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(schema[i].name, name) == 0) return &schema[i];
    return NULL;
}

/* remembers that the input gave key k */
static void mark_given(zt_config_t *cfg, const zkey_t *k) { cfg->given[k - schema] = 1; }

int zt_config_given(const zt_config_t *cfg, const char *key)
{
    const zkey_t *k = find_key(key);
    return k && cfg->given[k - schema];
}

static int find_section(const char *name)
{
    for (int i = 0; i < NSECTIONS; i++)
        if (strcmp(sections[i].name, name) == 0) return i;
    return -1;
}

static size_t section_len(const char *keyname) { return (size_t)(strchr(keyname, '.') - keyname); }

/* Best known key for a misspelt `name`: a key of the name's own section that
 * contains its part after the dot (a shorthand) wins, then a key whose part after the
 * dot equals the name's (right key, wrong section, or no section at all); otherwise
 * the nearest full name if it is close enough to be a plausible typo. */
static const char *suggest_key(const char *name)
{
    const char *dot = strrchr(name, '.');
    const char *bare = dot ? dot + 1 : name;
    /* train.batch_size is train.per_device_train_batch_size, not generate.batch_size */
    if (dot && strlen(bare) >= 4)
        for (int i = 0; i < NKEYS; i++)
            if (!strncmp(schema[i].name, name, (size_t)(dot - name) + 1) &&
                strcasestr(schema[i].name + (dot - name) + 1, bare))
                return schema[i].name;
    for (int i = 0; i < NKEYS; i++)
        if (strcasecmp(strchr(schema[i].name, '.') + 1, bare) == 0) return schema[i].name;
    int best = 1000;
    const char *who = NULL;
    for (int i = 0; i < NKEYS; i++) {
        int d = zt_levenshtein(name, dot ? schema[i].name : strchr(schema[i].name, '.') + 1);
        if (d < best) best = d, who = schema[i].name;
    }
    int limit = ZT_MAX(2, (int)strlen(name) / 3);
    if (best <= limit) return who;
    /* Shorthands: "warmup", "beta1", "batch_size" are inside the real names. */
    if (strlen(bare) >= 4)
        for (int i = 0; i < NKEYS; i++)
            if (strcasestr(strchr(schema[i].name, '.') + 1, bare)) return schema[i].name;
    if (strcasecmp(bare, "lr") == 0) return "optim.learning_rate";
    return NULL;
}

static const char *suggest_section(const char *name)
{
    int best = 1000;
    const char *who = NULL;
    for (int i = 0; i < NSECTIONS; i++) {
        int d = zt_levenshtein(name, sections[i].name);
        if (d < best) best = d, who = sections[i].name;
    }
    return best <= ZT_MAX(2, (int)strlen(name) / 3) ? who : NULL;
}

static int unknown_key(char *err, size_t errlen, const char *where, const char *name)
{
    const char *s = suggest_key(name);
    if (s) return zt_err(err, errlen, "%s: unknown key '%s' (did you mean '%s'?)", where, name, s);
    return zt_err(err, errlen, "%s: unknown key '%s' (ztrain --help lists every key)", where, name);
}

/* ---- typed setters with range checks ------------------------------------ */

static const char *type_expected(ktype_t t)
{
    switch (t) {
    case K_INT:
    case K_LONG: return "an integer";
    case K_DOUBLE: return "a number";
    case K_BOOL: return "a boolean (true or false)";
    case K_STRING:
    case K_ENUM: return "a string";
    case K_STRLIST: return "a string or a list of strings";
    case K_INTLIST: return "an integer or a list of integers";
    }
    return "?";
}

static void allowed_list(const char *allowed, char *buf, size_t len)
{
    size_t o = 0;
    for (const char *p = allowed; *p && o + 3 < len; p++) {
        if (*p == '|') {
            buf[o++] = ',';
            buf[o++] = ' ';
        } else {
            buf[o++] = *p;
        }
    }
    buf[o] = '\0';
}

static int in_allowed(const char *allowed, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = allowed; *p;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && strncmp(p, v, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static void fmt_num(const zkey_t *k, double v, char *buf, size_t len)
{
    if (k->type == K_DOUBLE) snprintf(buf, len, "%g", v);
    else snprintf(buf, len, "%.0f", v);
}

static int check_range(const zkey_t *k, double v, const char *where, char *err, size_t errlen)
{
    if (!(v >= k->min && v <= k->max)) {
        char a[40], lo[40], hi[40];
        fmt_num(k, v, a, sizeof a);
        fmt_num(k, k->min, lo, sizeof lo);
        fmt_num(k, k->max, hi, sizeof hi);
        return zt_err(err, errlen, "%s: %s: %s is out of range [%s, %s]", where, k->name, a, lo, hi);
    }
    return 0;
}

static int set_number(zt_config_t *cfg, const zkey_t *k, double v, const char *where, char *err, size_t errlen)
{
    if ((k->type == K_INT || k->type == K_LONG) && v != floor(v))
        return zt_err(err, errlen, "%s: %s: expected an integer, got %g", where, k->name, v);
    if (check_range(k, v, where, err, errlen)) return -1;
    if (k->type == K_INT) *(int *)field(cfg, k) = (int)v;
    else if (k->type == K_LONG) *(long *)field(cfg, k) = (long)v;
    else *(double *)field(cfg, k) = v;
    return 0;
}

static int check_string(const zkey_t *k, const char *v, const char *where, char *err, size_t errlen)
{
    if (strlen(v) >= k->size)
        return zt_err(err, errlen, "%s: %s: value is longer than %zu characters", where, k->name, k->size - 1);
    if (k->allowed && !in_allowed(k->allowed, v)) {
        char list[512];
        allowed_list(k->allowed, list, sizeof list);
        return zt_err(err, errlen, "%s: %s: '%s' must be one of: %s", where, k->name, v, list);
    }
    return 0;
}

static int set_enum(zt_config_t *cfg, const zkey_t *k, const char *v, const char *where, char *err, size_t errlen)
{
    const zname_t *e = enum_by_name(k, v);
    if (!e) {
        char list[512];
        enum_list(k, list, sizeof list);
        return zt_err(err, errlen, "%s: %s: '%s' must be one of: %s", where, k->name, v, list);
    }
    *(int *)field(cfg, k) = e->value;
    return 0;
}

static int set_string(zt_config_t *cfg, const zkey_t *k, const char *v, const char *where, char *err, size_t errlen)
{
    if (check_string(k, v, where, err, errlen)) return -1;
    set_buf(field(cfg, k), k->size, v);
    return 0;
}

/* String lists are staged so an error part-way leaves the old value intact. */
static int set_list(zt_config_t *cfg, const zkey_t *k, int n, const char *const *v, const char *where, char *err,
                    size_t errlen)
{
    if (n > ZT_MAX_FILES)
        return zt_err(err, errlen, "%s: %s: %d files given, at most %d are supported", where, k->name, n,
                      ZT_MAX_FILES);
    for (int i = 0; i < n; i++) {
        if (!v[i][0]) return zt_err(err, errlen, "%s: %s: element %d is an empty string", where, k->name, i);
        if (strlen(v[i]) >= k->size)
            return zt_err(err, errlen, "%s: %s: element %d is longer than %zu characters", where, k->name, i,
                          k->size - 1);
    }
    memset(field(cfg, k), 0, (size_t)ZT_MAX_FILES * k->size);
    for (int i = 0; i < n; i++) set_buf(list_elem(cfg, k, i), k->size, v[i]);
    *count_field(cfg, k) = n;
    return 0;
}

/* Integer lists: every element checked before any is stored */
static int set_intlist(zt_config_t *cfg, const zkey_t *k, int n, const double *v, const char *where, char *err,
                       size_t errlen)
{
    if (n > ZT_MAX_PP_STAGES)
        return zt_err(err, errlen, "%s: %s: %d entries given, at most %d are supported", where, k->name, n,
                      ZT_MAX_PP_STAGES);
    for (int i = 0; i < n; i++) {
        if (v[i] != floor(v[i]))
            return zt_err(err, errlen, "%s: %s: element %d: expected an integer, got %g", where, k->name, i, v[i]);
        if (v[i] < k->min || v[i] > k->max)
            return zt_err(err, errlen, "%s: %s: element %d (%g) out of range [%.0f, %.0f]", where, k->name, i, v[i],
                          k->min, k->max);
    }
    for (int i = 0; i < n; i++) ((int *)field(cfg, k))[i] = (int)v[i];
    *count_field(cfg, k) = n;
    return 0;
}

/* ---- the input file ------------------------------------------------------ */

static const char *setting_kind(const config_setting_t *s)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a number";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    case CONFIG_TYPE_GROUP: return "a group";
    }
    return "nothing";
}

static int set_from_setting(zt_config_t *cfg, const zkey_t *k, const config_setting_t *s, const char *where,
                            char *err, size_t errlen)
{
    int t = config_setting_type(s);
    switch (k->type) {
    case K_INT:
    case K_LONG:
    case K_DOUBLE:
        if (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64)
            return set_number(cfg, k, (double)config_setting_get_int64(s), where, err, errlen);
        if (t == CONFIG_TYPE_FLOAT) return set_number(cfg, k, config_setting_get_float(s), where, err, errlen);
        break;
    case K_BOOL:
        if (t == CONFIG_TYPE_BOOL) {
            *(int *)field(cfg, k) = config_setting_get_bool(s) ? 1 : 0;
            return 0;
        }
        break;
    case K_STRING:
        if (t == CONFIG_TYPE_STRING) return set_string(cfg, k, config_setting_get_string(s), where, err, errlen);
        break;
    case K_ENUM:
        if (t == CONFIG_TYPE_STRING) return set_enum(cfg, k, config_setting_get_string(s), where, err, errlen);
        break;
    case K_INTLIST:
        if (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64 || t == CONFIG_TYPE_FLOAT) {
            const double v = t == CONFIG_TYPE_FLOAT ? config_setting_get_float(s) : (double)config_setting_get_int64(s);
            return set_intlist(cfg, k, 1, &v, where, err, errlen);
        }
        if (t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST) {
            const int n = config_setting_length(s);
            if (n > ZT_MAX_PP_STAGES) return set_intlist(cfg, k, n, NULL, where, err, errlen);
            double v[ZT_MAX_PP_STAGES];
            for (int i = 0; i < n; i++) {
                const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
                const int et = config_setting_type(e);
                if (et != CONFIG_TYPE_INT && et != CONFIG_TYPE_INT64 && et != CONFIG_TYPE_FLOAT)
                    return zt_err(err, errlen, "%s: %s: element %d: expected an integer, got %s", where, k->name, i,
                                  setting_kind(e));
                v[i] = et == CONFIG_TYPE_FLOAT ? config_setting_get_float(e) : (double)config_setting_get_int64(e);
            }
            return set_intlist(cfg, k, n, v, where, err, errlen);
        }
        break;
    case K_STRLIST:
        if (t == CONFIG_TYPE_STRING) {
            const char *v = config_setting_get_string(s);
            return set_list(cfg, k, 1, &v, where, err, errlen);
        }
        if (t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST) {
            int n = config_setting_length(s);
            if (n > ZT_MAX_FILES) return set_list(cfg, k, n, NULL, where, err, errlen);
            const char *v[ZT_MAX_FILES];
            for (int i = 0; i < n; i++) {
                const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
                if (config_setting_type(e) != CONFIG_TYPE_STRING)
                    return zt_err(err, errlen, "%s: %s: element %d: expected a string, got %s", where, k->name, i,
                                  setting_kind(e));
                v[i] = config_setting_get_string(e);
            }
            return set_list(cfg, k, n, v, where, err, errlen);
        }
        break;
    }
    return zt_err(err, errlen, "%s: %s: expected %s, got %s", where, k->name, type_expected(k->type),
                  setting_kind(s));
}

static void where_of(const config_setting_t *s, const char *filename, char *buf, size_t len)
{
    snprintf(buf, len, "%s:%u", s->file ? s->file : filename, config_setting_source_line(s));
}

static int parse_section(zt_config_t *cfg, const config_setting_t *grp, const char *filename, char *err,
                         size_t errlen)
{
    int n = config_setting_length(grp);
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(grp, (unsigned)i);
        char full[256], where[ZT_STRLEN + 32];
        snprintf(full, sizeof full, "%s.%s", config_setting_name(grp), config_setting_name(s));
        where_of(s, filename, where, sizeof where);
        const zkey_t *k = find_key(full);
        if (!k) return unknown_key(err, errlen, where, full);
        if (set_from_setting(cfg, k, s, where, err, errlen)) return -1;
        mark_given(cfg, k);
    }
    return 0;
}

/* libconfig 1.5 reads a decimal or hex integer with atoi/strtoul into a 32-bit
 * int and silently wraps (3000000000 becomes -1294967296); only an `L` suffix
 * makes a 64-bit integer. Such literals are found here, in the text, and
 * rejected with the fix. Comments and strings are skipped; @include'd files
 * are not scanned. */
static int check_int_literals(const char *t, const char *filename, char *err, size_t errlen)
{
    int line = 1;
    for (const char *p = t; *p;) {
        unsigned char c = (unsigned char)*p;
        if (c == '\n') {
            line++;
            p++;
        } else if (c == '#' || (p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++) line += *p == '\n';
            if (*p) p += 2;
        } else if (c == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                line += *p == '\n';
            }
            if (*p) p++;
        } else if (isalpha(c) || c == '_' || c == '*' || c == '@') {
            for (p++; isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '*'; p++) {}
        } else if (isdigit(c) || (c == '.' && isdigit((unsigned char)p[1]))) {
            const char *s = p;
            int neg = s > t && s[-1] == '-';
            int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
            for (p += hex ? 2 : 0; isalnum((unsigned char)*p) || *p == '.' ||
                                   ((*p == '+' || *p == '-') && !hex && (p[-1] == 'e' || p[-1] == 'E'));
                 p++) {}
            size_t n = (size_t)(p - s);
            int is_float = !hex && (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n));
            if (!is_float && s[n - 1] != 'L') {
                errno = 0;
                unsigned long long v = strtoull(s, NULL, hex ? 16 : 10);
                if (errno == ERANGE || v > (neg ? 2147483648ULL : 2147483647ULL))
                    return zt_err(err, errlen, "%s:%d: integer %s%.*s does not fit in 32 bits; write it as %s%.*sL",
                                  filename, line, neg ? "-" : "", (int)n, s, neg ? "-" : "", (int)n, s);
            }
        } else {
            p++;
        }
    }
    return 0;
}

static int parse_text(zt_config_t *cfg, const char *text, const char *filename, char *err, size_t errlen)
{
    config_t lc;
    config_init(&lc);
    /* @include "x.cfg" resolves relative to the input file's directory. */
    char dir[ZT_STRLEN];
    snprintf(dir, sizeof dir, "%s", filename);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        config_set_include_dir(&lc, dir[0] ? dir : "/");
    }
    int rc = 0;
    if (!config_read_string(&lc, text)) {
        const char *f = config_error_file(&lc) ? config_error_file(&lc) : filename;
        const char *msg = config_error_text(&lc) ? config_error_text(&lc) : "syntax error";
        rc = zt_err(err, errlen, "%s:%d: %s", f, config_error_line(&lc), msg);
        goto done;
    }
    if ((rc = check_int_literals(text, filename, err, errlen)) != 0) goto done;
    const config_setting_t *root = config_root_setting(&lc);
    int n = config_setting_length(root);
    for (int i = 0; i < n && rc == 0; i++) {
        const config_setting_t *s = config_setting_get_elem(root, (unsigned)i);
        const char *name = config_setting_name(s);
        char where[ZT_STRLEN + 32];
        where_of(s, filename, where, sizeof where);
        if (find_section(name) >= 0) {
            if (!config_setting_is_group(s))
                rc = zt_err(err, errlen, "%s: %s: expected a group (%s = { key = value; ... };), got %s", where,
                            name, name, setting_kind(s));
            else
                rc = parse_section(cfg, s, filename, err, errlen);
        } else if (config_setting_is_group(s)) {
            const char *sug = suggest_section(name);
            if (sug)
                rc = zt_err(err, errlen, "%s: unknown section '%s' (did you mean '%s'?)", where, name, sug);
            else
                rc = zt_err(err, errlen, "%s: unknown section '%s' (ztrain --help lists every key)", where, name);
        } else {
            rc = unknown_key(err, errlen, where, name);
        }
    }
done:
    config_destroy(&lc);
    return rc;
}

/* ---- overrides ----------------------------------------------------------- */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

/* Strips one level of "..." or '...' quotes in place; \" and \\ escapes inside
 * double quotes, as a shell user would expect after the shell's own quoting. */
static int unquote(char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '\'' && s[n - 1] == '\'') {
        memmove(s, s + 1, n - 2);
        s[n - 2] = '\0';
        return 0;
    }
    if (!(n >= 1 && s[0] == '"')) return 0;
    if (n < 2 || s[n - 1] != '"') return -1;
    char *o = s;
    for (size_t i = 1; i < n - 1; i++) {
        if (s[i] == '\\' && i + 1 < n - 1) {
            char c = s[++i];
            *o++ = c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return 0;
}

static int parse_bool(const char *v, int *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) return *out = 1, 0;
        if (strcasecmp(v, no[i]) == 0) return *out = 0, 0;
    }
    return -1;
}

static int set_text(zt_config_t *cfg, const char *name, char *val, const char *where, char *err, size_t errlen);

static int apply_override(zt_config_t *cfg, const char *ov, char *err, size_t errlen)
{
    const char *where = "command line";
    char buf[ZT_MAX_FILES * 64 + ZT_STRLEN * 2];
    if (strlen(ov) >= sizeof buf) return zt_err(err, errlen, "%s: override is too long: '%.40s...'", where, ov);
    strcpy(buf, ov);
    char *eq = strchr(buf, '=');
    if (!eq) return zt_err(err, errlen, "%s: '%s' is not of the form section.key=value", where, ov);
    *eq = '\0';
    return set_text(cfg, trim(buf), trim(eq + 1), where, err, errlen);
}

int zt_config_set(zt_config_t *cfg, const char *key, const char *value, const char *where, char *err, size_t errlen)
{
    char buf[ZT_MAX_FILES * 64 + ZT_STRLEN * 2];
    if (strlen(value) >= sizeof buf) return zt_err(err, errlen, "%s: %s: value is too long", where, key);
    strcpy(buf, value);
    return set_text(cfg, key, trim(buf), where, err, errlen);
}

/* `name` = `val` as an override spells it (val is edited in place) */
static int set_text(zt_config_t *cfg, const char *name, char *val, const char *where, char *err, size_t errlen)
{
    const zkey_t *k = find_key(name);
    if (!k) return unknown_key(err, errlen, where, name);
    mark_given(cfg, k);

    switch (k->type) {
    case K_INT:
    case K_LONG:
    case K_DOUBLE: {
        char *end = NULL;
        double v = strtod(val, &end);
        if (!val[0] || *end || !isfinite(v))
            return zt_err(err, errlen, "%s: %s: expected %s, got '%s'", where, k->name, type_expected(k->type), val);
        return set_number(cfg, k, v, where, err, errlen);
    }
    case K_BOOL: {
        int b;
        if (parse_bool(val, &b))
            return zt_err(err, errlen, "%s: %s: expected %s, got '%s'", where, k->name, type_expected(k->type), val);
        *(int *)field(cfg, k) = b;
        return 0;
    }
    case K_STRING:
        if (unquote(val))
            return zt_err(err, errlen, "%s: %s: unterminated quoted string %s", where, k->name, val);
        return set_string(cfg, k, val, where, err, errlen);
    case K_ENUM:
        if (unquote(val))
            return zt_err(err, errlen, "%s: %s: unterminated quoted string %s", where, k->name, val);
        return set_enum(cfg, k, val, where, err, errlen);
    case K_INTLIST: {
        /* "4,4", optionally as [ 4, 4 ]; "" or [] = empty list */
        size_t n = strlen(val);
        if (n >= 2 && val[0] == '[' && val[n - 1] == ']') {
            val[n - 1] = '\0';
            val = trim(val + 1);
        }
        double v[ZT_MAX_PP_STAGES];
        int cnt = 0;
        for (char *p = val; *p;) {
            char *c = strchr(p, ','), *end;
            if (c) *c = '\0';
            char *item = trim(p);
            if (cnt == ZT_MAX_PP_STAGES) return set_intlist(cfg, k, cnt + 1, NULL, where, err, errlen);
            v[cnt] = strtod(item, &end);
            if (!item[0] || *end)
                return zt_err(err, errlen, "%s: %s: expected %s, got '%s'", where, k->name, type_expected(k->type),
                              item);
            cnt++;
            if (!c) break;
            p = c + 1;
        }
        return set_intlist(cfg, k, cnt, v, where, err, errlen);
    }
    case K_STRLIST: {
        /* "a.h5,b.h5", optionally as [ "a.h5", "b.h5" ]; "" or [] = empty list. */
        size_t n = strlen(val);
        if (n >= 2 && val[0] == '[' && val[n - 1] == ']') {
            val[n - 1] = '\0';
            val = trim(val + 1);
        }
        const char *items[ZT_MAX_FILES];
        int cnt = 0;
        if (val[0] && strcmp(val, "\"\"") != 0) {
            for (char *p = val;;) {
                char *c = strchr(p, ',');
                if (c) *c = '\0';
                char *item = trim(p);
                if (unquote(item))
                    return zt_err(err, errlen, "%s: %s: unterminated quoted string %s", where, k->name, item);
                if (cnt == ZT_MAX_FILES)
                    return zt_err(err, errlen, "%s: %s: more than %d files given", where, k->name, ZT_MAX_FILES);
                items[cnt++] = item;
                if (!c) break;
                p = c + 1;
            }
        }
        return set_list(cfg, k, cnt, items, where, err, errlen);
    }
    }
    return -1;
}

int zt_config_parse(zt_config_t *cfg, const char *text, const char *filename, int noverrides,
                    char *const overrides[], char *err, size_t errlen)
{
    if (!filename) filename = "<config>";
    zt_config_defaults(cfg);
    if (strlen(filename) >= sizeof cfg->source)
        return zt_err(err, errlen, "%s: input file name is too long", filename);
    set_buf(cfg->source, sizeof cfg->source, filename);
    if (text && parse_text(cfg, text, filename, err, errlen)) return -1;
    for (int i = 0; i < noverrides; i++)
        if (apply_override(cfg, overrides[i], err, errlen)) return -1;
    return zt_config_validate(cfg, err, errlen);
}

/* ---- validation ---------------------------------------------------------- */

/* ---- the learning-rate schedule ----------------------------------------------- */

/* transformers' lr_scheduler_kwargs as optim.* keys: whether the run sets each (a value
 * other than "not given"), for the rule that a type takes only its own arguments
 * (get_scheduler passes them on and the schedule function raises TypeError on others) */
static const struct {
    const char *key;
    unsigned bit;
} sched_kwargs[] = {
    {"optim.num_cycles", ZT_KW_NUM_CYCLES},           {"optim.power", ZT_KW_POWER},
    {"optim.lr_end", ZT_KW_LR_END},                   {"optim.timescale", ZT_KW_TIMESCALE},
    {"optim.min_lr", ZT_KW_MIN_LR},                   {"optim.min_lr_rate", ZT_KW_MIN_LR_RATE},
    {"optim.warmup_lr_rate", ZT_KW_WARMUP_LR_RATE},   {"optim.num_stable_steps", ZT_KW_NUM_STABLE_STEPS},
    {"optim.num_decay_steps", ZT_KW_NUM_DECAY_STEPS}, {"optim.warmup_type", ZT_KW_WARMUP_TYPE},
    {"optim.decay_type", ZT_KW_DECAY_TYPE},           {"optim.min_lr_ratio", ZT_KW_MIN_LR_RATIO},
};

/* the kwargs whose value is not their schema default ("not given": -1, 0, or the
 * schedule function's own default) */
static unsigned sched_kwargs_set(const zt_config_t *cfg)
{
    unsigned set = 0;
    for (size_t i = 0; i < sizeof sched_kwargs / sizeof sched_kwargs[0]; i++) {
        const zkey_t *k = find_key(sched_kwargs[i].key);
        const void *v = cfield(cfg, k);
        const int differs = k->type == K_DOUBLE ? *(const double *)v != k->def
                            : k->type == K_LONG ? (double)*(const long *)v != k->def
                                                : strcmp((const char *)v, k->sdef) != 0;
        if (differs) set |= sched_kwargs[i].bit;
    }
    return set;
}

static int check_schedule(const zt_config_t *cfg, char *err, size_t errlen)
{
    const struct zt_config_optim *o = &cfg->optim;
    const int t = zt_sched_parse(o->lr_scheduler_type);
    if (t < 0) return zt_err(err, errlen, "optim.lr_scheduler_type '%s' is not one of %s", o->lr_scheduler_type,
                             SCHEDULERS);
    const unsigned extra = sched_kwargs_set(cfg) & ~zt_sched_kwargs((zt_sched_type_t)t);
    for (size_t i = 0; extra && i < sizeof sched_kwargs / sizeof sched_kwargs[0]; i++) {
        if (!(extra & sched_kwargs[i].bit)) continue;
        if (sched_kwargs[i].bit == ZT_KW_MIN_LR_RATIO && (t == ZT_SCHED_COSINE || t == ZT_SCHED_LINEAR))
            return zt_err(err, errlen, "optim.min_lr_ratio is warmup_stable_decay's argument; transformers' %s "
                                       "decays to 0: for a floor use lr_scheduler_type = \"cosine_with_min_lr\" "
                                       "and optim.min_lr_rate", o->lr_scheduler_type);
        return zt_err(err, errlen, "%s is not an argument of lr_scheduler_type %s (transformers' get_scheduler "
                                   "raises on it); it belongs to another schedule", sched_kwargs[i].key,
                      o->lr_scheduler_type);
    }
    if ((t == ZT_SCHED_COSINE_WITH_MIN_LR || t == ZT_SCHED_COSINE_WARMUP_WITH_MIN_LR) &&
        (o->min_lr < 0) == (o->min_lr_rate < 0))
        return zt_err(err, errlen, "lr_scheduler_type %s needs exactly one of optim.min_lr and optim.min_lr_rate "
                                   "(transformers' lr_scheduler_kwargs)", o->lr_scheduler_type);
    if (t == ZT_SCHED_WARMUP_STABLE_DECAY && o->num_decay_steps < 0)
        return zt_err(err, errlen, "lr_scheduler_type warmup_stable_decay needs optim.num_decay_steps "
                                   "(transformers' get_wsd_schedule requires num_decay_steps)");
    if (t == ZT_SCHED_POLYNOMIAL && !(o->learning_rate > o->lr_end))
        return zt_err(err, errlen, "optim.lr_end (%g) must be smaller than optim.learning_rate (%g) for the "
                                   "polynomial schedule, as transformers requires", o->lr_end, o->learning_rate);
    if (t == ZT_SCHED_CONSTANT && (o->warmup_steps > 0 || o->warmup_ratio > 0))
        return zt_err(err, errlen, "lr_scheduler_type constant has no warm-up (transformers' get_constant_schedule "
                                   "ignores it): optim.%s would do nothing; use \"constant_with_warmup\"",
                      o->warmup_steps > 0 ? "warmup_steps" : "warmup_ratio");
    return 0;
}

int zt_config_lr_schedule(const zt_config_t *cfg, long total, zt_lr_schedule_t *s, char *err, size_t errlen)
{
    const struct zt_config_optim *o = &cfg->optim;
    *s = (zt_lr_schedule_t){
        .type = (zt_sched_type_t)zt_sched_parse(o->lr_scheduler_type),
        .lr = o->learning_rate,
        .warmup = zt_warmup_steps(o->warmup_steps, o->warmup_ratio, total),
        .total = total,
        .power = o->power,
        .lr_end = o->lr_end,
        .warmup_lr_rate = o->warmup_lr_rate,
        .num_decay = o->num_decay_steps,
        .warmup_shape = (zt_sched_shape_t)zt_sched_shape_parse(o->warmup_type),
        .decay_shape = (zt_sched_shape_t)zt_sched_shape_parse(o->decay_type),
        .min_lr_ratio = o->min_lr_ratio,
    };
    /* num_cycles' default is the schedule function's: 1 for hard restarts, half a wave else */
    s->num_cycles = o->num_cycles >= 0 ? o->num_cycles : s->type == ZT_SCHED_COSINE_WITH_RESTARTS ? 1.0 : 0.5;
    /* get_inverse_sqrt_schedule: timescale = num_warmup_steps or 10_000 */
    s->timescale = o->timescale > 0 ? o->timescale : s->warmup > 0 ? (double)s->warmup : 10000.0;
    /* min_lr is turned into a rate of the optimizer's lr, as transformers does */
    s->min_lr_rate = o->min_lr >= 0 ? o->min_lr / o->learning_rate : o->min_lr_rate >= 0 ? o->min_lr_rate : 0.0;
    s->num_stable = o->num_stable_steps >= 0 ? o->num_stable_steps : total - s->warmup - o->num_decay_steps;
    if (s->type == ZT_SCHED_POLYNOMIAL && s->warmup >= total)
        return zt_err(err, errlen, "the polynomial schedule has no steps to decay over: its warm-up (%ld) covers "
                                   "all %ld optimizer steps (transformers divides by zero)", s->warmup, total);
    if (s->type == ZT_SCHED_INVERSE_SQRT && o->timescale > 0 && o->timescale != floor(o->timescale))
        return zt_err(err, errlen, "optim.timescale (%g) must be a whole number of steps", o->timescale);
    return 0;
}


/* data.dataset (dataset_info.json entries) and data.train_files / data.val_files / data.format are two
 * ways to give the data: one only, as the other's keys would silently do nothing. */
static int data_dataset_conflict(const zt_config_t *cfg, char *err, size_t errlen)
{
    const zkey_t *tf = find_key("data.train_files"), *vf = find_key("data.val_files");
    if (cfg->data.eval_dataset[0] && !cfg->data.dataset[0])
        return zt_err(err, errlen, "data.eval_dataset needs data.dataset (data.val_files go with data.train_files)");
    if (!cfg->data.dataset[0]) return 0;
    /* their defaults or [] count as not given: a printed config holds the defaults */
    if (cfg->data.n_train_files > 1 || (cfg->data.n_train_files == 1 && strcmp(cfg->data.train_files[0], tf->sdef)))
        return zt_err(err, errlen, "data.dataset and data.train_files are exclusive: the training data are "
                                   "dataset_info.json's entries or files, not both (data.train_files = [] "
                                   "clears a file's)");
    if (cfg->data.n_val_files > 1 || (cfg->data.n_val_files == 1 && strcmp(cfg->data.val_files[0], vf->sdef)))
        return zt_err(err, errlen, "data.dataset and data.val_files are exclusive: with data.dataset, "
                                   "data.eval_dataset names the validation datasets (data.val_files = [] clears "
                                   "a file's)");
    if (strcmp(cfg->data.format, "tokens") != 0)
        return zt_err(err, errlen, "data.format (%s) is for data.train_files; data.dataset reads each entry's "
                                   "formatting from dataset_info.json", cfg->data.format);
    return 0;
}

int zt_config_batch_rows(const zt_config_t *cfg)
{
    return cfg->train.per_device_train_batch_size * (cfg->train.stage == ZT_STAGE_DPO ? 2 : 1);
}

/* train.stage = dpo: what the preference loop trains today (zt_train.c); each refusal
 * names what is not wired, so nothing trains differently from what was asked */
static int check_dpo(const zt_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->train.finetuning_type == ZT_FT_FULL && zt_pref_uses_ref(cfg->pref.fn.loss) &&
        !cfg->model.name_or_path[0])
        return zt_err(err, errlen, "train.stage = dpo with full fine-tuning copies its reference from "
                                   "model.name_or_path: set it (or pref.loss = orpo or simpo, which need none)");
    /* pairs files are read (and shuffled) pair by pair; token files give rows 2i, 2i + 1 */
    if (cfg->data.shuffle && !cfg->data.dataset[0] && strcmp(cfg->data.format, "tokens") == 0)
        return zt_err(err, errlen, "train.stage = dpo on token files reads rows 2i, 2i + 1 as a pair, in file "
                                   "order: set data.shuffle = false (a pairs file shuffles whole pairs)");
    if (cfg->data.neat_packing)
        return zt_err(err, errlen, "train.stage = dpo: data.neat_packing does not apply to pairs");
    if (cfg->lora.dropout > 0)
        return zt_err(err, errlen, "lora.dropout (%g) with train.stage = dpo: LLaMA-Factory's DPO trainer turns "
                                   "dropout off (disable_dropout); set lora.dropout = 0", cfg->lora.dropout);
    return 0;
}

int zt_config_validate(const zt_config_t *cfg, char *err, size_t errlen)
{
    const char *where = "config";
    /* Per-key checks again: the struct may have been edited in code after parsing. */
    for (int i = 0; i < NKEYS; i++) {
        const zkey_t *k = &schema[i];
        switch (k->type) {
        case K_INT: if (check_range(k, *(const int *)cfield(cfg, k), where, err, errlen)) return -1; break;
        case K_LONG:
            if (check_range(k, (double)*(const long *)cfield(cfg, k), where, err, errlen)) return -1;
            break;
        case K_DOUBLE: if (check_range(k, *(const double *)cfield(cfg, k), where, err, errlen)) return -1; break;
        case K_BOOL:
            if (*(const int *)cfield(cfg, k) != 0 && *(const int *)cfield(cfg, k) != 1)
                return zt_err(err, errlen, "%s: %s must be true or false", where, k->name);
            break;
        case K_STRING: {
            const char *s = cfield(cfg, k);
            if (!memchr(s, '\0', k->size)) return zt_err(err, errlen, "%s: %s is not terminated", where, k->name);
            if (check_string(k, s, where, err, errlen)) return -1;
            break;
        }
        case K_ENUM: {
            const int v = *(const int *)cfield(cfg, k);
            if (!enum_name(k, v)) {
                char list[512];
                enum_list(k, list, sizeof list);
                return zt_err(err, errlen, "%s: %s: %d is not the value of one of: %s", where, k->name, v, list);
            }
            break;
        }
        case K_INTLIST: {
            const int n = ccount(cfg, k);
            if (n < 0 || n > ZT_MAX_PP_STAGES)
                return zt_err(err, errlen, "%s: %s has %d elements (at most %d)", where, k->name, n, ZT_MAX_PP_STAGES);
            for (int j = 0; j < n; j++) {
                const int v = ((const int *)cfield(cfg, k))[j];
                if (v < k->min || v > k->max)
                    return zt_err(err, errlen, "%s: %s: element %d (%d) out of range [%.0f, %.0f]", where, k->name,
                                  j, v, k->min, k->max);
            }
            break;
        }
        case K_STRLIST: {
            int n = ccount(cfg, k);
            if (n < 0 || n > ZT_MAX_FILES)
                return zt_err(err, errlen, "%s: %s has %d elements (at most %d)", where, k->name, n, ZT_MAX_FILES);
            for (int j = 0; j < n; j++)
                if (!memchr(clist_elem(cfg, k, j), '\0', k->size) || !clist_elem(cfg, k, j)[0])
                    return zt_err(err, errlen, "%s: %s: element %d is empty or not terminated", where, k->name, j);
            break;
        }
        }
    }
    if (!cfg->model.head_dim && !cfg->model.name_or_path[0] && cfg->model.n_embd % cfg->model.n_head != 0)
        return zt_err(err, errlen, "model.n_embd (%d) must be divisible by model.n_head (%d)", cfg->model.n_embd,
                      cfg->model.n_head);
    if (!cfg->model.name_or_path[0] && cfg->data.seq_len > cfg->model.block_size)
        return zt_err(err, errlen, "data.seq_len (%d) exceeds model.block_size (%d)", cfg->data.seq_len,
                      cfg->model.block_size);
    if (data_dataset_conflict(cfg, err, errlen)) return -1;
    if (cfg->data.n_train_files < 1 && !cfg->data.dataset[0])
        return zt_err(err, errlen, "data.train_files: at least one training file is required");
    if (cfg->data.dataset[0] && !zt_template_find(cfg->data.template_name))
        return zt_err(err, errlen, "data.dataset needs data.template (%s), not '%s'", zt_template_names(),
                      cfg->data.template_name);
    if (strcmp(cfg->data.format, "tokens") != 0 && !zt_template_find(cfg->data.template_name))
        return zt_err(err, errlen, "data.format = %s needs data.template (%s), not '%s'", cfg->data.format,
                      zt_template_names(), cfg->data.template_name);
    if (cfg->data.mask_history && cfg->data.train_on_prompt)
        return zt_err(err, errlen, "data.mask_history and data.train_on_prompt are incompatible (as in LLaMA-Factory)");
    /* a token or sample file is trained as it was made: the key would silently do nothing */
    if (cfg->data.neat_packing && strcmp(cfg->data.format, "tokens") == 0 && !cfg->data.dataset[0])
        return zt_err(err, errlen, "data.neat_packing applies to instruction data (data.format = alpaca, sharegpt or "
                                   "messages); a file made by zt-prep-data --neat-packing trains neatly as it is");
    if (cfg->data.max_samples > 0 && strcmp(cfg->data.format, "tokens") == 0 && !cfg->data.dataset[0])
        return zt_err(err, errlen, "data.max_samples (%ld) applies to instruction data (data.format = alpaca, "
                                   "sharegpt or messages), not to token files", cfg->data.max_samples);
    if (cfg->data.ranking && (strcmp(cfg->data.format, "tokens") == 0 || cfg->data.dataset[0]))
        return zt_err(err, errlen, "data.ranking applies to data.format alpaca, sharegpt or messages (a "
                                   "dataset_info.json entry says \"ranking\": true itself)");
    if (cfg->data.ranking && cfg->train.stage != ZT_STAGE_DPO) /* pairs are no SFT samples */
        return zt_err(err, errlen, "data.ranking: preference pairs need train.stage = dpo");
    if (cfg->train.max_steps <= 0 && cfg->train.num_train_epochs <= 0)
        return zt_err(err, errlen, "train.max_steps and train.num_train_epochs are both 0: nothing to train "
                                   "(set one of them > 0)");
    if (cfg->optim.warmup_steps < 0) return zt_err(err, errlen, "optim.warmup_steps must be >= 0");
    /* transformers lets warmup_steps override the ratio; here the ratio would silently do nothing */
    if (cfg->optim.warmup_ratio > 0 && cfg->optim.warmup_steps > 0)
        return zt_err(err, errlen, "optim.warmup_ratio (%g) and optim.warmup_steps (%ld) are both set: give one "
                                   "(optim.warmup_steps = 0 warms up for the ratio)",
                      cfg->optim.warmup_ratio, cfg->optim.warmup_steps);
    if (check_schedule(cfg, err, errlen)) return -1;
    if (cfg->optim.adam_epsilon <= 0)
        return zt_err(err, errlen, "optim.adam_epsilon (%g) must be > 0", cfg->optim.adam_epsilon);
    if (!cfg->checkpoint.resume[0])
        return zt_err(err, errlen, "checkpoint.resume is empty (use \"none\", \"auto\" or a checkpoint path)");
    if (!cfg->train.output_dir[0]) return zt_err(err, errlen, "train.output_dir is empty");
    if (cfg->train.fp16 && cfg->train.bf16)
        return zt_err(err, errlen, "train.fp16 and train.bf16 are both true: choose one working precision");
    if (!(cfg->train.min_loss_scale > 0))
        return zt_err(err, errlen, "train.min_loss_scale (%g) must be > 0", cfg->train.min_loss_scale);
    if (cfg->train.fp16 && cfg->train.loss_scale == 0 &&
        cfg->train.min_loss_scale > ldexp(1.0, cfg->train.initial_scale_power))
        return zt_err(err, errlen, "train.min_loss_scale (%g) exceeds the initial loss scale 2^%d "
                                   "(train.initial_scale_power)", cfg->train.min_loss_scale,
                      cfg->train.initial_scale_power);
    if (cfg->fault.kind != ZT_FAULT_NONE && cfg->fault.rank < 0)
        return zt_err(err, errlen, "fault.kind is '%s' but fault.rank is -1 (set the rank that injects it)",
                      zt_config_enum_name("fault.kind", cfg->fault.kind));
    /* the parallel keys' rules, with the world and the model's shape: zt_plan_build */
    if (cfg->model.quantization_bit == 8)
        return zt_err(err, errlen, "model.quantization_bit = 8 is not supported: ztrain has no 8-bit (LLM.int8) "
                                   "path; use 4 (QLoRA) or 0");
    if (cfg->model.quantization_bit != 0 && cfg->model.quantization_bit != 4)
        return zt_err(err, errlen, "model.quantization_bit = %d: must be 0 (none) or 4",
                      cfg->model.quantization_bit);
    if (cfg->model.quantization_bit == 4 && cfg->train.finetuning_type != ZT_FT_LORA)
        return zt_err(err, errlen, "model.quantization_bit = 4 needs train.finetuning_type = lora (QLoRA: the 4-bit "
                                   "base is frozen)");
    if (cfg->pref.fn.label_smoothing > 1e-6 && cfg->pref.fn.loss != ZT_PREF_SIGMOID)
        return zt_err(err, errlen, "pref.label_smoothing (%g) applies to pref.loss = sigmoid only, not %s (as in "
                                   "LLaMA-Factory)", cfg->pref.fn.label_smoothing,
                      zt_config_enum_name("pref.loss", cfg->pref.fn.loss));
    if (cfg->pref.ref_model[0] && !zt_pref_uses_ref(cfg->pref.fn.loss))
        return zt_err(err, errlen, "pref.ref_model is set but pref.loss = %s uses no reference model",
                      zt_config_enum_name("pref.loss", cfg->pref.fn.loss));
    if (cfg->train.stage == ZT_STAGE_DPO && check_dpo(cfg, err, errlen)) return -1;
    /* QLoRA (zt_qlora.h): a pretrained base quantized at load, computed in float32 or bf16 */
    if (cfg->model.quantization_bit == 4 && !cfg->model.name_or_path[0])
        return zt_err(err, errlen, "model.quantization_bit = 4 needs model.name_or_path: the base quantized is a "
                                   "pretrained one, read from its directory");
    if (cfg->model.quantization_bit == 4 && cfg->train.fp16)
        return zt_err(err, errlen, "model.quantization_bit = 4 computes in float32 or bf16 (bitsandbytes' compute "
                                   "dtype float32 or bfloat16), not fp16: set train.fp16 = false");
    /* QLoRA DPO: the reference is the 4-bit base with the adapters off, the policy's own
     * units; a reference directory would be a second base in float32 */
    if (cfg->model.quantization_bit == 4 && cfg->train.stage == ZT_STAGE_DPO && cfg->pref.ref_model[0])
        return zt_err(err, errlen, "model.quantization_bit = 4 with pref.ref_model is not available yet (QLoRA's "
                                   "reference is its 4-bit base with the adapters off: give no pref.ref_model)");
    return 0;
}

/* ---- printing ------------------------------------------------------------ */

/* libconfig string literal: escapes \ and " and control characters. */
static void put_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", out);
        else if (*p == '\t') fputs("\\t", out);
        else if (*p == '\r') fputs("\\r", out);
        else if (*p < 0x20) fprintf(out, "\\x%02x", *p);
        else fputc(*p, out);
    }
    fputc('"', out);
}

/* %.17g round-trips every double; a '.' or exponent keeps it a float literal. */
static void put_double(FILE *out, double v)
{
    char b[64];
    snprintf(b, sizeof b, "%.17g", v);
    /* Prefer the shortest form that reads back exactly (1e-3, not 0.0010000000000000001). */
    for (int prec = 1; prec <= 17; prec++) {
        char t[64];
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v) {
            strcpy(b, t);
            break;
        }
    }
    if (!strpbrk(b, ".eEn")) strcat(b, ".0");
    fputs(b, out);
}

static void put_value(FILE *out, const zt_config_t *cfg, const zkey_t *k)
{
    switch (k->type) {
    case K_INT: fprintf(out, "%d", *(const int *)cfield(cfg, k)); break;
    case K_LONG: {
        long v = *(const long *)cfield(cfg, k);
        fprintf(out, (v > INT_MAX || v < INT_MIN) ? "%ldL" : "%ld", v);
        break;
    }
    case K_DOUBLE: put_double(out, *(const double *)cfield(cfg, k)); break;
    case K_BOOL: fputs(*(const int *)cfield(cfg, k) ? "true" : "false", out); break;
    case K_STRING: put_string(out, cfield(cfg, k)); break;
    case K_ENUM: put_string(out, enum_name(k, *(const int *)cfield(cfg, k))); break;
    case K_INTLIST: {
        const int n = ccount(cfg, k);
        fputs("[", out);
        for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? ", " : " ", ((const int *)cfield(cfg, k))[i]);
        fputs(n ? " ]" : "]", out);
        break;
    }
    case K_STRLIST: {
        int n = ccount(cfg, k);
        fputs("[", out);
        for (int i = 0; i < n; i++) {
            fputs(i ? ", " : " ", out);
            put_string(out, clist_elem(cfg, k, i));
        }
        fputs(n ? " ]" : "]", out);
        break;
    }
    }
}

void zt_config_print(const zt_config_t *cfg, FILE *out)
{
    fputs("# ztrain resolved configuration", out);
    if (cfg->source[0]) fprintf(out, " (input: %s)", cfg->source);
    fputs("\n", out);
    for (int s = 0; s < NSECTIONS; s++) {
        fprintf(out, "\n%s = {\n", sections[s].name);
        size_t sl = strlen(sections[s].name);
        for (int i = 0; i < NKEYS; i++) {
            const zkey_t *k = &schema[i];
            if (section_len(k->name) != sl || strncmp(k->name, sections[s].name, sl) != 0) continue;
            fprintf(out, "  %s = ", k->name + sl + 1);
            put_value(out, cfg, k);
            fputs(";\n", out);
        }
        fputs("};\n", out);
    }
}

const char *zt_config_enum_name(const char *key, int v)
{
    const zkey_t *k = find_key(key);
    return k && k->type == K_ENUM ? enum_name(k, v) : NULL;
}

int zt_config_value_text(const zt_config_t *cfg, const char *key, char *buf, size_t len)
{
    const zkey_t *k = find_key(key);
    if (!k) return -1;
    FILE *f = fmemopen(buf, len, "w");
    if (!f) zt_fatal("fmemopen failed");
    put_value(f, cfg, k);
    if (fclose(f) != 0) buf[len - 1] = 0;
    return 0;
}

char *zt_config_to_string(const zt_config_t *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) zt_fatal("open_memstream failed");
    zt_config_print(cfg, f);
    if (fclose(f) != 0) zt_fatal("writing the config to memory failed");
    return buf;
}

/* ---- help and markdown ---------------------------------------------------- */

static const char *type_name(ktype_t t)
{
    switch (t) {
    case K_INT: return "int";
    case K_LONG: return "int";
    case K_DOUBLE: return "float";
    case K_BOOL: return "bool";
    case K_STRING:
    case K_ENUM: return "string";
    case K_STRLIST: return "string list";
    case K_INTLIST: return "int list";
    }
    return "?";
}

static void default_text(const zkey_t *k, char *buf, size_t len)
{
    switch (k->type) {
    case K_INT:
    case K_LONG: snprintf(buf, len, "%.0f", k->def); break;
    case K_DOUBLE: snprintf(buf, len, "%g", k->def); break;
    case K_BOOL: snprintf(buf, len, "%s", k->def ? "true" : "false"); break;
    case K_STRING:
    case K_ENUM: snprintf(buf, len, "\"%s\"", k->sdef); break;
    case K_STRLIST: snprintf(buf, len, k->sdef[0] ? "\"%s\"" : "[]", k->sdef); break;
    case K_INTLIST: snprintf(buf, len, "[]"); break;
    }
}

static void range_text(const zkey_t *k, char *buf, size_t len)
{
    buf[0] = '\0';
    if (k->type == K_STRING && k->allowed) {
        allowed_list(k->allowed, buf, len);
    } else if (k->type == K_ENUM) {
        enum_list(k, buf, len);
    } else if (k->type == K_INT || k->type == K_LONG || k->type == K_DOUBLE) {
        char lo[40], hi[40];
        fmt_num(k, k->min, lo, sizeof lo);
        fmt_num(k, k->max, hi, sizeof hi);
        snprintf(buf, len, "%s .. %s", lo, hi);
    } else if (k->type == K_STRLIST) {
        snprintf(buf, len, "up to %d paths", ZT_MAX_FILES);
    } else if (k->type == K_INTLIST) {
        snprintf(buf, len, "up to %d integers >= %.0f", ZT_MAX_PP_STAGES, k->min);
    }
}

/* Word-wraps text at `width` columns, each line indented by `indent`. */
static void wrap(FILE *out, const char *text, int indent, int width)
{
    const char *p = text;
    while (*p) {
        int avail = width - indent, n = (int)strlen(p);
        if (n > avail) {
            n = avail;
            while (n > 0 && p[n] != ' ') n--;
            if (n == 0) n = avail;
        }
        fprintf(out, "%*s%.*s\n", indent, "", n, p);
        p += n;
        while (*p == ' ') p++;
    }
}

void zt_config_help(FILE *out)
{
    fputs("Configuration keys. In the input file:  section = { key = value; ... };\n"
          "On the command line, after the input file:  section.key=value  (lists comma-separated).\n",
          out);
    for (int s = 0; s < NSECTIONS; s++) {
        fprintf(out, "\n[%s] %s\n", sections[s].name, sections[s].help);
        size_t sl = strlen(sections[s].name);
        for (int i = 0; i < NKEYS; i++) {
            const zkey_t *k = &schema[i];
            if (section_len(k->name) != sl || strncmp(k->name, sections[s].name, sl) != 0) continue;
            char def[ZT_STRLEN], rng[512];
            default_text(k, def, sizeof def);
            range_text(k, rng, sizeof rng);
            fprintf(out, "  %s (%s, default %s)\n", k->name, type_name(k->type), def);
            if (rng[0])
                fprintf(out, "      %s%s\n", k->allowed || k->names ? "one of: " : k->type == K_STRLIST ? "" : "range: ", rng);
            wrap(out, k->help, 6, 100);
        }
    }
}

/* Markdown table cells: a '|' would end the cell, '*' would start emphasis. */
static void md_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|' || *s == '*') fputc('\\', out);
        fputc(*s, out);
    }
}

void zt_config_markdown(FILE *out)
{
    fputs("# ztrain configuration reference\n\n"
          "<!-- Generated from the schema in src/zt_config.c by `ztrain --config-markdown`; do not edit. -->\n\n"
          "Every key is written in the input file inside its section, `section = { key = value; };`, or "
          "overridden on the command line as `section.key=value`. See [config.md](config.md) for the syntax.\n",
          out);
    for (int s = 0; s < NSECTIONS; s++) {
        fprintf(out, "\n## `%s`\n\n%s\n\n", sections[s].name, sections[s].help);
        fputs("| key | type | default | allowed | description |\n|---|---|---|---|---|\n", out);
        size_t sl = strlen(sections[s].name);
        for (int i = 0; i < NKEYS; i++) {
            const zkey_t *k = &schema[i];
            if (section_len(k->name) != sl || strncmp(k->name, sections[s].name, sl) != 0) continue;
            char def[ZT_STRLEN], rng[512];
            default_text(k, def, sizeof def);
            range_text(k, rng, sizeof rng);
            fprintf(out, "| `%s` | %s | `", k->name, type_name(k->type));
            fputs(def, out); /* inside a code span: no escaping */
            fputs("` | ", out);
            md_cell(out, rng);
            fputs(" | ", out);
            md_cell(out, k->help);
            fputs(" |\n", out);
        }
    }
}
