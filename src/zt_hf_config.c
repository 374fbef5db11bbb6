/* zt_hf_config.c — typed reads of config.json values (zt_hf_config.h). */
#include "zt_hf_config.h"

#include <jansson.h>
#include <math.h>

#include "zt_common.h"

int zt_hf_has(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v);
}

static const json_t *get(zt_hf_config_t *c, const char *key, int required)
{
    if (c->failed) return NULL;
    const json_t *v = json_object_get(c->obj, key);
    if (v && json_is_null(v)) v = NULL;
    if (!v && required) {
        zt_err(c->err, c->errlen, "%s: missing key \"%s\"", c->file, key);
        c->failed = 1;
    }
    return v;
}

int zt_hf_int(zt_hf_config_t *c, const char *key, int def)
{
    const json_t *v = get(c, key, def == ZT_HF_REQUIRED);
    if (!v) return c->failed ? 0 : def;
    double x = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
    if (!(x >= 0 && x <= 2147483647.0) || x != floor(x)) {
        zt_err(c->err, c->errlen, "%s: \"%s\" must be a non-negative integer", c->file, key);
        c->failed = 1;
        return 0;
    }
    return (int)x;
}

double zt_hf_double(zt_hf_config_t *c, const char *key, double def)
{
    const json_t *v = get(c, key, 0);
    if (!v) return def;
    if (!json_is_number(v)) {
        zt_err(c->err, c->errlen, "%s: \"%s\" must be a number", c->file, key);
        c->failed = 1;
        return 0;
    }
    return json_number_value(v);
}

int zt_hf_bool(zt_hf_config_t *c, const char *key, int def)
{
    const json_t *v = get(c, key, 0);
    if (!v) return def;
    if (!json_is_boolean(v)) {
        zt_err(c->err, c->errlen, "%s: \"%s\" must be true or false", c->file, key);
        c->failed = 1;
        return 0;
    }
    return json_is_true(v);
}
