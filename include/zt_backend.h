/* zt_backend.h — the compute backend interface: pure kernels on buffers.
 *
 * A backend is a struct of function pointers with a name, registered in one
 * table (zt_backend.c) whose entries configure's defines guard. The CPU backend
 * (OpenBLAS GEMMs, OpenMP loops) always exists, so everything runs and is tested
 * without a GPU; the CUDA backend fills the same struct with device kernels.
 * Kernels know no model, no MPI and no config: buffers, shapes, scalars.
 *
 * Buffers passed to kernels live in the backend's memory (alloc/free); the CPU
 * backend's memory is host memory. All kernels are asynchronous with respect to
 * the host on devices that allow it; sync() waits for them.
 *
 * Letters: N rows (= B*T tokens), C channels, OC output channels, B batch,
 * T time, NH heads, NKV key/value heads, HD head size, I MLP size, V vocabulary.
 * Row-major throughout. Backward kernels ACCUMULATE (+=) into parameter gradients (so micro-batches and the tied
 * embedding sum naturally) and OVERWRITE activation gradients unless noted. */
#ifndef ZT_BACKEND_H
#define ZT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct zt_quant4_split; /* zt_quant.h */
enum { ZT_DQ4_BYTEWISE = 1, ZT_DQ4_BF16 = 2 }; /* dequant4's flags */

enum { ZT_MATMUL_HIGHEST = 0, ZT_MATMUL_HIGH = 1, ZT_MATMUL_MEDIUM = 2 };

typedef struct zt_backend {
    const char *name;
    /* memory */
    void *(*alloc)(size_t bytes);           /* zero-filled, aborts on failure */
    /* Optional (NULL: alloc): alloc for a buffer that is freed and allocated again every
     * step (the shard engine's gathers and transient gradients) */
    void *(*alloc_transient)(size_t bytes);
    void (*free)(void *p);                  /* device: stream-ordered (zt_backend_cuda.cu) */
    void (*memzero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);     /* backend -> backend */
    void (*to_host)(void *host, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *host, size_t bytes);
    void (*sync)(void);
    /* Host memory the backend transfers to and from fastest (pinned on CUDA), for
     * state kept off the device (offload); zero-filled, aborts on failure. */
    void *(*alloc_host)(size_t bytes);
    void (*free_host)(void *p);
    /* Asynchronous transfers between backend memory and alloc_host memory, so
     * offload's copies overlap its CPU work. A download starts after the work
     * already queued on the backend; its host buffer is valid after
     * wait_downloads. An upload may read its host buffer until wait_uploads
     * returns (do not change it before); backend work queued after the upload
     * sees the uploaded data. */
    void (*to_host_async)(void *host, const void *src, size_t bytes);
    void (*from_host_async)(void *dst, const void *host, size_t bytes);
    void (*wait_downloads)(void);
    void (*wait_uploads)(void);
    /* GEMM arithmetic for fp32 operands, as torch.set_float32_matmul_precision:
     * ZT_MATMUL_HIGHEST fp32, _HIGH TF32 tensor cores, _MEDIUM bf16 tensor cores
     * (fp32 accumulation in all three). A backend without such units ignores it; the
     * CPU backend runs MEDIUM on bf16 units through oneDNN (zt_cpu_gemm_path). */
    void (*set_matmul_precision)(int level);

    /* out (N,C) = wte[inp] (token embedding rows); a negative id gives a zero row (a
     * vocabulary row another tensor-parallel rank holds), and no gradient */
    void (*embedding_forward)(float *out, const int32_t *inp, const float *wte, int N, int C);
    /* dwte[inp] += dout (N,C) */
    void (*embedding_backward)(float *dwte, const float *dout, const int32_t *inp, int N, int C);
    /* out (B,T,C) += wpe[p] (learned positions), p = positions[b*T + t] (B*T), or t when
     * positions is NULL; positions restart per packed sample under neat packing */
    void (*positional_forward)(float *out, const float *wpe, const int32_t *positions, int B, int T,
                               int C);
    /* dwpe[p] += dout[b,t] over every (b,t), p as in the forward (NULL: dwpe[t] += sum
     * over b, in increasing b) */
    void (*positional_backward)(float *dwpe, const float *dout, const int32_t *positions, int B,
                                int T, int C);
    /* out (N,C), mean (N), rstd (N) = layernorm(inp) * weight + bias, biased variance;
     * bias may be NULL */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C, float eps);
    /* dinp (N,C) +=, dweight (C) +=, dbias (C) += (dbias may be NULL) */
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
    /* RMSNorm as HF's LlamaRMSNorm, over groups: each of the N rows (row stride `stride`
     * floats, for inp, out, dout and dinp alike) holds H groups of D channels at h*D;
     * out = inp * rstd * weight, rstd (N*H) = 1/sqrt(mean(inp^2) + eps), weight (D).
     * H = 1, D = stride = C is the plain norm; H heads of D = head_dim inside a packed
     * qkv row is Qwen3's q_norm / k_norm. */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int N,
                            int H, int D, int stride, float eps);
    /* dinp +=, dweight (D) += (same strided layout as the forward) */
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int H, int D,
                             int stride);
    /* Rotary embedding in place, HF's rotate_half convention: on each of H heads of D
     * channels (D even) of the B*T rows of x (row stride `stride`, head h at h*D), with
     * angle a_i = pos * inv_freq[i] (fp32 product), i < D/2:
     *   x[i] <- x[i] cos a_i - x[i + D/2] sin a_i ; x[i + D/2] <- x[i + D/2] cos a_i + x[i] sin a_i
     * pos = positions[b*T + t], or t when positions is NULL. */
    void (*rope_forward)(float *x, const float *inv_freq, const int32_t *positions, int B, int T,
                         int H, int D, int stride);
    /* The transpose (rotation by -a), in place on the gradient: dx <- R^T dx */
    void (*rope_backward)(float *dx, const float *inv_freq, const int32_t *positions, int B, int T,
                          int H, int D, int stride);
    /* SwiGLU: gu (N,2I) holds [gate | up] per row (one GEMM over gate_proj and up_proj);
     * out (N,I) = silu(gate) * up. The parameter is spelled NI: `I` is a macro of
     * <complex.h>, which OpenBLAS's cblas.h includes. */
    void (*swiglu_forward)(float *out, const float *gu, int N, int NI);
    /* dgu (N,2I) = d/d[gate | up] from dout (N,I), overwritten; dgu may be gu itself */
    void (*swiglu_backward)(float *dgu, const float *dout, const float *gu, int N, int NI);
    /* GeGLU (Gemma's MLP), the same layout: out (N,I) = gelu(gate) * up with the tanh
     * approximation of gelu_forward (HF's gelu_pytorch_tanh) */
    void (*geglu_forward)(float *out, const float *gu, int N, int NI);
    /* dgu (N,2I) from dout (N,I), overwritten; dgu may be gu itself */
    void (*geglu_backward)(float *dgu, const float *dout, const float *gu, int N, int NI);
    /* out (N,OC) = inp (N,C) @ W + bias, W is (C,OC) (HF Conv1D layout), or
     * W is (OC,C) and used transposed when transw != 0 (tied lm_head: W = wte).
     * bias may be NULL. */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC, int transw);
    /* dinp (N,C) = dout @ W^T (overwritten: the callers need no zeroing pass) ;
     * dweight += inp^T @ dout (same layout as W) ; dbias (OC) += colsum(dout).
     * dinp, dweight, dbias may be NULL to skip (dweight: a frozen weight). */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC, int transw);
    /* C (M,Nn) = alpha op(A) op(B) + beta C, row-major with leading dimensions (floats);
     * beta is 0 (overwrite) or 1 (accumulate). A is stored (M,K), or (K,M) when ta; B
     * (K,Nn), or (Nn,K) when tb. For products of column blocks of wider buffers (LoRA's
     * adapters read and write their target's columns of a fused GEMM's rows in place),
     * which the whole-buffer matmul_forward/backward cannot express. */
    void (*gemm)(int ta, int tb, int M, int Nn, int K, float alpha, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc);
    /* The backward of a rank-r product y (N,O) += p (N,r) B^T, B (O,r) (LoRA's B side): dp
     * (N,r) = dy B, overwritten, and when dB is non-NULL dB (O,r) += dy^T p, both from one
     * pass over dy. Row strides ldy, ldp, lddp (floats). NULL in a backend without it: the
     * caller runs the two as gemm calls. */
    void (*lowrank_backward)(int N, int O, int r, const float *dy, int ldy, const float *B, const float *p, int ldp,
                             float *dp, int lddp, float *dB);
    /* The MLP's up projection and its activation as one operation, so that a backend
     * can apply GELU in its GEMM's epilogue: pre (N,OC) = inp (N,C) @ W (C,OC) + bias ;
     * out (N,OC) = gelu(pre). pre is what gelu_matmul_backward needs. */
    void (*matmul_gelu_forward)(float *out, float *pre, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC);
    /* The backward of y (N,OC) = gelu(pre) @ W (C,OC) + bias, where act (N,C) = gelu(pre)
     * as stored: dweight += act^T @ dy ; dbias (OC) += colsum(dy) (dbias may be NULL) ;
     * then dpre (N,C) = (dy @ W^T) * gelu'(pre), overwritten. The gradients of W come
     * first, so dpre may be act itself (the model reuses that buffer). */
    void (*gelu_matmul_backward)(float *dpre, float *dweight, float *dbias, const float *dy,
                                 const float *act, const float *pre, const float *weight, int N,
                                 int C, int OC);
    /* Causal self-attention, flash-style: no (B,NH,T,T) matrix is kept or needed.
     * qkv (B,T,(NH+2NKV)*HD) as [q | k | v]: q head h at channels h*HD, k head g at
     * (NH+g)*HD, v head g at (NH+NKV+g)*HD; query head h reads KV head h / (NH/NKV)
     * (grouped-query attention, HF's repeat_kv; NKV divides NH). out (B,T,NH*HD);
     * lse (B,NH,T) = log sum_{j<=t} exp(s_tj), the natural log-sum-exp of the scaled
     * scores s_tj = q_t.k_j / sqrt(HD) of each causally masked row, all backward needs
     * besides qkv and out to recompute the probabilities p_tj = exp(s_tj - lse_t).
     * GPT-2 is NKV = NH, HD = C/NH.
     * seg (B,T) or NULL: packed samples (neat packing). With seg, query t of row b sees
     * key j <= t only when seg[b*T+j] == seg[b*T+t] (the sums above run over those j),
     * so each segment is causal attention on its own; the key t itself is always seen.
     * A negative id -s marks padding as HF's attention_mask does: query t of segment -s
     * sees the keys j <= t of segment s, and no query sees the key of a negative id,
     * its own included (LLaMA-Factory's right-padded DPO rows, whose logits it averages).
     * NULL is plain causal attention, computed exactly as without the argument.
     * window > 0: a sliding window (HF's sliding_window, Mistral's and Gemma's local
     * layers): query t sees key j only when t - j < window as well; 0: no window. */
    void (*attention_forward)(float *out, float *lse, const float *qkv, const int32_t *seg, int B,
                              int T, int NH, int NKV, int HD, int window);
    /* dqkv (B,T,(NH+2NKV)*HD) += from dout (B,T,NH*HD), with qkv, out and lse from the
     * forward: D_t = dout_t.out_t ; ds_tj = p_tj (dout_t.v_j - D_t) ;
     * dq_t += sum_j ds_tj k_j / sqrt(HD) ; dk_j += sum_t ds_tj q_t / sqrt(HD) ;
     * dv_j += sum_t p_tj dout_t (per query head; a KV head sums its query heads).
     * seg, window: the forward's (p_tj = 0 where they mask). */
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const int32_t *seg, int B, int T, int NH, int NKV,
                               int HD, int window);
    /* Ring attention's pieces (sequence parallelism): the attention of a block of Tq
     * queries against a block of Tk keys. q (B,Tq) rows of stride qs, query head h at
     * h*HD; k and v (B,Tk) rows of stride ks, KV head g at g*HD (h reads h / (NH/NKV)).
     * causal: the two blocks are the same positions (Tq = Tk, row t sees keys 0..t);
     * else every key is visible. qseg (B,Tq), kseg (B,Tk): the rows' segment ids (neat
     * packing; NULL: none): a key is seen only by queries of its segment (a negative
     * query id -s: of s, attention_forward's padding); a query row that
     * sees no key of the block gets out 0 and lse -inf. out (B,Tq,NH*HD) and lse (B,NH,Tq)
     * are this block's alone; attention_merge folds them into a running result. NULL where
     * a backend lacks them. window > 0: a sliding window (attention_forward's), query row t
     * at delta + t positions after key 0 (causal blocks: delta 0) sees key j only when
     * delta + t - j < window; 0: no window (delta unused). */
    void (*attention_block_forward)(float *out, float *lse, const float *q, int qs, const float *k, const float *v,
                                    int ks, const int32_t *qseg, const int32_t *kseg, int B, int Tq, int Tk, int NH,
                                    int NKV, int HD, int causal, int window, int delta);
    /* dq (stride qs) +=, dk, dv (stride ks) += for one block pair, with out and lse the
     * FINAL (merged) output and log-sum-exp of the query rows: the probabilities are
     * exp(s - lse) of the whole row, so the pairs' backwards add up to the full one */
    void (*attention_block_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q, int qs,
                                     const float *k, const float *v, int ks, const int32_t *qseg,
                                     const int32_t *kseg, const float *out, const float *lse, int B, int Tq, int Tk,
                                     int NH, int NKV, int HD, int causal, int window, int delta);
    /* out, lse (the running result, lse -inf: no key yet) := the softmax over its keys and
     * those of (out2, lse2): lse = log(e^lse + e^lse2), out weighted by e^(lse_i - lse) */
    void (*attention_merge)(float *out, float *lse, const float *out2, const float *lse2, int B, int T, int NH,
                            int HD);
    /* tanh-approximate GELU, elementwise over n */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n); /* dinp = */
    /* dst rows (N, width) at row stride dst_stride = src rows at src_stride (floats):
     * a column block of a packed buffer, such as the v part of a qkv row */
    void (*copy_rows)(float *dst, int dst_stride, const float *src, int src_stride, int N, int width);
    /* out = a + b */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    /* y += x */
    void (*accumulate)(float *y, const float *x, size_t n);
    /* In place: logits (N,V) become dlogits = (softmax - onehot(target)) * dscale;
     * losses (N) = -log softmax[target]. Targets < 0 are ignored (loss 0, grad 0).
     * With dscale == 0 only the losses are computed and logits are left unspecified. */
    void (*crossentropy_fused)(float *logits, float *losses, const int32_t *targets,
                               int N, int V, float dscale);
    /* Vocabulary-parallel cross-entropy (Megatron's): logits (N,V) are this rank's
     * columns [v0, v0 + V) of the vocabulary, the row statistics are completed by
     * all-reduces over the tensor-parallel ranks between the passes, so the full
     * (N, V tp) logits never exist. rowmax (N) = max of each row (then MAX over tp);
     * sz (N,2) = sum_j exp(logits - rowmax) and the target's logit where it is one of
     * these columns, else 0 (then SUM over tp); finally losses (N) = log sum - (target
     * logit - rowmax) and, with dscale != 0, logits become (softmax - onehot) * dscale.
     * Targets < 0 are ignored (loss 0, gradient 0). */
    void (*vocab_ce_max)(float *rowmax, const float *logits, int N, int V);
    void (*vocab_ce_sum)(float *sz, const float *logits, const float *rowmax, const int32_t *targets, int v0,
                         int N, int V);
    void (*vocab_ce_grad)(float *logits, float *losses, const float *rowmax, const float *sz,
                          const int32_t *targets, int v0, int N, int V, float dscale);
    /* Dropout with a counter-based mask (LoRA's lora_dropout): out (N,C) = x / (1 - p) where
     * kept, 0 where dropped; element (n, c) is dropped when u < p, u the top 53 bits of
     * zt_splitmix64(row_keys[n] ^ salt ^ zt_splitmix64(c0 + c + 1)) over 2^53 (row_keys (N)
     * backend memory; c0: x's first column in the whole input, so a tp rank's slice of
     * the features draws that slice of one rank's mask). The same keys and salt give the
     * same mask on every backend, so the backward multiplies by the same mask. out may be x. */
    void (*dropout_mask)(float *out, const float *x, const uint64_t *row_keys, uint64_t salt, int N, int C, int c0,
                         float p);
    /* x *= s */
    void (*scale)(float *x, float s, size_t n);
    /* sum of x^2 in double, the global-norm building block */
    double (*sumsq)(const float *x, size_t n);
    /* 1 if every element is finite */
    int (*all_finite)(const float *x, size_t n);
    /* AdamW with PyTorch semantics on a contiguous range:
     * m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2 ;
     * p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
     * `step` is t (1-based). grad_scale multiplies g first (clipping). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, float grad_scale, long step);
    /* bf16 <-> fp32 (round to nearest even) */
    void (*to_bf16)(uint16_t *out, const float *in, size_t n);
    void (*from_bf16)(float *out, const uint16_t *in, size_t n);
    /* IEEE fp16 <-> fp32: round to nearest even, overflow to +-Inf, subnormal
     * halves kept; bit-exact with include/zt_fp16.h on every backend, except that a
     * device may return another quiet NaN for a NaN */
    void (*to_fp16)(uint16_t *out, const float *in, size_t n);
    void (*from_fp16)(float *out, const uint16_t *in, size_t n);
    /* The engine's fp32 view view[0, n) holds exactly the bf16 values bf16[0, n)
     * (it was widened from them) until the next call for the same slot (0..2); a
     * NULL bf16 withdraws it. bf16 GEMMs may then read a weight inside the view
     * from its bf16 copy instead of rounding it again per GEMM. Optional (NULL). */
    void (*bf16_view)(int slot, const float *view, const uint16_t *bf16, size_t n);
    /* bitsandbytes' dequantize_4bit to float32, bit for bit (include/zt_quant.h): out (n) =
     * the 4-bit tensor of n values that zt_quant4_pack_region wrote at region (backend
     * memory, the floats of a unit), quant_type a zt_quant_type_t (nf4, fp4), nested its
     * double quantization, blocksize its block, split the tensor's blocks these n values
     * are (a tensor-parallel rank's share, zt_quant4_region_split; NULL: the whole tensor).
     * flags: ZT_DQ4_BYTEWISE, the region is stored a byte per float (its value 0..255: a
     * bf16 working copy widened); ZT_DQ4_BF16, each value rounded to bf16 (bitsandbytes'
     * dequantize_4bit to bfloat16), out still float. QLoRA's linear runs it before each GEMM
     * with a 4-bit weight. */
    void (*dequant4)(float *out, const float *region, int64_t n, int quant_type, int nested, int64_t blocksize,
                     const struct zt_quant4_split *split, int flags);
    /* 1 when the host can read and write this backend's buffers directly (last, so
     * initializers that omit it mean "device memory") */
    int host_memory;
    /* 1 for a counting backend (zt_memplan.h): its memory is address space that is never
     * touched and its data operations do nothing, so code that allocates can be run
     * once to measure what it would allocate */
    int dry;
} zt_backend_t;

/* Registry: NULL-terminated, CPU backend always present. */
extern const zt_backend_t *const zt_backends[];
/* Looks a backend up by name ("cpu", "cuda"); NULL if not built in or unusable. */
const zt_backend_t *zt_backend_get(const char *name);

extern const zt_backend_t zt_backend_cpu;

/* Number of threads the CPU kernels (and OpenBLAS) use. */
void zt_cpu_set_threads(int n);
/* fp16 conversions through the x86 F16C instructions when the processor has them
 * (want = 1, the default) or the portable code (want = 0); returns 1 when F16C is
 * in use. For tests: both paths give identical bits. */
int zt_cpu_use_f16c(int want);
/* The CPU backend's GEMM path after set_matmul_precision, for the startup log:
 * "fp32", "bf16 (oneDNN, avx512_bf16)" (or amx_bf16), "bf16 (oneDNN forced by
 * ZT_DNNL=force ...)" or "fp32: no bf16 units (train.bf16 computes in fp32)".
 * Under ZT_MATMUL_MEDIUM the CPU backend's GEMMs run in bf16 through oneDNN
 * when the processor has AVX512-BF16 or AMX-BF16 (src/zt_dnnl.h); the
 * environment variable ZT_DNNL=force does so without the units (tests),
 * ZT_DNNL=off never. */
const char *zt_cpu_gemm_path(void);

#endif
