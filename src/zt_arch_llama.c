/* zt_arch_llama.c — the Llama family: llama, qwen2, qwen3, mistral (HF LlamaForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM).
 *
 * Pre-RMSNorm blocks, rotary positions (HF's rotate_half, rope_theta, optional
 * "llama3" frequency scaling), grouped-query attention with head_dim independent of
 * the hidden size, SwiGLU MLP down(silu(gate) * up), nn.Linear (out, in) weights, no
 * positional embedding, lm_head tied or untied. The variants:
 *   llama   biases on q/k/v/o only with attention_bias
 *   qwen2   q/k/v biases always, none on o_proj
 *   qwen3   per-head RMSNorm of q and k (q_norm, k_norm) before the rotation;
 *           biases on q/k/v/o only with attention_bias
 *   mistral no biases; sliding_window, which the full causal attention equals for
 *           rows that fit in it (longer ones are refused)
 * HF names and shapes; the table order puts tensors one GEMM uses side by side:
 * q_proj, k_proj, v_proj weights are the rows of one (Q + 2KV, C) matrix (and their
 * biases one vector), gate_proj and up_proj those of one (2I, C) matrix.
 *   root unit 0   model.embed_tokens.weight (V,C), model.norm.weight (C), [lm_head.weight (V,C)]
 *   unit 1+l      model.layers.l.*
 *
 * Letters: Q = NH*HD, KV = NKV*HD, S = Q + 2KV (a qkv row), I intermediate size.
 * Activations kept per block (N = B*T): ln1 (N,C) rstd1 (N) [qkv_pre (N,S) qk_rstd
 * (N*(NH+NKV)): qwen3] qkv (N,S) after norm and rotation, lse (B,NH,T) atty (N,Q)
 * res2 (N,C) ln2 (N,C) rstd2 (N) gu (N,2I) act (N,I). With recompute one block's worth
 * is shared and the backward re-runs the block forward first (bit-identical). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_hf_config.h"
#include "zt_model_internal.h"

enum { V_LLAMA = 0, V_QWEN2 = 1, V_QWEN3 = 2, V_MISTRAL = 3 };

typedef struct block_acts {
    float *ln1, *rstd1, *qkv_pre, *qk_rstd, *qkv, *lse, *atty, *res2, *ln2, *rstd2, *gu, *act;
    /* sequence parallelism: qkv and atty for every position of this rank's heads
     * (B, sp T, S / sp) and (B, sp T, Q / sp) */
    float *qkv_sp, *atty_sp;
} block_acts_t;

typedef struct llama {
    block_acts_t *blk;          /* (L) */
    float *rstd_f;              /* (N) final norm */
    float *dqkv, *dqkv_pre;     /* (N,S) */
    float *dqkv_sp, *datty_sp;  /* sequence parallelism: (B, sp T, S / sp), (B, sp T, Q / sp) */
    float *dtmp;                /* (N, max(I, Q)) */
    float *inv_freq;            /* (HD/2) backend memory */
    float *dw_frozen;           /* (max(C, HD)) where a frozen norm's weight gradient goes */
    zt_lora_gemm_t lo_qkv, lo_o, lo_gu, lo_down; /* LoRA on the block's four GEMMs */
    int Q, KV, S;
    /* offsets within a block unit (SIZE_MAX: absent) and within the root unit */
    size_t o_ln1, o_wqkv, o_bqkv, o_qn, o_kn, o_wo, o_bo, o_ln2, o_wgu, o_wdown;
    size_t o_embed, o_norm, o_head;
} llama_t;

static int variant_of(const zt_arch_t *a);

/* ---- shape -------------------------------------------------------------------------- */

static int check_dims(const zt_model_dims_t *d, const char *where, char *err, size_t errlen)
{
    if (d->L < 1 || d->NH < 1 || d->C < 1 || d->V < 2 || d->maxT < 1 || d->I < 1)
        return zt_err(err, errlen, "%s: layers, heads, hidden size, intermediate size, vocabulary and positions must "
                      "be positive", where);
    if (d->NKV < 1 || d->NH % d->NKV)
        return zt_err(err, errlen, "%s: n_kv_head (%d) must divide n_head (%d)", where, d->NKV, d->NH);
    if (d->HD < 2 || d->HD % 2)
        return zt_err(err, errlen, "%s: head_dim (%d) must be even (rotary pairs)", where, d->HD);
    if (d->HD > 256) return zt_err(err, errlen, "%s: head_dim %d above 256 (the attention kernels' limit)", where, d->HD);
    if (!(d->norm_eps > 0)) return zt_err(err, errlen, "%s: rms_norm_eps must be > 0", where);
    if (!(d->rope_theta > 0)) return zt_err(err, errlen, "%s: rope_theta must be > 0", where);
    if (d->sliding_window < 0) return zt_err(err, errlen, "%s: sliding_window must be positive or null", where);
    if (d->rope_llama3 && !(d->rope_factor > 0 && d->rope_high_freq_factor > d->rope_low_freq_factor &&
                            d->rope_low_freq_factor > 0 && d->rope_original_max > 0))
        return zt_err(err, errlen, "%s: llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                      "original_max_position_embeddings > 0", where);
    return 0;
}

static void variant_biases(int v, int attention_bias, zt_model_dims_t *d)
{
    d->qkv_bias = v == V_QWEN2 ? 1 : attention_bias;
    d->o_bias = v == V_QWEN2 ? 0 : attention_bias;
    d->qk_norm = v == V_QWEN3;
}

static int llama_from_config(const zt_config_t *cfg, zt_model_dims_t *d, char *err, size_t errlen)
{
    const int v = variant_of(zt_arch_get(cfg->model.arch));
    zt_model_dims_default(d);
    d->L = cfg->model.n_layer;
    d->NH = cfg->model.n_head;
    d->NKV = cfg->model.n_kv_head ? cfg->model.n_kv_head : d->NH;
    d->C = cfg->model.n_embd;
    if (!cfg->model.head_dim && d->C % d->NH)
        return zt_err(err, errlen, "model: n_embd (%d) is not a multiple of n_head (%d): give model.head_dim", d->C,
                      d->NH);
    d->HD = cfg->model.head_dim ? cfg->model.head_dim : d->C / d->NH;
    /* LLaMA's rule: 2/3 of 4C, rounded up to a multiple of 32 */
    d->I = cfg->model.intermediate_size ? cfg->model.intermediate_size : ((8 * d->C / 3 + 31) / 32) * 32;
    d->V = cfg->model.vocab_size;
    d->maxT = cfg->model.block_size;
    d->tied = cfg->model.tie_word_embeddings;
    /* a saved config gives every key, false included */
    if (v == V_QWEN2 && cfg->model.attention_bias)
        return zt_err(err, errlen, "model.attention_bias does not apply to qwen2 (q/k/v always have biases, o_proj none)");
    if (v == V_MISTRAL && cfg->model.attention_bias)
        return zt_err(err, errlen, "model.attention_bias does not apply to mistral (no biases)");
    if (v != V_MISTRAL && cfg->model.sliding_window)
        return zt_err(err, errlen, "model.sliding_window applies to mistral only, not %s", cfg->model.arch);
    d->sliding_window = cfg->model.sliding_window;
    /* the attention never sees more than data.seq_len positions (generation slides its
     * window at the same length), so within the window it is exactly mistral's */
    if (d->sliding_window && cfg->data.seq_len > d->sliding_window)
        return zt_err(err, errlen, "data.seq_len (%d) exceeds model.sliding_window (%d): ztrain's attention is full "
                      "causal, equal to mistral's sliding window only for rows that fit in it", cfg->data.seq_len,
                      d->sliding_window);
    variant_biases(v, cfg->model.attention_bias, d);
    d->norm_eps = cfg->model.rms_norm_eps;
    d->rope_theta = cfg->model.rope_theta;
    d->rope_llama3 = strcmp(cfg->model.rope_type, "llama3") == 0;
    d->rope_factor = cfg->model.rope_factor;
    d->rope_low_freq_factor = cfg->model.rope_low_freq_factor;
    d->rope_high_freq_factor = cfg->model.rope_high_freq_factor;
    d->rope_original_max = cfg->model.rope_original_max_position_embeddings;
    return check_dims(d, "model", err, errlen);
}

/* rope_scaling (transformers 4.x) or rope_parameters (5.x): {"rope_type" (or "type"): "default" | "llama3", ...} */
static int rope_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    const json_t *rp = json_object_get(j, "rope_parameters");
    const json_t *rs = json_object_get(j, "rope_scaling");
    zt_hf_config_t c = {j, file, err, errlen, 0};
    d->rope_theta = zt_hf_double(&c, "rope_theta", 10000.0);
    if (c.failed) return -1;
    if (rp && json_is_object(rp)) {
        zt_hf_config_t p = {rp, file, err, errlen, 0};
        if (zt_hf_has(rp, "rope_theta")) d->rope_theta = zt_hf_double(&p, "rope_theta", d->rope_theta);
        if (p.failed) return -1;
        if (!rs || json_is_null(rs)) rs = rp;
    }
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return zt_err(err, errlen, "%s: rope_scaling must be an object or null", file);
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = t ? json_string_value(t) : "default";
    if (!type) return zt_err(err, errlen, "%s: rope_type must be a string", file);
    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "llama3") != 0)
        return zt_err(err, errlen, "%s: rope_type \"%s\" is not supported (default, llama3)", file, type);
    zt_hf_config_t s = {rs, file, err, errlen, 0};
    d->rope_llama3 = 1;
    d->rope_factor = zt_hf_double(&s, "factor", -1);
    d->rope_low_freq_factor = zt_hf_double(&s, "low_freq_factor", -1);
    d->rope_high_freq_factor = zt_hf_double(&s, "high_freq_factor", -1);
    d->rope_original_max = zt_hf_int(&s, "original_max_position_embeddings", ZT_HF_REQUIRED);
    return s.failed ? -1 : 0;
}

static int llama_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    /* the variant as zt_hf_model_resolve chose the family: class first, then model_type */
    const json_t *arch0 = json_array_get(json_object_get(j, "architectures"), 0);
    const zt_arch_t *a = zt_arch_for_hf(json_string_value(arch0), json_string_value(json_object_get(j, "model_type")));
    const int v = variant_of(a);
    zt_model_dims_default(d);
    zt_hf_config_t c = {j, file, err, errlen, 0};
    d->C = zt_hf_int(&c, "hidden_size", ZT_HF_REQUIRED);
    d->I = zt_hf_int(&c, "intermediate_size", ZT_HF_REQUIRED);
    d->L = zt_hf_int(&c, "num_hidden_layers", ZT_HF_REQUIRED);
    d->NH = zt_hf_int(&c, "num_attention_heads", ZT_HF_REQUIRED);
    d->NKV = zt_hf_int(&c, "num_key_value_heads", d->NH);
    d->V = zt_hf_int(&c, "vocab_size", ZT_HF_REQUIRED);
    d->maxT = zt_hf_int(&c, "max_position_embeddings", ZT_HF_REQUIRED);
    d->norm_eps = zt_hf_double(&c, "rms_norm_eps", 1e-6);
    d->tied = zt_hf_bool(&c, "tie_word_embeddings", 0);
    /* Qwen3Config's head_dim defaults to 128; Llama's to hidden / heads */
    d->HD = zt_hf_int(&c, "head_dim", v == V_QWEN3 ? 128 : (d->NH > 0 ? d->C / d->NH : 0));
    const int attention_bias = zt_hf_bool(&c, "attention_bias", 0);
    const int mlp_bias = zt_hf_bool(&c, "mlp_bias", 0);
    const int sliding = zt_hf_bool(&c, "use_sliding_window", 0);
    /* Qwen2/3 keep a sliding_window next to use_sliding_window false: only mistral uses it */
    if (v == V_MISTRAL) d->sliding_window = zt_hf_int(&c, "sliding_window", 0);
    if (c.failed) return -1;
    const json_t *act = json_object_get(j, "hidden_act");
    if (act && (!json_string_value(act) || strcmp(json_string_value(act), "silu")))
        return zt_err(err, errlen, "%s: hidden_act \"%s\" is not supported (silu)", file,
                      json_string_value(act) ? json_string_value(act) : "?");
    if (mlp_bias) return zt_err(err, errlen, "%s: mlp_bias = true is not supported", file);
    if (sliding) return zt_err(err, errlen, "%s: use_sliding_window = true is not supported", file);
    if (v == V_MISTRAL && attention_bias) return zt_err(err, errlen, "%s: attention_bias = true is not supported (mistral)", file);
    variant_biases(v, attention_bias, d);
    if (rope_from_hf(j, file, d, err, errlen)) return -1;
    return check_dims(d, file, err, errlen);
}

static json_t *llama_to_hf_common(const zt_model_dims_t *d, const char *cls, const char *type)
{
    json_t *rope = json_null();
    json_t *params = json_pack("{s:s, s:f}", "rope_type", d->rope_llama3 ? "llama3" : "default", "rope_theta",
                               d->rope_theta);
    if (d->rope_llama3) {
        rope = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", d->rope_factor,
                         "low_freq_factor", d->rope_low_freq_factor, "high_freq_factor", d->rope_high_freq_factor,
                         "original_max_position_embeddings", d->rope_original_max);
        json_object_update(params, rope);
    }
    /* both spellings: transformers 4.x reads rope_theta + rope_scaling, 5.x rope_parameters */
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:o, s:b, s:s, s:f, "
                     "s:f, s:b}",
                     "architectures", cls, "model_type", type, "hidden_size", d->C, "intermediate_size", d->I,
                     "num_hidden_layers", d->L, "num_attention_heads", d->NH, "num_key_value_heads", d->NKV,
                     "head_dim", d->HD, "vocab_size", d->V, "max_position_embeddings", d->maxT, "rms_norm_eps",
                     (double)d->norm_eps, "rope_theta", d->rope_theta, "rope_scaling", rope, "rope_parameters",
                     params, "tie_word_embeddings", d->tied, "hidden_act", "silu", "attention_dropout", 0.0,
                     "initializer_range", 0.02, "use_cache", 1);
}

static json_t *llama_to_hf(const zt_model_dims_t *d)
{
    json_t *j = llama_to_hf_common(d, "LlamaForCausalLM", "llama");
    json_object_set_new(j, "attention_bias", json_boolean(d->qkv_bias));
    json_object_set_new(j, "mlp_bias", json_false());
    return j;
}

static json_t *qwen2_to_hf(const zt_model_dims_t *d)
{
    json_t *j = llama_to_hf_common(d, "Qwen2ForCausalLM", "qwen2");
    json_object_set_new(j, "use_sliding_window", json_false());
    return j;
}

static json_t *qwen3_to_hf(const zt_model_dims_t *d)
{
    json_t *j = llama_to_hf_common(d, "Qwen3ForCausalLM", "qwen3");
    json_object_set_new(j, "attention_bias", json_boolean(d->qkv_bias));
    json_object_set_new(j, "use_sliding_window", json_false());
    return j;
}

static json_t *mistral_to_hf(const zt_model_dims_t *d)
{
    json_t *j = llama_to_hf_common(d, "MistralForCausalLM", "mistral");
    json_object_set_new(j, "sliding_window", d->sliding_window ? json_integer(d->sliding_window) : json_null());
    return j;
}

static void llama_to_config(const zt_model_dims_t *d, zt_config_t *cfg)
{
    cfg->model.n_layer = d->L;
    cfg->model.n_head = d->NH;
    cfg->model.n_kv_head = d->NKV;
    cfg->model.n_embd = d->C;
    cfg->model.head_dim = d->HD;
    cfg->model.intermediate_size = d->I;
    cfg->model.vocab_size = d->V;
    cfg->model.block_size = d->maxT;
    cfg->model.tie_word_embeddings = d->tied;
    cfg->model.rms_norm_eps = d->norm_eps;
    cfg->model.rope_theta = d->rope_theta;
    cfg->model.attention_bias = d->o_bias;
    cfg->model.sliding_window = d->sliding_window;
    snprintf(cfg->model.rope_type, sizeof cfg->model.rope_type, "%s", d->rope_llama3 ? "llama3" : "default");
    if (d->rope_llama3) {
        cfg->model.rope_factor = d->rope_factor;
        cfg->model.rope_low_freq_factor = d->rope_low_freq_factor;
        cfg->model.rope_high_freq_factor = d->rope_high_freq_factor;
        cfg->model.rope_original_max_position_embeddings = d->rope_original_max;
    }
}

/* ---- parameters ----------------------------------------------------------------------- */

static void llama_build(zt_param_table_t *t, float init_std)
{
    const zt_model_dims_t *d = &t->dims;
    const int64_t C = d->C, Q = (int64_t)d->NH * d->HD, KV = (int64_t)d->NKV * d->HD, I = d->I;
    zt_params_add(t, "model.embed_tokens.weight", 2, d->V, C, 0, -1, ZT_INIT_NORMAL, init_std, ZT_ROLE_EMBED,
                  ZT_W_OUT_IN);
    zt_params_add(t, "model.norm.weight", 1, C, 1, 0, -1, ZT_INIT_ONES, 0, ZT_ROLE_NORM, ZT_W_NONE);
    if (!d->tied)
        zt_params_add(t, "lm_head.weight", 2, d->V, C, 0, -1, ZT_INIT_NORMAL, init_std, ZT_ROLE_HEAD, ZT_W_OUT_IN);
    for (int l = 0; l < d->L; l++) {
        char n[96];
        const int u = 1 + l;
#define P(suffix, nd, a, b, init, std, role)                                  \
    do {                                                                      \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);               \
        zt_params_add(t, n, nd, a, b, u, l, init, std, role, ZT_W_OUT_IN);    \
    } while (0)
        P("input_layernorm.weight", 1, C, 1, ZT_INIT_ONES, 0, ZT_ROLE_NORM);
        P("self_attn.q_proj.weight", 2, Q, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_Q);
        P("self_attn.k_proj.weight", 2, KV, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_K);
        P("self_attn.v_proj.weight", 2, KV, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_V);
        if (d->qkv_bias) {
            P("self_attn.q_proj.bias", 1, Q, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_Q);
            P("self_attn.k_proj.bias", 1, KV, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_K);
            P("self_attn.v_proj.bias", 1, KV, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_V);
        }
        if (d->qk_norm) {
            P("self_attn.q_norm.weight", 1, d->HD, 1, ZT_INIT_ONES, 0, ZT_ROLE_QK_NORM);
            P("self_attn.k_norm.weight", 1, d->HD, 1, ZT_INIT_ONES, 0, ZT_ROLE_QK_NORM);
        }
        P("self_attn.o_proj.weight", 2, C, Q, ZT_INIT_NORMAL, init_std, ZT_ROLE_O);
        if (d->o_bias) P("self_attn.o_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_O);
        P("post_attention_layernorm.weight", 1, C, 1, ZT_INIT_ONES, 0, ZT_ROLE_NORM);
        P("mlp.gate_proj.weight", 2, I, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_GATE);
        P("mlp.up_proj.weight", 2, I, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_UP);
        P("mlp.down_proj.weight", 2, C, I, ZT_INIT_NORMAL, init_std, ZT_ROLE_DOWN);
#undef P
    }
    zt_params_finish(t, 1 + d->L, 0, 1);
}

/* sequence parallelism: (B, sp T) rows of this rank's q, k and v heads, KV heads
 * replicated where fewer than sp: N (NH + 2 max(NKV, sp)) HD floats */
static size_t sp_row_floats(const zt_model_dims_t *d, size_t N)
{
    return N * ((size_t)d->NH + 2 * (size_t)ZT_MAX(d->NKV, d->sp_size)) * d->HD;
}

static size_t per_block_floats(const zt_model_dims_t *d, size_t B, size_t T)
{
    const size_t N = B * T, C = d->C, Q = (size_t)d->NH * d->HD, S = Q + 2 * (size_t)d->NKV * d->HD, I = d->I;
    const size_t Nl = d->tp_seq ? N / (size_t)d->tp_size : N; /* the residual stream's rows */
    size_t f = Nl * C + Nl /* ln1, rstd1 */ + N * S /* qkv */ + B * d->NH * T /* lse */ + N * Q /* atty */ +
               Nl * C /* res2 */ + Nl * C + Nl /* ln2, rstd2 */ + 2 * N * I /* gu */ + N * I /* act */;
    if (d->qk_norm) f += N * S + N * (size_t)(d->NH + d->NKV);
    if (d->sp_size > 1 && !d->sp_ring) f += sp_row_floats(d, N) + N * Q; /* qkv_sp, atty_sp */
    return f;
}

/* LoRA on a block's four GEMMs: their n*r summed, and the widest output and input */
static void lora_shape(const zt_param_table_t *t, size_t *nr, int *c_max)
{
    const zt_model_dims_t *d = &t->dims;
    const int Q = d->NH * d->HD;
    static const char *const gemm[4][3] = {{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
                                           {"self_attn.o_proj"}, {"mlp.gate_proj", "mlp.up_proj"},
                                           {"mlp.down_proj"}};
    const int c[4] = {d->C, Q, d->C, d->I};
    *nr = 0, *c_max = 0;
    for (int k = 0; k < 4 && t->lora_rank; k++) {
        int n = 0;
        for (int i = 0; i < 3 && gemm[k][i]; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.0.%s.lora_A.weight", gemm[k][i]);
            n += zt_param_table_find(t, name) >= 0;
        }
        if (!n) continue;
        *nr += (size_t)n * t->lora_rank;
        *c_max = ZT_MAX(*c_max, c[k]);
    }
}

static size_t llama_activation_bytes(const zt_param_table_t *t, int B, int T, int recompute)
{
    const zt_model_dims_t *d = &t->dims;
    const size_t N = (size_t)B * T, Q = (size_t)d->NH * d->HD, S = Q + 2 * (size_t)d->NKV * d->HD;
    size_t f = (recompute ? 1 : (size_t)d->L) * per_block_floats(d, (size_t)B, (size_t)T);
    if (d->sp_size > 1 && !d->sp_ring)
        f += 3 * sp_row_floats(d, N) + N * Q /* dqkv_sp, datty_sp, the all-to-all's buffers */;
    if (d->sp_size > 1 && d->sp_ring) /* ring: K|V blocks, their gradients, one pair's result */
        f += 5 * N * 2 * (size_t)d->NKV * d->HD + N / 2 * Q + N / 2 * (size_t)d->NH;
    f += N /* rstd_f */ + N * S /* dqkv */ + (d->qk_norm ? N * S : 0) + N * ZT_MAX((size_t)d->I, Q) /* dtmp */ +
         (size_t)d->HD / 2 + ZT_MAX((size_t)d->C, (size_t)d->HD) /* dw_frozen */;
    size_t nr;
    int c_max;
    lora_shape(t, &nr, &c_max);
    if (nr) f += (size_t)d->L * N * nr + zt_lora_scratch_floats(N, t->lora_rank, c_max, t->lora_dropout > 0);
    return f * sizeof(float);
}

static double llama_flops_per_token(const zt_model_dims_t *d, int T)
{
    /* 6 flops per GEMM parameter per token (2 forward + 4 backward), the head included
     * (tied or not), plus attention: QK^T and att@V are each 2*T*Q per token forward
     * (causal half ignored, as PaLM's MFU convention) */
    const double C = d->C, Q = (double)d->NH * d->HD, KV = (double)d->NKV * d->HD, I = d->I, L = d->L;
    const double gemm_params = L * (C * (Q + 2 * KV) + Q * C + 3 * C * I) + (double)d->V * C;
    return 6.0 * gemm_params + 12.0 * L * Q * (double)T;
}

/* ---- rotary frequencies ---------------------------------------------------------------- */

/* HF's inv_freq (fp32): 1 / theta^(2i/HD), then, for llama3, long wavelengths divided by
 * factor and the band between the two wavelength bounds interpolated smoothly
 * (transformers' _compute_llama3_parameters). */
static void rope_inv_freq(const zt_model_dims_t *d, float *out)
{
    const int half = d->HD / 2;
    for (int i = 0; i < half; i++) {
        float f = (float)(1.0 / pow(d->rope_theta, (double)(2 * i) / d->HD));
        if (d->rope_llama3) {
            const double old = d->rope_original_max, lo = old / d->rope_low_freq_factor,
                         hi = old / d->rope_high_freq_factor, wavelen = 2.0 * M_PI / f;
            double g = wavelen > lo ? f / d->rope_factor : f;
            if (!(wavelen < hi) && !(wavelen > lo)) {
                const double smooth = (old / wavelen - d->rope_low_freq_factor) /
                                      (d->rope_high_freq_factor - d->rope_low_freq_factor);
                g = (1.0 - smooth) * g / d->rope_factor + smooth * g;
            }
            f = (float)g;
        }
        out[i] = f;
    }
}

/* ---- runtime ------------------------------------------------------------------------------ */

static size_t off_of(const zt_model_t *m, const char *suffix, int required)
{
    char n[96];
    snprintf(n, sizeof n, "model.layers.0.%s", suffix);
    const int i = zt_param_table_find(m->table, n);
    if (i < 0) {
        if (required) zt_fatal("llama: parameter %s missing from the table", n);
        return SIZE_MAX;
    }
    return m->table->params[i].offset;
}

static void llama_create(zt_model_t *m)
{
    llama_t *g = zt_calloc(1, sizeof *g);
    m->fam = g;
    const zt_model_dims_t *d = &m->d;
    const zt_param_table_t *t = m->table;
    g->Q = d->NH * d->HD;
    g->KV = d->NKV * d->HD;
    g->S = g->Q + 2 * g->KV;
    const size_t N = (size_t)m->Bmax * m->Tmax, C = d->C, S = g->S, Q = g->Q, I = d->I, F = sizeof(float);
    const size_t Nl = d->tp_seq ? N / (size_t)d->tp_size : N; /* the residual stream's rows */
    if (d->L > 0) {
        g->o_ln1 = off_of(m, "input_layernorm.weight", 1);
        g->o_wqkv = off_of(m, "self_attn.q_proj.weight", 1);
        g->o_bqkv = off_of(m, "self_attn.q_proj.bias", d->qkv_bias);
        g->o_qn = off_of(m, "self_attn.q_norm.weight", d->qk_norm);
        g->o_kn = off_of(m, "self_attn.k_norm.weight", d->qk_norm);
        g->o_wo = off_of(m, "self_attn.o_proj.weight", 1);
        g->o_bo = off_of(m, "self_attn.o_proj.bias", d->o_bias);
        g->o_ln2 = off_of(m, "post_attention_layernorm.weight", 1);
        g->o_wgu = off_of(m, "mlp.gate_proj.weight", 1);
        g->o_wdown = off_of(m, "mlp.down_proj.weight", 1);
    }
    g->o_embed = t->params[zt_param_table_find(t, "model.embed_tokens.weight")].offset;
    g->o_norm = t->params[zt_param_table_find(t, "model.norm.weight")].offset;
    g->o_head = d->tied ? g->o_embed : t->params[zt_param_table_find(t, "lm_head.weight")].offset;

    g->blk = zt_calloc(d->L ? (size_t)d->L : 1, sizeof *g->blk);
    for (int l = 0; l < d->L; l++) {
        block_acts_t *a = &g->blk[l];
        if (m->recompute && l > 0) {
            *a = g->blk[0];
            continue;
        }
        a->ln1 = zt_model_alloc(m, Nl * C * F);
        a->rstd1 = zt_model_alloc(m, Nl * F);
        if (d->qk_norm) {
            a->qkv_pre = zt_model_alloc(m, N * S * F);
            a->qk_rstd = zt_model_alloc(m, N * (size_t)(d->NH + d->NKV) * F);
        }
        a->qkv = zt_model_alloc(m, N * S * F);
        a->lse = zt_model_alloc(m, (size_t)m->Bmax * d->NH * m->Tmax * F);
        a->atty = zt_model_alloc(m, N * Q * F);
        a->res2 = zt_model_alloc(m, Nl * C * F);
        a->ln2 = zt_model_alloc(m, Nl * C * F);
        a->rstd2 = zt_model_alloc(m, Nl * F);
        a->gu = zt_model_alloc(m, 2 * N * I * F);
        a->act = zt_model_alloc(m, N * I * F);
        if (d->sp_size > 1 && !d->sp_ring) {
            a->qkv_sp = zt_model_alloc(m, sp_row_floats(d, N) * F);
            a->atty_sp = zt_model_alloc(m, N * Q * F);
        }
    }
    if (d->sp_size > 1 && d->sp_ring) zt_model_ring_scratch(m, d->NH, d->NKV, d->HD);
    if (d->sp_size > 1 && !d->sp_ring) {
        g->dqkv_sp = zt_model_alloc(m, sp_row_floats(d, N) * F);
        g->datty_sp = zt_model_alloc(m, N * Q * F);
        zt_model_sp_scratch(m, sp_row_floats(d, N));
    }
    g->rstd_f = zt_model_alloc(m, N * F);
    g->dqkv = zt_model_alloc(m, N * S * F);
    if (d->qk_norm) g->dqkv_pre = zt_model_alloc(m, N * S * F);
    g->dtmp = zt_model_alloc(m, N * ZT_MAX(I, Q) * F);
    g->inv_freq = zt_model_alloc(m, (size_t)(d->HD / 2) * F);
    float *h = zt_malloc((size_t)(d->HD / 2) * F);
    rope_inv_freq(d, h);
    m->be->from_host(g->inv_freq, h, (size_t)(d->HD / 2) * F);
    free(h);
    g->dw_frozen = zt_model_alloc(m, ZT_MAX(C, (size_t)d->HD) * F);
    if (t->lora_rank && d->L > 0) {
        const int iq = zt_param_table_find(t, "model.layers.0.self_attn.q_proj.weight");
        const int io = zt_param_table_find(t, "model.layers.0.self_attn.o_proj.weight");
        const int ig = zt_param_table_find(t, "model.layers.0.mlp.gate_proj.weight");
        const int id = zt_param_table_find(t, "model.layers.0.mlp.down_proj.weight");
        const int qkv[3] = {iq, iq + 1, iq + 2}, gu[2] = {ig, ig + 1}; /* adjacent in the table */
        zt_lora_gemm_init(m, &g->lo_qkv, qkv, 3, d->C);
        zt_lora_gemm_init(m, &g->lo_o, &io, 1, g->Q);
        zt_lora_gemm_init(m, &g->lo_gu, gu, 2, d->C);
        zt_lora_gemm_init(m, &g->lo_down, &id, 1, d->I);
        size_t nr;
        int c_max;
        lora_shape(t, &nr, &c_max);
        if (nr) zt_lora_scratch(m, c_max);
    }
}

static void llama_destroy(zt_model_t *m)
{
    llama_t *g = m->fam;
    const zt_backend_t *be = m->be;
    for (int l = 0; l < m->d.L; l++) {
        if (m->recompute && l > 0) break;
        block_acts_t *a = &g->blk[l];
        float *bufs[] = {a->ln1, a->rstd1, a->qkv_pre, a->qk_rstd, a->qkv, a->lse,
                         a->atty, a->res2, a->ln2, a->rstd2, a->gu, a->act, a->qkv_sp, a->atty_sp};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->free(bufs[i]);
    }
    be->free(g->rstd_f);
    be->free(g->dqkv);
    if (g->dqkv_pre) be->free(g->dqkv_pre);
    be->free(g->dtmp);
    if (g->dqkv_sp) be->free(g->dqkv_sp), be->free(g->datty_sp);
    be->free(g->inv_freq);
    be->free(g->dw_frozen);
    zt_lora_gemm_t *lo[4] = {&g->lo_qkv, &g->lo_o, &g->lo_gu, &g->lo_down};
    for (int i = 0; i < 4; i++) zt_lora_gemm_free(m, lo[i]);
    free(g->blk);
    free(g);
}

static void llama_embed_forward(zt_model_t *m, const float *root, float *x0)
{
    const llama_t *g = m->fam;
    zt_model_embed_tokens(m, root + g->o_embed, x0);
}

static void llama_embed_backward(zt_model_t *m, float *droot, const float *dx0)
{
    const llama_t *g = m->fam;
    zt_model_embed_tokens_backward(m, droot + g->o_embed, dx0);
}

static void llama_block_forward(zt_model_t *m, int l, const float *w, const float *lora, const float *x_in,
                                float *out)
{
    llama_t *g = m->fam;
    const block_acts_t *a = &g->blk[l];
    const zt_backend_t *be = m->be;
    const zt_model_dims_t *d = &m->d;
    /* Nl: the residual stream's rows (N / tp under tp_sequence_parallel) */
    const int B = m->B, T = m->T, C = d->C, N = B * T, Nl = zt_model_rows(m), S = g->S, Q = g->Q, I = d->I;
    const float eps = (float)d->norm_eps;
    be->rmsnorm_forward(a->ln1, a->rstd1, x_in, w + g->o_ln1, Nl, 1, C, C, eps);
    const float *ln1 = zt_model_tp_gather(m, a->ln1, zt_model_tp_scratch(m, 0)); // (N,C)
    const float *bqkv = d->qkv_bias ? w + g->o_bqkv : NULL;
    if (d->qk_norm) {
        be->matmul_forward(a->qkv_pre, ln1, w + g->o_wqkv, bqkv, N, C, S, 1); // (N,S)
        zt_lora_gemm_forward(m, &g->lo_qkv, l, lora, ln1, a->qkv_pre);
        be->copy_rows(a->qkv + Q + g->KV, S, a->qkv_pre + Q + g->KV, S, N, g->KV); // v as it is
        be->rmsnorm_forward(a->qkv, a->qk_rstd, a->qkv_pre, w + g->o_qn, N, d->NH, d->HD, S, eps);
        be->rmsnorm_forward(a->qkv + Q, a->qk_rstd + (size_t)N * d->NH, a->qkv_pre + Q, w + g->o_kn, N, d->NKV,
                            d->HD, S, eps);
    } else {
        be->matmul_forward(a->qkv, ln1, w + g->o_wqkv, bqkv, N, C, S, 1); // (N,S)
        zt_lora_gemm_forward(m, &g->lo_qkv, l, lora, ln1, a->qkv);
    }
    /* positions: a packed batch's, or under sequence parallelism this rank's chunk's; m->seg
     * (packed rows, or NULL) covers whole sequences */
    const int32_t *pos = zt_model_positions(m);
    be->rope_forward(a->qkv, g->inv_freq, pos, B, T, d->NH, d->HD, S);
    be->rope_forward(a->qkv + Q, g->inv_freq, pos, B, T, d->NKV, d->HD, S);
    if (d->sp_size > 1 && d->sp_ring) {
        zt_model_ring_forward(m, a->qkv, d->NH, d->NKV, d->HD, a->atty, a->lse);
    } else if (d->sp_size > 1) {
        /* Ulysses: every position for this rank's share of the heads, and back */
        const int sp = d->sp_size, h[3] = {d->NH, d->NKV, d->NKV}, nkv = ZT_MAX(d->NKV / sp, 1);
        zt_model_sp_scatter_heads(m, a->qkv, 3, h, d->HD, a->qkv_sp); // (B, sp T, (NH + 2 nkv) HD / sp)
        be->attention_forward(a->atty_sp, a->lse, a->qkv_sp, m->seg, B, sp * T, d->NH / sp, nkv, d->HD);
        zt_model_sp_gather_heads(m, a->atty_sp, 1, h, d->HD, a->atty); // (N,Q)
    } else {
        zt_model_self_attention(m, l, a->qkv, a->atty, a->lse, d->NH, d->NKV, d->HD); // (N,Q)
    }
    float *y = zt_model_tp_partial(m, a->res2); // row-parallel: (N,C) partial sums under tp
    be->matmul_forward(y, a->atty, w + g->o_wo, zt_model_tp_bias(m, d->o_bias ? w + g->o_bo : NULL), N, Q, C, 1);
    zt_lora_gemm_forward(m, &g->lo_o, l, lora, a->atty, y);
    zt_model_tp_reduce(m, y, a->res2); // (Nl,C)
    be->residual_forward(a->res2, a->res2, x_in, (size_t)Nl * C);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->res2, w + g->o_ln2, Nl, 1, C, C, eps);
    const float *ln2 = zt_model_tp_gather(m, a->ln2, zt_model_tp_scratch(m, 0)); // (N,C)
    be->matmul_forward(a->gu, ln2, w + g->o_wgu, NULL, N, C, 2 * I, 1); // (N,2I) [gate | up]
    zt_lora_gemm_forward(m, &g->lo_gu, l, lora, ln2, a->gu);
    be->swiglu_forward(a->act, a->gu, N, I);                               // (N,I)
    y = zt_model_tp_partial(m, out);
    be->matmul_forward(y, a->act, w + g->o_wdown, NULL, N, I, C, 1); // row-parallel
    zt_lora_gemm_forward(m, &g->lo_down, l, lora, a->act, y);
    zt_model_tp_reduce(m, y, out);
    be->residual_forward(out, out, a->res2, (size_t)Nl * C);
}

static void llama_block_backward(zt_model_t *m, int l, const float *w, float *dw, const float *lora,
                                 float *dlora, const float *x_in, float *dres)
{
    llama_t *g = m->fam;
    const block_acts_t *a = &g->blk[l];
    const zt_backend_t *be = m->be;
    const zt_model_dims_t *d = &m->d;
    const int B = m->B, T = m->T, C = d->C, N = B * T, Nl = zt_model_rows(m), S = g->S, Q = g->Q, I = d->I;
    const size_t F = sizeof(float);
    /* tp_sequence_parallel: dres and the norms are this rank's Nl rows; the GEMMs see all
     * N, gathered (tp scratch 0) and reduce-scattered (from dres2 into dn) */
    float *full = zt_model_tp_scratch(m, 0), *dn = d->tp_seq ? m->tp_rows : m->dres2;
    /* dw NULL: the base is frozen (LoRA): no weight-gradient GEMMs; the norms' weight
     * gradients, cheap, land in a scratch */
#define DW(off) (dw ? dw + (off) : NULL)
#define DN(off) (dw ? dw + (off) : g->dw_frozen)
    /* re-run the forward to refill the shared buffers; its output goes to dres2, free
     * until dln2 below, because the next block's x_in must stay intact */
    if (m->recompute) llama_block_forward(m, l, w, lora, x_in, m->dres2);
    /* dres = dL/d(out), out = res2 + down(swiglu(gu(ln2(res2)))) */
    float *dact = g->dtmp;
    const float *dy = zt_model_tp_gather(m, dres, full); // (N,C)
    be->matmul_backward(dact, DW(g->o_wdown), NULL, dy, a->act, w + g->o_wdown, N, I, C, 1);
    zt_lora_gemm_backward(m, &g->lo_down, l, lora, dlora, a->act, dy, dact);
    be->swiglu_backward(a->gu, dact, a->gu, N, I); // gu becomes dgu: nothing reads it after
    const float *ln2 = zt_model_tp_gather(m, a->ln2, full);
    be->matmul_backward(m->dres2, DW(g->o_wgu), NULL, a->gu, ln2, w + g->o_wgu, N, C, 2 * I, 1);
    zt_lora_gemm_backward(m, &g->lo_gu, l, lora, dlora, ln2, a->gu, m->dres2);
    zt_model_tp_reduce(m, m->dres2, dn); // column-parallel: each rank's columns' part
    be->rmsnorm_backward(dres, DN(g->o_ln2), dn, a->res2, w + g->o_ln2, a->rstd2, Nl, 1, C, C);
    /* dres = dL/d res2 ; res2 = x_in + o(attention(rope(norm(qkv(ln1(x_in)))))) */
    float *datty = g->dtmp;
    dy = zt_model_tp_gather(m, dres, full);
    be->matmul_backward(datty, DW(g->o_wo), d->o_bias ? DW(g->o_bo) : NULL, dy, a->atty, w + g->o_wo, N, Q, C, 1);
    zt_lora_gemm_backward(m, &g->lo_o, l, lora, dlora, a->atty, dy, datty);
    if (d->sp_size > 1 && d->sp_ring) {
        be->memzero(g->dqkv, (size_t)N * S * F);
        zt_model_ring_backward(m, g->dqkv, datty, a->qkv, a->atty, a->lse, d->NH, d->NKV, d->HD);
    } else if (d->sp_size > 1) {
        const int sp = d->sp_size, h[3] = {d->NH, d->NKV, d->NKV}, nkv = ZT_MAX(d->NKV / sp, 1);
        zt_model_sp_scatter_heads(m, datty, 1, h, d->HD, g->datty_sp);
        be->memzero(g->dqkv_sp, sp_row_floats(d, (size_t)N) * F);
        be->attention_backward(g->dqkv_sp, g->datty_sp, a->qkv_sp, a->atty_sp, a->lse, m->seg, B, sp * T, d->NH / sp,
                               nkv, d->HD);
        zt_model_sp_gather_heads(m, g->dqkv_sp, 3, h, d->HD, g->dqkv); // (N,S), overwritten
    } else {
        be->memzero(g->dqkv, (size_t)N * S * F);
        be->attention_backward(g->dqkv, datty, a->qkv, a->atty, a->lse, m->seg, B, T, d->NH, d->NKV, d->HD);
    }
    const int32_t *pos = zt_model_positions(m);
    be->rope_backward(g->dqkv, g->inv_freq, pos, B, T, d->NH, d->HD, S);
    be->rope_backward(g->dqkv + Q, g->inv_freq, pos, B, T, d->NKV, d->HD, S);
    float *dqkv = g->dqkv;
    if (d->qk_norm) {
        dqkv = g->dqkv_pre;
        be->memzero(dqkv, (size_t)N * S * F);
        be->rmsnorm_backward(dqkv, DN(g->o_qn), g->dqkv, a->qkv_pre, w + g->o_qn, a->qk_rstd, N, d->NH, d->HD, S);
        be->rmsnorm_backward(dqkv + Q, DN(g->o_kn), g->dqkv + Q, a->qkv_pre + Q, w + g->o_kn,
                             a->qk_rstd + (size_t)N * d->NH, N, d->NKV, d->HD, S);
        be->copy_rows(dqkv + Q + g->KV, S, g->dqkv + Q + g->KV, S, N, g->KV);
    }
    const float *ln1 = zt_model_tp_gather(m, a->ln1, full);
    float *dln1 = zt_model_needs_dx_in(m, l, dw) ? m->dres2 : NULL;
    be->matmul_backward(dln1, DW(g->o_wqkv), d->qkv_bias ? DW(g->o_bqkv) : NULL, dqkv, ln1, w + g->o_wqkv, N, C,
                        S, 1);
    zt_lora_gemm_backward(m, &g->lo_qkv, l, lora, dlora, ln1, dqkv, dln1);
    if (!dln1) return;
    zt_model_tp_reduce(m, m->dres2, dn);
    be->rmsnorm_backward(dres, DN(g->o_ln1), dn, x_in, w + g->o_ln1, a->rstd1, Nl, 1, C, C);
#undef DW
#undef DN
}

static void llama_final_norm_forward(zt_model_t *m, const float *root, const float *x, float *xf)
{
    const llama_t *g = m->fam;
    m->be->rmsnorm_forward(xf, g->rstd_f, x, root + g->o_norm, zt_model_rows(m), 1, m->d.C, m->d.C,
                           (float)m->d.norm_eps);
}

static void llama_final_norm_backward(zt_model_t *m, const float *root, float *droot, const float *x,
                                      const float *dxf, float *dx)
{
    const llama_t *g = m->fam;
    const int N = zt_model_rows(m), C = m->d.C;
    m->be->memzero(dx, (size_t)N * C * sizeof(float));
    m->be->rmsnorm_backward(dx, droot ? droot + g->o_norm : g->dw_frozen, dxf, x, root + g->o_norm, g->rstd_f, N, 1,
                            C, C);
}

static size_t llama_head_offset(const zt_model_t *m) { return ((const llama_t *)m->fam)->o_head; }

static const zt_arch_ops_t llama_ops = {
    .create = llama_create,
    .destroy = llama_destroy,
    .embed_forward = llama_embed_forward,
    .embed_backward = llama_embed_backward,
    .block_forward = llama_block_forward,
    .block_backward = llama_block_backward,
    .final_norm_forward = llama_final_norm_forward,
    .final_norm_backward = llama_final_norm_backward,
    .head_offset = llama_head_offset,
};

#define LLAMA_ENTRY(var, nm, cls, type, to_hf)                                                                 \
    const zt_arch_t var = {                                                                                    \
        .name = nm, .hf_class = cls, .hf_model_type = type, .dims_from_config = llama_from_config,             \
        .dims_from_hf = llama_from_hf, .dims_to_hf = to_hf, .dims_to_config = llama_to_config,                 \
        .build_params = llama_build, .activation_bytes = llama_activation_bytes,                               \
        .flops_per_token = llama_flops_per_token, .ops = &llama_ops,                                           \
    }
LLAMA_ENTRY(zt_arch_llama, "llama", "LlamaForCausalLM", "llama", llama_to_hf);
LLAMA_ENTRY(zt_arch_qwen2, "qwen2", "Qwen2ForCausalLM", "qwen2", qwen2_to_hf);
LLAMA_ENTRY(zt_arch_qwen3, "qwen3", "Qwen3ForCausalLM", "qwen3", qwen3_to_hf);
LLAMA_ENTRY(zt_arch_mistral, "mistral", "MistralForCausalLM", "mistral", mistral_to_hf);

static int variant_of(const zt_arch_t *a)
{
    return a == &zt_arch_qwen2 ? V_QWEN2 : a == &zt_arch_qwen3 ? V_QWEN3 : a == &zt_arch_mistral ? V_MISTRAL : V_LLAMA;
}
