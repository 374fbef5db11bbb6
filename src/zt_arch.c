/* zt_arch.c — the family registry (zt_arch.h). */
#include "zt_arch.h"

#include <string.h>

#include "zt_common.h"
#include "zt_lora.h"
#include "zt_qlora.h"

extern const zt_arch_t zt_arch_gpt2, zt_arch_llama, zt_arch_qwen2, zt_arch_qwen3, zt_arch_mistral, zt_arch_gemma3;

const zt_arch_t *const zt_archs[] = {&zt_arch_gpt2,    &zt_arch_llama,  &zt_arch_qwen2, &zt_arch_qwen3,
                                     &zt_arch_mistral, &zt_arch_gemma3, NULL};

const zt_arch_t *zt_arch_get(const char *name)
{
    for (int i = 0; name && zt_archs[i]; i++)
        if (strcmp(zt_archs[i]->name, name) == 0) return zt_archs[i];
    return NULL;
}

const zt_arch_t *zt_arch_for_hf(const char *hf_class, const char *model_type)
{
    for (int i = 0; hf_class && zt_archs[i]; i++)
        if (strcmp(zt_archs[i]->hf_class, hf_class) == 0) return zt_archs[i];
    for (int i = 0; model_type && zt_archs[i]; i++)
        if (strcmp(zt_archs[i]->hf_model_type, model_type) == 0) return zt_archs[i];
    return NULL;
}

const char *zt_arch_names(void)
{
    static char buf[256];
    if (!buf[0])
        for (int i = 0; zt_archs[i]; i++) {
            if (i) strncat(buf, ", ", sizeof buf - strlen(buf) - 1);
            strncat(buf, zt_archs[i]->name, sizeof buf - strlen(buf) - 1);
        }
    return buf;
}

void zt_model_dims_default(zt_model_dims_t *d)
{
    memset(d, 0, sizeof *d);
    d->norm_eps = 1e-5;
    d->rope_theta = 10000.0;
    d->tp_size = 1;
    d->sp_size = 1;
}

zt_param_table_t *zt_arch_build_table(const zt_arch_t *a, const zt_model_dims_t *d, float init_std)
{
    zt_param_table_t *t = zt_params_new(a, d);
    a->build_params(t, init_std);
    return t;
}

zt_param_table_t *zt_arch_table_from_config(const zt_config_t *cfg, char *err, size_t errlen)
{
    const zt_arch_t *a = zt_arch_get(cfg->model.arch);
    if (!a) {
        zt_err(err, errlen, "model.arch: unknown family \"%s\" (%s)", cfg->model.arch, zt_arch_names());
        return NULL;
    }
    zt_model_dims_t d;
    if (a->dims_from_config(cfg, &d, err, errlen)) return NULL;
    zt_param_table_t *t = zt_arch_build_table(a, &d, (float)cfg->model.init_std);
    if (cfg->train.finetuning_type == ZT_FT_LORA &&
        (zt_lora_apply(t, cfg, err, errlen) || zt_qlora_apply(t, cfg, err, errlen))) {
        zt_param_table_free(t);
        return NULL;
    }
    return t;
}
