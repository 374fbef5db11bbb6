/* zt_params.h — the parameter table: what a model's parameters are, without the model.
 *
 * A family (zt_arch.h) builds the table: HF state_dict names and shapes, the unit each
 * parameter belongs to, whether weight decay applies, its initializer, and a role that
 * says what the tensor is (so placement under tensor parallelism is data, not a name
 * match). The shard engine, the layouts, the checkpoints and the HF readers and writers
 * use the table and never include the model.
 *
 * Within a unit, parameters are concatenated in table order (offset, numel), so a unit
 * is one flat fp32 buffer. A family orders its table so that tensors used by one GEMM
 * are adjacent: Llama's q_proj, k_proj, v_proj weights (out, in) one after the other
 * are the rows of one (q + 2 kv, C) matrix, and gate_proj, up_proj those of (2I, C).
 *
 * The unit plan: unit `root_unit` stays materialized for a whole micro-step (it is used
 * at both ends: embeddings and head), blocks l = 0..L-1 are units first_block_unit + l.
 *
 * Initial values are a pure function of (seed, parameter name, element index)
 * (counter-based hashing + Box-Muller), so any rank can create exactly the slice it
 * owns and every world size starts from identical weights. */
#ifndef ZT_PARAMS_H
#define ZT_PARAMS_H

#include <stddef.h>
#include <stdint.h>

/* init_std is the standard deviation (NORMAL) or the bound b of U(-b, b) (UNIFORM:
 * LoRA's A, kaiming-uniform with a = sqrt 5 as PEFT, b = 1 / sqrt(fan_in)) */
enum { ZT_INIT_NORMAL = 0, ZT_INIT_ZEROS = 1, ZT_INIT_ONES = 2, ZT_INIT_UNIFORM = 3 };

/* What a tensor is. Weights and their biases share a role. */
typedef enum {
    ZT_ROLE_EMBED = 0,  /* token embedding (V, C): vocabulary rows */
    ZT_ROLE_POS_EMBED,  /* learned positions (maxT, C) */
    ZT_ROLE_NORM,       /* norm scale or shift (C): replicated */
    ZT_ROLE_QK_NORM,    /* per-head q/k norm (head_dim) (Qwen3): replicated, but a tp rank's
                         * gradient covers only its heads (summed over tp) */
    ZT_ROLE_QKV,        /* GPT-2 c_attn: q, k and v in one (C, 3C) Conv1D */
    ZT_ROLE_Q, ZT_ROLE_K, ZT_ROLE_V,
    ZT_ROLE_O,          /* attention output projection */
    ZT_ROLE_GATE, ZT_ROLE_UP,
    ZT_ROLE_FC,         /* GPT-2 c_fc */
    ZT_ROLE_DOWN,       /* MLP output projection (Llama down_proj, GPT-2 mlp.c_proj) */
    ZT_ROLE_HEAD,       /* untied lm_head (V, C) */
    ZT_ROLE_N
} zt_role_t;

/* How a 2-D weight is stored: nn.Linear keeps (out, in), GPT-2's Conv1D (in, out). */
typedef enum { ZT_W_NONE = 0, ZT_W_OUT_IN = 1, ZT_W_IN_OUT = 2 } zt_wlayout_t;

typedef struct zt_param {
    char name[96];      /* HF name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];
    size_t numel;
    int unit;
    int block;          /* layer index, -1 outside the blocks */
    size_t offset;      /* element offset within its unit's flat buffer */
    int decay;          /* weight decay applies (ndim >= 2) */
    int init;           /* ZT_INIT_* */
    float init_std;
    zt_role_t role;
    zt_wlayout_t wlayout;
    int frozen;         /* no gradient, no optimizer state (LoRA's base); a unit's
                         * parameters are all frozen or none */
    int lora_a, lora_b; /* this weight's LoRA adapter parameters, -1 if none */
    int quant;          /* QLoRA: stored 4-bit (zt_quant4_pack_region, the table's
                         * quant_* format); numel is then the floats that form takes
                         * in its unit, shape its values' (zt_qlora_values) */
    int adapter;        /* 'A' (r, in) or 'B' (out, r): a LoRA matrix, of its base
                         * weight's role; 0 for any other parameter */
    /* Tensor parallelism (zt_params_tp_local): what of the global tensor (gshape,
     * gnumel) this rank holds. tp_dim -1: all of it (replicated over tp); 0 or 1: a
     * slice along that dimension of the stored shape, tp_nblk blocks of
     * shape[tp_dim] / tp_nblk, block j at global index tp_goff[j] along it (GPT-2's
     * c_attn: its q, k and v columns of this rank's heads). tp_share: tp ranks that
     * hold the same elements (1 for a slice, tp replicated); the lowest of them
     * writes it. tp_grad_sum: those ranks' gradients are partial sums (summed over
     * tp before the data-parallel reduction). Without tp: tp_dim -1, tp_share 1. */
    int tp_dim, tp_nblk, tp_share, tp_grad_sum;
    int64_t tp_goff[3];
    int64_t gshape[2];
    size_t gnumel;
} zt_param_t;

/* The shape of a model, family-neutral. A family fills what it uses and leaves
 * the rest at the values zt_model_dims_default gives. */
typedef struct zt_model_dims {
    int L, NH, NKV, C, HD, I, V, maxT; /* layers, heads, KV heads, hidden, head_dim,
                                        * intermediate (MLP) size, vocabulary, positions */
    int tied;                   /* lm_head is the token embedding */
    int qkv_bias;               /* q/k/v projections have biases (Qwen2, GPT-2) */
    int o_bias;                 /* the attention output projection has a bias */
    int qk_norm;                /* per-head RMSNorm of q and k (Qwen3) */
    double norm_eps;            /* layernorm / rmsnorm epsilon (double: config.json round trips) */
    double rope_theta;
    /* rope_scaling {"rope_type": "llama3", ...}; rope_llama3 = 0: none. rope_linear:
     * {"rope_type": "linear", "factor"}, every frequency / factor */
    int rope_llama3, rope_linear;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max;      /* original_max_position_embeddings */
    /* sliding_window (0 = none): a token attends to the last sliding_window positions,
     * itself included: every layer (mistral) or, with sliding_pattern p > 0, the layers l
     * with (l + 1) % p != 0 (gemma3's sliding_attention layers), whose rotary base is
     * rope_local_theta */
    int sliding_window, sliding_pattern;
    double rope_local_theta;
    /* Gemma: RMSNorms scale by (1 + weight) (norm_plus1), four per block (sandwich:
     * the attention's and the MLP's outputs are normed before the residual adds), GeGLU
     * MLP (act_gelu), token embeddings times sqrt(C) (embed_scale) */
    int norm_plus1, sandwich, act_gelu, embed_scale;
    /* tensor parallelism: a local table's dims hold this rank's share (NH, NKV and I
     * divided by tp_size; V: its vocabulary rows [vocab_start, vocab_start + V), blocks of
     * vocab_block = ceil(V_total / tp) rows, the last rank's shorter) */
    int tp_size, tp_rank;
    int vocab_start, vocab_block, vocab_total;
    /* tp_seq (parallel.tp_sequence_parallel, Megatron's sequence parallelism): between
     * the row- and column-parallel GEMMs the residual stream is split over the tp ranks
     * by rows (tokens [tp_rank N/tp, (tp_rank + 1) N/tp) of the micro-batch), so the
     * norms, residual adds and their activations are 1/tp of the tokens; reduce-scatter
     * and all-gather replace the all-reduces */
    int tp_seq;
    /* sequence parallelism (Ulysses): each of sp_size ranks runs positions
     * [sp_rank T, (sp_rank + 1) T) of every sequence, T the model's time */
    int sp_size, sp_rank;
    /* sp_ring: ring attention instead: the T positions are chunks sp_rank and
     * 2 sp - 1 - sp_rank of the sequence's 2 sp chunks of T / 2, stored chunk-major
     * (B, T/2) of the first, then of the second */
    int sp_ring;
} zt_model_dims_t;

struct zt_arch;

typedef struct zt_param_table {
    const struct zt_arch *arch; /* the family that built it */
    zt_model_dims_t dims;
    int nparams;
    zt_param_t *params;
    int nunits;
    size_t *unit_numel;     /* (nunits) */
    int *unit_first;        /* (nunits) first param index of each unit */
    int *unit_count;        /* (nunits) number of params in each unit */
    size_t total_numel;
    int root_unit;          /* gathered for the whole micro-step */
    int head_unit;          /* the final norm and an untied head in a unit of their own (a
                             * pipeline's last stage: zt_params_split_head), or -1: in the root
                             * unit (zt_params_head_unit) */
    int first_block_unit;   /* block l is unit first_block_unit + l */
    int *unit_frozen;       /* (nunits) 1: the unit's parameters are frozen */
    /* LoRA: block l's adapters are unit first_adapter_unit + l (-1: no adapters); the
     * root unit has none. lora_scale = alpha / r (rsLoRA: alpha / sqrt r). */
    int first_adapter_unit, lora_rank;
    float lora_scale;
    double lora_dropout;    /* PEFT's lora_dropout on the adapters' input (0: none) */
    /* QLoRA (zt_qlora.h): the format of the parameters with `quant` set */
    int quant_type;         /* zt_quant_type_t */
    int quant_nested;       /* double quantization */
    int64_t quant_blocksize;
    int quant_stored;       /* the directory holds the 4-bit form (read as is, not quantized at load) */
    int quant_bytewise;     /* a 16-bit working copy (train.bf16): each element holds one byte of the
                             * 4-bit form as its value 0..255, exact in bf16 (zt_qlora.h) */
    int cap;                /* allocated entries of params */
} zt_param_table_t;

/* An empty table for a family to fill (zt_params_add), then zt_params_finish. */
zt_param_table_t *zt_params_new(const struct zt_arch *arch, const zt_model_dims_t *d);
/* Appends a parameter; returns its index. ndim 1 ignores d1. */
int zt_params_add(zt_param_table_t *t, const char *name, int ndim, int64_t d0, int64_t d1, int unit,
                  int block, int init, float std, zt_role_t role, zt_wlayout_t wlayout);
/* Computes the units' sizes and offsets (after the last add). */
void zt_params_finish(zt_param_table_t *t, int nunits, int root_unit, int first_block_unit);

void zt_param_table_free(zt_param_table_t *t);
/* The trainable parameters of t as a table of their own (names, shapes, init; units
 * kept), map[p] = p's index there or -1 for a frozen p. What a LoRA checkpoint holds. */
zt_param_table_t *zt_params_trainable(const zt_param_table_t *t, int *map);
int zt_param_table_find(const zt_param_table_t *t, const char *name); /* -1 if absent */
/* Pipelines: the final norm and an untied head (lm_head) moved out of the root unit into a
 * unit of their own (the base model's last; LoRA's adapter units move one on), so the first stage holds the embedding and the last
 * the head; a tied head is the embedding and stays in the root unit with the norm. 1 when
 * it split, 0 otherwise. The model reads the head through the unit's buffer it is handed
 * (its offsets are the parameters' in their unit), so nothing else changes. */
int zt_params_split_head(zt_param_table_t *t);
/* The unit of the final norm and the head: head_unit, or the root unit */
static inline int zt_params_head_unit(const zt_param_table_t *t) { return t->head_unit >= 0 ? t->head_unit : t->root_unit; }
/* A pipeline stage's units: of the layers flagged in `layers` (L + 2 flags: 0 the
 * embedding, l + 1 block l, L + 1 the head), the root unit for the embedding, the head's
 * unit (zt_params_head_unit) for the head, block l's unit and its LoRA adapter unit for
 * block l; a malloc'd (nunits) mask. */
unsigned char *zt_params_units_of_layers(const zt_param_table_t *t, const unsigned char *layers);
const char *zt_role_name(zt_role_t r);

/* Tensor parallelism: this rank's table of the global table g (same parameters in the
 * same order, so indices agree; local shapes, units and offsets; dims with the local
 * heads, intermediate size and vocabulary). -1 with err naming what tp does not divide,
 * or a parameter it cannot place. tp = 1: a copy. */
zt_param_table_t *zt_params_tp_local(const zt_param_table_t *g, int tp, int rank, char *err, size_t errlen);
/* Calls fn(arg, global_start, local_start, len) for the runs of local elements
 * [start, start + n) of p that are contiguous in the global tensor, in order. */
void zt_param_tp_runs(const zt_param_t *p, size_t start, size_t n,
                      void (*fn)(void *arg, size_t gstart, size_t lstart, size_t len), void *arg);

/* Initial value of element `idx` of parameter p (pure function). */
float zt_param_init_value(const zt_param_t *p, uint64_t seed, size_t idx);
/* Fills out[0..n) with elements [start, start+n) of p's initial values (local
 * elements of a tp slice take their global element's value). */
void zt_param_init_range(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out);

#endif
