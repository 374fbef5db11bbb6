/* zt_quant.h — bitsandbytes' 4-bit weight formats (NF4, FP4), bit for bit.
 *
 * A 4-bit weight of N values is three things (bitsandbytes' Params4bit / QuantState):
 *   packed  (ceil(N/2) bytes)  two 4-bit code indices per byte, the first value in the HIGH nibble;
 *                              an odd N ends with the index of 0.0 in the last low nibble;
 *   absmax  (ceil(N/B) floats) max |x| of each block of B consecutive values (B = blocksize, 64 by
 *                              default), the scale a code value is multiplied by;
 *   quant_type                 nf4 or fp4: which 16-value code table an index points into.
 * With double quantization ("nested", bitsandbytes' compress_statistics) the absmax floats are
 * themselves stored as offset = mean(absmax), and absmax - offset quantized to one byte each with
 * the 256-value dynamic map in blocks of 256 (nested_absmax: one float per block of 256).
 *
 * Every rule here reproduces what bitsandbytes (its CPU path, release noted in
 * tests/reference/README.md) does, so that a checkpoint quantized by ztrain equals the one
 * bitsandbytes writes and a file written by bitsandbytes dequantizes to the values it would:
 * - 4-bit: full blocks scale by x * (1/absmax), the tensor's last partial block by x / absmax
 *   (absmax floored at 1e-38 there, and stored floored); scaled values are clamped to [-1, 1] and
 *   take the code whose interval holds them, the intervals split at the float32 midpoints of
 *   neighbouring code values with a value exactly at a midpoint going to the lower code value;
 * - 8-bit (nested): absmax-relative values go through bitsandbytes' 65536-step grid
 *   (fmaf((v + 1) / 2, 65535, 0.5) truncated) and then to the nearest dynamic-map value of the
 *   grid point, a tie to the lower one; an all-zero block gets code 0;
 * - offset: torch.mean's float32 summation order (see zt_quant_mean);
 * - dequantize: code * absmax, and for nested scales (code8 * nested_absmax) + offset, each
 *   product and sum rounded to float32 on its own (no fused multiply-add).
 * Kernels only: no model, no MPI, no files. */
#ifndef ZT_QUANT_H
#define ZT_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ZT_QUANT_NF4 = 0, ZT_QUANT_FP4 = 1 } zt_quant_type_t;

#define ZT_QUANT_NESTED_BLOCKSIZE 256 /* bitsandbytes' block of the double quantization */
#define ZT_QUANT_MAX_DIMS 8

const char *zt_quant_type_name(zt_quant_type_t t); /* "nf4", "fp4" */
/* The 16 code values, indexed by the 4-bit index. */
const float *zt_quant_code(zt_quant_type_t t);
/* bitsandbytes' create_dynamic_map(): 256 sorted values, the nested absmax code. */
const float *zt_quant_dynamic_map(void);
/* 1 for a block size bitsandbytes' quantize_4bit accepts (32, 64, ..., 4096), else 0. */
int zt_quant_blocksize_ok(int64_t blocksize);

/* Quantizes n values starting at a block boundary of their tensor into packed ((n+1)/2 bytes)
 * and absmax (ceil(n/blocksize) floats). When the range does not end on a block boundary its last
 * block is taken to be the tensor's final partial block (bitsandbytes scales that one differently),
 * so a rank quantizing the blocks it owns passes whole blocks, and the tensor's tail only where it
 * owns it. A NaN or infinity is refused: -1 with "NAME: element I is nan: ..." in err. */
int zt_quant4_quantize(const char *name, zt_quant_type_t t, const float *x, int64_t n, int64_t blocksize,
                       uint8_t *packed, float *absmax, char *err, size_t errlen);

/* torch.mean of n float32 values, bit-identical to torch's CPU sum (vectorised cascade summation
 * on 8-lane vectors) divided by n, as torch computes it with torch_threads threads: above 32768
 * values torch sums per-thread chunks and then the per-thread sums, so its own result depends on
 * its thread count. ztrain quantizes with torch_threads = 1, the order that does not depend on the
 * machine. The offset of double quantization is the mean of all of a tensor's absmax, so ranks
 * gather absmax (1/blocksize of the weight's values) before calling this. */
float zt_quant_mean(const float *x, int64_t n, int torch_threads);

/* bitsandbytes' quantize_blockwise with the dynamic map: n values in blocks of blocksize into one
 * code byte each and one absmax per block. */
void zt_quant8_quantize(const float *x, int64_t n, int64_t blocksize, uint8_t *codes, float *absmax);

/* Double quantization of a tensor's nblocks absmax: offset = zt_quant_mean(absmax, torch_threads),
 * then absmax - offset through zt_quant8_quantize in blocks of 256 into codes (nblocks bytes) and
 * nested_absmax (ceil(nblocks/256) floats). */
void zt_quant4_double_quant(const float *absmax, int64_t nblocks, int torch_threads, uint8_t *codes,
                            float *nested_absmax, float *offset);

/* Part of a tensor's blocks, as a tensor-parallel rank holds them (zt_qlora.h): its local blocks
 * are whole blocks of the tensor, runs of run_blocks consecutive ones stride_blocks apart (a
 * row-parallel split: each row's share of columns), the first at tensor block first_block. A
 * column-parallel split is one run. run_blocks 0: the whole tensor. Each local block keeps its
 * own scale; the double-quantization offset is the tensor's, and a block of 256 nested scales
 * that the split cuts is held by every rank whose blocks it scales (one float each). */
typedef struct zt_quant4_split {
    int64_t run_blocks, stride_blocks, first_block;
} zt_quant4_split_t;

/* The tensor's block of local block b (the CPU backend's and the CUDA kernel's one rule). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t zt_quant4_global_block(const zt_quant4_split_t *s, int64_t b)
{
    return s->run_blocks ? s->first_block + (b / s->run_blocks) * s->stride_blocks + b % s->run_blocks : b;
}
/* The nested scales a split of nblocks local blocks needs (a run of the tensor's, from that of
 * its first block to that of its last): ceil(nblocks / 256) for the whole tensor. */
int64_t zt_quant4_nested_count(const zt_quant4_split_t *s, int64_t nblocks);

/* A quantized tensor as stored: pointers into its bytes, nothing owned. */
typedef struct zt_quant4_view {
    zt_quant_type_t type;
    int64_t numel, blocksize;
    const uint8_t *packed;       /* (numel + 1) / 2 */
    int nested;                  /* double quantization */
    const float *absmax;         /* !nested: ceil(numel / blocksize) */
    const uint8_t *absmax_codes; /* nested: ceil(numel / blocksize) indices into the dynamic map */
    const float *nested_absmax;  /* nested: ceil(nblocks / nested_blocksize) */
    int64_t nested_blocksize;    /* nested: 256 */
    float offset;                /* nested */
    zt_quant4_split_t split;     /* which of the tensor's blocks these are (zeros: all of them);
                                  * nested_absmax[0] is the scale of the first one's block of 256 */
} zt_quant4_view_t;

/* Elements [e0, e0 + n) of the tensor, dequantized to float32 into out (n floats), exactly as
 * bitsandbytes' dequantize_4bit: rows r0..r1 of a (rows, cols) weight are e0 = r0 * cols,
 * n = (r1 - r0) * cols, so a caller dequantizes one tile at a time just before its GEMM. */
void zt_quant4_dequantize(const zt_quant4_view_t *q, int64_t e0, int64_t n, float *out);
/* The same into bf16 (bitsandbytes' dequantize_4bit to bfloat16: the float32 value rounded to
 * nearest even), for a bf16 GEMM. */
void zt_quant4_dequantize_bf16(const zt_quant4_view_t *q, int64_t e0, int64_t n, uint16_t *out);

/* The scale of block b (absmax, or its double-quantized form). */
float zt_quant4_block_scale(const zt_quant4_view_t *q, int64_t b);

/* ---- a 4-bit tensor in the space of its float32 values --------------------------------------
 * QLoRA's base keeps each quantized weight as a region of floats of a unit buffer, so the engine
 * that stores, gathers and offloads units moves it as it moves any frozen tensor. The region
 * holds, from its start (floats first, so they stay aligned):
 *   not nested  absmax (nb floats), packed ((n + 1) / 2 bytes)
 *   nested      offset (1 float), nested_absmax (ceil(nb / 256) floats), absmax codes (nb bytes),
 *               packed ((n + 1) / 2 bytes)
 * nb = ceil(n / blocksize): about 0.53 of n floats' 4 bytes per value at block size 64, nested. */

/* The floats at the region's start (offset and nested_absmax, or absmax) for nblocks blocks of
 * split s (NULL: a whole tensor): its bytes (codes, then packed) begin there. */
int64_t zt_quant4_region_floats(int64_t nblocks, int nested, const zt_quant4_split_t *s);
/* The bytes of that layout for n values (at most 4 n for any n >= 1 and block size >= 32 whole). */
size_t zt_quant4_region_bytes(int64_t n, int64_t blocksize, int nested, const zt_quant4_split_t *s);
/* Quantizes the whole tensor x (n values) into that layout in place (its first
 * zt_quant4_region_bytes): x is read first, then overwritten. torch_threads = 1 for the nested offset (see zt_quant_mean). -1 with err naming
 * `name` for a non-finite value or a block size bitsandbytes refuses (x unchanged). */
int zt_quant4_pack_region(const char *name, zt_quant_type_t t, int nested, int64_t blocksize, float *x, int64_t n,
                          char *err, size_t errlen);
/* Writes the parts a view points to (a tensor as a file stores it: packed bytes, absmax or its
 * codes, nested absmax, offset) into that layout at region (zt_quant4_region_bytes of it);
 * nested_blocksize must be 256, as the layout assumes. */
void zt_quant4_region_write(const zt_quant4_view_t *q, float *region);
/* The view of a region written by zt_quant4_pack_region (s NULL) or zt_quant4_region_split. */
void zt_quant4_region_view(zt_quant_type_t t, int nested, int64_t blocksize, const float *region, int64_t n,
                           const zt_quant4_split_t *s, zt_quant4_view_t *v);
/* The region of split s's n values (whole blocks of the tensor, or its tail) cut from the whole
 * tensor's view q: their packed bytes, their absmax or codes, the nested scales they need and the
 * offset, byte for byte what q holds for them (the packed bytes left as they are where q->packed
 * is NULL: a rank that fills in only those it owns). */
void zt_quant4_region_split(const zt_quant4_view_t *q, const zt_quant4_split_t *s, int64_t n, float *region);

/* ---- bitsandbytes' serialised quant_state --------------------------------------------------- */

typedef enum { ZT_QUANT_DT_F32 = 0, ZT_QUANT_DT_F16 = 1, ZT_QUANT_DT_BF16 = 2 } zt_quant_dtype_t;

/* The JSON of WEIGHT.quant_state.bitsandbytes__nf4 (or __fp4), typed. */
typedef struct zt_quant_state {
    zt_quant_type_t type;
    int64_t blocksize;
    zt_quant_dtype_t dtype;      /* of the unquantized weight: what dequantize returns in bitsandbytes */
    int ndim;
    int64_t shape[ZT_QUANT_MAX_DIMS];
    int64_t numel;
    int nested;                  /* nested_* fields present */
    int64_t nested_blocksize;
    zt_quant_dtype_t nested_dtype;
    float nested_offset;
} zt_quant_state_t;

/* Parses the len JSON bytes of tensor `tensor` (its name ends in bitsandbytes__<quant_type>).
 * -1 with one line naming the tensor and the field on bad input. */
int zt_quant_state_parse(const char *tensor, const char *json, size_t len, zt_quant_state_t *out, char *err,
                         size_t errlen);

/* Checks the lengths of a stored tensor's parts against its quant_state: packed bytes, absmax
 * count (bytes when nested), nested_absmax count (ignored when not nested); `weight` is the
 * weight's name ("model.layers.0.mlp.down_proj.weight"). -1 with "WEIGHT.absmax: ..." in err. */
int zt_quant4_check_sizes(const char *weight, const zt_quant_state_t *st, int64_t packed_bytes, int64_t absmax_len,
                          int64_t nested_absmax_len, char *err, size_t errlen);

/* ---- config.json's quantization_config (transformers' BitsAndBytesConfig) ------------------- */

typedef struct json_t json_t;

#define ZT_QUANT_MAX_SKIP 64

typedef struct zt_quant_hf {
    int quantized;               /* 0: the model has no quantization_config */
    zt_quant_type_t type;        /* bnb_4bit_quant_type (transformers' default fp4) */
    int double_quant;            /* bnb_4bit_use_double_quant */
    zt_quant_dtype_t compute_dtype; /* bnb_4bit_compute_dtype (default float32) */
    int n_skip;                  /* llm_int8_skip_modules: modules kept in full precision */
    char skip[ZT_QUANT_MAX_SKIP][128];
} zt_quant_hf_t;

/* Reads quantization_config from a parsed config.json object (`file` for messages). Only
 * bitsandbytes 4-bit with uint8 storage is accepted; 8-bit, GPTQ, AWQ, fp8 and every other
 * quant_method are refused with one line naming the file and the key. */
int zt_quant_hf_config(const json_t *config, const char *file, zt_quant_hf_t *out, char *err, size_t errlen);

#endif
