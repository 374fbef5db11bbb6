/* zt_qlora.h — QLoRA's 4-bit base (model.quantization_bit = 4 with LoRA), as PEFT on a
 * bitsandbytes base trains it.
 *
 * transformers' BitsAndBytesConfig(load_in_4bit) replaces every nn.Linear of the blocks by a
 * Linear4bit and leaves the embeddings, the norms and lm_head in full precision; PEFT then puts
 * its adapters on those 4-bit linears. ztrain does the same in the parameter table: each block
 * linear's weight is marked `quant`, and once loaded it is quantized in place, in the space of
 * its own floats in its frozen unit (zt_quant4_pack_region), bit-identical to bitsandbytes'
 * quantize_4bit of that tensor (double quantization included). The shard engine moves those
 * bytes like any frozen tensor; only the linear (zt_linear.c) reads them, dequantizing to fp32
 * just before its GEMM (bitsandbytes' compute dtype float32). The base's weights then keep their
 * fp32 size in the unit: the bytes beyond the 4-bit region are unused. */
#ifndef ZT_QLORA_H
#define ZT_QLORA_H

#include <stddef.h>

#include "zt_config.h"
#include "zt_params.h"
#include "zt_quant.h"

/* bitsandbytes' Linear4bit default block size */
#define ZT_QLORA_BLOCKSIZE 64

/* Marks t's block linears (a table with LoRA applied) 4-bit in cfg's format; nothing without
 * quantization_bit = 4. -1 with err for a family whose linears bitsandbytes would not turn into
 * Linear4bit as ztrain stores them (GPT-2's Conv1D). */
int zt_qlora_apply(zt_param_table_t *t, const zt_config_t *cfg, char *err, size_t errlen);

/* The number of t's 4-bit weights (0: no 4-bit base). */
int zt_qlora_count(const zt_param_table_t *t);
/* One line for the log: "14 block linears nf4 (double quantization, blocks of 64), ..." into buf. */
void zt_qlora_describe(const zt_param_table_t *t, char *buf, size_t len);

/* Quantizes 4-bit parameter p of t in place: value holds all of its numel floats, as read. A
 * rank that holds part of a weight (a sharded strategy) quantizes all of it and keeps its own
 * floats' worth of the region, since bitsandbytes' blocks and nested offset span the tensor.
 * -1 with err naming the tensor for a non-finite weight. */
int zt_qlora_quantize(const zt_param_table_t *t, int p, float *value, char *err, size_t errlen);

/* The view of 4-bit parameter p of t, whose region starts at w (its unit's buffer + offset). */
void zt_qlora_view(const zt_param_table_t *t, const zt_param_t *p, const float *w, zt_quant4_view_t *v);

/* The floats the widest 4-bit GEMM of t dequantizes into (its weights side by side: q|k|v,
 * gate|up), 0 without a 4-bit base: the linears' shared scratch (zt_linear.c). */
size_t zt_qlora_dequant_floats(const zt_param_table_t *t);

#endif
