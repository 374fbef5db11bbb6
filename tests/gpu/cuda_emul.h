/* cuda_emul.h — runs CUDA kernel source on the host, for tests without a GPU (g++, C++20).
 *
 * Include before the kernels (src/zt_attention_kernels.cuh, src/zt_kernels_cuda.cuh). A launch
 * (zt_emu::launch) runs the blocks of the grid one after another; the threads
 * of a block are coroutines (one host thread in all) that switch at barriers
 * only, so a run is deterministic and needs no locks (OS threads with
 * std::barrier would model the same, but with 128-256 of them per block on a
 * two-core machine every barrier costs a round of futex wake-ups). On x86-64 a
 * switch saves the callee-saved registers and the stack pointer (switch_to
 * below); glibc's swapcontext, used elsewhere, also saves and restores the
 * signal mask with a system call at every switch, which was half the run time
 * of tests/gpu/emulate_attention (~3e8 switches):
 *   - __syncthreads waits for every thread of the block; __syncwarp, the
 *     shuffles and the wmma collectives wait for the 32 lanes of the warp;
 *   - schedules (launch's last argument): ASCENDING, warp after warp, each
 *     running as far as it can (through its own warp barriers) before the next
 *     starts, so a warp reading shared memory that another warp fills without
 *     a __syncthreads in between reads the fill pattern instead; DESCENDING,
 *     the same with warps and lanes in the opposite order; RANDOM + seed, warps
 *     interleaved at random at every warp barrier. A kernel free of races
 *     gives bit-identical results under every schedule;
 *   - dynamic shared memory is per block, filled with 0xff bytes (NaN as fp32
 *     and as bf16) before each block, so reads of unwritten shared memory show;
 *     it ends at a PROT_NONE page (writes past the end fault), and the wmma shim
 *     checks its whole 16x16 footprint against the buffer, the 32-byte pointer
 *     alignment and the leading dimension (multiple of 8 for bf16, 4 for fp32);
 *   - atomicAdd on float is a plain read-add-write: threads switch only at
 *     barriers, so it is atomic; the order of the adds is the schedule's, so a
 *     kernel with float atomics need not be bit-identical across schedules
 *     (nor is it on a device);
 *   - __syncthreads_or is a __syncthreads whose result is the OR of every
 *     thread's predicate, read after all have arrived;
 *   - fp16 conversions round as include/zt_fp16.h (IEEE nearest even, as
 *     cvt.rn.f16.f32 does) but turn every NaN into the canonical 0x7fff /
 *     0x7fffffff as the device's cvt does (cuda_fp16.hpp's host path, written
 *     to match it, does the same); rsqrtf and __expf are the correctly rounded
 *     host functions (the device's are within 2 ulp);
 *   - barriers no thread can pass (a __syncthreads some threads skip, lanes of a
 *     warp at different collectives, threads that exit while others wait) stop
 *     the test with a message instead of hanging; so does a partial shuffle mask.
 * The wmma fragments hold the whole 16x16 tile in every lane (see the rules in
 * zt_attention_kernels.cuh); mma_sync accumulates in fp32 in k order. Static
 * __shared__ variables become function statics in a section of their own
 * (zt_emu_shared), which is filled with 0xff before each block like dynamic
 * shared memory: per block only because blocks run one after another; their
 * bounds are not guarded (an overrun hits the neighbouring static). Not
 * emulated: real concurrency and memory ordering, timing, bank conflicts,
 * register pressure; a missing __syncwarp between
 * element-wise shared-memory writes and a wmma load cannot show either, since
 * every shim collective synchronises the warp on entry. */
#ifndef ZT_CUDA_EMUL_H
#define ZT_CUDA_EMUL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>

extern "C" {
#include "zt_bf16.h"
#include "zt_fp16.h"
}

/* internal linkage: in a --with-cuda build libztrain.a also holds nvcc's host
 * stubs of the same kernels (same names), which must neither clash with nor
 * stand in for the emulated ones */
#define __global__ static
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("zt_emu_shared")))
/* the linker's bounds of that section; null where no kernel has static shared memory */
extern "C" __attribute__((weak)) unsigned char __start_zt_emu_shared[], __stop_zt_emu_shared[];
#define ZT_DYNAMIC_SMEM(type, name) type *name = (type *)zt_emu::g.smem

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

using std::max;
using std::min;

namespace zt_emu {

enum { READY, AT_BLOCK, AT_WARP, DONE };

/* ---- the coroutine switch --------------------------------------------------
 * switch_to(from, to) saves the running coroutine's context in *from and resumes
 * *to. On x86-64: the callee-saved registers (rbx, rbp, r12-r15) pushed on the
 * running stack and the stack pointer swapped. That is the whole context at a
 * switch, which is a function call (a barrier): the System V ABI lets a call
 * clobber every other general and vector register, and the floating-point
 * control (mxcsr, the x87 control word), which the ABI makes callee-saved, is
 * the same in every coroutine since no kernel changes it. A new coroutine's
 * stack holds zeros for those registers and returns into its start function.
 * Other machines: ucontext. */
#if defined(__x86_64__)
struct context_t {
    void *sp;
};
/* a weak symbol: one definition however many translation units include this */
extern "C" void zt_emu_switch(void **save_sp, void *load_sp);
asm(".pushsection .text\n"
    ".weak zt_emu_switch\n"
    ".hidden zt_emu_switch\n"
    ".type zt_emu_switch, @function\n"
    ".p2align 4\n"
    "zt_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size zt_emu_switch, . - zt_emu_switch\n"
    ".popsection\n");
inline void switch_to(context_t *from, context_t *to) { zt_emu_switch(&from->sp, to->sp); }
/* c runs start() on the stack [lo, lo + bytes) when first switched to */
inline void make_context(context_t *c, void (*start)(), unsigned char *lo, size_t bytes)
{
    uint64_t *sp = (uint64_t *)((uintptr_t)(lo + bytes) & ~(uintptr_t)15);
    *--sp = 0;                              /* start()'s return address: it never returns */
    *--sp = (uint64_t)(uintptr_t)start;     /* where zt_emu_switch's ret goes */
    for (int r = 0; r < 6; r++) *--sp = 0;  /* rbp, rbx, r12-r15 */
    c->sp = sp;
}
#else
struct context_t {
    ucontext_t uc;
};
inline void switch_to(context_t *from, context_t *to) { swapcontext(&from->uc, &to->uc); }
inline void make_context(context_t *c, void (*start)(), unsigned char *lo, size_t bytes)
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = nullptr;  /* start() never returns */
    makecontext(&c->uc, start, 0);
}
#endif

struct thread_t {
    context_t ctx;
    dim3 idx;
    int state;
    unsigned lin;         /* linear thread index in the block */
    unsigned shfl;        /* shuffles done: picks the slot buffer */
    unsigned votes;       /* __syncthreads_or calls done: picks the vote buffer */
    unsigned long warp_syncs;  /* warp barriers passed: lanes must agree */
};

struct state_t {
    std::vector<thread_t> th;
    context_t sched;
    unsigned cur;
    dim3 grid, block, bidx;
    unsigned char *smem = nullptr;          /* this block's dynamic shared memory */
    size_t smem_bytes = 0;
    unsigned char *stacks = nullptr;
    size_t stack_bytes = 0, stacks_map = 0;
    unsigned char *smem_map = nullptr;
    size_t smem_map_bytes = 0;
    std::function<void()> body;
    std::vector<uint64_t> slots[2];         /* shuffle exchange, 32 per warp, double-buffered */
    std::vector<unsigned char> votes[2];    /* __syncthreads_or predicates, double-buffered */
    unsigned long switches = 0;
};
inline state_t g;

[[noreturn]] inline void fail(const char *what)
{
    fprintf(stderr, "cuda_emul: %s (block %u,%u,%u thread %u)\n", what, g.bidx.x, g.bidx.y,
            g.bidx.z, g.cur);
    exit(1);
}

inline thread_t &self() { return g.th[g.cur]; }

inline void wait_at(int state)
{
    thread_t &t = self();
    t.state = state;
    g.switches++;
    switch_to(&t.ctx, &g.sched);
}

inline void warp_barrier(unsigned mask)
{
    if (mask != 0xffffffffu) fail("partial warp mask: the emulator supports full warps only");
    wait_at(AT_WARP);
}

/* a coroutine's start: the block's body, then back to the scheduler for good */
inline void entry()
{
    g.body();
    self().state = DONE;
    switch_to(&self().ctx, &g.sched);
    fail("a finished thread was resumed");
}

/* Is p (n bytes) inside this block's shared memory? Whole or not at all. */
inline void check_smem(const void *p, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    if (c + n <= g.smem || c >= g.smem + g.smem_bytes) return;  /* global memory */
    if (c < g.smem || c + n > g.smem + g.smem_bytes) fail("wmma access outside shared memory");
}

/* Schedules: warp after warp in ascending or descending order, each running
 * as far as it can (through its warp barriers) before the next one starts; or
 * warps picked at random (seeded, so reproducible) one warp-barrier step at a
 * time, which interleaves them at every collective. */
enum { ASCENDING = 0, DESCENDING = 1, RANDOM = 2 /* + seed */ };

/* Runs the READY lanes of warp w until each blocks; releases the warp when all
 * 32 wait at a warp barrier. Returns whether it released them. */
inline bool step_warp(unsigned w, bool reverse)
{
    for (unsigned li = 0; li < 32; li++) {
        const unsigned i = w * 32 + (reverse ? 31 - li : li);
        if (g.th[i].state != READY) continue;
        g.cur = i;
        switch_to(&g.sched, &g.th[i].ctx);
    }
    unsigned at_warp = 0;
    for (unsigned l = 0; l < 32; l++) at_warp += g.th[w * 32 + l].state == AT_WARP;
    if (at_warp == 0) return false;
    if (at_warp < 32) fail("lanes of a warp at different barriers (divergent collective)");
    for (unsigned l = 0; l < 32; l++) {
        g.th[w * 32 + l].state = READY;
        g.th[w * 32 + l].warp_syncs++;
    }
    return true;
}

/* Runs one block to the end under a schedule. */
inline void run_block(unsigned schedule)
{
    const unsigned n = (unsigned)g.th.size(), nwarps = n / 32;
    const bool reverse = schedule == DESCENDING;
    uint64_t rng = 0x2545f4914f6cdd1dull * (schedule + 1) + g.bidx.x * 7919u + g.bidx.y;
    for (unsigned i = 0; i < n; i++) {
        thread_t &t = g.th[i];
        t.lin = i;
        t.idx = dim3(i % g.block.x, i / g.block.x % g.block.y, i / (g.block.x * g.block.y));
        t.state = READY;
        t.shfl = 0;
        t.votes = 0;
        t.warp_syncs = 0;
        /* its stack above a guard page; the tops staggered by 17 cache lines so that the
         * threads' hot frames do not all fall in the same cache sets (the stacks are
         * 256 KiB apart), which made the switches ~10% slower */
        make_context(&t.ctx, entry, g.stacks + (size_t)i * g.stack_bytes + 4096,
                     g.stack_bytes - 4096 - (size_t)(i % 61) * 17 * 64);
    }
    std::vector<unsigned> live(nwarps);
    for (;;) {
        if (schedule < RANDOM) {
            for (unsigned wi = 0; wi < nwarps; wi++)
                while (step_warp(reverse ? nwarps - 1 - wi : wi, reverse)) {}
        } else {
            for (;;) {  /* warps with a lane READY are live; pick one at random */
                live.clear();
                for (unsigned w = 0; w < nwarps; w++)
                    for (unsigned l = 0; l < 32; l++)
                        if (g.th[w * 32 + l].state == READY) { live.push_back(w); break; }
                if (live.empty()) break;
                rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                step_warp(live[rng % live.size()], false);
            }
        }
        unsigned done = 0, at_block = 0;
        for (unsigned i = 0; i < n; i++) {
            done += g.th[i].state == DONE;
            at_block += g.th[i].state == AT_BLOCK;
        }
        for (unsigned i = 0; i < n; i++)
            if (g.th[i].warp_syncs != g.th[i & ~31u].warp_syncs)
                fail("lanes of a warp passed different numbers of warp barriers");
        if (done == n) return;
        if (at_block != n) fail("__syncthreads not reached by every thread of the block");
        for (unsigned i = 0; i < n; i++) g.th[i].state = READY;
    }
}

/* Runs kernel(args...) as grid x block threads with `smem` bytes of dynamic
 * shared memory: f is a callable that calls the kernel with its arguments. */
template <class F>
void launch(dim3 grid, dim3 block, size_t smem, F &&f, unsigned schedule = ASCENDING)
{
    const unsigned n = block.x * block.y * block.z;
    if (n == 0 || n % 32 || n > 1024) fail("block size must be a positive multiple of 32, at most 1024");
    if (smem > (size_t)227 << 10) fail("more dynamic shared memory than any device allows (227 KiB)");
    g.grid = grid;
    g.block = block;
    g.body = f;
    g.th.assign(n, thread_t{});
    for (int b = 0; b < 2; b++) {
        g.slots[b].assign((size_t)n, 0);
        g.votes[b].assign((size_t)n, 0);
    }
    /* coroutine stacks, each with a guard page below it */
    const size_t stack = (size_t)256 << 10;
    if (g.stacks_map < stack * n) {
        if (g.stacks) munmap(g.stacks, g.stacks_map);
        g.stacks_map = stack * n;
        g.stacks = (unsigned char *)mmap(nullptr, g.stacks_map, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (g.stacks == MAP_FAILED) fail("mmap of the coroutine stacks failed");
        for (unsigned i = 0; i < n; i++) mprotect(g.stacks + (size_t)i * stack, 4096, PROT_NONE);
    }
    g.stack_bytes = stack;
    /* shared memory ending at a guard page, its start 128-byte aligned */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t span = (smem + 127 + page - 1) / page * page;
    if (g.smem_map) munmap(g.smem_map, g.smem_map_bytes);
    g.smem_map_bytes = span + page;
    g.smem_map = (unsigned char *)mmap(nullptr, g.smem_map_bytes, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.smem_map == MAP_FAILED) fail("mmap of shared memory failed");
    mprotect(g.smem_map + span, page, PROT_NONE);
    g.smem = (unsigned char *)(((uintptr_t)(g.smem_map + span - smem)) & ~(uintptr_t)127);
    g.smem_bytes = smem;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                g.bidx = dim3(x, y, z);
                memset(g.smem_map, 0xff, span);
                if (__start_zt_emu_shared)
                    memset(__start_zt_emu_shared, 0xff,
                           (size_t)(__stop_zt_emu_shared - __start_zt_emu_shared));
                run_block(schedule);
            }
}

template <class T>
inline T shuffle(unsigned mask, T v, unsigned src_lane)
{
    static_assert(sizeof(T) <= 8, "shuffles of up to 8 bytes");
    thread_t &t = self();
    const unsigned lane = t.lin % 32, base = t.lin - lane;
    /* double-buffered: a lane can write shuffle k+2's slot only after every
     * lane has passed shuffle k+1's barrier, so after every read of shuffle k */
    std::vector<uint64_t> &slot = g.slots[t.shfl++ & 1];
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    slot[base + lane] = bits;
    warp_barrier(mask);
    bits = slot[base + (src_lane % 32)];
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* Block-wide vote: double-buffered like the shuffles, since a thread can write
 * vote k+2's buffer only after every thread has passed vote k+1's barrier. */
inline int syncthreads_or(int pred)
{
    thread_t &t = self();
    std::vector<unsigned char> &v = g.votes[t.votes++ & 1];
    v[t.lin] = pred != 0;
    wait_at(AT_BLOCK);
    for (unsigned char x : v)
        if (x) return 1;
    return 0;
}

}  // namespace zt_emu

#define threadIdx (zt_emu::self().idx)
#define blockIdx (zt_emu::g.bidx)
#define blockDim (zt_emu::g.block)
#define gridDim (zt_emu::g.grid)

inline void __syncthreads() { zt_emu::wait_at(zt_emu::AT_BLOCK); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { zt_emu::warp_barrier(mask); }
template <class T> inline T __shfl_sync(unsigned mask, T v, int src)
{
    return zt_emu::shuffle(mask, v, (unsigned)src);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int m)
{
    return zt_emu::shuffle(mask, v, (zt_emu::self().lin % 32) ^ (unsigned)m);
}
inline int __syncthreads_or(int pred) { return zt_emu::syncthreads_or(pred); }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* one IEEE operation each, round to nearest even, never fused: the tests build with
 * -ffp-contract=off, so the plain operators are exactly that */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
/* Serial by construction: threads switch at barriers only. */
inline float atomicAdd(float *p, float v)
{
    const float old = *p;
    *p = old + v;
    return old;
}

/* ---- bf16: the bits, rounded as include/zt_bf16.h (nearest even) ---------- */

struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{zt_bf16_from_f32(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return zt_bf16_to_f32(h.bits); }

/* ---- fp16: IEEE rounding (zt_fp16.h), NaNs canonical as the device's cvt -- */

struct __half {
    unsigned short x;
};
inline __half __float2half_rn(float f)
{
    return __half{(__float_as_uint(f) & 0x7fffffffu) > 0x7f800000u ? (unsigned short)0x7fffu
                                                                    : zt_fp16_from_f32(f)};
}
inline float __half2float(__half h)
{
    return (h.x & 0x7fffu) > 0x7c00u ? __uint_as_float(0x7fffffffu) : zt_fp16_to_f32(h.x);
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }

/* ---- wmma: 16x16x16, bf16 operands, fp32 accumulators --------------------- */

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

/* Every lane holds the whole tile, row-major (m, k), (k, n) or (m, n). */
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the shim has 16x16x16 only");
    static constexpr int num_elements = 256;
    T x[256];
};

/* The checks a real load/store would fail (or silently misbehave) on; the
 * footprint is 15 ldm + 16 elements in either layout. */
template <class T> inline void check_access(const T *p, unsigned ldm)
{
    if ((uintptr_t)p % 32) zt_emu::fail("wmma pointer not 32-byte aligned");
    if (ldm % (16 / sizeof(T))) zt_emu::fail("wmma leading dimension not a multiple of 16 bytes");
    zt_emu::check_smem(p, ((size_t)15 * ldm + 16) * sizeof(T));
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

/* operands: element (r, c) of the tile at p[r ldm + c] (row_major) or p[c ldm + r] */
template <class Use, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                             const __nv_bfloat16 *p, unsigned ldm)
{
    zt_emu::warp_barrier(0xffffffffu);
    constexpr bool col = std::is_same<L, col_major>::value;
    check_access(p, ldm);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = col ? p[c * ldm + r] : p[r * ldm + c];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout)
{
    zt_emu::warp_barrier(0xffffffffu);
    check_access(p, ldm);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout)
{
    zt_emu::warp_barrier(0xffffffffu);
    check_access(p, ldm);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            if (layout == mem_col_major) p[c * ldm + r] = f.x[r * 16 + c];
            else p[r * ldm + c] = f.x[r * 16 + c];
        }
}

/* The last product mma_sync computed, by the bits of its operands: a warp's lanes
 * hold the same fragments and run one after another from one warp barrier to the
 * next (every schedule steps a whole warp at a time), so 31 of 32 lanes find their
 * product here instead of repeating 4096 multiply-adds; a lane whose operands differ
 * in any bit computes its own. */
struct mma_memo_t {
    bool valid;
    uint16_t a[256], b[256];
    float c[256], d[256];
};
inline mma_memo_t mma_memo;

/* d = a b + c; the products of bf16 are exact in fp32, summed in k order */
template <class La, class Lb>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, La> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Lb> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    static_assert(sizeof a.x == sizeof mma_memo.a && sizeof c.x == sizeof mma_memo.c, "fragment sizes");
    zt_emu::warp_barrier(0xffffffffu);
    mma_memo_t &memo = mma_memo;
    if (memo.valid && !memcmp(memo.a, a.x, sizeof memo.a) && !memcmp(memo.b, b.x, sizeof memo.b) &&
        !memcmp(memo.c, c.x, sizeof memo.c)) {
        memcpy(d.x, memo.d, sizeof memo.d);
        return;
    }
    memcpy(memo.a, a.x, sizeof memo.a);
    memcpy(memo.b, b.x, sizeof memo.b);
    memcpy(memo.c, c.x, sizeof memo.c);
    float af[256], bf[256], out[256];
    for (int i = 0; i < 256; i++) {
        af[i] = __bfloat162float(a.x[i]);
        bf[i] = __bfloat162float(b.x[i]);
        out[i] = c.x[i];
    }
    for (int m = 0; m < 16; m++)
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 16; n++) out[m * 16 + n] += af[m * 16 + k] * bf[k * 16 + n];
    memcpy(memo.d, out, sizeof out);
    memo.valid = true;
    memcpy(d.x, out, sizeof out);
}
}  // namespace wmma
}  // namespace nvcuda

#endif
