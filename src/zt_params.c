/* zt_params.c — the parameter table and the counter-based initializer (zt_params.h). */
#define _GNU_SOURCE /* sincos */
#include "zt_params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_plan.h"
#include "zt_quant.h"

zt_param_table_t *zt_params_new(const struct zt_arch *arch, const zt_model_dims_t *d)
{
    zt_param_table_t *t = zt_calloc(1, sizeof *t);
    t->arch = arch;
    t->dims = *d;
    t->head_unit = -1;
    return t;
}

int zt_params_add(zt_param_table_t *t, const char *name, int ndim, int64_t d0, int64_t d1, int unit,
                  int block, int init, float std, zt_role_t role, zt_wlayout_t wlayout)
{
    if (t->nparams == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        zt_param_t *np = realloc(t->params, (size_t)t->cap * sizeof *np);
        if (!np) zt_fatal("out of memory growing the parameter table");
        t->params = np;
    }
    zt_param_t *p = &t->params[t->nparams];
    memset(p, 0, sizeof *p);
    if ((size_t)snprintf(p->name, sizeof p->name, "%s", name) >= sizeof p->name)
        zt_fatal("parameter name too long: %s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    p->unit = unit;
    p->block = block;
    p->decay = ndim >= 2;
    p->init = init;
    p->init_std = std;
    p->role = role;
    p->wlayout = ndim > 1 ? wlayout : ZT_W_NONE;
    p->lora_a = p->lora_b = -1;
    p->tp_dim = -1;
    p->tp_nblk = 1;
    p->tp_share = 1;
    p->gshape[0] = p->shape[0];
    p->gshape[1] = p->shape[1];
    p->gnumel = p->numel;
    return t->nparams++;
}

void zt_params_finish(zt_param_table_t *t, int nunits, int root_unit, int first_block_unit)
{
    /* callable again after more parameters (LoRA's adapter units) were added */
    free(t->unit_numel);
    free(t->unit_first);
    free(t->unit_count);
    free(t->unit_frozen);
    t->total_numel = 0;
    t->nunits = nunits;
    t->root_unit = root_unit;
    t->first_block_unit = first_block_unit;
    if (!t->lora_rank) t->first_adapter_unit = -1;
    t->unit_numel = zt_calloc((size_t)nunits, sizeof *t->unit_numel);
    t->unit_first = zt_calloc((size_t)nunits, sizeof *t->unit_first);
    t->unit_count = zt_calloc((size_t)nunits, sizeof *t->unit_count);
    t->unit_frozen = zt_calloc((size_t)nunits, sizeof *t->unit_frozen);
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        if (p->unit < 0 || p->unit >= nunits) zt_fatal("parameter %s in unit %d of %d", p->name, p->unit, nunits);
        /* a unit's parameters must be adjacent in the table: its buffer is their concatenation */
        if (t->unit_count[p->unit]++ == 0) {
            t->unit_first[p->unit] = i;
            t->unit_frozen[p->unit] = p->frozen;
        } else if (t->params[i - 1].unit != p->unit) {
            zt_fatal("parameter %s: unit %d is not contiguous", p->name, p->unit);
        } else if (p->frozen != t->unit_frozen[p->unit]) {
            zt_fatal("parameter %s: unit %d mixes frozen and trainable parameters", p->name, p->unit);
        }
        p->offset = t->unit_numel[p->unit];
        t->unit_numel[p->unit] += p->numel;
        t->total_numel += p->numel;
    }
}

void zt_param_table_free(zt_param_table_t *t)
{
    if (!t) return;
    free(t->params);
    free(t->unit_numel);
    free(t->unit_first);
    free(t->unit_count);
    free(t->unit_frozen);
    free(t);
}

zt_param_table_t *zt_params_trainable(const zt_param_table_t *t, int *map)
{
    zt_param_table_t *v = zt_params_new(t->arch, &t->dims);
    for (int p = 0; p < t->nparams; p++) {
        const zt_param_t *q = &t->params[p];
        map[p] = -1;
        if (q->frozen) continue;
        map[p] = zt_params_add(v, q->name, q->ndim, q->shape[0], q->shape[1], q->unit, q->block, q->init, q->init_std,
                               q->role, q->wlayout);
    }
    zt_params_finish(v, t->nunits, t->root_unit, t->first_block_unit);
    v->head_unit = t->head_unit;
    return v;
}

int zt_param_table_find(const zt_param_table_t *t, const char *name)
{
    for (int i = 0; i < t->nparams; i++)
        if (strcmp(t->params[i].name, name) == 0) return i;
    return -1;
}

const char *zt_role_name(zt_role_t r)
{
    static const char *const names[ZT_ROLE_N] = {
        [ZT_ROLE_EMBED] = "embed", [ZT_ROLE_POS_EMBED] = "pos_embed", [ZT_ROLE_NORM] = "norm",
        [ZT_ROLE_QKV] = "qkv",     [ZT_ROLE_Q] = "q",                 [ZT_ROLE_K] = "k",
        [ZT_ROLE_V] = "v",         [ZT_ROLE_O] = "o",                 [ZT_ROLE_GATE] = "gate",
        [ZT_ROLE_UP] = "up",       [ZT_ROLE_FC] = "fc",               [ZT_ROLE_DOWN] = "down",
        [ZT_ROLE_HEAD] = "head",
    };
    return r >= 0 && r < ZT_ROLE_N ? names[r] : "?";
}

/* ---- counter-based init ----------------------------------------------------
 * splitmix64 finalizer over (seed, hash(name), index): a pure function, so a
 * rank can produce any slice of any parameter without generating the rest. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* Box-Muller on pair j = idx / 2: both outputs are used (cos for even idx, sin for
 * odd), so each pair of elements costs one pair of hashes, one log and one sincos. */
static void normal_pair(uint64_t key, size_t j, double *z0, double *z1)
{
    uint64_t a = zt_splitmix64(key ^ zt_splitmix64(2 * (uint64_t)j));
    uint64_t b = zt_splitmix64(key ^ zt_splitmix64(2 * (uint64_t)j + 1));
    /* 53-bit uniforms; u1 in (0,1] so log is finite */
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    double r = sqrt(-2.0 * log(u1)), sn, cs;
    sincos(2.0 * M_PI * u2, &sn, &cs);
    *z0 = r * cs;
    *z1 = r * sn;
}

static float normal_at(uint64_t key, size_t idx)
{
    double z0, z1;
    normal_pair(key, idx / 2, &z0, &z1);
    return (float)(idx & 1 ? z1 : z0);
}

/* U(-b, b) from one 53-bit uniform per element */
static float uniform_at(uint64_t key, size_t idx, float b)
{
    const uint64_t a = zt_splitmix64(key ^ zt_splitmix64(~(uint64_t)idx));
    const double u = (double)(a >> 11) * (1.0 / 9007199254740992.0);
    return (float)((2.0 * u - 1.0) * b);
}

float zt_param_init_value(const zt_param_t *p, uint64_t seed, size_t idx)
{
    switch (p->init) {
    case ZT_INIT_ONES: return 1.0f;
    case ZT_INIT_ZEROS: return 0.0f;
    case ZT_INIT_UNIFORM: return uniform_at(zt_splitmix64(seed) ^ name_hash(p->name), idx, p->init_std);
    default: return p->init_std * normal_at(zt_splitmix64(seed) ^ name_hash(p->name), idx);
    }
}

static void init_global(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out);
typedef struct { const zt_param_t *p; uint64_t seed; float *out; size_t base; } init_run_t;
static void init_run(void *arg, size_t gstart, size_t lstart, size_t len)
{
    init_run_t *a = arg;
    init_global(a->p, a->seed, gstart, len, a->out + (lstart - a->base));
}

void zt_param_init_range(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out)
{
    if (p->tp_dim < 0) {
        init_global(p, seed, start, n, out);
        return;
    }
    init_run_t a = {p, seed, out, start};
    zt_param_tp_runs(p, start, n, init_run, &a);
}

static void init_global(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out)
{
    if (p->init == ZT_INIT_UNIFORM) {
        for (size_t i = 0; i < n; i++) out[i] = zt_param_init_value(p, seed, start + i);
        return;
    }
    if (p->init != ZT_INIT_NORMAL) {
        const float v = p->init == ZT_INIT_ONES ? 1.0f : 0.0f;
        for (size_t i = 0; i < n; i++) out[i] = v;
        return;
    }
    const uint64_t key = zt_splitmix64(seed) ^ name_hash(p->name);
    size_t i = 0;
    if (n && (start & 1)) { /* odd first element: second half of its pair */
        out[i++] = p->init_std * normal_at(key, start);
    }
    for (; i + 1 < n; i += 2) {
        double z0, z1;
        normal_pair(key, (start + i) / 2, &z0, &z1);
        out[i] = p->init_std * (float)z0;
        out[i + 1] = p->init_std * (float)z1;
    }
    if (i < n) out[i] = p->init_std * normal_at(key, start + i);
}


/* ---- tensor-parallel placement ----------------------------------------------
 * By role, in the stored layout: column-parallel GEMMs (q/k/v, gate/up, c_attn,
 * c_fc) keep their output features of this rank's heads or MLP share, row-parallel
 * ones (o, down, c_proj) their input features; the embedding and the head their
 * vocabulary rows; norms, positions and the row-parallel biases (added once, after
 * the all-reduce) are whole on every rank.
 * A LoRA pair y += s (x A^T) B^T follows its base: on a column-parallel base, B (out, r)
 * keeps this rank's output rows and A is whole; on a row-parallel one, A (r, in) keeps
 * this rank's input columns and B is whole (each rank's x A^T is a partial sum, which
 * the base's own all-reduce of y completes). The whole matrix's gradient is then a
 * partial sum on each rank (dA from this rank's output columns of dy, dB from its
 * partial x A^T), summed over tp as a q/k norm's. */
enum { TP_WHOLE = 0, TP_OUT, TP_IN, TP_ROWS };

static int tp_kind(const zt_param_t *p)
{
    switch (p->role) {
    case ZT_ROLE_EMBED: case ZT_ROLE_HEAD: return TP_ROWS;
    case ZT_ROLE_QKV: case ZT_ROLE_Q: case ZT_ROLE_K: case ZT_ROLE_V: case ZT_ROLE_GATE: case ZT_ROLE_UP:
    case ZT_ROLE_FC: return p->adapter == 'A' ? TP_WHOLE : TP_OUT;
    case ZT_ROLE_O: case ZT_ROLE_DOWN: return p->ndim == 1 || p->adapter == 'B' ? TP_WHOLE : TP_IN;
    default: return TP_WHOLE;
    }
}

static zt_param_table_t *tp_local(const zt_param_table_t *g, int tp, int rank, int name_sizes, char *err,
                                   size_t errlen);

/* The tp sizes from 1 to 64 that split g's tensors (its 4-bit blocks whole), as "1, 2 and 4" */
static void tp_sizes_that_work(const zt_param_table_t *g, char *buf, size_t len)
{
    int ok[64], n = 0;
    char e[ZT_ERRLEN];
    for (int tp = 1; tp <= 64; tp++) {
        zt_param_table_t *t = tp == 1 ? NULL : tp_local(g, tp, 0, 0, e, sizeof e);
        if (tp == 1 || t) ok[n++] = tp;
        if (t) zt_param_table_free(t);
    }
    buf[0] = 0;
    for (int i = 0; i < n; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%d", i == 0 ? "" : i == n - 1 ? " and " : ", ", ok[i]);
}

/* A 4-bit weight's share (zt_qlora.h): whole blocks of its tensor, rows for a column split and
 * each row's columns for a row split; sized (numel) for the rank whose share needs the most
 * nested scales, so that every tp rank's units have one size. -1 where a block would straddle. */
static int tp_local_4bit(const zt_param_table_t *g, const zt_param_t *q, zt_param_t *p, int tp, int kv_share,
                         int name_sizes, char *err, size_t errlen)
{
    const int64_t bs = g->quant_blocksize, R = p->shape[0], C = p->shape[1];
    const int cut = p->tp_dim == 0 ? (R * C) % bs != 0 : C % bs != 0;
    if (cut) {
        char works[256] = "";
        if (name_sizes) tp_sizes_that_work(g, works, sizeof works);
        if (p->tp_dim == 0)
            return zt_err(err, errlen, "model.quantization_bit = 4 with parallel.tensor_parallel_size = %d: %s (%lld, %lld) "
                                       "is cut by rows into %lld values a rank, not whole 4-bit blocks of %lld; "
                                       "tensor_parallel_size %s keep%s them whole", tp, q->name, (long long)q->shape[0],
                          (long long)q->shape[1], (long long)(R * C), (long long)bs, works,
                          strchr(works, ' ') ? "" : "s");
        return zt_err(err, errlen, "model.quantization_bit = 4 with parallel.tensor_parallel_size = %d: %s (%lld, %lld) "
                                   "is cut into %lld input columns of each row, not whole 4-bit blocks of %lld; "
                                   "tensor_parallel_size %s keep%s them whole", tp, q->name, (long long)q->shape[0],
                      (long long)q->shape[1], (long long)C, (long long)bs, works, strchr(works, ' ') ? "" : "s");
    }
    size_t most = 0;
    for (int r = 0; r < tp; r++) {
        zt_quant4_split_t sp = {0};
        if (p->tp_dim == 0) {
            const int64_t goff = (kv_share > 1 && (q->role == ZT_ROLE_K || q->role == ZT_ROLE_V) ? r / kv_share : r) * R;
            sp.run_blocks = R * C / bs, sp.first_block = goff * C / bs;
        } else {
            sp.run_blocks = C / bs, sp.stride_blocks = q->shape[1] / bs, sp.first_block = (int64_t)r * C / bs;
        }
        most = ZT_MAX(most, zt_quant4_region_bytes(R * C, bs, g->quant_nested, &sp));
    }
    p->numel = ZT_CEIL_DIV(g->quant_bytewise ? most : ZT_CEIL_DIV(most, sizeof(float)), (size_t)R) * (size_t)R;
    return 0;
}

zt_param_table_t *zt_params_tp_local(const zt_param_table_t *g, int tp, int rank, char *err, size_t errlen)
{
    return tp_local(g, tp, rank, 1, err, errlen);
}

static zt_param_table_t *tp_local(const zt_param_table_t *g, int tp, int rank, int name_sizes, char *err,
                                   size_t errlen)
{
    const zt_model_dims_t *d = &g->dims;
    const zt_plan_shape_t shape = {d->L, d->NH, d->NKV, d->I, d->V};
    if (zt_plan_tp_splits(&shape, tp, err, errlen)) return NULL;
    zt_param_table_t *t = zt_params_new(g->arch, d);
    /* kv_share: tp ranks that hold one KV head (1 when tp divides the KV heads) */
    const int kv_share = d->NKV < tp ? tp / d->NKV : 1;
    const int vb = (d->V + tp - 1) / tp;
    t->dims.NH /= tp, t->dims.NKV = d->NKV < tp ? 1 : d->NKV / tp, t->dims.I /= tp;
    t->dims.V = ZT_MIN(vb, d->V - rank * vb);
    t->dims.vocab_start = rank * vb, t->dims.vocab_block = vb, t->dims.vocab_total = d->V;
    t->dims.tp_size = tp, t->dims.tp_rank = rank;
    if (t->dims.sp_size < 1) t->dims.sp_size = 1;
    t->lora_rank = g->lora_rank, t->lora_scale = g->lora_scale, t->first_adapter_unit = g->first_adapter_unit;
    t->lora_dropout = g->lora_dropout;
    t->quant_type = g->quant_type, t->quant_nested = g->quant_nested, t->quant_blocksize = g->quant_blocksize;
    t->quant_stored = g->quant_stored, t->quant_bytewise = g->quant_bytewise;
    for (int i = 0; i < g->nparams; i++) {
        const zt_param_t *q = &g->params[i];
        const int k = tp > 1 ? tp_kind(q) : TP_WHOLE;
        /* dim of the stored tensor the slice runs along */
        int dim = -1;
        if (k == TP_ROWS) dim = 0;
        else if (k == TP_OUT) dim = q->ndim == 1 || q->wlayout == ZT_W_OUT_IN ? 0 : 1;
        else if (k == TP_IN) dim = q->wlayout == ZT_W_OUT_IN ? 1 : 0;
        int64_t d0 = dim == 0 ? q->shape[0] / tp : q->shape[0];
        const int64_t d1 = dim == 1 ? q->shape[1] / tp : q->shape[1];
        if (k == TP_ROWS) d0 = t->dims.V; /* vocabulary blocks: the last may be shorter */
        const int j = zt_params_add(t, q->name, q->ndim, d0, d1, q->unit, q->block, q->init, q->init_std, q->role,
                                    q->wlayout);
        zt_param_t *p = &t->params[j];
        p->decay = q->decay;
        p->frozen = q->frozen;
        p->lora_a = q->lora_a, p->lora_b = q->lora_b, p->adapter = q->adapter;
        p->quant = q->quant;
        /* a 4-bit weight takes the floats of its 4-bit form (zt_qlora.h), not its shape's: whole,
         * or its share (below) */
        if (q->quant && tp == 1) p->numel = q->numel;
        p->gshape[0] = q->shape[0], p->gshape[1] = q->shape[1], p->gnumel = q->numel;
        p->tp_share = dim < 0 ? tp : 1;
        p->tp_grad_sum = dim < 0 && tp > 1 && (q->role == ZT_ROLE_QK_NORM || q->adapter);
        if (dim < 0) continue;
        if (kv_share > 1 && (q->role == ZT_ROLE_K || q->role == ZT_ROLE_V)) {
            /* the one KV head of this rank's query heads, whole, shared with the
             * other ranks of its group; each has a partial gradient of it */
            const int64_t rows = q->shape[0] / d->NKV;
            zt_param_t *pk = p;
            pk->shape[0] = rows;
            pk->numel = (size_t)rows * (size_t)pk->shape[1];
            pk->tp_dim = 0;
            pk->tp_nblk = 1;
            pk->tp_goff[0] = (int64_t)(rank / kv_share) * rows;
            pk->tp_share = kv_share;
            pk->tp_grad_sum = 1;
            if (q->quant && tp_local_4bit(g, q, pk, tp, kv_share, name_sizes, err, errlen)) {
                zt_param_table_free(t);
                return NULL;
            }
            continue;
        }
        /* GPT-2's c_attn packs q, k and v along its output: three blocks */
        p->tp_dim = dim;
        p->tp_nblk = q->role == ZT_ROLE_QKV ? 3 : 1;
        if (k == TP_ROWS) {
            p->tp_goff[0] = t->dims.vocab_start;
            continue;
        }
        const int64_t G = q->shape[dim], blk = G / tp / p->tp_nblk;
        if ((G / tp) % p->tp_nblk || G % tp) {
            zt_err(err, errlen, "parallel.tensor_parallel_size (%d) does not divide %s (%lld)", tp, q->name,
                   (long long)G);
            zt_param_table_free(t);
            return NULL;
        }
        for (int b = 0; b < p->tp_nblk; b++) p->tp_goff[b] = b * (G / p->tp_nblk) + rank * blk;
        if (q->quant && tp_local_4bit(g, q, p, tp, 1, name_sizes, err, errlen)) {
            zt_param_table_free(t);
            return NULL;
        }
    }
    zt_params_finish(t, g->nunits, g->root_unit, g->first_block_unit);
    t->head_unit = g->head_unit;
    return t;
}

void zt_param_tp_runs(const zt_param_t *p, size_t start, size_t n,
                      void (*fn)(void *arg, size_t gstart, size_t lstart, size_t len), void *arg)
{
    if (p->tp_dim < 0) {
        if (n) fn(arg, start, start, n);
        return;
    }
    const size_t L1 = (size_t)p->shape[1], G1 = (size_t)p->gshape[1];
    const size_t blk = (size_t)p->shape[p->tp_dim] / (size_t)p->tp_nblk;
    for (size_t e = start, end = start + n; e < end;) {
        const size_t r = e / L1, c = e % L1;
        size_t g, run;
        if (p->tp_dim == 0) {
            /* whole rows: a block of rows is one global run */
            const size_t b = r / blk, w = r % blk;
            g = ((size_t)p->tp_goff[b] + w) * G1 + c;
            run = (blk - w) * L1 - c;
        } else {
            const size_t b = c / blk, w = c % blk;
            g = r * G1 + (size_t)p->tp_goff[b] + w;
            run = blk - w;
        }
        if (run > end - e) run = end - e;
        fn(arg, g, e, run);
        e += run;
    }
}

unsigned char *zt_params_units_of_layers(const zt_param_table_t *t, const unsigned char *layers)
{
    unsigned char *held = zt_calloc((size_t)t->nunits, 1);
    const int L = t->dims.L;
    held[t->root_unit] = layers[0];
    held[zt_params_head_unit(t)] |= layers[L + 1];
    for (int l = 0; l < L; l++) {
        held[t->first_block_unit + l] = layers[l + 1];
        if (t->first_adapter_unit >= 0) held[t->first_adapter_unit + l] = layers[l + 1];
    }
    return held;
}

int zt_params_split_head(zt_param_table_t *t)
{
    if (t->dims.tied || (t->head_unit >= 0 && t->head_unit != t->root_unit)) return 0;
    /* the base model's last unit: LoRA's adapter units stay the last ones, one further on */
    const int head = t->first_adapter_unit >= 0 ? t->first_adapter_unit : t->nunits;
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        if (p->unit >= head) p->unit++;
        else if (p->unit == t->root_unit && p->block < 0 && (p->role == ZT_ROLE_HEAD || p->role == ZT_ROLE_NORM))
            p->unit = head;
    }
    if (t->first_adapter_unit >= 0) t->first_adapter_unit++;
    zt_params_finish(t, t->nunits + 1, t->root_unit, t->first_block_unit);
    t->head_unit = head;
    return 1;
}
