/* test_plan.c — the parallel plan: every rule of the mesh refused with its own line
 * naming its keys, and valid meshes accepted with the right axis sizes (pp x
 * dp_replicate x dp_shard x sp x tp = world), dtypes and generation quantum. */
#include "zt_backend.h"
#include "zt_common.h"
#include "zt_config.h"
#include "zt_plan.h"
#include "zt_train.h"
#include "zt_test.h"

#include <string.h>

static zt_config_t cfg;
static zt_parallel_plan_t plan;
static char err[512];
/* a llama-like shape: 8 heads, 2 KV heads, MLP 96, vocabulary 10 */
static const zt_plan_shape_t shape = {.n_layer = 2, .n_head = 8, .n_kv_head = 2, .intermediate = 96, .vocab = 10};

/* cfg from overrides; the plan of it on world ranks, per_node of them a node */
static int build(int world, int per_node, int n, char *const ov[])
{
    err[0] = '\0';
    if (zt_config_parse(&cfg, NULL, "in.cfg", n, ov, err, sizeof err) != 0) {
        printf("\n  config: %s\n", err);
        return -2;
    }
    return zt_plan_build(&plan, &cfg, &shape, world, per_node, err, sizeof err);
}

#define EXPECT_ERR(msg)                                                      \
    do {                                                                     \
        CU_ASSERT_STRING_EQUAL(err, msg);                                    \
        if (strcmp(err, msg)) printf("\n  expected '%s'\n  got      '%s'\n", msg, err); \
    } while (0)

#define AXES(pp_, rep, shard, sp_, tp_) \
    CU_ASSERT(plan.pp == (pp_) && plan.dp_replicate == (rep) && plan.dp_shard == (shard) && plan.sp == (sp_) && plan.tp == (tp_))

static void t_valid_meshes(void)
{
    CU_ASSERT_EQUAL_FATAL(build(1, 1, 0, NULL), 0);
    AXES(1, 1, 1, 1, 1);
    CU_ASSERT_EQUAL(plan.strategy, ZT_DDP);
    CU_ASSERT_EQUAL(plan.gen_quantum, 1);

    /* ddp replicates over every data rank, zero3 shards over them */
    char *ddp[] = {"parallel.strategy=ddp"};
    CU_ASSERT_EQUAL_FATAL(build(8, 8, 1, ddp), 0);
    AXES(1, 8, 1, 1, 1);
    char *z3[] = {"parallel.strategy=full_shard", "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL_FATAL(build(8, 8, 2, z3), 0);
    AXES(1, 1, 4, 1, 2);
    CU_ASSERT_EQUAL(plan.dp, 4);
    CU_ASSERT_EQUAL(plan.data, 4);
    CU_ASSERT_EQUAL(plan.strategy, ZT_ZERO3);

    /* hybrid: shard groups of one node's data ranks by default (4 ranks a node, tp 2: 2) */
    char *hyb[] = {"parallel.strategy=hybrid_shard", "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL_FATAL(build(16, 4, 2, hyb), 0);
    AXES(1, 4, 2, 1, 2);
    CU_ASSERT_EQUAL(plan.shard_group, 2);
    /* nodes of different sizes: one shard group of every data rank */
    CU_ASSERT_EQUAL_FATAL(build(16, 0, 2, hyb), 0);
    AXES(1, 1, 8, 1, 2);
    /* shard groups of sp x dp_shard ranks */
    char *hsp[] = {"parallel.strategy=hybrid_shard_zero2", "parallel.sequence_parallel_size=2",
                   "parallel.shard_group_size=4"};
    CU_ASSERT_EQUAL_FATAL(build(8, 8, 3, hsp), 0);
    AXES(1, 2, 2, 2, 1);

    /* tp x sp x dp, Ulysses: 8 / 2 = 4 heads and 2 / 2 = 1 KV head per tp rank, sp 2 */
    char *mesh[] = {"parallel.tensor_parallel_size=2", "parallel.sequence_parallel_size=2",
                    "parallel.strategy=zero2", "data.seq_len=64"};
    CU_ASSERT_EQUAL_FATAL(build(8, 8, 4, mesh), 0);
    AXES(1, 1, 2, 2, 2);
    CU_ASSERT_EQUAL(plan.pp * plan.dp_replicate * plan.dp_shard * plan.sp * plan.tp, 8);
    CU_ASSERT_EQUAL(plan.gen_quantum, 2);
    /* KV heads fewer than tp are shared: tp 4 over 2 KV heads */
    char *tp4[] = {"parallel.tensor_parallel_size=4"};
    CU_ASSERT_EQUAL(build(4, 4, 1, tp4), 0);

    /* ring: two chunks a rank; tp_sequence_parallel: a tp share of each */
    char *ring[] = {"parallel.sequence_parallel_size=2", "parallel.sp_mode=ring", "parallel.tensor_parallel_size=2",
                    "parallel.tp_sequence_parallel=true", "data.seq_len=64"};
    CU_ASSERT_EQUAL_FATAL(build(4, 4, 5, ring), 0);
    CU_ASSERT_EQUAL(plan.sp_mode, ZT_SP_RING);
    CU_ASSERT_EQUAL(plan.tp_sequence_parallel, 1);
    CU_ASSERT_EQUAL(plan.gen_quantum, 8);
    /* tp_sequence_parallel means nothing without tp */
    char *tps1[] = {"parallel.tp_sequence_parallel=true"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 1, tps1), 0);
    CU_ASSERT_EQUAL(plan.tp_sequence_parallel, 0);

    /* auto: the strategy is resolved later, through zt_plan_resolve */
    char *aut[] = {"parallel.strategy=auto", "parallel.offload_optimizer=cpu", "parallel.offload_param=cpu"};
    CU_ASSERT_EQUAL_FATAL(build(4, 4, 3, aut), 0);
    CU_ASSERT_EQUAL(plan.strategy, ZT_STRATEGY_AUTO);
    zt_plan_resolve(&plan, ZT_DDP);
    AXES(1, 4, 1, 1, 1);
    zt_plan_resolve(&plan, ZT_ZERO3);
    AXES(1, 1, 4, 1, 1);
}

static void t_dtypes(void)
{
    CU_ASSERT_EQUAL_FATAL(build(1, 1, 0, NULL), 0);
    CU_ASSERT(plan.param_dtype == ZT_PREC_FP32 && plan.reduce_dtype == ZT_PREC_FP32 && plan.matmul == ZT_MATMUL_HIGHEST);
    char *bf[] = {"train.bf16=true", "parallel.reduce_dtype=bf16"};
    CU_ASSERT_EQUAL_FATAL(build(1, 1, 2, bf), 0);
    CU_ASSERT(plan.param_dtype == ZT_PREC_BF16 && plan.reduce_dtype == ZT_PREC_BF16 && plan.matmul == ZT_MATMUL_MEDIUM);
    char *fp[] = {"train.fp16=true", "parallel.reduce_dtype=fp16", "train.matmul_precision=high"};
    CU_ASSERT_EQUAL_FATAL(build(1, 1, 3, fp), 0);
    CU_ASSERT(plan.param_dtype == ZT_PREC_FP16 && plan.reduce_dtype == ZT_PREC_FP16 && plan.matmul == ZT_MATMUL_HIGH);
    char *red[] = {"parallel.reduce_dtype=fp16"};
    CU_ASSERT_EQUAL(build(1, 1, 1, red), -1);
    EXPECT_ERR("parallel.reduce_dtype = fp16 needs train.fp16 = true (fp16 gradients need loss scaling against "
               "underflow and overflow)");
}

static void t_mesh_rules(void)
{
    char *tp2[] = {"parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL(build(3, 3, 1, tp2), -1);
    EXPECT_ERR("parallel.tensor_parallel_size (2) x parallel.sequence_parallel_size (1) must divide the number of "
               "ranks (3)");
    char *tp3[] = {"parallel.tensor_parallel_size=3"};
    CU_ASSERT_EQUAL(build(3, 3, 1, tp3), -1);
    EXPECT_ERR("parallel.tensor_parallel_size (3) must divide the attention heads (8)");
    /* 12 heads, 3 KV heads: tp 4 divides the heads, and neither divides nor is a multiple of 3 */
    const zt_plan_shape_t kv3 = {2, 12, 3, 96, 10};
    zt_config_defaults(&cfg);
    cfg.parallel.tensor_parallel_size = 4;
    CU_ASSERT_EQUAL(zt_plan_build(&plan, &cfg, &kv3, 4, 4, err, sizeof err), -1);
    EXPECT_ERR("parallel.tensor_parallel_size (4) must divide the key/value heads (or be a multiple of them) (3)");
    const zt_plan_shape_t mlp = {2, 8, 8, 90, 10};
    CU_ASSERT_EQUAL(zt_plan_build(&plan, &cfg, &mlp, 4, 4, err, sizeof err), -1);
    EXPECT_ERR("parallel.tensor_parallel_size (4) must divide the intermediate (MLP) size (90)");
    const zt_plan_shape_t voc = {2, 8, 8, 96, 5};
    CU_ASSERT_EQUAL(zt_plan_build(&plan, &cfg, &voc, 4, 4, err, sizeof err), -1);
    EXPECT_ERR("parallel.tensor_parallel_size (4) must divide the vocabulary into non-empty blocks (5)");
    /* the same rule, alone, for a parameter table's tp split */
    CU_ASSERT_EQUAL(zt_plan_tp_splits(&voc, 4, err, sizeof err), -1);
    CU_ASSERT_EQUAL(zt_plan_tp_splits(&voc, 1, err, sizeof err), 0);
}

static void t_sp_rules(void)
{
    char *seq[] = {"parallel.sequence_parallel_size=2", "data.seq_len=15"};
    CU_ASSERT_EQUAL(build(2, 2, 2, seq), -1);
    EXPECT_ERR("parallel.sequence_parallel_size (2) must divide data.seq_len (15)");
    char *ring[] = {"parallel.sequence_parallel_size=2", "parallel.sp_mode=ring", "data.seq_len=18"};
    CU_ASSERT_EQUAL(build(2, 2, 3, ring), -1);
    EXPECT_ERR("parallel.sequence_parallel_size (2) must divide data.seq_len (18) into 2 sp chunks (ring attention's "
               "causal balance)");
    /* ring splits no heads: any head count */
    char *ring3[] = {"parallel.sequence_parallel_size=3", "parallel.sp_mode=ring", "data.seq_len=60"};
    CU_ASSERT_EQUAL(build(3, 3, 3, ring3), 0);
    /* Ulysses: tp 2 leaves 4 heads and 1 KV head a rank; sp 8 divides neither */
    char *uly[] = {"parallel.sequence_parallel_size=8", "parallel.tensor_parallel_size=2", "data.seq_len=64"};
    CU_ASSERT_EQUAL(build(16, 16, 3, uly), -1);
    EXPECT_ERR("parallel.sequence_parallel_size (8) must divide the attention heads (4) and divide or be a multiple of "
               "the key/value heads (1) of a tensor-parallel rank (Ulysses splits heads)");
    char *uly3[] = {"parallel.sequence_parallel_size=3", "data.seq_len=63"};
    CU_ASSERT_EQUAL(build(3, 3, 2, uly3), -1);
    EXPECT_ERR("parallel.sequence_parallel_size (3) must divide the attention heads (8) and divide or be a multiple of "
               "the key/value heads (2) of a tensor-parallel rank (Ulysses splits heads)");
}

static void t_tp_seq_rules(void)
{
    /* B 1 x 9 tokens over tp 2 */
    char *tok[] = {"parallel.tensor_parallel_size=2", "parallel.tp_sequence_parallel=true",
                   "train.per_device_train_batch_size=1", "data.seq_len=9"};
    CU_ASSERT_EQUAL(build(2, 2, 4, tok), -1);
    EXPECT_ERR("parallel.tp_sequence_parallel: the 9 tokens of a micro-batch (per rank) must divide by "
               "parallel.tensor_parallel_size (2)");
    /* B 2 x 9 = 18 tokens train, but generation pads one sequence of 9 to tp 2 shares */
    char *gen[] = {"parallel.tensor_parallel_size=2", "parallel.tp_sequence_parallel=true",
                   "train.per_device_train_batch_size=2", "data.seq_len=9", "generate.at_eval=true"};
    CU_ASSERT_EQUAL(build(2, 2, 5, gen), -1);
    EXPECT_ERR("generation with parallel.tp_sequence_parallel: data.seq_len (9) must divide by 2 "
               "(tensor_parallel_size x the sequence parallel chunks)");
    CU_ASSERT_EQUAL(build(2, 2, 4, gen), 0);
}

static void t_shard_group_rules(void)
{
    char *sg3[] = {"parallel.strategy=hybrid_shard", "parallel.shard_group_size=3"};
    CU_ASSERT_EQUAL(build(4, 4, 2, sg3), -1);
    EXPECT_ERR("parallel.shard_group_size (3) must divide the number of data-parallel ranks (4 = 4 ranks / "
               "tensor_parallel_size 1)");
    char *big[] = {"parallel.strategy=hybrid_shard_zero2", "parallel.shard_group_size=8",
                   "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL(build(8, 8, 3, big), -1);
    EXPECT_ERR("parallel.shard_group_size (8) must divide the number of data-parallel ranks (4 = 8 ranks / "
               "tensor_parallel_size 2)");
    char *sp[] = {"parallel.strategy=hybrid_shard", "parallel.shard_group_size=3", "parallel.sequence_parallel_size=2",
                  "data.seq_len=64"};
    CU_ASSERT_EQUAL(build(12, 12, 4, sp), -1);
    EXPECT_ERR("parallel.shard_group_size (3) must be a multiple of parallel.sequence_parallel_size (2)");
    /* shard groups shape only the hybrids */
    char *z3[] = {"parallel.strategy=zero3", "parallel.shard_group_size=3"};
    CU_ASSERT_EQUAL(build(4, 4, 2, z3), 0);
}

static void t_offload_rules(void)
{
    /* the strategies that shard parameters, and only those (auto: decided later) */
    const char *st[] = {"ddp", "zero1", "zero2", "shard_grad_op", "zero3", "hybrid_shard", "hybrid_shard_zero2", "auto"};
    const int ok[] = {0, 0, 0, 1, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++) {
        char s[64];
        snprintf(s, sizeof s, "parallel.strategy=%s", st[i]);
        char *ov[] = {s, "parallel.offload_optimizer=cpu", "parallel.offload_param=cpu"};
        const int rc = build(4, 4, 3, ov);
        CU_ASSERT_EQUAL(rc, ok[i] ? 0 : -1);
        if (!ok[i]) {
            char want[256];
            snprintf(want, sizeof want, "parallel.offload_param = cpu needs a strategy that shards parameters "
                     "(shard_grad_op, zero3, hybrid_shard, hybrid_shard_zero2, or auto), not %s", st[i]);
            EXPECT_ERR(want);
        }
    }
    char *alone[] = {"parallel.strategy=zero3", "parallel.offload_param=cpu"};
    CU_ASSERT_EQUAL(build(2, 2, 2, alone), -1);
    EXPECT_ERR("parallel.offload_param = cpu needs parallel.offload_optimizer = \"cpu\" too (the optimizer steps the "
               "parameter shard where it lives)");
    char *opt[] = {"parallel.strategy=ddp", "parallel.offload_optimizer=cpu"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 2, opt), 0);
    CU_ASSERT(plan.offload_optimizer == ZT_OFFLOAD_CPU && plan.offload_param == ZT_OFFLOAD_NONE);
}

static void t_onebit_rules(void)
{
    /* ddp, zero1, zero2 by name (auto refused); no tp, sp or optimizer offload */
    const char *st[] = {"ddp", "zero1", "zero2", "shard_grad_op", "zero3", "hybrid_shard", "hybrid_shard_zero2", "auto"};
    for (int i = 0; i < 8; i++) {
        char s[64];
        snprintf(s, sizeof s, "parallel.strategy=%s", st[i]);
        char *ov[] = {s, "optim.type=onebit_adam", "optim.freeze_step=7"};
        const int rc = build(4, 4, 3, ov);
        CU_ASSERT_EQUAL(rc, i < 3 ? 0 : -1);
        if (i < 3) {
            CU_ASSERT(plan.optimizer == ZT_OPTIM_ONEBIT_ADAM && plan.freeze_step == 7);
            continue;
        }
        char want[512];
        snprintf(want, sizeof want, "optim.type = onebit_adam runs with parallel.strategy = ddp, zero1 or zero2, not "
                 "%s (every rank steps the whole momentum with its own full gradient: a strategy that shards "
                 "parameters or has replica groups is refused; see doc/user-guide.md, 1-bit Adam)", st[i]);
        EXPECT_ERR(want);
    }
    char *tp[] = {"optim.type=onebit_adam", "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL(build(4, 4, 2, tp), -1);
    EXPECT_ERR("optim.type = onebit_adam needs parallel.tensor_parallel_size = 1 and parallel.sequence_parallel_size "
               "= 1 (tp and sp ranks hold parts of one gradient, not data-parallel replicas of it)");
    char *sp[] = {"optim.type=onebit_adam", "parallel.sequence_parallel_size=2", "data.seq_len=64"};
    CU_ASSERT_EQUAL(build(4, 4, 3, sp), -1);
    char *off[] = {"optim.type=onebit_adam", "parallel.offload_optimizer=cpu"};
    CU_ASSERT_EQUAL(build(2, 2, 2, off), -1);
    EXPECT_ERR("optim.type = onebit_adam does not run with parallel.offload_optimizer = cpu");
    char *adamw[] = {"parallel.strategy=zero3"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 1, adamw), 0);
    CU_ASSERT(plan.optimizer == ZT_OPTIM_ADAMW && plan.freeze_step == 100000);
}

/* the pipeline axis: outermost, its stages' layers (the embedding and the head counted:
 * 4 layers for the shape's 2 blocks), and each of its rules refused with its own line */
static void t_pipeline(void)
{
    char *pp2[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2"};
    CU_ASSERT_EQUAL_FATAL(build(4, 4, 2, pp2), 0);
    AXES(2, 2, 1, 1, 1);
    CU_ASSERT(plan.dp == 2 && plan.data == 2 && plan.stages == 2 && plan.pp_v == 1 && plan.micro == 2);
    CU_ASSERT(plan.pp_schedule == ZT_PP_1F1B);
    CU_ASSERT(plan.stage_first[0] == 0 && plan.stage_first[1] == 2 && plan.stage_first[2] == 4);
    /* uneven: the earlier stages take one more */
    char *pp3[] = {"parallel.pipeline_parallel_size=3", "train.gradient_accumulation_steps=3"};
    CU_ASSERT_EQUAL_FATAL(build(3, 3, 2, pp3), 0);
    CU_ASSERT(plan.stage_first[1] == 2 && plan.stage_first[2] == 3 && plan.stage_first[3] == 4);
    char *given[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                     "parallel.pp_layers_per_stage=[1, 3]"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 3, given), 0);
    CU_ASSERT(plan.stage_first[1] == 1 && plan.stage_first[2] == 4);
    /* gpipe runs any number of micro-batches; interleaved: v stages per rank */
    char *gpipe[] = {"parallel.pipeline_parallel_size=2", "parallel.pp_schedule=gpipe"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 2, gpipe), 0);
    CU_ASSERT(plan.pp_schedule == ZT_PP_GPIPE && plan.micro == 1);
    char *il[] = {"parallel.pipeline_parallel_size=2", "parallel.pp_schedule=interleaved_1f1b",
                  "parallel.pp_stages_per_rank=2", "train.gradient_accumulation_steps=4"};
    CU_ASSERT_EQUAL_FATAL(build(2, 2, 4, il), 0);
    CU_ASSERT(plan.stages == 4 && plan.pp_v == 2 && plan.stage_first[1] == 1 && plan.stage_first[4] == 4);

    char *world[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2"};
    CU_ASSERT_EQUAL(build(3, 3, 2, world), -1);
    EXPECT_ERR("parallel.pipeline_parallel_size (2) x parallel.tensor_parallel_size (1) x "
               "parallel.sequence_parallel_size (1) must divide the number of ranks (3)");
    char *deep[] = {"parallel.pipeline_parallel_size=5", "train.gradient_accumulation_steps=5"};
    CU_ASSERT_EQUAL(build(5, 5, 2, deep), -1);
    EXPECT_ERR("parallel.pipeline_parallel_size (5) x parallel.pp_stages_per_rank (1) = 5 stages: more than the "
               "model's 4 layers (2 blocks, the embedding and the head)");
    char *count[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                     "parallel.pp_layers_per_stage=1,1,2"};
    CU_ASSERT_EQUAL(build(2, 2, 3, count), -1);
    EXPECT_ERR("parallel.pp_layers_per_stage has 3 entries; the pipeline has 2 stages "
               "(parallel.pipeline_parallel_size 2 x parallel.pp_stages_per_rank 1)");
    char *sum[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                   "parallel.pp_layers_per_stage=[1, 2]"};
    CU_ASSERT_EQUAL(build(2, 2, 3, sum), -1);
    EXPECT_ERR("parallel.pp_layers_per_stage sums to 3 layers; the model has 4 (2 blocks, the embedding and the head)");
    char *few[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=1"};
    CU_ASSERT_EQUAL(build(2, 2, 2, few), -1);
    EXPECT_ERR("parallel.pp_schedule = 1f1b: train.gradient_accumulation_steps (1) must be at least "
               "parallel.pipeline_parallel_size (2) (the pipeline's micro-batches are the accumulation steps)");
    char *v1[] = {"parallel.pipeline_parallel_size=2", "parallel.pp_schedule=interleaved_1f1b"};
    CU_ASSERT_EQUAL(build(2, 2, 2, v1), -1);
    EXPECT_ERR("parallel.pp_schedule = interleaved_1f1b needs parallel.pp_stages_per_rank >= 2 (with one stage per "
               "rank it is 1f1b)");
    char *v2[] = {"parallel.pipeline_parallel_size=2", "parallel.pp_stages_per_rank=2",
                  "train.gradient_accumulation_steps=2"};
    CU_ASSERT_EQUAL(build(2, 2, 3, v2), -1);
    EXPECT_ERR("parallel.pp_stages_per_rank (2) > 1 needs parallel.pp_schedule = interleaved_1f1b");
    char *il3[] = {"parallel.pipeline_parallel_size=2", "parallel.pp_schedule=interleaved_1f1b",
                   "parallel.pp_stages_per_rank=2", "train.gradient_accumulation_steps=3"};
    CU_ASSERT_EQUAL(build(2, 2, 4, il3), -1);
    EXPECT_ERR("parallel.pp_schedule = interleaved_1f1b: train.gradient_accumulation_steps (3) must be a multiple "
               "of parallel.pipeline_parallel_size (2)");
    char *z3[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                  "parallel.strategy=zero3"};
    CU_ASSERT_EQUAL(build(4, 4, 3, z3), 0);
    AXES(2, 1, 2, 1, 1);
    /* torchtitan's order: pp, dp_replicate, dp_shard (a hybrid's shard groups within a pipeline rank) */
    char *hyb[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                   "parallel.strategy=hybrid_shard", "parallel.shard_group_size=2"};
    CU_ASSERT_EQUAL_FATAL(build(8, 8, 4, hyb), 0);
    AXES(2, 2, 2, 1, 1);
    char *tp[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                  "parallel.tensor_parallel_size=2"};
    CU_ASSERT_EQUAL_FATAL(build(4, 4, 3, tp), 0);
    AXES(2, 1, 1, 1, 2);
    char *bf16[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2", "train.bf16=true"};
    CU_ASSERT_EQUAL(build(2, 2, 3, bf16), 0);
    /* a 4-bit base: each pipeline rank loads and holds its stages' 4-bit linears */
    char *q4[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                  "train.finetuning_type=lora", "model.quantization_bit=4", "model.name_or_path=base"};
    CU_ASSERT_EQUAL(build(2, 2, 5, q4), 0);
    /* 1-bit Adam and optimizer offload run per pipeline rank, on its stages' units */
    char *onebit[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                      "optim.type=onebit_adam"};
    CU_ASSERT_EQUAL(build(4, 4, 3, onebit), 0);
    AXES(2, 2, 1, 1, 1);
    char *off[] = {"parallel.pipeline_parallel_size=2", "train.gradient_accumulation_steps=2",
                   "parallel.strategy=zero3", "parallel.offload_optimizer=cpu", "parallel.offload_param=cpu"};
    CU_ASSERT_EQUAL(build(4, 4, 3, off), 0);
    AXES(2, 1, 2, 1, 1);
    /* the list key itself: integers only */
    char *bad[] = {"parallel.pp_layers_per_stage=[1, x]"};
    CU_ASSERT_EQUAL(build(2, 2, 1, bad), -2);
    char *zero[] = {"parallel.pp_layers_per_stage=2,0"};
    CU_ASSERT_EQUAL(build(2, 2, 1, zero), -2);
}

/* cfg of a small GPT-2 (6 blocks of 64, 2 heads, B 2 x T 16 a micro-batch), with overrides
 * and parallel.strategy = auto: zt_train_auto_mesh's answer on world ranks, per_node a node */
static int auto_mesh(int world, int per_node, int n, char *const ov[], char *why, size_t len)
{
    char *args[16] = {"parallel.strategy=auto", "model.n_layer=6", "model.n_embd=64", "model.n_head=2",
                      "model.vocab_size=260", "model.block_size=32", "data.seq_len=16",
                      "train.per_device_train_batch_size=2", "train.gradient_accumulation_steps=4"};
    const int base = 9;
    for (int i = 0; i < n && base + i < 16; i++) args[base + i] = ov[i];
    why[0] = err[0] = '\0';
    if (zt_config_parse(&cfg, NULL, "in.cfg", base + n, args, err, sizeof err) != 0) {
        printf("\n  config: %s\n", err);
        return -2;
    }
    const int rc = zt_train_auto_mesh(&cfg, world, per_node, why, len);
    printf("\n  auto on %d ranks (%d a node): %d, pp %d x tp %d x sp %d: %s", world, per_node, rc,
           cfg.parallel.pipeline_parallel_size, cfg.parallel.tensor_parallel_size,
           cfg.parallel.sequence_parallel_size, why);
    return rc;
}

#define MESH(pp_, tp_, sp_)                                                                      \
    CU_ASSERT(cfg.parallel.pipeline_parallel_size == (pp_) && cfg.parallel.tensor_parallel_size == (tp_) && \
              cfg.parallel.sequence_parallel_size == (sp_))

/* parallel.strategy = auto and the pipeline: tp within a node first; where no mesh without
 * a pipeline fits, the smallest pp that does (1f1b, or gpipe with fewer accumulation steps
 * than pp, or one line where a schedule given is refused there). Limits between the dry
 * run's figures of the meshes (--estimate-memory: ddp 5.70 MiB a rank at pp 1 on 2 ranks,
 * zero3 4.27, tp 2 ddp 3.00, pp 2 ddp 3.59, pp 2 x tp 2 ddp 2.00 on 4). */
static void t_auto_pipeline(void)
{
    char why[1024];
    /* plenty of memory: nothing to choose, the strategy is chosen later as always */
    char *big[] = {"parallel.memory_limit_gb=8"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 1, big, why, sizeof why), 0);
    MESH(1, 1, 1);
    /* 4.1 MiB: below zero3 at pp 1; tp 2 fits within the node and is preferred to a pipeline */
    char *lim[] = {"parallel.memory_limit_gb=0.004"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 1, lim, why, sizeof why), 1);
    MESH(1, 2, 1);
    /* one rank a node: no tp, and a mesh without a pipeline that fits is preferred to one
     * (Ulysses sp 2 over the two nodes, with zero3) */
    CU_ASSERT_EQUAL(auto_mesh(2, 1, 1, lim, why, sizeof why), 1);
    MESH(1, 1, 2);
    /* a model neither tp nor Ulysses can split (1 head): pp 2 under 1f1b (4 accumulation steps >= pp) */
    char *one[] = {"parallel.memory_limit_gb=0.004", "model.n_head=1"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 2, one, why, sizeof why), 1);
    MESH(2, 1, 1);
    CU_ASSERT_EQUAL(cfg.parallel.pp_schedule, ZT_PP_1F1B);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "without a pipeline (tp within a node's 2 ranks, sp over the rest); pp 2, the "
                                       "smallest that fits, x tp 1 x sp 1 with ddp and 1f1b fits"));
    CU_ASSERT_EQUAL(zt_plan_build(&plan, &cfg, &(zt_plan_shape_t){6, 1, 1, 256, 260}, 2, 2, err, sizeof err), 0);
    /* 1 accumulation step: gpipe, and the line says why and what it costs */
    char *a1[] = {"parallel.memory_limit_gb=0.004", "model.n_head=1", "train.gradient_accumulation_steps=1"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 3, a1, why, sizeof why), 1);
    MESH(2, 1, 1);
    CU_ASSERT_EQUAL(cfg.parallel.pp_schedule, ZT_PP_GPIPE);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "with ddp and gpipe fits"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "; gpipe as 1f1b needs train.gradient_accumulation_steps (1) >= pp: the bubble "
                                       "is (pp - 1) / (M + pp - 1) = 50% of a step"));
    /* 1f1b given: kept, and the pipeline it refuses is named with the schedule that fits */
    char *a1g[] = {"parallel.memory_limit_gb=0.004", "model.n_head=1", "train.gradient_accumulation_steps=1",
                   "parallel.pp_schedule=1f1b"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 4, a1g, why, sizeof why), -1);
    MESH(1, 1, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "without a pipeline; pp 2 x tp 1 x sp 1 with ddp fits under "
                                       "parallel.pp_schedule = gpipe"));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "but the schedule given is refused there: parallel.pp_schedule = 1f1b: "
                                       "train.gradient_accumulation_steps (1) must be at least"));
    /* 4 ranks, 2 a node, 2 MiB: nothing at pp 1 (tp 2 x dp 2 under zero3 needs 2.28 MiB); pp 2 x tp 2 */
    char *l4[] = {"parallel.memory_limit_gb=0.002"};
    CU_ASSERT_EQUAL(auto_mesh(4, 2, 1, l4, why, sizeof why), 1);
    MESH(2, 2, 1);
    /* a mesh given is kept: auto chooses the strategy alone */
    char *kept[] = {"parallel.memory_limit_gb=0.004", "model.n_head=1", "parallel.pipeline_parallel_size=1"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 3, kept, why, sizeof why), 0);
    MESH(1, 1, 1);
    /* too tight for any pipeline: left to the run's own refusal */
    char *tiny[] = {"parallel.memory_limit_gb=0.0005", "model.n_head=1"};
    CU_ASSERT_EQUAL(auto_mesh(2, 2, 2, tiny, why, sizeof why), 0);
    MESH(1, 1, 1);
}

static const zt_test_t tests[] = {
    {"valid meshes and their axes", t_valid_meshes},
    {"dtypes", t_dtypes},
    {"mesh and tp rules", t_mesh_rules},
    {"sequence parallel rules", t_sp_rules},
    {"tp_sequence_parallel rules", t_tp_seq_rules},
    {"shard group rules", t_shard_group_rules},
    {"offload rules", t_offload_rules},
    {"1-bit Adam rules", t_onebit_rules},
    {"pipeline axis and rules", t_pipeline},
    {"auto: a pipeline where no mesh without one fits", t_auto_pipeline},
    {NULL, NULL},
};

ZT_TEST_MAIN("plan", tests)
