/* zt_qlora.h — QLoRA's 4-bit base (model.quantization_bit = 4 with LoRA), as PEFT on a
 * bitsandbytes base trains it.
 *
 * transformers' BitsAndBytesConfig(load_in_4bit) replaces every nn.Linear of the blocks by a
 * Linear4bit and leaves the embeddings, the norms and lm_head in full precision; PEFT then puts
 * its adapters on those 4-bit linears. ztrain does the same in the parameter table: each block
 * linear's weight is marked `quant`, and once loaded it is quantized in place, in the space of
 * its frozen unit, in the floats its 4-bit form takes (zt_quant4_pack_region: the weight's numel
 * in the table is that size, about 0.53 bytes per value), bit-identical to bitsandbytes'
 * quantize_4bit of the tensor (double quantization included). The shard engine stores, gathers
 * and offloads those bytes like any frozen tensor; only the linear (zt_linear.c) reads them,
 * dequantizing to fp32 just before its GEMM (bitsandbytes' compute dtype float32).
 * Under train.bf16 the frozen units are a bf16 working copy, whose rounding would change the
 * bytes: there each element holds one byte of the 4-bit form as its value 0..255, exact in bf16
 * (the table's quant_bytewise; numel is then the form's bytes), and the linear dequantizes to
 * bf16 values (bitsandbytes' compute dtype bfloat16). Under tp a rank's entry is its split's
 * share of the blocks (zt_quant4_region_split, zt_qlora_split). */
#ifndef ZT_QLORA_H
#define ZT_QLORA_H

#include <stddef.h>

#include "zt_config.h"
#include "zt_params.h"
#include "zt_quant.h"

/* bitsandbytes' Linear4bit default block size */
#define ZT_QLORA_BLOCKSIZE 64

/* Marks t's block linears (a table with LoRA applied) 4-bit in cfg's format and sizes them by
 * their 4-bit form (the units' offsets recomputed); nothing without quantization_bit = 4. -1 with err for a family whose linears bitsandbytes would not turn into
 * Linear4bit as ztrain stores them (GPT-2's Conv1D). */
int zt_qlora_apply(zt_param_table_t *t, const zt_config_t *cfg, char *err, size_t errlen);

/* The number of t's 4-bit weights (0: no 4-bit base). */
int zt_qlora_count(const zt_param_table_t *t);
/* One line for the log: "14 block linears nf4 (double quantization, blocks of 64), ..." into buf. */
void zt_qlora_describe(const zt_param_table_t *t, char *buf, size_t len);

/* The values of parameter p (its shape's product): its numel, except for a 4-bit weight, whose
 * numel is the floats its 4-bit form takes in its unit. */
size_t zt_qlora_values(const zt_param_t *p);

/* Quantizes 4-bit parameter p of t whole: value holds its zt_qlora_values(p) floats, as read; on
 * return its first p->numel floats are its 4-bit form (a whole tensor's, for the export tools; a
 * run's loader quantizes a rank's blocks alone, zt_hf_model.c). -1 with err naming the tensor for
 * a non-finite weight. */
int zt_qlora_quantize(const zt_param_table_t *t, int p, float *value, char *err, size_t errlen);

/* Which of its tensor's 4-bit blocks parameter p of a tp rank's table holds (zt_quant4_split_t:
 * zeros for a whole tensor). zt_params_tp_local has refused a split that cuts a block. */
void zt_qlora_split(const zt_param_table_t *t, const zt_param_t *p, zt_quant4_split_t *s);

/* The view of 4-bit parameter p of t, whose region starts at w (its unit's buffer + offset). */
void zt_qlora_view(const zt_param_table_t *t, const zt_param_t *p, const float *w, zt_quant4_view_t *v);

/* The floats the widest 4-bit GEMM of t dequantizes into (its weights side by side: q|k|v,
 * gate|up), 0 without a 4-bit base: the linears' shared scratch (zt_linear.c). */
size_t zt_qlora_dequant_floats(const zt_param_table_t *t);

#endif
