/* zt_hf_bnb.h — bitsandbytes' 4-bit weights in a Hugging Face directory, as transformers saves a
 * model loaded with BitsAndBytesConfig(load_in_4bit=True) (a "pre-quantized" directory).
 *
 * save_pretrained writes each Linear4bit weight W of N values as six tensors (bitsandbytes'
 * Params4bit / QuantState.as_dict(packed=True)):
 *   W                                      U8 (ceil(N/2), 1): the packed 4-bit indices
 *   W.absmax                               F32 (nblocks), or U8 (nblocks) codes when nested
 *   W.nested_absmax                        F32 (ceil(nblocks/256))          nested only
 *   W.quant_map                            F32 (16): the nf4 / fp4 code table
 *   W.nested_quant_map                     F32 (256): the dynamic map       nested only
 *   W.quant_state.bitsandbytes__<nf4|fp4>  U8: JSON {quant_type, blocksize, dtype, shape,
 *                                          nested_blocksize, nested_dtype, nested_offset}
 * and config.json carries quantization_config (zt_quant_hf_config). ztrain reads those bytes into
 * the 4-bit region its units store (zt_quant4_region_write): nothing is dequantized or quantized
 * again, so a run from such a directory holds the very bytes bitsandbytes computed. Every part is
 * checked against the quant_state and the model before it is used; a mismatch is one line naming
 * the file and the tensor. No MPI, no model: names, bytes and checks. */
#ifndef ZT_HF_BNB_H
#define ZT_HF_BNB_H

#include <stddef.h>
#include <stdint.h>

#include "zt_hf.h"
#include "zt_quant.h"

/* 1 when `name` is one of the tensors that accompany a 4-bit weight (W.absmax, W.nested_absmax,
 * W.quant_map, W.nested_quant_map, W.quant_state.bitsandbytes__*), with W in weight (len
 * bytes); else 0. */
int zt_hf_bnb_weight_of(const char *name, char *weight, size_t len);

/* 1 when the directory holds `weight` in bitsandbytes' 4-bit form (its quant_state tensor
 * exists), else 0. */
int zt_hf_bnb_stored(const zt_hf_dir_t *d, const char *weight);

/* The directory's 4-bit `weight` into region (zt_quant4_region_bytes(rows * cols, blocksize,
 * nested) bytes, the layout of zt_quant4_region_view), after checking that its quant_state is
 * valid JSON naming (rows, cols), quant type `type`, block size `blocksize`, double quantization
 * as `nested` (nested block size 256, float32 scales); that every part has its dtype and length;
 * that quant_map and nested_quant_map are bitsandbytes' tables; and that the scales are finite.
 * -1 with one line naming the file and the tensor. */
int zt_hf_bnb_read(zt_hf_dir_t *d, const char *weight, int64_t rows, int64_t cols, zt_quant_type_t type,
                   int nested, int64_t blocksize, float *region, char *err, size_t errlen);

#endif
