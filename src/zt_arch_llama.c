/* zt_arch_llama.c — the Llama family: llama, qwen2, qwen3, mistral, gemma3 (HF LlamaForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM).
 *
 * Pre-RMSNorm blocks, rotary positions (HF's rotate_half, rope_theta, optional
 * "llama3" frequency scaling), grouped-query attention with head_dim independent of
 * the hidden size, SwiGLU MLP down(silu(gate) * up), nn.Linear (out, in) weights, no
 * positional embedding, lm_head tied or untied. The variants:
 *   llama   biases on q/k/v/o only with attention_bias
 *   qwen2   q/k/v biases always, none on o_proj
 *   qwen3   per-head RMSNorm of q and k (q_norm, k_norm) before the rotation;
 *           biases on q/k/v/o only with attention_bias
 *   mistral no biases; every layer attends through a sliding_window
 *   gemma3  Gemma 3's text model: RMSNorms scale by (1 + weight) and there are four
 *           per block (input_layernorm; post_attention_layernorm on the attention's
 *           output before its residual add; pre_ and post_feedforward_layernorm around
 *           the MLP), q_norm/k_norm as qwen3, GeGLU (gelu_pytorch_tanh) for SwiGLU,
 *           embeddings times sqrt(hidden_size), biases only with attention_bias; its
 *           sliding_attention layers (layer_types) see a sliding_window and rotate with
 *           rope_local_base_freq, the full_attention ones with rope_theta (and rope
 *           scaling). The attention scale is query_pre_attn_scalar^-0.5, which must be
 *           head_dim's.
 * HF names and shapes; the table order puts tensors one GEMM uses side by side:
 * q_proj, k_proj, v_proj weights are the rows of one (Q + 2KV, C) matrix (and their
 * biases one vector), gate_proj and up_proj those of one (2I, C) matrix.
 *   root unit 0   model.embed_tokens.weight (V,C), model.norm.weight (C), [lm_head.weight (V,C)]
 *   unit 1+l      model.layers.l.*
 *
 * Letters: Q = NH*HD, KV = NKV*HD, S = Q + 2KV (a qkv row), I intermediate size.
 * Activations kept per block (N = B*T): ln1 (N,C) rstd1 (N) [qkv_pre (N,S) qk_rstd
 * (N*(NH+NKV)): qwen3, gemma3] qkv (N,S) after norm and rotation, atty (N,Q) (and the
 * attention's lse, kept by zt_attention.c) [ao (N,C) rstd_pa (N): gemma3's attention
 * output before its norm] res2 (N,C) ln2 (N,C) rstd2 (N) gu (N,2I) act (N,I) [mo (N,C)
 * rstd_pf (N): the MLP's output before its norm].
 * With recompute one block's worth is shared and the backward re-runs the block forward
 * first (bit-identical). The four linears (zt_linear.c) and the attention (zt_attention.c)
 * bring their tensor- and sequence-parallel collectives and LoRA with them: the block is
 * the maths. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_hf_config.h"
#include "zt_model_internal.h"
#include "zt_qlora.h"

enum { V_LLAMA = 0, V_QWEN2 = 1, V_QWEN3 = 2, V_MISTRAL = 3, V_GEMMA3 = 4 };

typedef struct block_acts {
    float *ln1, *rstd1, *qkv_pre, *qk_rstd, *qkv, *atty, *res2, *ln2, *rstd2, *gu, *act;
    float *ao, *rstd_pa, *mo, *rstd_pf; /* sandwich norms' inputs and rstd */
} block_acts_t;

typedef struct llama {
    block_acts_t *blk;          /* (L) */
    float *rstd_f;              /* (N) final norm */
    float *dqkv, *dqkv_pre;     /* (N,S) */
    zt_attention_t att;         /* the attention's own activations (lse, sequence parallelism's) */
    float *dtmp;                /* (N, max(I, Q)) */
    float *inv_freq;            /* (HD/2) backend memory */
    float *inv_freq_local;      /* (HD/2) the sliding layers' (gemma3), else NULL */
    float *dw_frozen;           /* (max(C, HD)) where a frozen norm's weight gradient goes */
    float *ones, *w1;           /* norm_plus1: (max(C, HD)) ones, and 1 + the weight of the norm in use */
    float *dsand;               /* sandwich: (Nl,C) the gradient of a normed output's input */
    /* the block's four linears: q|k|v and gate|up column parallel, o and down row parallel */
    zt_linear_t qkv, o, gu, down;
    int Q, KV, S;
    /* the norms' offsets within a block unit (SIZE_MAX: absent), and within the root unit */
    size_t o_ln1, o_qn, o_kn, o_ln2, o_pa, o_pf;
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
    if (d->sliding_pattern && !(d->rope_local_theta > 0))
        return zt_err(err, errlen, "%s: rope_local_base_freq must be > 0", where);
    if (d->rope_linear && !(d->rope_factor > 0)) return zt_err(err, errlen, "%s: linear rope scaling needs factor > 0", where);
    if (d->rope_llama3 && !(d->rope_factor > 0 && d->rope_high_freq_factor > d->rope_low_freq_factor &&
                            d->rope_low_freq_factor > 0 && d->rope_original_max > 0))
        return zt_err(err, errlen, "%s: llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                      "original_max_position_embeddings > 0", where);
    return 0;
}

/* biases, norms and the MLP's activation, which the variant fixes */
static void variant_biases(int v, int attention_bias, zt_model_dims_t *d)
{
    d->qkv_bias = v == V_QWEN2 ? 1 : attention_bias;
    d->o_bias = v == V_QWEN2 ? 0 : attention_bias;
    d->qk_norm = v == V_QWEN3 || v == V_GEMMA3;
    d->norm_plus1 = d->sandwich = d->act_gelu = d->embed_scale = v == V_GEMMA3;
}

/* gemma3's layers l with (l + 1) % pattern == 0 are full attention (Gemma3TextConfig's
 * layer_types), the others sliding_attention; mistral's layers (pattern 0) all slide */
static int layer_slides(const zt_model_dims_t *d, int l) { return !d->sliding_pattern || (l + 1) % d->sliding_pattern; }

static int layer_window(const zt_model_dims_t *d, int l) { return layer_slides(d, l) ? d->sliding_window : 0; }

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
    if (v != V_MISTRAL && v != V_GEMMA3 && cfg->model.sliding_window)
        return zt_err(err, errlen, "model.sliding_window applies to mistral and gemma3, not %s", cfg->model.arch);
    d->sliding_window = cfg->model.sliding_window;
    /* a saved config gives these at their defaults for every family */
    if (v != V_GEMMA3 && (cfg->model.sliding_window_pattern != 6 || cfg->model.rope_local_base_freq != 10000.0))
        return zt_err(err, errlen, "model.sliding_window_pattern and model.rope_local_base_freq apply to gemma3, not %s",
                      cfg->model.arch);
    if (v == V_GEMMA3) {
        d->sliding_pattern = cfg->model.sliding_window_pattern;
        d->rope_local_theta = cfg->model.rope_local_base_freq;
    }
    variant_biases(v, cfg->model.attention_bias, d);
    d->norm_eps = cfg->model.rms_norm_eps;
    d->rope_theta = cfg->model.rope_theta;
    d->rope_llama3 = strcmp(cfg->model.rope_type, "llama3") == 0;
    d->rope_linear = strcmp(cfg->model.rope_type, "linear") == 0;
    d->rope_factor = cfg->model.rope_factor;
    d->rope_low_freq_factor = cfg->model.rope_low_freq_factor;
    d->rope_high_freq_factor = cfg->model.rope_high_freq_factor;
    d->rope_original_max = cfg->model.rope_original_max_position_embeddings;
    return check_dims(d, "model", err, errlen);
}

/* A rope_scaling object (or null): {"rope_type" (or "type"): "default" | "llama3" | "linear", ...} */
static int rope_scaling_from_hf(const json_t *rs, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return zt_err(err, errlen, "%s: rope_scaling must be an object or null", file);
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = t ? json_string_value(t) : "default";
    if (!type) return zt_err(err, errlen, "%s: rope_type must be a string", file);
    if (strcmp(type, "default") == 0) return 0;
    zt_hf_config_t s = {rs, file, err, errlen, 0};
    if (strcmp(type, "linear") == 0) {
        d->rope_linear = 1;
        d->rope_factor = zt_hf_double(&s, "factor", ZT_HF_REQUIRED);
        return s.failed ? -1 : 0;
    }
    if (strcmp(type, "llama3") != 0)
        return zt_err(err, errlen, "%s: rope_type \"%s\" is not supported (default, llama3, linear)", file, type);
    d->rope_llama3 = 1;
    d->rope_factor = zt_hf_double(&s, "factor", -1);
    d->rope_low_freq_factor = zt_hf_double(&s, "low_freq_factor", -1);
    d->rope_high_freq_factor = zt_hf_double(&s, "high_freq_factor", -1);
    d->rope_original_max = zt_hf_int(&s, "original_max_position_embeddings", ZT_HF_REQUIRED);
    return s.failed ? -1 : 0;
}

/* rope_theta + rope_scaling (transformers 4.x) or rope_parameters (5.x) */
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
    return rope_scaling_from_hf(rs, file, d, err, errlen);
}

/* Gemma 3: 4.x gives rope_theta (the full_attention layers', default 1e6),
 * rope_local_base_freq (the sliding ones', 1e4) and rope_scaling (full_attention only);
 * 5.x rope_parameters {"sliding_attention": {...}, "full_attention": {...}}, whose
 * sliding part must be default rope */
static int gemma3_rope_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    zt_hf_config_t c = {j, file, err, errlen, 0};
    d->rope_theta = zt_hf_double(&c, "rope_theta", 1e6);
    d->rope_local_theta = zt_hf_double(&c, "rope_local_base_freq", 1e4);
    if (c.failed) return -1;
    const json_t *rp = json_object_get(j, "rope_parameters"), *full = NULL;
    if (rp && json_is_object(rp)) {
        const json_t *sl = json_object_get(rp, "sliding_attention");
        full = json_object_get(rp, "full_attention");
        if ((sl && !json_is_object(sl)) || (full && !json_is_object(full)))
            return zt_err(err, errlen, "%s: rope_parameters.sliding_attention and .full_attention must be objects", file);
        zt_hf_config_t ps = {sl, file, err, errlen, 0}, pf = {full, file, err, errlen, 0};
        if (sl && zt_hf_has(sl, "rope_theta")) d->rope_local_theta = zt_hf_double(&ps, "rope_theta", 0);
        if (full && zt_hf_has(full, "rope_theta")) d->rope_theta = zt_hf_double(&pf, "rope_theta", 0);
        if (ps.failed || pf.failed) return -1;
        zt_model_dims_t local = *d;
        if (rope_scaling_from_hf(sl, file, &local, err, errlen)) return -1;
        if (local.rope_llama3 || local.rope_linear)
            return zt_err(err, errlen, "%s: rope scaling of the sliding_attention layers is not supported", file);
    }
    const json_t *rs = json_object_get(j, "rope_scaling");
    return rope_scaling_from_hf(rs && !json_is_null(rs) ? rs : full, file, d, err, errlen);
}

/* Gemma 3's layer kinds: layer_types (a list of "sliding_attention" / "full_attention")
 * or sliding_window_pattern (default 6), as the pattern ztrain keeps: layer l is full
 * attention when (l + 1) % pattern == 0 (L + 1: none is) */
static int gemma3_layers_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    zt_hf_config_t c = {j, file, err, errlen, 0};
    const json_t *lt = json_object_get(j, "layer_types");
    if (!lt || json_is_null(lt)) {
        d->sliding_pattern = zt_hf_int(&c, "sliding_window_pattern", 6);
        return c.failed ? -1 : d->sliding_pattern < 1 ? zt_err(err, errlen, "%s: sliding_window_pattern must be >= 1",
                                                                file)
                                                      : 0;
    }
    if (!json_is_array(lt) || (int)json_array_size(lt) != d->L)
        return zt_err(err, errlen, "%s: layer_types must be a list of num_hidden_layers (%d) strings", file, d->L);
    int first_full = -1;
    for (int l = 0; l < d->L; l++) {
        const char *k = json_string_value(json_array_get(lt, (size_t)l));
        if (!k || (strcmp(k, "sliding_attention") && strcmp(k, "full_attention")))
            return zt_err(err, errlen, "%s: layer_types[%d] must be \"sliding_attention\" or \"full_attention\"",
                          file, l);
        if (first_full < 0 && !strcmp(k, "full_attention")) first_full = l;
    }
    d->sliding_pattern = first_full < 0 ? d->L + 1 : first_full + 1;
    for (int l = 0; l < d->L; l++)
        if (layer_slides(d, l) != !strcmp(json_string_value(json_array_get(lt, (size_t)l)), "sliding_attention"))
            return zt_err(err, errlen, "%s: layer_types: layer %d breaks the pattern of a full_attention layer every %d "
                          "layers, the one ztrain runs", file, l, d->sliding_pattern);
    return 0;
}

/* What Gemma 3 adds to the llama keys; what ztrain does not compute is refused */
static int gemma3_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    zt_hf_config_t c = {j, file, err, errlen, 0};
    const double qpas = zt_hf_double(&c, "query_pre_attn_scalar", 256);
    const int bidirectional = zt_hf_bool(&c, "use_bidirectional_attention", 0);
    if (c.failed) return -1;
    if (qpas != d->HD)
        return zt_err(err, errlen, "%s: query_pre_attn_scalar (%g) other than head_dim (%d) is not supported", file,
                      qpas, d->HD);
    if (bidirectional) return zt_err(err, errlen, "%s: use_bidirectional_attention = true is not supported", file);
    static const char *const softcaps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(j, softcaps[k]);
        if (v && !json_is_null(v)) return zt_err(err, errlen, "%s: %s is not supported (null)", file, softcaps[k]);
    }
    if (gemma3_layers_from_hf(j, file, d, err, errlen)) return -1;
    return gemma3_rope_from_hf(j, file, d, err, errlen);
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
    d->tied = zt_hf_bool(&c, "tie_word_embeddings", v == V_GEMMA3); /* Gemma3TextConfig ties by default */
    /* Qwen3Config's and Gemma3TextConfig's head_dim default to 128 and 256; Llama's to hidden / heads */
    d->HD = zt_hf_int(&c, "head_dim", v == V_QWEN3 ? 128 : v == V_GEMMA3 ? 256 : (d->NH > 0 ? d->C / d->NH : 0));
    const int attention_bias = zt_hf_bool(&c, "attention_bias", 0);
    const int mlp_bias = zt_hf_bool(&c, "mlp_bias", 0);
    const int sliding = zt_hf_bool(&c, "use_sliding_window", 0);
    /* Qwen2/3 keep a sliding_window next to use_sliding_window false: only mistral and gemma3 use it */
    if (v == V_MISTRAL || v == V_GEMMA3) d->sliding_window = zt_hf_int(&c, "sliding_window", v == V_GEMMA3 ? 4096 : 0);
    if (c.failed) return -1;
    /* Gemma spells the activation hidden_activation (hidden_act is an older alias) */
    const char *want = v == V_GEMMA3 ? "gelu_pytorch_tanh" : "silu";
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "hidden_activation" : "hidden_act";
        const json_t *act = json_object_get(j, key);
        if (act && !json_is_null(act) && (!json_string_value(act) || strcmp(json_string_value(act), want)))
            return zt_err(err, errlen, "%s: %s \"%s\" is not supported (%s)", file, key,
                          json_string_value(act) ? json_string_value(act) : "?", want);
    }
    if (mlp_bias) return zt_err(err, errlen, "%s: mlp_bias = true is not supported", file);
    if (sliding) return zt_err(err, errlen, "%s: use_sliding_window = true is not supported", file);
    if (v == V_MISTRAL && attention_bias) return zt_err(err, errlen, "%s: attention_bias = true is not supported (mistral)", file);
    variant_biases(v, attention_bias, d);
    if (v == V_GEMMA3) {
        if (gemma3_from_hf(j, file, d, err, errlen)) return -1;
    } else if (rope_from_hf(j, file, d, err, errlen)) {
        return -1;
    }
    return check_dims(d, file, err, errlen);
}

/* rope_scaling (null for none) into *scaling, and rope_parameters with theta (new references) */
static void rope_to_hf(const zt_model_dims_t *d, double theta, json_t **scaling, json_t **params)
{
    const char *type = d->rope_llama3 ? "llama3" : d->rope_linear ? "linear" : "default";
    *scaling = json_null();
    *params = json_pack("{s:s, s:f}", "rope_type", type, "rope_theta", theta);
    if (d->rope_llama3)
        *scaling = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", d->rope_factor,
                             "low_freq_factor", d->rope_low_freq_factor, "high_freq_factor",
                             d->rope_high_freq_factor, "original_max_position_embeddings", d->rope_original_max);
    if (d->rope_linear) *scaling = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", d->rope_factor);
    if (!json_is_null(*scaling)) json_object_update(*params, *scaling);
}

static json_t *llama_to_hf_common(const zt_model_dims_t *d, const char *cls, const char *type)
{
    json_t *rope, *params;
    rope_to_hf(d, d->rope_theta, &rope, &params);
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

/* Gemma 3 in both spellings: 4.x's rope_theta / rope_local_base_freq / rope_scaling /
 * sliding_window_pattern and 5.x's rope_parameters per layer kind / layer_types */
static json_t *gemma3_to_hf(const zt_model_dims_t *d)
{
    json_t *j = llama_to_hf_common(d, "Gemma3ForCausalLM", "gemma3_text");
    json_t *full = json_object_get(j, "rope_parameters");
    json_incref(full);
    json_object_set_new(j, "rope_parameters", json_pack("{s:{s:s, s:f}, s:o}", "sliding_attention", "rope_type",
                                                        "default", "rope_theta", d->rope_local_theta,
                                                        "full_attention", full));
    json_object_del(j, "hidden_act");
    json_t *types = json_array();
    for (int l = 0; l < d->L; l++)
        json_array_append_new(types, json_string(layer_slides(d, l) ? "sliding_attention" : "full_attention"));
    json_t *g = json_pack("{s:s, s:f, s:o, s:i, s:o, s:i, s:n, s:n, s:b, s:b}", "hidden_activation",
                                    "gelu_pytorch_tanh", "rope_local_base_freq", d->rope_local_theta,
                                    "sliding_window", d->sliding_window ? json_integer(d->sliding_window) : json_null(),
                                    "sliding_window_pattern", d->sliding_pattern, "layer_types", types,
                                    "query_pre_attn_scalar", d->HD, "final_logit_softcapping",
                                    "attn_logit_softcapping", "attention_bias", d->qkv_bias,
                                    "use_bidirectional_attention", 0);
    json_object_update(j, g);
    json_decref(g);
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
    if (d->sliding_pattern) {
        cfg->model.sliding_window_pattern = d->sliding_pattern;
        cfg->model.rope_local_base_freq = d->rope_local_theta;
    }
    snprintf(cfg->model.rope_type, sizeof cfg->model.rope_type, "%s",
             d->rope_llama3 ? "llama3" : d->rope_linear ? "linear" : "default");
    if (d->rope_linear) cfg->model.rope_factor = d->rope_factor;
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
    /* a (1 + weight) norm starts at zero, the identity as HF's Gemma3RMSNorm */
    const int norm_init = d->norm_plus1 ? ZT_INIT_ZEROS : ZT_INIT_ONES;
    zt_params_add(t, "model.norm.weight", 1, C, 1, 0, -1, norm_init, 0, ZT_ROLE_NORM, ZT_W_NONE);
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
        P("input_layernorm.weight", 1, C, 1, norm_init, 0, ZT_ROLE_NORM);
        P("self_attn.q_proj.weight", 2, Q, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_Q);
        P("self_attn.k_proj.weight", 2, KV, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_K);
        P("self_attn.v_proj.weight", 2, KV, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_V);
        if (d->qkv_bias) {
            P("self_attn.q_proj.bias", 1, Q, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_Q);
            P("self_attn.k_proj.bias", 1, KV, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_K);
            P("self_attn.v_proj.bias", 1, KV, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_V);
        }
        if (d->qk_norm) {
            P("self_attn.q_norm.weight", 1, d->HD, 1, norm_init, 0, ZT_ROLE_QK_NORM);
            P("self_attn.k_norm.weight", 1, d->HD, 1, norm_init, 0, ZT_ROLE_QK_NORM);
        }
        P("self_attn.o_proj.weight", 2, C, Q, ZT_INIT_NORMAL, init_std, ZT_ROLE_O);
        if (d->o_bias) P("self_attn.o_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_O);
        /* llama's pre-MLP norm; gemma3's norm of the attention's output, its pre-MLP norm next */
        P("post_attention_layernorm.weight", 1, C, 1, norm_init, 0, ZT_ROLE_NORM);
        if (d->sandwich) P("pre_feedforward_layernorm.weight", 1, C, 1, norm_init, 0, ZT_ROLE_NORM);
        P("mlp.gate_proj.weight", 2, I, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_GATE);
        P("mlp.up_proj.weight", 2, I, C, ZT_INIT_NORMAL, init_std, ZT_ROLE_UP);
        P("mlp.down_proj.weight", 2, C, I, ZT_INIT_NORMAL, init_std, ZT_ROLE_DOWN);
        if (d->sandwich) P("post_feedforward_layernorm.weight", 1, C, 1, norm_init, 0, ZT_ROLE_NORM);
#undef P
    }
    zt_params_finish(t, 1 + d->L, 0, 1);
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
static void rope_inv_freq(const zt_model_dims_t *d, double theta, int scaled, float *out)
{
    const int half = d->HD / 2;
    for (int i = 0; i < half; i++) {
        float f = (float)(1.0 / pow(theta, (double)(2 * i) / d->HD));
        if (scaled && d->rope_linear) f = (float)(f / d->rope_factor); /* transformers: inv_freq /= factor */
        if (scaled && d->rope_llama3) {
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

/* block 0's parameter of that suffix, its index in the table */
static int param_of(const zt_model_t *m, const char *suffix)
{
    char n[96];
    snprintf(n, sizeof n, "model.layers.0.%s", suffix);
    const int i = zt_param_table_find(m->table, n);
    if (i < 0) zt_fatal("llama: parameter %s missing from the table", n);
    return i;
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
        g->o_qn = off_of(m, "self_attn.q_norm.weight", d->qk_norm);
        g->o_kn = off_of(m, "self_attn.k_norm.weight", d->qk_norm);
        /* gemma3: post_attention_layernorm norms the attention's output */
        g->o_pa = d->sandwich ? off_of(m, "post_attention_layernorm.weight", 1) : SIZE_MAX;
        g->o_ln2 = off_of(m, d->sandwich ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight", 1);
        g->o_pf = d->sandwich ? off_of(m, "post_feedforward_layernorm.weight", 1) : SIZE_MAX;
        const int iq = param_of(m, "self_attn.q_proj.weight"), ig = param_of(m, "mlp.gate_proj.weight");
        const int qkv[3] = {iq, iq + 1, iq + 2}, gu[2] = {ig, ig + 1}; /* adjacent in the table */
        const int io = param_of(m, "self_attn.o_proj.weight"), id = param_of(m, "mlp.down_proj.weight");
        zt_linear_init(m, &g->qkv, ZT_LINEAR_COLUMN, qkv, 3, d->qkv_bias ? param_of(m, "self_attn.q_proj.bias") : -1);
        zt_linear_init(m, &g->o, ZT_LINEAR_ROW, &io, 1, d->o_bias ? param_of(m, "self_attn.o_proj.bias") : -1);
        zt_linear_init(m, &g->gu, ZT_LINEAR_COLUMN, gu, 2, -1);
        zt_linear_init(m, &g->down, ZT_LINEAR_ROW, &id, 1, -1);
    }
    g->o_embed = t->params[zt_param_table_find(t, "model.embed_tokens.weight")].offset;
    g->o_norm = t->params[zt_param_table_find(t, "model.norm.weight")].offset;
    g->o_head = d->tied ? g->o_embed : t->params[zt_param_table_find(t, "lm_head.weight")].offset;

    g->blk = zt_calloc(d->L ? (size_t)d->L : 1, sizeof *g->blk);
    for (int l = 0; l < d->L; l++) {
        block_acts_t *a = &g->blk[l];
        if (!zt_model_holds_block(m, l)) continue; /* another pipeline stage's */
        if (m->recompute && l > zt_model_first_block(m)) {
            *a = g->blk[zt_model_first_block(m)];
            continue;
        }
        a->ln1 = zt_model_alloc(m, Nl * C * F);
        a->rstd1 = zt_model_alloc(m, Nl * F);
        if (d->qk_norm) {
            a->qkv_pre = zt_model_alloc(m, N * S * F);
            a->qk_rstd = zt_model_alloc(m, N * (size_t)(d->NH + d->NKV) * F);
        }
        a->qkv = zt_model_alloc(m, N * S * F);
        a->atty = zt_model_alloc(m, N * Q * F);
        a->res2 = zt_model_alloc(m, Nl * C * F);
        a->ln2 = zt_model_alloc(m, Nl * C * F);
        a->rstd2 = zt_model_alloc(m, Nl * F);
        a->gu = zt_model_alloc(m, 2 * N * I * F);
        a->act = zt_model_alloc(m, N * I * F);
        if (d->sandwich) {
            a->ao = zt_model_alloc(m, Nl * C * F);
            a->rstd_pa = zt_model_alloc(m, Nl * F);
            a->mo = zt_model_alloc(m, Nl * C * F);
            a->rstd_pf = zt_model_alloc(m, Nl * F);
        }
    }
    zt_attention_init(m, &g->att);
    g->rstd_f = zt_model_alloc(m, N * F);
    g->dqkv = zt_model_alloc(m, N * S * F);
    if (d->qk_norm) g->dqkv_pre = zt_model_alloc(m, N * S * F);
    g->dtmp = zt_model_alloc(m, N * ZT_MAX(I, Q) * F);
    m->share_qkv = g->dqkv, m->share_out = g->dtmp; /* zt_model_set_shared_rows' (N,S), (N,Q) */
    const size_t half = (size_t)(d->HD / 2), CH = ZT_MAX(C, (size_t)d->HD);
    float *h = zt_malloc(ZT_MAX(half, CH) * F);
    g->inv_freq = zt_model_alloc(m, half * F);
    rope_inv_freq(d, d->rope_theta, 1, h);
    m->be->from_host(g->inv_freq, h, half * F);
    if (d->sliding_pattern) { /* gemma3's sliding layers: their own base, never scaled (as HF) */
        g->inv_freq_local = zt_model_alloc(m, half * F);
        rope_inv_freq(d, d->rope_local_theta, 0, h);
        m->be->from_host(g->inv_freq_local, h, half * F);
    }
    g->dw_frozen = zt_model_alloc(m, CH * F);
    if (d->norm_plus1) {
        for (size_t i = 0; i < CH; i++) h[i] = 1.0f;
        g->ones = zt_model_alloc(m, CH * F);
        m->be->from_host(g->ones, h, CH * F);
        g->w1 = zt_model_alloc(m, CH * F);
    }
    free(h);
    if (d->sandwich) g->dsand = zt_model_alloc(m, Nl * C * F);
    if (t->lora_rank && d->L > 0) {
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
        if (!zt_model_holds_block(m, l)) continue;
        if (m->recompute && l > zt_model_first_block(m)) break;
        block_acts_t *a = &g->blk[l];
        float *bufs[] = {a->ln1, a->rstd1, a->qkv_pre, a->qk_rstd, a->qkv, a->atty,   a->res2,
                         a->ln2, a->rstd2, a->gu,      a->act,     a->ao,  a->rstd_pa, a->mo, a->rstd_pf};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->free(bufs[i]);
    }
    be->free(g->rstd_f);
    be->free(g->dqkv);
    if (g->dqkv_pre) be->free(g->dqkv_pre);
    be->free(g->dtmp);
    zt_attention_free(m, &g->att);
    be->free(g->inv_freq);
    be->free(g->dw_frozen);
    float *extra[] = {g->inv_freq_local, g->ones, g->w1, g->dsand};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++)
        if (extra[i]) be->free(extra[i]);
    zt_linear_t *lin[4] = {&g->qkv, &g->o, &g->gu, &g->down};
    for (int i = 0; i < 4; i++) zt_linear_free(m, lin[i]);
    free(g->blk);
    free(g);
}

/* The weight a norm multiplies by: w itself, or for Gemma's (1 + w) norms 1 + w, made in
 * g->w1 (n floats) for this one call. d(1 + w)/dw = 1, so the backward kernels take the
 * same 1 + w and accumulate w's gradient as they would the weight's. */
static const float *norm_weight(zt_model_t *m, const float *w, int n)
{
    const llama_t *g = m->fam;
    if (!m->d.norm_plus1) return w;
    m->be->copy(g->w1, g->ones, (size_t)n * sizeof(float));
    m->be->accumulate(g->w1, w, (size_t)n);
    return g->w1;
}

/* Gemma's embedding scale: HF's float32 tensor of hidden_size ** 0.5 */
static float embed_multiplier(const zt_model_dims_t *d) { return (float)sqrt((double)d->C); }

static void llama_embed_forward(zt_model_t *m, const float *root, float *x0)
{
    const llama_t *g = m->fam;
    zt_model_embed_tokens(m, root + g->o_embed, x0);
    if (m->d.embed_scale) m->be->scale(x0, embed_multiplier(&m->d), (size_t)zt_model_rows(m) * m->d.C);
}

static void llama_embed_backward(zt_model_t *m, float *droot, float *dx0)
{
    const llama_t *g = m->fam;
    if (m->d.embed_scale) m->be->scale(dx0, embed_multiplier(&m->d), (size_t)zt_model_rows(m) * m->d.C);
    zt_model_embed_tokens_backward(m, droot + g->o_embed, dx0);
}

/* gemma3's sandwich: res = x + norm(y), y (Nl,C) the sublayer's output, normed with the
 * unit's weight at offset o (rstd (Nl) kept for the backward) */
static void sandwich_forward(zt_model_t *m, float *res, const float *x, const float *y, float *rstd, const float *w,
                             size_t o)
{
    const int Nl = zt_model_rows(m), C = m->d.C;
    m->be->rmsnorm_forward(res, rstd, y, norm_weight(m, w + o, C), Nl, 1, C, C, (float)m->d.norm_eps);
    m->be->residual_forward(res, res, x, (size_t)Nl * C);
}

/* dL/dy (Nl,C) into g->dsand from dres = dL/dres (the residual's own part stays in dres) */
static const float *sandwich_backward(zt_model_t *m, const float *dres, const float *y, const float *rstd,
                                      const float *w, float *dw, size_t o)
{
    const llama_t *g = m->fam;
    const int Nl = zt_model_rows(m), C = m->d.C;
    m->be->memzero(g->dsand, (size_t)Nl * C * sizeof(float));
    m->be->rmsnorm_backward(g->dsand, dw ? dw + o : g->dw_frozen, dres, y, norm_weight(m, w + o, C), rstd, Nl, 1, C,
                            C);
    return g->dsand;
}

/* block l's rotary frequencies: gemma3's sliding layers have their own base */
static const float *layer_inv_freq(const zt_model_t *m, int l)
{
    const llama_t *g = m->fam;
    return g->inv_freq_local && layer_slides(&m->d, l) ? g->inv_freq_local : g->inv_freq;
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
    const int window = layer_window(d, l);
    const float *inv_freq = layer_inv_freq(m, l);
    be->rmsnorm_forward(a->ln1, a->rstd1, x_in, norm_weight(m, w + g->o_ln1, C), Nl, 1, C, C, eps);
    if (d->qk_norm) {
        zt_linear_forward(m, &g->qkv, l, w, lora, a->ln1, a->qkv_pre); // (N,S)
        be->copy_rows(a->qkv + Q + g->KV, S, a->qkv_pre + Q + g->KV, S, N, g->KV); // v as it is
        be->rmsnorm_forward(a->qkv, a->qk_rstd, a->qkv_pre, norm_weight(m, w + g->o_qn, d->HD), N, d->NH, d->HD, S,
                            eps);
        be->rmsnorm_forward(a->qkv + Q, a->qk_rstd + (size_t)N * d->NH, a->qkv_pre + Q,
                            norm_weight(m, w + g->o_kn, d->HD), N, d->NKV, d->HD, S, eps);
    } else {
        zt_linear_forward(m, &g->qkv, l, w, lora, a->ln1, a->qkv); // (N,S)
    }
    /* positions: a packed batch's, or under sequence parallelism this rank's chunk's */
    const int32_t *pos = zt_model_positions(m);
    be->rope_forward(a->qkv, inv_freq, pos, B, T, d->NH, d->HD, S);
    be->rope_forward(a->qkv + Q, inv_freq, pos, B, T, d->NKV, d->HD, S);
    zt_attention_forward(m, &g->att, l, window, a->qkv, a->atty); // (N,Q)
    /* the attention's output: into res2 (llama), or into ao, normed into res2 (gemma3) */
    float *ao = d->sandwich ? a->ao : a->res2;
    zt_linear_forward(m, &g->o, l, w, lora, a->atty, ao); // (Nl,C)
    if (d->sandwich) sandwich_forward(m, a->res2, x_in, ao, a->rstd_pa, w, g->o_pa);
    else be->residual_forward(a->res2, a->res2, x_in, (size_t)Nl * C);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->res2, norm_weight(m, w + g->o_ln2, C), Nl, 1, C, C, eps);
    zt_linear_forward(m, &g->gu, l, w, lora, a->ln2, a->gu); // (N,2I) [gate | up]
    if (d->act_gelu) be->geglu_forward(a->act, a->gu, N, I); // (N,I)
    else be->swiglu_forward(a->act, a->gu, N, I);
    float *mo = d->sandwich ? a->mo : out;
    zt_linear_forward(m, &g->down, l, w, lora, a->act, mo); // (Nl,C)
    if (d->sandwich) sandwich_forward(m, out, a->res2, mo, a->rstd_pf, w, g->o_pf);
    else be->residual_forward(out, out, a->res2, (size_t)Nl * C);
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
    const int window = layer_window(d, l);
    const float *inv_freq = layer_inv_freq(m, l);
    /* tp_sequence_parallel: dres and the norms are this rank's Nl rows, the linears'
     * dL/dx (dn) too. dw NULL: the base is frozen (LoRA): the linears run no weight-gradient
     * GEMMs; the norms' weight gradients, cheap, land in a scratch */
#define DN(off) (dw ? dw + (off) : g->dw_frozen)
    /* re-run the forward to refill the shared buffers; its output goes to dres2, free
     * until dln2 below, because the next block's x_in must stay intact */
    if (m->recompute) llama_block_forward(m, l, w, lora, x_in, m->dres2);
    /* dres = dL/d(out), out = res2 + down(swiglu(gu(ln2(res2)))) (gemma3: + norm(down(...))) */
    float *dact = g->dtmp;
    const float *dmo = d->sandwich ? sandwich_backward(m, dres, a->mo, a->rstd_pf, w, dw, g->o_pf) : dres;
    zt_linear_backward(m, &g->down, l, w, dw, lora, dlora, a->act, dmo, dact); // (N,I)
    // gu becomes dgu: nothing reads it after
    if (d->act_gelu) be->geglu_backward(a->gu, dact, a->gu, N, I);
    else be->swiglu_backward(a->gu, dact, a->gu, N, I);
    const float *dn = zt_linear_backward(m, &g->gu, l, w, dw, lora, dlora, a->ln2, a->gu, m->dres2); // (Nl,C)
    be->rmsnorm_backward(dres, DN(g->o_ln2), dn, a->res2, norm_weight(m, w + g->o_ln2, C), a->rstd2, Nl, 1, C, C);
    /* dres = dL/d res2 ; res2 = x_in + o(attention(rope(norm(qkv(ln1(x_in)))))) (gemma3: + norm(o(...))) */
    float *datty = g->dtmp;
    const float *dao = d->sandwich ? sandwich_backward(m, dres, a->ao, a->rstd_pa, w, dw, g->o_pa) : dres;
    zt_linear_backward(m, &g->o, l, w, dw, lora, dlora, a->atty, dao, datty); // (N,Q)
    zt_attention_backward(m, &g->att, l, window, a->qkv, a->atty, datty, g->dqkv); // (N,S)
    const int32_t *pos = zt_model_positions(m);
    be->rope_backward(g->dqkv, inv_freq, pos, B, T, d->NH, d->HD, S);
    be->rope_backward(g->dqkv + Q, inv_freq, pos, B, T, d->NKV, d->HD, S);
    float *dqkv = g->dqkv;
    if (d->qk_norm) {
        dqkv = g->dqkv_pre;
        be->memzero(dqkv, (size_t)N * S * F);
        be->rmsnorm_backward(dqkv, DN(g->o_qn), g->dqkv, a->qkv_pre, norm_weight(m, w + g->o_qn, d->HD), a->qk_rstd, N,
                             d->NH, d->HD, S);
        be->rmsnorm_backward(dqkv + Q, DN(g->o_kn), g->dqkv + Q, a->qkv_pre + Q, norm_weight(m, w + g->o_kn, d->HD),
                             a->qk_rstd + (size_t)N * d->NH, N, d->NKV, d->HD, S);
        be->copy_rows(dqkv + Q + g->KV, S, g->dqkv + Q + g->KV, S, N, g->KV);
    }
    dn = zt_linear_backward(m, &g->qkv, l, w, dw, lora, dlora, a->ln1, dqkv,
                            zt_model_needs_dx_in(m, l, dw) ? m->dres2 : NULL);
    if (!dn) return;
    be->rmsnorm_backward(dres, DN(g->o_ln1), dn, x_in, norm_weight(m, w + g->o_ln1, C), a->rstd1, Nl, 1, C, C);
#undef DN
}

static void llama_final_norm_forward(zt_model_t *m, const float *root, const float *x, float *xf)
{
    const llama_t *g = m->fam;
    m->be->rmsnorm_forward(xf, g->rstd_f, x, norm_weight(m, root + g->o_norm, m->d.C), zt_model_rows(m), 1, m->d.C,
                           m->d.C, (float)m->d.norm_eps);
}

static void llama_final_norm_backward(zt_model_t *m, const float *root, float *droot, const float *x,
                                      const float *dxf, float *dx)
{
    const llama_t *g = m->fam;
    const int N = zt_model_rows(m), C = m->d.C;
    m->be->memzero(dx, (size_t)N * C * sizeof(float));
    m->be->rmsnorm_backward(dx, droot ? droot + g->o_norm : g->dw_frozen, dxf, x, norm_weight(m, root + g->o_norm, C),
                            g->rstd_f, N, 1, C, C);
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
        .build_params = llama_build,                               \
        .flops_per_token = llama_flops_per_token, .ops = &llama_ops,                                           \
    }
LLAMA_ENTRY(zt_arch_llama, "llama", "LlamaForCausalLM", "llama", llama_to_hf);
LLAMA_ENTRY(zt_arch_qwen2, "qwen2", "Qwen2ForCausalLM", "qwen2", qwen2_to_hf);
LLAMA_ENTRY(zt_arch_qwen3, "qwen3", "Qwen3ForCausalLM", "qwen3", qwen3_to_hf);
LLAMA_ENTRY(zt_arch_mistral, "mistral", "MistralForCausalLM", "mistral", mistral_to_hf);
LLAMA_ENTRY(zt_arch_gemma3, "gemma3", "Gemma3ForCausalLM", "gemma3_text", gemma3_to_hf);

static int variant_of(const zt_arch_t *a)
{
    return a == &zt_arch_qwen2     ? V_QWEN2
           : a == &zt_arch_qwen3   ? V_QWEN3
           : a == &zt_arch_mistral ? V_MISTRAL
           : a == &zt_arch_gemma3  ? V_GEMMA3
                                   : V_LLAMA;
}
