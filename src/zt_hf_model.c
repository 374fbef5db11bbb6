/* zt_hf_model.c — Hugging Face model directories for the model (zt_hf_model.h). */
#include "zt_hf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_common.h"
#include "zt_hf.h"
#include "zt_hf_bnb.h"
#include "zt_data.h"
#include "zt_lora.h"
#include "zt_qlora.h"
#include "zt_tokenizer.h"
#include "zt_safetensors.h"

/* model.* keys a config.json decides; one the input gave must agree with it */
static const char *const shape_keys[] = {
    "model.arch", "model.n_layer", "model.n_head", "model.n_kv_head", "model.n_embd", "model.head_dim",
    "model.intermediate_size", "model.vocab_size", "model.block_size", "model.rope_theta", "model.rms_norm_eps",
    "model.tie_word_embeddings", "model.attention_bias", "model.rope_type", "model.rope_factor",
    "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_position_embeddings",
    "model.sliding_window", "model.sliding_window_pattern", "model.rope_local_base_freq",
};

int zt_hf_model_resolve(zt_config_t *cfg, const char *config_text, const char *file, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loads(config_text, 0, &je);
    if (!j) return zt_err(err, errlen, "%s:%d:%d: %s", file, je.line, je.column, je.text);
    int rc = 0;
    const json_t *cls = json_array_get(json_object_get(j, "architectures"), 0);
    const json_t *mt = json_object_get(j, "model_type");
    const zt_arch_t *a = zt_arch_for_hf(json_string_value(cls), json_string_value(mt));
    zt_model_dims_t d;
    zt_quant_hf_t q = {0};
    if (!json_is_object(j)) {
        rc = zt_err(err, errlen, "%s: not a JSON object", file);
    } else if (!a) {
        rc = zt_err(err, errlen, "%s: unknown architecture %s / model_type %s (ztrain has %s)", file,
                    json_string_value(cls) ? json_string_value(cls) : "(none)",
                    json_string_value(mt) ? json_string_value(mt) : "(none)", zt_arch_names());
    } else {
        rc = a->dims_from_hf(j, file, &d, err, errlen);
        /* a pre-quantized directory (bitsandbytes 4-bit) decides the quantization keys; every
         * other quantization_config is refused here, naming the key */
        if (!rc) rc = zt_quant_hf_config(j, file, &q, err, errlen);
    }
    json_decref(j);
    if (rc) return -1;
    zt_config_t hf = *cfg;
    snprintf(hf.model.arch, sizeof hf.model.arch, "%s", a->name);
    a->dims_to_config(&d, &hf);
    if (q.quantized) {
        hf.model.quantization_bit = 4;
        snprintf(hf.model.quantization_type, sizeof hf.model.quantization_type, "%s", zt_quant_type_name(q.type));
        hf.model.double_quantization = q.double_quant;
    }
    for (size_t i = 0; i < sizeof shape_keys / sizeof *shape_keys + 3; i++) {
        static const char *const quant_keys[] = {"model.quantization_bit", "model.quantization_type",
                                                 "model.double_quantization"};
        const size_t ns = sizeof shape_keys / sizeof *shape_keys;
        const char *k = i < ns ? shape_keys[i] : quant_keys[i - ns];
        if (!zt_config_given(cfg, k)) continue;
        char mine[256], theirs[256];
        zt_config_value_text(cfg, k, mine, sizeof mine);
        zt_config_value_text(&hf, k, theirs, sizeof theirs);
        if (strcmp(mine, theirs) != 0)
            return zt_err(err, errlen, "%s = %s in the input disagrees with %s, which gives %s", k, mine, file,
                          theirs);
    }
    if (cfg->data.seq_len > d.maxT)
        return zt_err(err, errlen, "data.seq_len (%d) exceeds max_position_embeddings (%d) of %s", cfg->data.seq_len,
                      d.maxT, file);
    cfg->model = hf.model; /* hf began as a copy of cfg: its other keys are the input's */
    cfg->model_prequantized = q.quantized;
    /* the directory made this a QLoRA run: the rules that go with it (LoRA, float32, ...) */
    char why[ZT_ERRLEN];
    if (q.quantized && !zt_config_given(cfg, "model.quantization_bit") && zt_config_validate(cfg, why, sizeof why))
        return zt_err(err, errlen, "%.200s: its quantization_config makes the base 4-bit: %.300s", file, why);
    return 0;
}

/* ---- weights in ------------------------------------------------------------------------- */

static int is_adapter_param(const zt_param_table_t *t, const zt_param_t *p)
{
    return t->first_adapter_unit >= 0 && p->unit >= t->first_adapter_unit;
}

/* Tensors transformers drops on load without a word: we do the same. */
static int ignorable(const zt_param_table_t *t, const char *name)
{
    const size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    if (n >= k && strcmp(name + n - k, "rotary_emb.inv_freq") == 0) return 1;
    return t->dims.tied && strcmp(name, "lm_head.weight") == 0 && zt_param_table_find(t, name) < 0;
}

/* idx[p] = the directory's tensor for parameter p, shapes checked; every tensor used */
static int match_tensors(zt_hf_dir_t *d, const zt_param_table_t *t, int *idx, char *err, size_t errlen)
{
    zt_quant_hf_t qc;
    if (zt_quant_hf_config(zt_hf_config(d), zt_hf_config_path(d), &qc, err, errlen)) return -1;
    const int prequant = qc.quantized;
    for (int p = 0; p < t->nparams; p++) {
        const zt_param_t *q = &t->params[p];
        int ndim;
        int64_t shape[8];
        zt_st_dtype_t dt;
        const char *file = NULL;
        idx[p] = -1;
        if (is_adapter_param(t, q)) continue; /* LoRA's adapters are not the model's */
        idx[p] = zt_hf_find(d, q->name, &ndim, shape, &dt, &file);
        if (idx[p] >= 0 && zt_hf_bnb_stored(d, q->name)) {
            /* bitsandbytes' packed bytes: their quant_state gives the shape (zt_hf_bnb_read) */
            if (!q->quant)
                return zt_err(err, errlen, "%s: tensor %s is stored 4-bit (bitsandbytes); ztrain's 4-bit base is "
                                           "the blocks' linears", file, q->name);
            if (!prequant)
                return zt_err(err, errlen, "%s: tensor %s is stored 4-bit (bitsandbytes) but %s has no "
                                           "quantization_config", file, q->name, zt_hf_config_path(d));
            continue;
        }
        if (idx[p] >= 0 && q->quant && prequant)
            return zt_err(err, errlen, "%s: tensor %s is not stored 4-bit though config.json's quantization_config "
                                       "says the base is (llm_int8_skip_modules?): ztrain's 4-bit base is every "
                                       "linear of the blocks", file, q->name);
        if (idx[p] < 0)
            return zt_err(err, errlen, "%s: missing tensor %s (%s %s needs it)", zt_hf_path(d), q->name,
                          t->arch->hf_class, "as configured");
        int same = ndim == q->ndim && shape[0] == q->shape[0] && (ndim < 2 || shape[1] == q->shape[1]);
        if (!same) {
            char have[96] = "(";
            for (int k = 0; k < ndim && k < 8; k++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", k ? ", " : "", (long long)shape[k]);
            strncat(have, ")", sizeof have - strlen(have) - 1);
            char want[64];
            if (q->ndim == 1) snprintf(want, sizeof want, "(%lld)", (long long)q->shape[0]);
            else snprintf(want, sizeof want, "(%lld, %lld)", (long long)q->shape[0], (long long)q->shape[1]);
            return zt_err(err, errlen, "%s: tensor %s has shape %s, config.json implies %s", file, q->name, have, want);
        }
    }
    for (int i = 0; i < zt_hf_ntensors(d); i++) {
        const char *n = zt_hf_tensor_name(d, i);
        char w[256];
        /* a 4-bit weight's absmax, quant_map, quant_state, ...: read with the weight */
        const int part_of = zt_hf_bnb_weight_of(n, w, sizeof w) ? zt_param_table_find(t, w) : -1;
        if (part_of >= 0 && t->params[part_of].quant) continue;
        if (zt_param_table_find(t, n) < 0 && !ignorable(t, n))
            return zt_err(err, errlen, "%s: unexpected tensor %s (not part of %s as config.json describes it)",
                          zt_hf_path(d), n, t->arch->hf_class);
    }
    return 0;
}

/* An integer OR over the exponent fields (vectorizes, unlike a float test with an early
 * exit): the scan costs a fifth of a warm load otherwise. */
static int all_finite(const float *x, size_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
    return !bad;
}

int zt_hf_model_read_4bit(zt_hf_dir_t *d, const zt_param_table_t *t, int p, float *w, char *err, size_t errlen)
{
    const zt_param_t *q = &t->params[p];
    if (zt_hf_bnb_stored(d, q->name))
        return zt_hf_bnb_read(d, q->name, q->shape[0], q->shape[1], (zt_quant_type_t)t->quant_type, t->quant_nested,
                              t->quant_blocksize, w, err, errlen);
    const char *file = NULL;
    const int k = zt_hf_find(d, q->name, NULL, NULL, NULL, &file);
    char e[ZT_ERRLEN];
    if (zt_hf_read(d, k, 0, zt_qlora_values(q), w, err, errlen)) return -1;
    /* a NaN or an infinity is refused, naming the element */
    return zt_qlora_quantize(t, p, w, e, sizeof e) ? zt_err(err, errlen, "%s: %s", file, e) : 0;
}

/* A 4-bit weight (zt_qlora.h) is read whole, as bitsandbytes quantizes it: a rank that holds
 * part of its 4-bit form reads all of the tensor and keeps its own floats of that form (the
 * engine's gathers put it together again, byte for byte). Under tp (lt: this tp rank's table)
 * that form is the rank's share of the blocks (zt_quant4_region_split), cut from the whole. */
static int quantize_seg(zt_hf_dir_t *d, const zt_param_table_t *t, const zt_param_table_t *lt, const zt_io_seg_t *g,
                        char *e, size_t el)
{
    const zt_param_t *q = &t->params[g->param];
    float *w = zt_malloc(ZT_MAX(zt_qlora_values(q), q->numel) * sizeof *w);
    int rc = zt_hf_model_read_4bit(d, t, g->param, w, e, el);
    if (!rc && lt) {
        const zt_param_t *lq = &lt->params[g->param];
        float *share = zt_calloc(lq->numel, sizeof *share);
        zt_quant4_view_t v;
        zt_quant4_split_t sp;
        zt_qlora_view(t, q, w, &v);
        zt_qlora_split(lt, lq, &sp);
        zt_quant4_region_split(&v, &sp, (int64_t)zt_qlora_values(lq), share);
        free(w);
        w = share;
    }
    if (!rc && t->quant_bytewise) { /* a 16-bit working copy: a byte of the form an element (zt_qlora.h) */
        const uint8_t *b = (const uint8_t *)w;
        for (size_t k = 0; k < g->len; k++) g->value[k] = (float)b[g->start + k];
    } else if (!rc) {
        memcpy(g->value, w + g->start, g->len * sizeof *w);
    }
    free(w);
    return rc;
}

/* A run of the tensor's blocks [g0, g1) (values [g0 bs, min(g1 bs, N))) read from the directory
 * and quantized: their packed bytes and absmax (the tensor's tail block where the run reaches
 * it). A NaN or infinity is refused, naming its element in the tensor. */
static int quantize_blocks(zt_hf_dir_t *d, int k, const zt_param_table_t *t, const zt_param_t *q, int64_t g0,
                           int64_t g1, uint8_t *packed, float *absmax, double *got, char *e, size_t el)
{
    const int64_t bs = t->quant_blocksize, N = (int64_t)zt_qlora_values(q);
    const int64_t e0 = g0 * bs, n = ZT_MIN(g1 * bs, N) - e0;
    if (n <= 0) return 0;
    *got += 4.0 * (double)n;
    float *x = zt_malloc((size_t)n * sizeof *x);
    const char *file = NULL;
    zt_hf_find(d, q->name, NULL, NULL, NULL, &file);
    int rc = zt_hf_read(d, k, (size_t)e0, (size_t)n, x, e, el);
    for (int64_t i = 0; !rc && i < n; i++)
        if (!isfinite(x[i]))
            rc = zt_err(e, el, "%s: %s: element %" PRId64 " is %s: 4-bit quantization needs finite weights", file,
                        q->name, e0 + i, isnan(x[i]) ? "nan" : "inf");
    char e2[ZT_ERRLEN];
    if (!rc && zt_quant4_quantize(q->name, (zt_quant_type_t)t->quant_type, x, n, bs, packed, absmax, e2, sizeof e2))
        rc = zt_err(e, el, "%s: %s", file, e2);
    free(x);
    return rc;
}

/* 4-bit weight p quantized at load by the ranks that hold it (its pipeline rank's: the tp x data
 * ranks of one stage group, the world without a pipeline), each reading and quantizing only what
 * it needs: the absmax of a 1/W share of the tensor's blocks (W those ranks; summed over them
 * into all of the blocks: the nested offset is a mean over every block), then the double
 * quantization of those (a few bytes a block, on each of them), then the packed codes of the
 * blocks under this rank's own segments of its region (the tp share's, lt non-NULL, or the whole
 * tensor's). No rank holds more of the weight in float32 than its share of the blocks or of its
 * segments, and another pipeline rank's weight not at all. Collective over those ranks: each
 * calls it for every 4-bit weight its stages hold, in table order, even after an error (failed:
 * set, then nothing is read). Bit-identical to quantizing the whole tensor. */
static int quantize_owned(zt_hf_dir_t *d, int k, const zt_param_table_t *t, const zt_param_table_t *lt, int p,
                          const zt_io_seg_t *segs, int nseg, zt_comm_t *comm, int failed, double *got, char *e,
                          size_t el)
{
    const zt_param_t *q = &t->params[p], *lq = lt ? &lt->params[p] : q;
    const int64_t bs = t->quant_blocksize, N = (int64_t)zt_qlora_values(q), NB = ZT_CEIL_DIV(N, bs);
    /* this rank among its pipeline rank's: tp innermost (zt_comm_create_mesh) */
    const int W = comm->tp.size * comm->data.size, r = comm->tp.rank + comm->tp.size * comm->data.rank;
    const int nested = t->quant_nested;
    const zt_quant_type_t type = (zt_quant_type_t)t->quant_type;
    /* 1. the absmax of every block: each rank its share, summed (the others' are zeros) */
    float *absmax = zt_calloc((size_t)NB, sizeof *absmax);
    const int64_t b0 = NB * r / W, b1 = NB * (r + 1) / W;
    uint8_t *mine = zt_malloc((size_t)((b1 - b0) * bs + 1) / 2 + 1); /* their packed codes, kept */
    int rc = failed ? -1 : quantize_blocks(d, k, t, q, b0, b1, mine, absmax + b0, got, e, el);
    /* over the data ranks, then the tp ranks: the pipeline rank's W */
    zt_allreduce(comm, &comm->data, ZT_IN_PLACE, absmax, (size_t)NB, ZT_F32, ZT_SUM);
    if (comm->tp.size > 1) zt_allreduce(comm, &comm->tp, ZT_IN_PLACE, absmax, (size_t)NB, ZT_F32, ZT_SUM);
    /* 2. the scales as the region stores them */
    uint8_t *codes = nested ? zt_malloc((size_t)NB) : NULL;
    float *nabs = nested ? zt_malloc((size_t)ZT_CEIL_DIV(NB, ZT_QUANT_NESTED_BLOCKSIZE) * sizeof *nabs) : NULL;
    zt_quant4_view_t v = {.type = type, .numel = N, .blocksize = bs, .nested = nested, .absmax = absmax,
                          .nested_blocksize = ZT_QUANT_NESTED_BLOCKSIZE};
    if (nested) {
        zt_quant4_double_quant(absmax, NB, 1, codes, nabs, &v.offset);
        v.absmax = NULL, v.absmax_codes = codes, v.nested_absmax = nabs;
    }
    zt_quant4_split_t sp;
    zt_qlora_split(lt ? lt : t, lq, &sp);
    const int64_t ln = (int64_t)zt_qlora_values(lq), lnb = ZT_CEIL_DIV(ln, bs);
    float *region = zt_calloc(lq->numel, sizeof(float));
    zt_quant4_region_split(&v, &sp, ln, region);
    /* 3. the packed codes under this rank's segments: runs of consecutive blocks of the tensor */
    const size_t P0 = (size_t)zt_quant4_region_floats(lnb, nested, &sp) * sizeof(float) + (nested ? (size_t)lnb : 0);
    uint8_t *packed = (uint8_t *)region + P0;
    const size_t esz = t->quant_bytewise ? 1 : sizeof(float); /* the region's bytes an element */
    for (int i = 0; i < nseg && !rc; i++) {
        if (segs[i].param != p) continue;
        const size_t lo = ZT_MAX(segs[i].start * esz, P0), hi = ZT_MIN((segs[i].start + segs[i].len) * esz,
                                                                       P0 + (size_t)(ln + 1) / 2);
        if (lo >= hi) continue;
        int64_t lb = (int64_t)(2 * (lo - P0)) / bs;
        const int64_t le = ZT_CEIL_DIV((int64_t)(2 * (hi - P0)), bs);
        while (lb < le && !rc) {
            /* the longest run from lb whose blocks follow each other in the tensor too, and lie
             * all inside or all outside this rank's share of step 1 (quantized there already) */
            int64_t run = 1;
            const int64_t g0 = zt_quant4_global_block(&sp, lb), in = g0 >= b0 && g0 < b1;
            const int64_t lim = in ? b1 : g0 < b0 ? b0 : NB;
            while (lb + run < le && g0 + run < lim && zt_quant4_global_block(&sp, lb + run) == g0 + run) run++;
            const int64_t nvals = ZT_MIN((lb + run) * bs, ln) - lb * bs;
            if (in) {
                memcpy(packed + lb * bs / 2, mine + (g0 - b0) * bs / 2, (size_t)(nvals + 1) / 2);
            } else {
                uint8_t *pk = zt_malloc((size_t)(run * bs + 1) / 2);
                float *am = zt_malloc((size_t)run * sizeof *am);
                rc = quantize_blocks(d, k, t, q, g0, g0 + run, pk, am, got, e, el);
                if (!rc) memcpy(packed + lb * bs / 2, pk, (size_t)(nvals + 1) / 2);
                free(pk);
                free(am);
            }
            lb += run;
        }
    }
    /* 4. this rank's segments out of the region */
    for (int i = 0; i < nseg && !rc; i++) {
        const zt_io_seg_t *g = &segs[i];
        if (g->param != p) continue;
        if (t->quant_bytewise)
            for (size_t j = 0; j < g->len; j++) g->value[j] = (float)((const uint8_t *)region)[g->start + j];
        else
            memcpy(g->value, region + g->start, g->len * sizeof *region);
    }
    free(region);
    free(mine);
    free(absmax);
    free(codes);
    free(nabs);
    return rc;
}

/* This tp rank's table when tp splits a 4-bit base (its shares are cut at load), else NULL */
static zt_param_table_t *tp_table_4bit(const zt_param_table_t *t, zt_comm_t *comm)
{
    if (comm->mesh_tp <= 1 || !zt_qlora_count(t)) return NULL;
    char e[ZT_ERRLEN];
    zt_param_table_t *lt = zt_params_tp_local(t, comm->mesh_tp, comm->tp.rank, e, sizeof e);
    if (!lt) zt_fatal("%s", e); /* the run built this very table before */
    return lt;
}

int zt_hf_model_load(const char *dir, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm, double *bytes,
                     char *err, size_t errlen)
{
    char e[ZT_ERRLEN] = "";
    zt_hf_dir_t *d = zt_hf_open(dir, e, sizeof e);
    int *idx = zt_calloc((size_t)t->nparams, sizeof *idx);
    int rc = d ? match_tensors(d, t, idx, e, sizeof e) : -1;
    if (zt_agree_error(comm, rc, e, sizeof e)) {
        zt_hf_close(d);
        free(idx);
        return zt_err(err, errlen, "%s", e);
    }
    zt_io_seg_t *segs = NULL;
    const int n = zt_shard_io_segments(s, 0, &segs);
    zt_param_table_t *lt = tp_table_4bit(t, comm);
    double got = 0;
    for (int i = 0; i < n && !rc; i++) {
        const zt_io_seg_t *g = &segs[i];
        if (idx[g->param] < 0) continue;
        if (t->params[g->param].quant && !t->quant_stored) continue; /* below, each rank its blocks */
        if (t->params[g->param].quant) {
            rc = quantize_seg(d, t, lt, g, e, sizeof e);
            got += 4.0 * (double)(t->quant_stored ? t->params[g->param].numel : zt_qlora_values(&t->params[g->param]));
            continue;
        }
        rc = zt_hf_read(d, idx[g->param], g->start, g->len, g->value, e, sizeof e);
        for (size_t k = rc || all_finite(g->value, g->len) ? g->len : 0; k < g->len && !rc; k++)
            if (!isfinite(g->value[k]))
                rc = zt_err(e, sizeof e, "%s: tensor %s: element %zu is %g", dir, t->params[g->param].name,
                            g->start + k, (double)g->value[k]);
        got += 4.0 * (double)g->len;
    }
    if (!t->quant_stored)
        for (int p = 0; p < t->nparams; p++)
            if (t->params[p].quant && zt_shard_holds(s, t->params[p].unit)) {
                const int r2 = quantize_owned(d, idx[p], t, lt, p, segs, n, comm, rc, &got, e, sizeof e);
                if (!rc) rc = r2;
            }
    zt_shard_io_done(s, segs, n, rc ? 0 : 1);
    if (lt) zt_param_table_free(lt);
    zt_hf_close(d);
    free(idx);
    if (zt_agree_error(comm, rc, e, sizeof e)) return zt_err(err, errlen, "%s", e);
    zt_shard_after_load(s);
    if (bytes) *bytes = zt_sum_double(comm, &comm->world, got);
    return 0;
}

/* ---- weights out ------------------------------------------------------------------------- */

struct zt_hf_export {
    char outdir[ZT_STRLEN], tmp[ZT_STRLEN + 8];
    zt_hf_writer_t *w;
    zt_comm_t *comm;
    int writer;             /* this process creates and renames */
    int adapter;            /* a PEFT adapter directory, not a model */
    const zt_param_table_t *t;
    int *widx;              /* (nparams) the writer's tensor of each parameter, -1: not exported */
};



static int write_json(const char *path, json_t *j, char *err, size_t errlen)
{
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    return rc ? zt_err(err, errlen, "%s: cannot write", path) : 0;
}

static int copy_file(const char *from, const char *to, char *err, size_t errlen)
{
    size_t n;
    char *buf = zt_read_file(from, &n, err, errlen);
    if (!buf) return -1;
    FILE *f = fopen(to, "wb");
    int rc = !f || fwrite(buf, 1, n, f) != n;
    if (f && fclose(f)) rc = 1;
    free(buf);
    return rc ? zt_err(err, errlen, "%s: cannot write: %s", to, strerror(errno)) : 0;
}

/* The token ids of the source's config.json, if any */
static void copy_ids(json_t *dst, const char *source_dir)
{
    if (!source_dir || !source_dir[0]) return;
    char p[ZT_STRLEN + 32];
    snprintf(p, sizeof p, "%s/config.json", source_dir);
    json_t *src = json_load_file(p, 0, NULL);
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (size_t i = 0; src && i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(src, keys[i]);
        if (v) json_object_set(dst, keys[i], v);
    }
    json_decref(src);
}

/* The target_modules entry of block 0's adapted linear q: its module name when every
 * linear of that name has an adapter (GPT-2's "c_proj": attn.c_proj and mlp.c_proj),
 * else parent.name ("attn.c_proj"), which PEFT's suffix match takes alone. */
static void target_name(const zt_param_table_t *t, const zt_param_t *q, char *buf, size_t len)
{
    char mod[64], other[64];
    zt_lora_module_name(q, mod, sizeof mod);
    int all = 1;
    for (int p = 0; p < t->nparams; p++) {
        zt_lora_module_name(&t->params[p], other, sizeof other);
        all &= t->params[p].block != 0 || strcmp(other, mod) || t->params[p].lora_a >= 0;
    }
    /* the last one or two parts of q->name = ...parent.mod.weight before ".weight" */
    const char *end = strrchr(q->name, '.'), *b = end;
    for (int dots = all ? 1 : 2; b > q->name; b--)
        if (b[-1] == '.' && --dots == 0) break;
    snprintf(buf, len, "%.*s", (int)(end - b), b);
}

/* adapter_config.json as PEFT writes it for a LoRA of t; fan_in_fan_out is true for
 * Conv1D (in, out) bases, as PEFT sets it for GPT-2 */
static json_t *adapter_config(const zt_param_table_t *t, const char *base)
{
    json_t *targets = json_array();
    int conv1d = 0;
    for (int p = 0; p < t->nparams; p++) {
        const zt_param_t *q = &t->params[p];
        char name[96];
        if (q->block != 0 || q->lora_a < 0) continue;
        target_name(t, q, name, sizeof name);
        conv1d |= q->wlayout == ZT_W_IN_OUT;
        int seen = 0;
        for (size_t i = 0; i < json_array_size(targets); i++)
            seen |= !strcmp(json_string_value(json_array_get(targets, i)), name);
        if (!seen) json_array_append_new(targets, json_string(name));
    }
    const double alpha = (double)t->lora_scale * t->lora_rank; /* rsLoRA is written as such below */
    return json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:s, s:b, s:b, s:b, s:b, s:n, s:b, s:{}, s:{}}",
                     "peft_type", "LORA", "task_type", "CAUSAL_LM", "r", t->lora_rank, "lora_alpha", alpha,
                     "lora_dropout", t->lora_dropout, "target_modules", targets, "base_model_name_or_path",
                     base ? base : "",
                     "bias", "none", "fan_in_fan_out", conv1d, "inference_mode", 1, "use_rslora", 0, "use_dora", 0,
                     "modules_to_save", "init_lora_weights", 1, "rank_pattern", "alpha_pattern");
}

static int make_files(zt_hf_export_t *x, const char *dtype, const char *source_dir, int eos, char *err, size_t errlen)
{
    zt_rm_rf(x->tmp);
    if (zt_mkdir_p(x->tmp, err, errlen)) return -1;
    if (zt_hf_writer_create_files(x->w, err, errlen)) return -1;
    const zt_param_table_t *t = x->t;
    if (x->adapter) {
        char p[ZT_STRLEN + 64];
        snprintf(p, sizeof p, "%s/adapter_config.json", x->tmp);
        json_t *a = adapter_config(t, source_dir);
        const int rc = write_json(p, a, err, errlen);
        json_decref(a);
        return rc;
    }
    json_t *cfg = t->arch->dims_to_hf(&t->dims);
    json_object_set_new(cfg, "torch_dtype", json_string(strcmp(dtype, "bf16") ? "float32" : "bfloat16"));
    json_object_set_new(cfg, "dtype", json_string(strcmp(dtype, "bf16") ? "float32" : "bfloat16"));
    if (eos >= 0) {
        json_object_set_new(cfg, "eos_token_id", json_integer(eos));
        json_object_set_new(cfg, "bos_token_id", json_integer(eos));
    }
    copy_ids(cfg, source_dir);
    char p[ZT_STRLEN + 64], q[ZT_STRLEN + 64];
    snprintf(p, sizeof p, "%s/config.json", x->tmp);
    int rc = write_json(p, cfg, err, errlen);
    json_t *gen = json_object();
    json_object_set_new(gen, "_from_model_config", json_true());
    static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        if (json_object_get(cfg, ids[i])) json_object_set(gen, ids[i], json_object_get(cfg, ids[i]));
    json_decref(cfg);
    snprintf(p, sizeof p, "%s/generation_config.json", x->tmp);
    snprintf(q, sizeof q, "%s/generation_config.json", source_dir ? source_dir : "");
    struct stat st;
    if (!rc) rc = source_dir && source_dir[0] && stat(q, &st) == 0 ? copy_file(q, p, err, errlen)
                                                               : write_json(p, gen, err, errlen);
    json_decref(gen);
    /* the tokenizer travels with the model, as save_pretrained of a pipeline does */
    static const char *const tok[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                      "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                                      "chat_template.jinja"};
    for (size_t i = 0; !rc && source_dir && source_dir[0] && i < sizeof tok / sizeof *tok; i++) {
        snprintf(q, sizeof q, "%s/%s", source_dir, tok[i]);
        snprintf(p, sizeof p, "%s/%s", x->tmp, tok[i]);
        if (stat(q, &st) == 0) rc = copy_file(q, p, err, errlen);
    }
    /* ztrain's own byte-level tokenizer (vocabulary 257, end-of-text 256) travels as a
     * tokenizer.json too, so the directory is complete for AutoTokenizer and pipelines */
    snprintf(p, sizeof p, "%s/tokenizer.json", x->tmp);
    if (!rc && stat(p, &st) != 0 && t->dims.V == ZT_BYTE_VOCAB && eos == ZT_BYTE_EOT) {
        rc = zt_tokenizer_write_byte_level_json(p, eos, err, errlen);
        json_t *tc = json_pack("{s:s, s:s, s:s, s:s, s:i}", "tokenizer_class", "PreTrainedTokenizerFast", "eos_token",
                               "<|endoftext|>", "bos_token", "<|endoftext|>", "unk_token", "<|endoftext|>",
                               "model_max_length", t->dims.maxT);
        snprintf(p, sizeof p, "%s/tokenizer_config.json", x->tmp);
        if (!rc) rc = write_json(p, tc, err, errlen);
        json_decref(tc);
    }
    return rc;
}

static int agree(zt_comm_t *comm, int rc, char *err, size_t errlen)
{
    return comm ? zt_agree_error(comm, rc, err, errlen) : rc;
}

zt_hf_export_t *zt_hf_export_begin(const char *outdir, const zt_param_table_t *t, int adapter, const char *dtype,
                                   int64_t max_shard_bytes, const char *source_dir, int eos_token_id,
                                   zt_comm_t *comm, char *err, size_t errlen)
{
    zt_hf_export_t *x = zt_calloc(1, sizeof *x);
    snprintf(x->outdir, sizeof x->outdir, "%s", outdir);
    snprintf(x->tmp, sizeof x->tmp, "%s.tmp", outdir);
    x->comm = comm;
    x->t = t;
    x->adapter = adapter;
    x->writer = !comm || comm->world.rank == 0;
    x->widx = zt_calloc((size_t)t->nparams, sizeof *x->widx);
    zt_hf_out_tensor_t *ot = zt_calloc((size_t)t->nparams, sizeof *ot);
    int n = 0;
    for (int p = 0; p < t->nparams; p++) {
        const zt_param_t *q = &t->params[p];
        x->widx[p] = -1;
        if (is_adapter_param(t, q) != adapter) continue;
        /* PEFT's keys: base_model.model. + the module path */
        snprintf(ot[n].name, sizeof ot[n].name, "%s%s", adapter ? "base_model.model." : "", q->name);
        ot[n].ndim = q->ndim;
        ot[n].shape[0] = q->shape[0];
        ot[n].shape[1] = q->shape[1];
        x->widx[p] = n++;
    }
    char e[ZT_ERRLEN] = "";
    x->w = n ? zt_hf_writer_plan(x->tmp, ot, n, strcmp(dtype, "bf16") ? ZT_ST_F32 : ZT_ST_BF16,
                                 (uint64_t)max_shard_bytes, e, sizeof e)
             : NULL;
    if (!n) zt_err(e, sizeof e, "%s: nothing to export (no %s)", outdir, adapter ? "adapters" : "model weights");
    free(ot);
    int rc = x->w ? 0 : -1;
    if (!rc && x->writer) rc = make_files(x, dtype, source_dir, eos_token_id, e, sizeof e);
    if (agree(comm, rc, e, sizeof e)) {
        if (x->writer) zt_rm_rf(x->tmp);
        if (x->w) zt_hf_writer_close(x->w, NULL, 0);
        free(x->widx);
        free(x);
        zt_err(err, errlen, "%s", e);
        return NULL;
    }
    return x;
}

int zt_hf_export_write(zt_hf_export_t *x, int p, size_t start, size_t n, const float *v, char *err, size_t errlen)
{
    return x->widx[p] < 0 ? 0 : zt_hf_writer_write(x->w, x->widx[p], start, n, v, err, errlen);
}

int zt_hf_export_finish(zt_hf_export_t *x, int ok, char *err, size_t errlen)
{
    char e[ZT_ERRLEN] = "";
    int rc = ok ? 0 : -1;
    if (!ok) snprintf(e, sizeof e, "%.400s: export abandoned", x->outdir);
    if (zt_hf_writer_close(x->w, e, sizeof e) && !rc) rc = -1;
    rc = agree(x->comm, rc, e, sizeof e);
    if (x->writer && !rc && x->adapter) {
        /* PEFT's file name (the writer names a single shard model.safetensors) */
        char a[ZT_STRLEN + 64], b[ZT_STRLEN + 64];
        snprintf(a, sizeof a, "%s/model.safetensors", x->tmp);
        snprintf(b, sizeof b, "%s/adapter_model.safetensors", x->tmp);
        if (rename(a, b) != 0) rc = zt_err(e, sizeof e, "%s: cannot rename to %s: %s", a, b, strerror(errno));
    }
    if (x->writer) {
        if (!rc) {
            /* the old directory goes only once the new one is complete */
            char old[ZT_STRLEN + 8];
            snprintf(old, sizeof old, "%s.old", x->outdir);
            zt_rm_rf(old);
            struct stat st;
            const int had = stat(x->outdir, &st) == 0;
            if (had && rename(x->outdir, old) != 0)
                rc = zt_err(e, sizeof e, "%s: cannot move aside: %s", x->outdir, strerror(errno));
            if (!rc && rename(x->tmp, x->outdir) != 0)
                rc = zt_err(e, sizeof e, "%s: cannot rename to %s: %s", x->tmp, x->outdir, strerror(errno));
            if (!rc && had) zt_rm_rf(old);
            if (!rc) {
                char parent[ZT_STRLEN + 8];
                snprintf(parent, sizeof parent, "%s/..", x->outdir);
                zt_fsync_path(parent);
            }
        }
        if (rc) zt_rm_rf(x->tmp);
    }
    rc = agree(x->comm, rc, e, sizeof e);
    free(x->widx);
    free(x);
    return rc ? zt_err(err, errlen, "%s", e) : 0;
}

/* Every adapter value on every rank (the write segments are disjoint across the world,
 * so a sum of zero-filled buffers is the whole): small beside the base. */
static float *all_adapters(zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm, size_t *offs)
{
    size_t total = 0;
    for (int p = 0; p < t->nparams; p++) {
        offs[p] = total;
        if (is_adapter_param(t, &t->params[p])) total += t->params[p].numel;
    }
    float *all = zt_calloc(total ? total : 1, sizeof *all);
    zt_io_seg_t *segs = NULL;
    const int n = zt_shard_io_segments(s, 1, &segs);
    for (int i = 0; i < n; i++)
        if (is_adapter_param(t, &t->params[segs[i].param]))
            memcpy(all + offs[segs[i].param] + segs[i].start, segs[i].value, segs[i].len * sizeof(float));
    zt_shard_io_done(s, segs, n, 0);
    if (total) zt_allreduce(comm, &comm->world, ZT_IN_PLACE, all, total, ZT_F32, ZT_SUM);
    return all;
}

/* v[k] (element start + k of base weight q) += scale * (B A)[o, i]: q is (out, in), or
 * Conv1D's (in, out), where PEFT adds the transpose (fan_in_fan_out) */
void zt_hf_lora_merge(const zt_param_table_t *t, int p, const float *all, const size_t *offs, size_t start, size_t n,
                      float *v)
{
    const zt_param_t *q = &t->params[p];
    if (q->lora_a < 0) return;
    const int r = t->lora_rank, conv1d = q->wlayout == ZT_W_IN_OUT;
    const size_t cols = (size_t)q->shape[1], in = conv1d ? (size_t)q->shape[0] : cols;
    const float *A = all + offs[q->lora_a], *B = all + offs[q->lora_b]; // (r, in), (out, r)
    for (size_t k = 0; k < n; k++) {
        const size_t row = (start + k) / cols, col = (start + k) % cols;
        const size_t o = conv1d ? col : row, i = conv1d ? row : col;
        float acc = 0.0f;
        for (int j = 0; j < r; j++) acc += B[o * r + j] * A[(size_t)j * in + i];
        v[k] += t->lora_scale * acc;
    }
}

/* A 4-bit weight in a model export: dequantized (bitsandbytes' dequantize_4bit, float32) with its
 * adapters merged, as the full-precision weight transformers reads. Its 4-bit form (under tp: this
 * tp rank's share) is put together on every rank that holds it first (each byte from the one rank
 * whose write segment holds it, zeros elsewhere: a byte-wise max over the data group, the ranks of
 * one tp position within the pipeline rank whose stage holds the weight; the world without tp
 * and pipelines), then each of those ranks writes its share of the rows, each run at its place in
 * the whole tensor. Collective over that group: each rank calls it for every 4-bit weight its
 * stages hold, in table order, even after an error. */
typedef struct {
    zt_hf_export_t *x;
    const zt_param_table_t *t;
    int p, rc;
    size_t e0;
    float *w;
    const float *all;
    const size_t *offs;
    char *e;
    size_t el;
} export_run_t;

static void export_run(void *arg, size_t gstart, size_t lstart, size_t len)
{
    export_run_t *a = arg;
    float *v = a->w + (lstart - a->e0);
    if (a->all) zt_hf_lora_merge(a->t, a->p, a->all, a->offs, gstart, len, v);
    if (!a->rc) a->rc = zt_hf_export_write(a->x, a->p, gstart, len, v, a->e, a->el);
}

static int export_4bit(zt_hf_export_t *x, const zt_param_table_t *t, const zt_param_table_t *lt, int p,
                       const zt_io_seg_t *segs, int n, const float *all, const size_t *offs, zt_comm_t *comm,
                       int failed, char *e, size_t el)
{
    const zt_param_t *q = &(lt ? lt : t)->params[p];
    zt_group_t *grp = &comm->data; /* the ranks of its pipeline rank at this tp position */
    uint8_t *region = zt_calloc(q->numel, sizeof(float));
    for (int i = 0; i < n; i++)
        if (segs[i].param != p) continue;
        else if (t->quant_bytewise) /* a byte an element (zt_qlora.h) */
            for (size_t k = 0; k < segs[i].len; k++) region[segs[i].start + k] = (uint8_t)segs[i].value[k];
        else
            memcpy(region + segs[i].start * sizeof(float), segs[i].value, segs[i].len * sizeof(float));
    zt_allreduce(comm, grp, ZT_IN_PLACE, region, q->numel * sizeof(float), ZT_U8, ZT_MAX);
    zt_quant4_view_t v;
    zt_qlora_view(lt ? lt : t, q, (const float *)(const void *)region, &v);
    const int64_t rows = q->shape[0], cols = q->shape[1], W = grp->size, r = grp->rank;
    const int64_t r0 = rows * r / W, r1 = rows * (r + 1) / W;
    const size_t e0 = (size_t)(r0 * cols), len = (size_t)((r1 - r0) * cols);
    float *w = zt_malloc((len ? len : 1) * sizeof *w);
    zt_quant4_dequantize(&v, (int64_t)e0, (int64_t)len, w);
    export_run_t a = {x, t, p, failed, e0, w, all, offs, e, el};
    if (!failed) zt_param_tp_runs(q, e0, len, export_run, &a); /* value coordinates: its shape's */
    free(w);
    free(region);
    return failed ? 0 : a.rc;
}

int zt_hf_model_save(const char *outdir, const zt_config_t *cfg, zt_shard_t *s, const zt_param_table_t *t,
                     int adapter, int eos_token_id, zt_comm_t *comm, double *seconds, char *err, size_t errlen)
{
    const double t0 = zt_now();
    const char *dtype = adapter ? "fp32" /* as PEFT saves adapters */
                        : cfg->checkpoint.hf_dtype == ZT_HF_DTYPE_AUTO
                            ? (cfg->train.bf16 ? "bf16" : "fp32")
                            : zt_config_enum_name("checkpoint.hf_dtype", cfg->checkpoint.hf_dtype);
    const int64_t max_shard = adapter ? INT64_MAX : zt_hf_parse_size(cfg->checkpoint.hf_max_shard_size);
    if (max_shard <= 0)
        return zt_err(err, errlen, "checkpoint.hf_max_shard_size: \"%s\" is not a size (\"5GB\", \"500MB\")",
                      cfg->checkpoint.hf_max_shard_size);
    /* a LoRA run's model export is the merged model: W + scale B A */
    const int merge = !adapter && t->first_adapter_unit >= 0;
    size_t *offs = merge ? zt_calloc((size_t)t->nparams, sizeof *offs) : NULL;
    float *all = merge ? all_adapters(s, t, comm, offs) : NULL;
    zt_hf_export_t *x = zt_hf_export_begin(outdir, t, adapter, dtype, max_shard, cfg->model.name_or_path,
                                           eos_token_id, comm, err, errlen);
    if (!x) {
        free(offs);
        free(all);
        return -1;
    }
    zt_io_seg_t *segs = NULL;
    /* every parameter: a LoRA run's frozen base too */
    const int n = zt_shard_io_view(s, ZT_IO_WRITE_ALL, &segs);
    char e[ZT_ERRLEN] = "";
    int rc = 0;
    float *tmp = NULL;
    size_t tmp_n = 0;
    for (int i = 0; i < n && !rc; i++) {
        const zt_io_seg_t *g = &segs[i];
        const zt_param_t *q = &t->params[g->param];
        const float *v = g->value;
        if (q->quant) continue; /* below, whole */
        if (merge && q->lora_a >= 0) {
            if (g->len > tmp_n) free(tmp), tmp = zt_malloc(g->len * sizeof *tmp), tmp_n = g->len;
            memcpy(tmp, g->value, g->len * sizeof *tmp);
            zt_hf_lora_merge(t, g->param, all, offs, g->start, g->len, tmp);
            v = tmp;
        }
        rc = zt_hf_export_write(x, g->param, g->start, g->len, v, e, sizeof e);
    }
    zt_param_table_t *lt = adapter ? NULL : tp_table_4bit(t, comm);
    for (int p = 0; p < t->nparams && !adapter; p++)
        if (t->params[p].quant && zt_shard_holds(s, t->params[p].unit)) {
            const int r2 = export_4bit(x, t, lt, p, segs, n, all, offs, comm, rc, e, sizeof e);
            if (!rc) rc = r2;
        }
    if (lt) zt_param_table_free(lt);
    free(tmp);
    free(offs);
    free(all);
    zt_shard_io_done(s, segs, n, 0);
    if (!rc) rc = zt_hf_export_finish(x, 1, e, sizeof e);
    else {
        char e2[ZT_ERRLEN];
        zt_hf_export_finish(x, 0, e2, sizeof e2);
    }
    if (seconds) *seconds = zt_now() - t0;
    return rc ? zt_err(err, errlen, "%s", e) : 0;
}

/* ---- adapters in ------------------------------------------------------------------------ */

int zt_hf_model_load_adapter(const char *dir, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm,
                             char *err, size_t errlen)
{
    char e[ZT_ERRLEN] = "", path[ZT_STRLEN + 64];
    int rc = 0;
    /* rank 0 checks the config against lora.*: a mismatch is one message on every rank */
    if (comm->world.rank == 0) {
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        json_error_t je;
        json_t *j = json_load_file(path, 0, &je);
        if (!j) {
            rc = zt_err(e, sizeof e, "%s: %s", path, je.text);
        } else {
            const json_t *rr = json_object_get(j, "r"), *al = json_object_get(j, "lora_alpha");
            const json_t *rs = json_object_get(j, "use_rslora");
            const double alpha = json_number_value(al);
            const double scale = alpha / (json_is_true(rs) ? sqrt((double)json_integer_value(rr)) : (double)json_integer_value(rr));
            if (!json_is_integer(rr) || json_integer_value(rr) != t->lora_rank)
                rc = zt_err(e, sizeof e, "%s: r = %lld, lora.rank is %d", path, (long long)json_integer_value(rr),
                            t->lora_rank);
            else if (!json_is_number(al) || fabs(scale - t->lora_scale) > 1e-6 * fabs(scale))
                rc = zt_err(e, sizeof e, "%s: lora_alpha %g (scale %g) disagrees with lora.alpha (scale %g)", path, alpha,
                            scale, (double)t->lora_scale);
            json_decref(j);
        }
    }
    if (zt_agree_error(comm, rc, e, sizeof e)) return zt_err(err, errlen, "%s", e);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    zt_st_file_t f;
    memset(&f, 0, sizeof f);
    rc = zt_st_open(path, &f, e, sizeof e);
    /* every adapter of the table must be there (PEFT's names), and nothing else */
    int *idx = zt_calloc((size_t)t->nparams, sizeof *idx);
    int used = 0;
    for (int p = 0; p < t->nparams && !rc; p++) {
        const zt_param_t *q = &t->params[p];
        idx[p] = -1;
        if (!is_adapter_param(t, q)) continue;
        char name[256];
        snprintf(name, sizeof name, "base_model.model.%s", q->name);
        idx[p] = zt_st_find(&f, name);
        if (idx[p] < 0) rc = zt_err(e, sizeof e, "%s: missing tensor %s", path, name);
        else if (f.tensors[idx[p]].numel != q->numel ||
                 f.tensors[idx[p]].shape[0] != q->shape[0])
            rc = zt_err(e, sizeof e, "%s: tensor %s has another shape than lora.rank and the model give", path, name);
        used++;
    }
    if (!rc && used != f.ntensors)
        rc = zt_err(e, sizeof e, "%s: %d tensors, the adapters of lora.target are %d (another target_modules?)", path,
                    f.ntensors, used);
    if (zt_agree_error(comm, rc, e, sizeof e)) {
        free(idx);
        if (f.fp) zt_st_close(&f);
        return zt_err(err, errlen, "%s", e);
    }
    zt_io_seg_t *segs = NULL;
    const int n = zt_shard_io_segments(s, 0, &segs);
    float *buf = NULL;
    for (int i = 0; i < n && !rc; i++) {
        const zt_io_seg_t *g = &segs[i];
        if (idx[g->param] < 0) continue;
        buf = realloc(buf, t->params[g->param].numel * sizeof *buf);
        if (!buf) zt_fatal("out of memory reading %s", path);
        rc = zt_st_read_f32(&f, idx[g->param], buf, e, sizeof e);
        if (!rc) memcpy(g->value, buf + g->start, g->len * sizeof *buf);
    }
    free(buf);
    free(idx);
    zt_st_close(&f);
    zt_shard_io_done(s, segs, n, rc ? 0 : 1);
    if (zt_agree_error(comm, rc, e, sizeof e)) return zt_err(err, errlen, "%s", e);
    zt_shard_after_load(s);
    return 0;
}
