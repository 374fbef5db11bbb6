/* zt_lora.h — LoRA adapters as parameters of the table (train.finetuning_type = lora).
 *
 * zt_lora_apply freezes every parameter of a family's table and adds, for each target
 * linear of block l, lora_A (r, in) and lora_B (out, r) under PEFT's names less the
 * "base_model.model." prefix (model.layers.0.self_attn.q_proj.lora_A.weight), in an
 * adapter unit of their own (first_adapter_unit + l) that the shard engine treats like
 * any trainable unit while the base units are frozen. A is initialised as PEFT does
 * (kaiming-uniform, a = sqrt 5: U(-1/sqrt(in), 1/sqrt(in))), B = 0, deterministically
 * per seed and element as every parameter. In an adapter unit the A matrices come
 * first, in the base's order, so the A's of linears that share an input and a GEMM
 * (q, k, v; gate, up) are the rows of one matrix. The update of a target W is
 * scale * B A, scale = alpha / r (rsLoRA: alpha / sqrt r); for a Conv1D (in, out) base
 * (GPT-2) A and B keep these nn.Linear shapes and the update is its transpose, as PEFT's
 * fan_in_fan_out. lora.target "all" is every linear of the blocks; a list follows PEFT's
 * target_modules rule: a module matches a name it equals or ends with after a dot
 * ("c_proj" is GPT-2's attn.c_proj and mlp.c_proj, "attn.c_proj" the first alone). */
#ifndef ZT_LORA_H
#define ZT_LORA_H

#include <stddef.h>

#include "zt_config.h"
#include "zt_params.h"

/* Applies cfg's lora.* to t (a finished table). -1 with err for a target that names no
 * linear of the family or an option not implemented. */
int zt_lora_apply(zt_param_table_t *t, const zt_config_t *cfg, char *err, size_t errlen);

/* The module name of a weight ("q_proj" of "model.layers.0.self_attn.q_proj.weight")
 * into buf; "" if it is no block linear. */
void zt_lora_module_name(const zt_param_t *p, char *buf, size_t len);

#endif
