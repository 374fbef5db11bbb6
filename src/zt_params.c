/* zt_params.c — the parameter table and the counter-based initializer (zt_params.h). */
#define _GNU_SOURCE /* sincos */
#include "zt_params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

zt_param_table_t *zt_params_new(const struct zt_arch *arch, const zt_model_dims_t *d)
{
    zt_param_table_t *t = zt_calloc(1, sizeof *t);
    t->arch = arch;
    t->dims = *d;
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

void zt_param_init_range(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out)
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

