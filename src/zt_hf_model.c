/* zt_hf_model.c — Hugging Face model directories for the model (zt_hf_model.h). */
#include "zt_hf_model.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_common.h"

/* model.* keys a config.json decides; one the input gave must agree with it */
static const char *const shape_keys[] = {
    "model.arch", "model.n_layer", "model.n_head", "model.n_kv_head", "model.n_embd", "model.head_dim",
    "model.intermediate_size", "model.vocab_size", "model.block_size", "model.rope_theta", "model.rms_norm_eps",
    "model.tie_word_embeddings", "model.attention_bias", "model.rope_type", "model.rope_factor",
    "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_position_embeddings",
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
    if (!json_is_object(j)) {
        rc = zt_err(err, errlen, "%s: not a JSON object", file);
    } else if (!a) {
        rc = zt_err(err, errlen, "%s: unknown architecture %s / model_type %s (ztrain has %s)", file,
                    json_string_value(cls) ? json_string_value(cls) : "(none)",
                    json_string_value(mt) ? json_string_value(mt) : "(none)", zt_arch_names());
    } else {
        rc = a->dims_from_hf(j, file, &d, err, errlen);
    }
    json_decref(j);
    if (rc) return -1;
    zt_config_t hf = *cfg;
    snprintf(hf.model.arch, sizeof hf.model.arch, "%s", a->name);
    a->dims_to_config(&d, &hf);
    for (size_t i = 0; i < sizeof shape_keys / sizeof *shape_keys; i++) {
        const char *k = shape_keys[i];
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
    return 0;
}
