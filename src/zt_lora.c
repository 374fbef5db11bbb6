/* zt_lora.c — LoRA adapters in the parameter table (zt_lora.h). */
#include "zt_lora.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_common.h"

static int is_linear(const zt_param_t *p)
{
    if (p->ndim != 2 || p->block < 0) return 0;
    switch (p->role) {
    case ZT_ROLE_QKV: case ZT_ROLE_Q: case ZT_ROLE_K: case ZT_ROLE_V: case ZT_ROLE_O:
    case ZT_ROLE_GATE: case ZT_ROLE_UP: case ZT_ROLE_FC: case ZT_ROLE_DOWN: return 1;
    default: return 0;
    }
}

void zt_lora_module_name(const zt_param_t *p, char *buf, size_t len)
{
    buf[0] = 0;
    if (!is_linear(p)) return;
    const char *end = strrchr(p->name, '.');
    if (!end) return;
    const char *b = end;
    while (b > p->name && b[-1] != '.') b--;
    snprintf(buf, len, "%.*s", (int)(end - b), b);
}

/* PEFT's rule for a list of target_modules: a module (the weight's name less ".weight")
 * is a target when it is the name or ends with "." + name. So "c_proj" takes both of
 * GPT-2's attn.c_proj and mlp.c_proj, "attn.c_proj" the first alone. */
static int matches(const zt_param_t *p, const char *want)
{
    if (!is_linear(p)) return 0;
    const size_t n = strlen(p->name) - strlen(".weight"), k = strlen(want);
    return k <= n && strncmp(p->name + n - k, want, k) == 0 && (k == n || p->name[n - k - 1] == '.');
}

static int wanted(const zt_config_t *cfg, const zt_param_t *p)
{
    for (int i = 0; i < cfg->lora.n_target; i++)
        if ((!strcmp(cfg->lora.target[i], "all") && is_linear(p)) || matches(p, cfg->lora.target[i])) return 1;
    return 0;
}

int zt_lora_apply(zt_param_table_t *t, const zt_config_t *cfg, char *err, size_t errlen)
{
    /* every target name must name a linear of this family */
    for (int i = 0; i < cfg->lora.n_target; i++) {
        const char *want = cfg->lora.target[i];
        int found = !strcmp(want, "all");
        char mod[64], have[512] = "";
        for (int p = 0; p < t->nparams && !found; p++) {
            zt_lora_module_name(&t->params[p], mod, sizeof mod);
            found = matches(&t->params[p], want);
            if (mod[0] && t->params[p].block == 0 && !strstr(have, mod))
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", have[0] ? ", " : "", mod);
        }
        if (!found)
            return zt_err(err, errlen, "lora.target: \"%s\" is no linear of %s (all, %s)", want, t->arch->name, have);
    }
    const int r = cfg->lora.rank, base_units = t->nunits, L = t->dims.L, nbase = t->nparams;
    for (int p = 0; p < nbase; p++) t->params[p].frozen = 1;
    t->lora_rank = r;
    const double alpha = cfg->lora.alpha > 0 ? cfg->lora.alpha : 2.0 * r;
    t->lora_scale = (float)(alpha / (cfg->lora.use_rslora ? sqrt((double)r) : (double)r));
    t->lora_dropout = cfg->lora.dropout;
    t->first_adapter_unit = base_units;
    for (int l = 0; l < L; l++)
        for (int pass = 0; pass < 2; pass++) /* all A's of the block, then all B's */
            for (int p = 0; p < nbase; p++) {
                zt_param_t q = t->params[p]; /* a copy: adding reallocates the table */
                char mod[64], name[128];
                zt_lora_module_name(&q, mod, sizeof mod);
                if (q.block != l || !mod[0] || !wanted(cfg, &q)) continue;
                const int64_t out = q.wlayout == ZT_W_IN_OUT ? q.shape[1] : q.shape[0];
                const int64_t in = q.wlayout == ZT_W_IN_OUT ? q.shape[0] : q.shape[1];
                const size_t stem = strlen(q.name) - strlen(".weight");
                snprintf(name, sizeof name, "%.*s.lora_%c.weight", (int)stem, q.name, pass ? 'B' : 'A');
                const int k = pass ? zt_params_add(t, name, 2, out, r, base_units + l, l, ZT_INIT_ZEROS, 0, q.role,
                                                   ZT_W_OUT_IN)
                                   : zt_params_add(t, name, 2, r, in, base_units + l, l, ZT_INIT_UNIFORM,
                                                   (float)(1.0 / sqrt((double)in)), q.role, ZT_W_OUT_IN);
                t->params[k].adapter = pass ? 'B' : 'A';
                if (pass) t->params[p].lora_b = k;
                else t->params[p].lora_a = k;
            }
    zt_params_finish(t, base_units + L, t->root_unit, t->first_block_unit);
    return 0;
}
