/* zt_hf_config.h — typed reads of a Hugging Face config.json (jansson), for the families.
 *
 * Each getter records the first error (the file and key, and what was wrong) in the
 * context and returns the default or 0 after it, so a family reads every key and
 * checks once: `if (c.failed) return -1`. A default of ZT_HF_REQUIRED makes a key
 * mandatory. JSON null counts as absent (transformers writes "head_dim": null). */
#ifndef ZT_HF_CONFIG_H
#define ZT_HF_CONFIG_H

#include <stddef.h>

typedef struct json_t json_t;

typedef struct zt_hf_config {
    const json_t *obj;
    const char *file;       /* for messages */
    char *err;
    size_t errlen;
    int failed;
} zt_hf_config_t;

#define ZT_HF_REQUIRED (-1)

/* A non-negative integer (an integral real such as 4.0 is accepted). */
int zt_hf_int(zt_hf_config_t *c, const char *key, int def);
double zt_hf_double(zt_hf_config_t *c, const char *key, double def);
int zt_hf_bool(zt_hf_config_t *c, const char *key, int def);
/* The key exists and is not null. */
int zt_hf_has(const json_t *obj, const char *key);

#endif
