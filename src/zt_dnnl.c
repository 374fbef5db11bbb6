/* zt_dnnl.c — bf16 GEMMs through oneDNN's matmul primitive, and the cpuid test
 * for bf16 units (zt_dnnl.h).
 *
 * One CPU engine for the process; one stream, operand scratch and oneDNN
 * scratchpad per thread (thread-local), so that the attention kernel may call
 * a GEMM from each of its OpenMP threads at once: oneDNN sees it is inside a
 * parallel region and runs that product on the calling thread. Primitives live
 * in one process-wide cache, keyed by everything that shapes them (M, N, K,
 * the two transposes, ldc, bias or not, accumulate or not, alpha) and created
 * once under a mutex; a primitive may execute concurrently on several streams
 * because each execution brings its own scratchpad (scratchpad_mode = user).
 *
 * Operands are rounded to bf16 (round to nearest even, exactly zt_bf16.h's
 * conversion) into contiguous scratch in their stored layout; a transposed
 * operand is described to oneDNN by its strides. Accumulation (dweight +=) is
 * the sum post-op; bias is oneDNN's fp32 bias; alpha is an output scale. */
#include "config.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "zt_bf16.h"
#include "zt_common.h"
#include "zt_dnnl.h"

/* ------------------------------------------------------------ detection -- */

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

const char *zt_dnnl_units(void)
{
    static int done = 0;
    static const char *units = NULL;
    if (done) return units;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)) /* OSXSAVE */) {
        uint64_t xcr0 = xgetbv0();
        int zmm_os = (xcr0 & 0xe6) == 0xe6;             /* SSE, AVX, opmask, ZMM state */
        int amx_os = (xcr0 & 0x60000) == 0x60000;       /* XTILECFG, XTILEDATA */
        unsigned b7 = 0, d7 = 0, a71 = 0;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            b7 = b;
            d7 = d;
            if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) a71 = a;
        }
        int avx512f = (b7 >> 16) & 1, avx512bw = (b7 >> 30) & 1;
        int avx512_bf16 = zmm_os && avx512f && avx512bw && ((a71 >> 5) & 1);
        int amx_bf16 = zmm_os && amx_os && ((d7 >> 22) & 1) && ((d7 >> 24) & 1); /* AMX-BF16, AMX-TILE */
        units = amx_bf16 ? "amx_bf16" : avx512_bf16 ? "avx512_bf16" : NULL;
    }
#endif
    done = 1;
    return units;
}

int zt_dnnl_mode(void)
{
    static int mode = -1;
    if (mode >= 0) return mode;
    const char *env = getenv("ZT_DNNL");
    int force = env && strcmp(env, "force") == 0, off = env && strcmp(env, "off") == 0;
#ifdef ZT_HAVE_DNNL
    mode = off ? ZT_DNNL_OFF : zt_dnnl_units() ? ZT_DNNL_UNITS : force ? ZT_DNNL_FORCED : ZT_DNNL_OFF;
#else
    (void)force;
    (void)off;
    mode = ZT_DNNL_OFF;
#endif
    return mode;
}

#ifndef ZT_HAVE_DNNL

const char *zt_dnnl_isa(void) { return "none (built without oneDNN)"; }
void zt_dnnl_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, const float *bias, int accumulate, float *C, int ldc)
{
    zt_fatal("zt_dnnl_gemm: ztrain was built without oneDNN");
}
int zt_dnnl_native_bf16(void) { return 0; }
long zt_dnnl_primitives_created(void) { return 0; }
void zt_dnnl_view(int slot, const float *view, const uint16_t *bf16, size_t n) {}
void zt_dnnl_round_counts(long *from_view, long *rounded) { *from_view = *rounded = 0; }
const void *zt_dnnl_round(int slot, const float *src, int rows, int cols, int ld)
{
    zt_fatal("zt_dnnl_round: ztrain was built without oneDNN");
}
void zt_dnnl_gemm_rounded(int ta, int tb, int M, int N, int K, float alpha, const void *A,
                          const void *B, const float *bias, int accumulate, float *C, int ldc)
{
    zt_fatal("zt_dnnl_gemm_rounded: ztrain was built without oneDNN");
}

#else /* ZT_HAVE_DNNL */

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

/* Every oneDNN call through this: rank, host, file:line, the call and oneDNN's status. */
#define ZT_DNNL(call)                                                                    \
    do {                                                                                 \
        dnnl_status_t zt_dnnl_st_ = (call);                                              \
        if (zt_dnnl_st_ != dnnl_success)                                                 \
            zt_fatal_at(__FILE__, __LINE__, "%s failed: %s (dnnl_status %d)", #call,     \
                        dnnl_status2str(zt_dnnl_st_), (int)zt_dnnl_st_);                 \
    } while (0)

const char *zt_dnnl_isa(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

typedef struct {
    int ta, tb, M, N, K, ldc, bias, acc;
    float alpha;
} gemm_key_t;

typedef struct {
    gemm_key_t k;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, bias_md, c_md, scr_md;
    size_t scr_bytes;
} entry_t;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t **cache;
static int ncache, capcache;
static long ncreated;
static dnnl_engine_t engine;

long zt_dnnl_primitives_created(void)
{
    pthread_mutex_lock(&cache_lock);
    long n = ncreated;
    pthread_mutex_unlock(&cache_lock);
    return n;
}

static int key_eq(const gemm_key_t *a, const gemm_key_t *b)
{
    return a->ta == b->ta && a->tb == b->tb && a->M == b->M && a->N == b->N && a->K == b->K &&
           a->ldc == b->ldc && a->bias == b->bias && a->acc == b->acc && a->alpha == b->alpha;
}

/* The operands' type in oneDNN: bf16 where this oneDNN has a bf16 matmul for
 * the processor; otherwise (oneDNN 2.x implements bf16 only from avx512_core
 * on) fp32 holding the bf16-rounded values. The products of two bf16 numbers
 * are exact in fp32, so the emulation computes what a bf16 matmul with fp32
 * accumulation computes, up to summation order: ZT_DNNL=force tests this
 * module's rounding, layouts, caching, post-ops and threading on any CPU. */
/* dnnl_data_type_t once decided (under cache_lock; read without it by zt_dnnl_round) */
static _Atomic int opdt = -1;

static void decide_opdt(void)
{
    if (opdt >= 0) return;
    if (!engine) ZT_DNNL(dnnl_engine_create(&engine, dnnl_cpu, 0));
    dnnl_memory_desc_t a, c;
    dnnl_dims_t d = {8, 8};
    ZT_DNNL(dnnl_memory_desc_init_by_tag(&a, 2, d, dnnl_bf16, dnnl_ab));
    ZT_DNNL(dnnl_memory_desc_init_by_tag(&c, 2, d, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    ZT_DNNL(dnnl_matmul_desc_init(&md, &a, &a, NULL, &c));
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL);
    if (st == dnnl_success) {
        ZT_DNNL(dnnl_primitive_desc_destroy(pd));
        opdt = dnnl_bf16;
    } else if (st == dnnl_unimplemented) {
        opdt = dnnl_f32;
    } else {
        ZT_DNNL(st);
    }
}

int zt_dnnl_native_bf16(void)
{
    if (opdt < 0) {
        pthread_mutex_lock(&cache_lock);
        decide_opdt();
        pthread_mutex_unlock(&cache_lock);
    }
    return opdt == dnnl_bf16;
}

static entry_t *create_entry(const gemm_key_t *k)
{
    entry_t *e = zt_calloc(1, sizeof *e);
    e->k = *k;
    decide_opdt();
    /* op(A) (M,K): stored (M,K) contiguous, or (K,M) contiguous read transposed */
    dnnl_dims_t ad = {k->M, k->K}, as = {k->ta ? 1 : k->K, k->ta ? k->M : 1};
    dnnl_dims_t bd = {k->K, k->N}, bs = {k->tb ? 1 : k->N, k->tb ? k->K : 1};
    dnnl_dims_t cd = {k->M, k->N}, cs = {k->ldc, 1};
    dnnl_dims_t biasd = {1, k->N}, biass = {k->N, 1};
    ZT_DNNL(dnnl_memory_desc_init_by_strides(&e->a_md, 2, ad, (dnnl_data_type_t)opdt, as));
    ZT_DNNL(dnnl_memory_desc_init_by_strides(&e->b_md, 2, bd, (dnnl_data_type_t)opdt, bs));
    ZT_DNNL(dnnl_memory_desc_init_by_strides(&e->c_md, 2, cd, dnnl_f32, cs));
    if (k->bias) ZT_DNNL(dnnl_memory_desc_init_by_strides(&e->bias_md, 2, biasd, dnnl_f32, biass));
    dnnl_matmul_desc_t md;
    ZT_DNNL(dnnl_matmul_desc_init(&md, &e->a_md, &e->b_md, k->bias ? &e->bias_md : NULL, &e->c_md));
    dnnl_primitive_attr_t attr;
    ZT_DNNL(dnnl_primitive_attr_create(&attr));
    ZT_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (k->alpha != 1.0f) ZT_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha));
    dnnl_post_ops_t po = NULL;
    if (k->acc) {
        ZT_DNNL(dnnl_post_ops_create(&po));
        ZT_DNNL(dnnl_post_ops_append_sum(po, 1.0f));
        ZT_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_primitive_desc_t pd;
    ZT_DNNL(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL));
    /* which implementation oneDNN chose: ZT_DNNL_VERBOSE=1 prints each; a reference
     * (C loop) one is warned about once, as it would make the bf16 path slow */
    const char *impl = "?";
    ZT_DNNL(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    static int warned = 0;
    const char *verbose = getenv("ZT_DNNL_VERBOSE");
    if ((verbose && *verbose && strcmp(verbose, "0") != 0) || (strstr(impl, "ref") && !warned)) {
        fprintf(stderr, "zt_dnnl: %s matmul M=%d N=%d K=%d ta=%d tb=%d ldc=%d bias=%d acc=%d alpha=%g: %s%s\n",
                opdt == dnnl_bf16 ? "bf16" : "f32 (bf16-rounded)", k->M, k->N, k->K, k->ta, k->tb, k->ldc,
                k->bias, k->acc, (double)k->alpha, impl,
                strstr(impl, "ref") ? " (a reference implementation: slow)" : "");
        if (strstr(impl, "ref")) warned = 1;
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) e->scr_md = *smd;
    e->scr_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    ZT_DNNL(dnnl_primitive_create(&e->prim, pd));
    ZT_DNNL(dnnl_primitive_desc_destroy(pd));
    if (po) ZT_DNNL(dnnl_post_ops_destroy(po));
    ZT_DNNL(dnnl_primitive_attr_destroy(attr));
    return e;
}

static const entry_t *lookup(const gemm_key_t *k)
{
    pthread_mutex_lock(&cache_lock);
    entry_t *e = NULL;
    for (int i = 0; i < ncache; i++)
        if (key_eq(&cache[i]->k, k)) {
            e = cache[i];
            break;
        }
    if (!e) {
        e = create_entry(k);
        if (ncache == capcache) {
            capcache = capcache ? 2 * capcache : 64;
            entry_t **nc = realloc(cache, (size_t)capcache * sizeof *nc);
            if (!nc) zt_fatal("out of memory growing the oneDNN primitive cache");
            cache = nc;
        }
        cache[ncache++] = e;
        ncreated++;
    }
    pthread_mutex_unlock(&cache_lock);
    return e;
}

/* per-thread: stream, operand scratch, scratchpad, and the memory objects of the
 * primitives this thread ran (created once, re-pointed per call: creating five
 * objects per call cost microseconds, as much as a small attention GEMM) */
#define MEMCACHE 256
typedef struct {
    const entry_t *e;
    dnnl_memory_t m[5]; /* src, weights, dst, bias, scratchpad */
} memset_t;
typedef struct {
    dnnl_stream_t stream;
    memset_t mem[MEMCACHE];
    void *slot[ZT_DNNL_SLOTS]; /* rounded operands: bf16, or fp32 holding bf16 values */
    size_t nslot[ZT_DNNL_SLOTS];
    void *scr;
    size_t nscr;
} tls_t;
static __thread tls_t tls;

static void *grow(void *p, size_t *have, size_t need)
{
    if (need <= *have) return p;
    free(p);
    *have = need + need / 4;
    return zt_aligned_alloc(*have);
}

static void execute(const entry_t *e, const void *A, const void *B, const float *bias, float *C)
{
    if (!tls.stream) {
        pthread_mutex_lock(&cache_lock);
        if (!engine) ZT_DNNL(dnnl_engine_create(&engine, dnnl_cpu, 0));
        pthread_mutex_unlock(&cache_lock);
        ZT_DNNL(dnnl_stream_create(&tls.stream, engine, dnnl_stream_default_flags));
    }
    if (e->scr_bytes) tls.scr = grow(tls.scr, &tls.nscr, e->scr_bytes);
    void *h[5] = {(void *)A, (void *)B, C, (void *)bias, tls.scr};
    const dnnl_memory_desc_t *md[5] = {&e->a_md, &e->b_md, &e->c_md, &e->bias_md, &e->scr_md};
    const int have[5] = {1, 1, 1, e->k.bias, e->scr_bytes > 0};
    size_t slot = ((uintptr_t)e >> 4) % MEMCACHE;
    memset_t *ms = &tls.mem[slot];
    if (ms->e != e) { /* miss: replace what this slot held */
        for (int i = 0; i < 5; i++)
            if (ms->m[i]) {
                ZT_DNNL(dnnl_memory_destroy(ms->m[i]));
                ms->m[i] = NULL;
            }
        for (int i = 0; i < 5; i++)
            if (have[i]) ZT_DNNL(dnnl_memory_create(&ms->m[i], md[i], engine, h[i]));
        ms->e = e;
    } else {
        for (int i = 0; i < 5; i++)
            if (have[i]) ZT_DNNL(dnnl_memory_set_data_handle(ms->m[i], h[i]));
    }
    static const int argk[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    for (int i = 0; i < 5; i++)
        if (have[i]) args[nargs++] = (dnnl_exec_arg_t){argk[i], ms->m[i]};
    ZT_DNNL(dnnl_primitive_execute(e->prim, tls.stream, nargs, args));
    ZT_DNNL(dnnl_stream_wait(tls.stream));
}

/* K = 0: oneDNN is not asked about empty products */
static void empty_product(int M, int N, const float *bias, int accumulate, float *C, int ldc)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            C[(size_t)m * ldc + n] = (accumulate ? C[(size_t)m * ldc + n] : 0.0f) + (bias ? bias[n] : 0.0f);
}

static void gemm_rounded(int ta, int tb, int M, int N, int K, float alpha, const void *A,
                         const void *B, const float *bias, int accumulate, float *C, int ldc)
{
    if (bias && alpha != 1.0f) zt_fatal("zt_dnnl_gemm: alpha != 1 with a bias is not supported");
    gemm_key_t k = {.ta = !!ta, .tb = !!tb, .M = M, .N = N, .K = K, .ldc = ldc, .bias = bias != NULL,
               .acc = !!accumulate, .alpha = alpha};
    execute(lookup(&k), A, B, bias, C);
}

/* rows x cols at row stride ld -> contiguous, rounded to bf16 (round to nearest
 * even, zt_bf16.h): as bf16, or (wide) as the fp32 value of that bf16 */
static void round_into(void *dst, const float *restrict src, int rows, int cols, int ld, int wide)
{
#pragma omp parallel for if ((size_t)rows * cols >= 65536 && !omp_in_parallel()) schedule(static)
    for (int r = 0; r < rows; r++) {
        const uint32_t *restrict s = (const uint32_t *)(src + (size_t)r * ld);
        if (wide) {
            uint32_t *restrict d = (uint32_t *)dst + (size_t)r * cols;
#pragma omp simd
            for (int c = 0; c < cols; c++) d[c] = (uint32_t)zt_bf16_from_bits(s[c]) << 16;
        } else {
            uint16_t *restrict d = (uint16_t *)dst + (size_t)r * cols;
#pragma omp simd
            for (int c = 0; c < cols; c++) d[c] = zt_bf16_from_bits(s[c]);
        }
    }
}

/* zt_dnnl_view's registry: written between kernels by the main thread, read by
 * zt_dnnl_round from any thread */
static struct {
    const float *view;
    const uint16_t *bf16;
    size_t n;
} views[ZT_DNNL_NVIEW];
/* counted only once asked for (ZT_DNNL_VERBOSE, zt_dnnl_round_counts): the attention's
 * threads round operands at once, and a shared counter would be a contended line */
static _Atomic long nfrom_view, nrounded;
static int counting;

static void tally(_Atomic long *c)
{
    if (counting) atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static void print_counts(void)
{
    fprintf(stderr, "zt_dnnl: %ld GEMM operands read from bf16 working copies, %ld rounded\n",
            (long)nfrom_view, (long)nrounded);
}

/* 0 off, 1 on, 2 check (tests: every operand taken from a view is compared with
 * its rounding, so a wrong or stale registration fails even where, as on AVX2, the
 * GEMM reads the fp32 view itself) */
static int views_mode;
static pthread_once_t views_once = PTHREAD_ONCE_INIT;

static void read_views_env(void)
{
    const char *env = getenv("ZT_DNNL_VIEWS");
    views_mode = env && strcmp(env, "off") == 0 ? 0 : env && strcmp(env, "check") == 0 ? 2 : 1;
    const char *verbose = getenv("ZT_DNNL_VERBOSE");
    if (verbose && *verbose && strcmp(verbose, "0") != 0) counting = 1, atexit(print_counts);
}

static int views_on(void)
{
    pthread_once(&views_once, read_views_env);
    return views_mode;
}

void zt_dnnl_view(int slot, const float *view, const uint16_t *bf16, size_t n)
{
    if (slot < 0 || slot >= ZT_DNNL_NVIEW) zt_fatal("zt_dnnl_view: slot %d out of range", slot);
    if (!views_on() || !bf16) view = NULL, bf16 = NULL, n = 0;
    views[slot].view = view, views[slot].bf16 = bf16, views[slot].n = n;
}

void zt_dnnl_round_counts(long *from_view, long *rounded)
{
    counting = 1;
    *from_view = nfrom_view;
    *rounded = nrounded;
}

/* the operand's bf16 values where a registered view holds them (contiguous only:
 * the GEMM reads its operands densely in their stored layout), else NULL */
static const void *from_view(const float *src, size_t n, int wide)
{
    const uintptr_t a = (uintptr_t)src;
    for (int k = 0; k < ZT_DNNL_NVIEW; k++) {
        const uintptr_t v = (uintptr_t)views[k].view;
        if (!v || a < v || (a - v) % sizeof(float)) continue;
        const size_t at = (a - v) / sizeof(float);
        if (n > views[k].n || at > views[k].n - n) continue;
        const uint16_t *h = views[k].bf16 + at;
        if (views_on() == 2)
            for (size_t i = 0; i < n; i++)
                if (zt_bf16_from_bits(((const uint32_t *)src)[i]) != h[i])
                    zt_fatal("zt_dnnl: element %zu of an operand taken from view slot %d is not its bf16 "
                             "copy (%#x, rounded %#x)", at + i, k, h[i],
                             zt_bf16_from_bits(((const uint32_t *)src)[i]));
        return wide ? (const void *)src : (const void *)h;
    }
    return NULL;
}

const void *zt_dnnl_round(int slot, const float *src, int rows, int cols, int ld)
{
    if (slot < 0 || slot >= ZT_DNNL_SLOTS) zt_fatal("zt_dnnl_round: slot %d out of range", slot);
    if (opdt < 0) zt_dnnl_native_bf16();
    views_on(); /* reads the environment once (ZT_DNNL_VERBOSE turns the counters on) */
    const int wide = opdt != dnnl_bf16;
    const size_t count = (size_t)ZT_MAX(rows, 0) * ZT_MAX(cols, 0), n = count * (wide ? 4 : 2);
    if (count && (ld == cols || rows == 1)) {
        const void *v = from_view(src, count, wide);
        if (v) {
            tally(&nfrom_view);
            return v;
        }
    }
    tally(&nrounded);
    tls.slot[slot] = grow(tls.slot[slot], &tls.nslot[slot], n);
    if (n) round_into(tls.slot[slot], src, rows, cols, ld, wide);
    return tls.slot[slot];
}

void zt_dnnl_gemm_rounded(int ta, int tb, int M, int N, int K, float alpha, const void *A,
                          const void *B, const float *bias, int accumulate, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        empty_product(M, N, bias, accumulate, C, ldc);
        return;
    }
    gemm_rounded(ta, tb, M, N, K, alpha, A, B, bias, accumulate, C, ldc);
}

void zt_dnnl_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, const float *bias, int accumulate, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        empty_product(M, N, bias, accumulate, C, ldc);
        return;
    }
    const void *a = ta ? zt_dnnl_round(0, A, K, M, lda) : zt_dnnl_round(0, A, M, K, lda);
    const void *b = tb ? zt_dnnl_round(1, B, N, K, ldb) : zt_dnnl_round(1, B, K, N, ldb);
    gemm_rounded(ta, tb, M, N, K, alpha, a, b, bias, accumulate, C, ldc);
}

#endif /* ZT_HAVE_DNNL */
