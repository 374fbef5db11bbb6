/* zt_qlora.c — QLoRA's 4-bit base in the parameter table (zt_qlora.h). */
#include "zt_qlora.h"

#include <stdio.h>
#include <string.h>

#include "zt_common.h"
#include "zt_lora.h"

int zt_qlora_apply(zt_param_table_t *t, const zt_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->model.quantization_bit != 4) return 0;
    t->quant_type = strcmp(cfg->model.quantization_type, "fp4") == 0 ? ZT_QUANT_FP4 : ZT_QUANT_NF4;
    t->quant_nested = cfg->model.double_quantization;
    t->quant_blocksize = ZT_QLORA_BLOCKSIZE;
    t->quant_stored = cfg->model_prequantized;
    t->quant_bytewise = cfg->train.bf16;
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        char mod[64];
        zt_lora_module_name(p, mod, sizeof mod);
        if (!mod[0] || p->adapter) continue; /* the base's linears, not their adapters */
        if (p->wlayout != ZT_W_OUT_IN)
            return zt_err(err, errlen, "model.quantization_bit = 4: %s is a Conv1D (in, out) weight; the 4-bit base "
                                       "is implemented for nn.Linear families (llama, qwen2, qwen3, mistral, gemma3)",
                          p->name);
        /* the region's floats (bytes under bf16), rounded up to whole rows: the per_param layout
         * shards by rows */
        const size_t bytes = zt_quant4_region_bytes((int64_t)p->numel, t->quant_blocksize, t->quant_nested, NULL);
        if (bytes > 4 * p->numel) /* zt_quant4_pack_region writes the region over the values */
            return zt_err(err, errlen, "model.quantization_bit = 4: %s (%zu values) is smaller than its 4-bit form",
                          p->name, p->numel);
        const size_t rows = (size_t)p->shape[0];
        p->quant = 1;
        p->numel = ZT_CEIL_DIV(t->quant_bytewise ? bytes : ZT_CEIL_DIV(bytes, sizeof(float)), rows) * rows;
    }
    zt_params_finish(t, t->nunits, t->root_unit, t->first_block_unit);
    return 0;
}

size_t zt_qlora_values(const zt_param_t *p)
{
    return (size_t)p->shape[0] * (p->ndim == 2 ? (size_t)p->shape[1] : 1);
}

int zt_qlora_count(const zt_param_table_t *t)
{
    int n = 0;
    for (int i = 0; i < t->nparams; i++) n += t->params[i].quant != 0;
    return n;
}

void zt_qlora_describe(const zt_param_table_t *t, char *buf, size_t len)
{
    size_t values = 0, floats = 0;
    for (int i = 0; i < t->nparams; i++)
        if (t->params[i].quant) values += zt_qlora_values(&t->params[i]), floats += t->params[i].numel;
    if (t->quant_bytewise)
        snprintf(buf, len, "%d block linears %s %s (%sblocks of %lld): %zu values in %zu bf16 elements, a byte "
                           "each (%.2f bytes a value), dequantized to bf16 before each GEMM",
                 zt_qlora_count(t), t->quant_stored ? "read 4-bit from the directory in" : "quantized at load to",
                 zt_quant_type_name((zt_quant_type_t)t->quant_type), t->quant_nested ? "double quantization, " : "",
                 (long long)t->quant_blocksize, values, floats, values ? 2.0 * (double)floats / (double)values : 0.0);
    else
        snprintf(buf, len, "%d block linears %s %s (%sblocks of %lld): %zu values in %zu floats "
                           "(%.2f bytes a value), dequantized to float32 before each GEMM; embeddings, norms and "
                           "lm_head float32",
                 zt_qlora_count(t), t->quant_stored ? "read 4-bit from the directory in" : "quantized at load to",
                 zt_quant_type_name((zt_quant_type_t)t->quant_type),
                 t->quant_nested ? "double quantization, " : "", (long long)t->quant_blocksize, values, floats,
                 values ? 4.0 * (double)floats / (double)values : 0.0);
}

int zt_qlora_quantize(const zt_param_table_t *t, int p, float *value, char *err, size_t errlen)
{
    const zt_param_t *q = &t->params[p];
    return zt_quant4_pack_region(q->name, (zt_quant_type_t)t->quant_type, t->quant_nested, t->quant_blocksize, value,
                                 (int64_t)zt_qlora_values(q), err, errlen);
}

void zt_qlora_split(const zt_param_table_t *t, const zt_param_t *p, zt_quant4_split_t *s)
{
    memset(s, 0, sizeof *s);
    if (p->tp_dim < 0) return;
    const int64_t bs = t->quant_blocksize, R = p->shape[0], C = p->shape[1];
    if (p->tp_dim == 0) { /* rows tp_goff[0].. of the (out, in) weight: one run of blocks */
        s->run_blocks = R * C / bs, s->first_block = p->tp_goff[0] * C / bs;
    } else { /* input columns tp_goff[0].. of every row */
        s->run_blocks = C / bs, s->stride_blocks = p->gshape[1] / bs, s->first_block = p->tp_goff[0] / bs;
    }
}

void zt_qlora_view(const zt_param_table_t *t, const zt_param_t *p, const float *w, zt_quant4_view_t *v)
{
    zt_quant4_split_t s;
    zt_qlora_split(t, p, &s);
    zt_quant4_region_view((zt_quant_type_t)t->quant_type, t->quant_nested, t->quant_blocksize, w,
                          (int64_t)zt_qlora_values(p), &s, v);
}

/* the GEMM a weight belongs to: q|k|v share one, gate|up one, every other its own */
static int gemm_group(zt_role_t r)
{
    if (r == ZT_ROLE_K || r == ZT_ROLE_V) return ZT_ROLE_Q;
    if (r == ZT_ROLE_UP) return ZT_ROLE_GATE;
    return r;
}

size_t zt_qlora_dequant_floats(const zt_param_table_t *t)
{
    size_t best = 0, run = 0;
    int prev_block = -2, prev_group = -1;
    for (int i = 0; i < t->nparams; i++) {
        const zt_param_t *p = &t->params[i];
        if (!p->quant) {
            prev_block = -2;
            continue;
        }
        const int g = gemm_group(p->role);
        run = (p->block == prev_block && g == prev_group ? run : 0) + zt_qlora_values(p);
        prev_block = p->block, prev_group = g;
        best = ZT_MAX(best, run);
    }
    return best;
}
