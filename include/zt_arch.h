/* zt_arch.h — the model families, registered in one table like the backends.
 *
 * A family is a file (src/zt_arch_<name>.c). It declares and checks its shape (from
 * ztrain's model.* keys or from a Hugging Face config.json), builds its parameter
 * table with HF names, shapes and roles, gives its activation bytes and FLOPs per
 * token, and runs its units forward and backward through the backend. Nothing
 * outside a family file tests a family name or knows which unit is the root: the
 * train loop, the shard engine and the checkpoints see zt_param_table_t and the
 * family-neutral zt_model_* calls (zt_model.h).
 *
 * One implementation may serve several entries (llama, qwen2, qwen3 differ in
 * biases, q/k norms and defaults: src/zt_arch_llama.c). */
#ifndef ZT_ARCH_H
#define ZT_ARCH_H

#include <stddef.h>

#include "zt_backend.h"
#include "zt_config.h"
#include "zt_params.h"

typedef struct json_t json_t;   /* jansson */
typedef struct zt_model zt_model_t;

/* A family's model hooks, called by zt_model.c, which owns what every family shares
 * (the batch, the residual stream between blocks, the chunked head and loss). A
 * family keeps its own activations in m's family state (zt_model_family). */
typedef struct zt_arch_ops {
    /* allocates the family's activations with zt_model_alloc */
    void (*create)(zt_model_t *m);
    void (*destroy)(zt_model_t *m);
    /* x0 (N,C) = embedding of the batch's inputs */
    void (*embed_forward)(zt_model_t *m, const float *root, float *x0);
    /* root gradients of the embedding from dx0 (N,C) (not called for a frozen root);
     * dx0 is the caller's scratch, free to be scaled in place */
    void (*embed_backward)(zt_model_t *m, float *droot, float *dx0);
    /* out (N,C) = block l applied to x_in (N,C), which stays intact; lora: the block's
     * adapter unit or NULL */
    void (*block_forward)(zt_model_t *m, int l, const float *w, const float *lora, const float *x_in,
                          float *out);
    /* dx (N,C): in dL/d(block output), out dL/d(x_in); parameter gradients += into dw
     * (NULL: frozen), the adapters' into dlora */
    void (*block_backward)(zt_model_t *m, int l, const float *w, float *dw, const float *lora, float *dlora,
                           const float *x_in, float *dx);
    /* xf (N,C) = final norm of x (N,C) */
    void (*final_norm_forward)(zt_model_t *m, const float *root, const float *x, float *xf);
    /* dx (N,C) = d final norm (overwritten), from dxf (N,C); its parameters' grads +=
     * (droot NULL: frozen) */
    void (*final_norm_backward)(zt_model_t *m, const float *root, float *droot, const float *x,
                                const float *dxf, float *dx);
    /* element offset of the head weight (V,C) in the root unit (tied: the embedding) */
    size_t (*head_offset)(const zt_model_t *m);
} zt_arch_ops_t;

typedef struct zt_arch {
    const char *name;           /* model.arch */
    const char *hf_class;       /* config.json "architectures"[0] */
    const char *hf_model_type;  /* config.json "model_type" */
    /* Shape from the model.* keys; -1 with err for a shape the family cannot run. */
    int (*dims_from_config)(const zt_config_t *cfg, zt_model_dims_t *d, char *err, size_t errlen);
    /* Shape from a parsed config.json (transformers 4.x and 5.x spellings);
     * `file` names it in messages. */
    int (*dims_from_hf)(const json_t *config, const char *file, zt_model_dims_t *d, char *err,
                        size_t errlen);
    /* config.json for an export: every dimension, architectures, model_type; the
     * caller adds dtype and the token ids. New reference. */
    json_t *(*dims_to_hf)(const zt_model_dims_t *d);
    /* Writes the family's shape into cfg's model.* keys (after dims_from_hf, so a
     * run's saved config.cfg and checkpoints describe the model). */
    void (*dims_to_config)(const zt_model_dims_t *d, zt_config_t *cfg);
    /* Adds the parameters and finishes the table. */
    void (*build_params)(zt_param_table_t *t, float init_std);
    /* Training FLOPs per token (6 N over the GEMM parameters + attention), for MFU. */
    double (*flops_per_token)(const zt_model_dims_t *d, int T);
    const zt_arch_ops_t *ops;
} zt_arch_t;

/* Registry: NULL-terminated. */
extern const zt_arch_t *const zt_archs[];
/* Looks a family up by model.arch; NULL if unknown. */
const zt_arch_t *zt_arch_get(const char *name);
/* By config.json: "architectures"[0], else "model_type"; NULL if unknown. */
const zt_arch_t *zt_arch_for_hf(const char *hf_class, const char *model_type);
/* "gpt2, llama, qwen2, qwen3" for messages. */
const char *zt_arch_names(void);

/* Neutral defaults: everything 0 but norm_eps 1e-5, rope_theta 10000. */
void zt_model_dims_default(zt_model_dims_t *d);
/* The family's parameter table for shape d. */
zt_param_table_t *zt_arch_build_table(const zt_arch_t *a, const zt_model_dims_t *d, float init_std);
/* Shape and table from a resolved config (model.arch and model.*). */
zt_param_table_t *zt_arch_table_from_config(const zt_config_t *cfg, char *err, size_t errlen);

/* GPT-2 of the given size (tests, tools, benchmarks). */
zt_param_table_t *zt_arch_gpt2_table(int L, int NH, int C, int V, int maxT, float init_std);

#endif
