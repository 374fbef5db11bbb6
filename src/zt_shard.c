/* zt_shard.c — the shard engine: residency, gathers, reductions, optimizer shard.
 *
 * Every strategy is expressed with the same per-unit pieces:
 *   lay      who owns which elements (over the optimizer-shard group `sg`;
 *            ddp uses a one-rank layout: every rank owns everything)
 *   full     persistent full parameters (ddp, zero1, zero2)
 *   gath     transient gathered parameters (shard_grad_op, zero3, hybrids)
 *   shard_p  owned master parameters, packed (the strategies above that shard params)
 *   gfull    full gradients: persistent (ddp, zero1) or per unit during backward
 *   gshard   owned gradients, packed (everything but ddp)
 *   m, v     Adam moments of the owned elements, packed
 * Replicated state (ddp over the world, hybrids over the replica group) is
 * kept identical by reducing gradients over `rg` as well.
 *
 * bf16 (opts->param_dtype): the master weights are fp32 and packed like m and v
 * (shard_p, for every strategy, ddp included), and counted with the optimizer
 * state as in ZeRO's 2 + 2 + 12 bytes per parameter. The working copy is bf16:
 * wfull (ddp, zero1, zero2) or wshard (the strategies that shard parameters,
 * the source of bf16 all-gathers into gath). After AdamW the working copy is
 * re-rounded from the master (and re-gathered where the strategy gathers). The
 * model computes in fp32, so zt_shard_params widens a unit into one of two fp32
 * scratch buffers (the root unit's and the running block's).
 * Gradients: the model accumulates fp32 into the unit gradient buffer; with
 * reduce_dtype bf16 a unit is rounded to bf16 for its reduction (gcomm, rs16) and
 * widened again where it lands. What persists across micro-steps (gfull for
 * ddp/zero1, gshard otherwise) stays fp32: accumulating micro-batches in bf16
 * would round every partial sum to 8 bits, and DeepSpeed's bf16 optimizer keeps
 * fp32 gradient accumulators for the same reason. With one rank nothing is
 * communicated, so nothing is rounded.
 *
 * Offload (offload_optim): the fp32 master of the owned elements (`master`, packed
 * like m and v), m and v live in host memory from the backend's alloc_host (pinned
 * on CUDA) and AdamW runs there with the CPU kernel. The backend keeps the working
 * parameters (fp32 or bf16); per unit, the optimizer step steps the host shard and
 * uploads the owned part of the working copy (rounded to bf16 on the host, so half
 * the bytes cross the bus), then re-gathers it where the strategy keeps parameters
 * replicated. Where gradients are sharded (zero2, shard_grad_op, zero3: host_grads)
 * the owned gradient accumulators live on the host too, as in ZeRO-Offload: each
 * unit's reduced gradients are downloaded while the next unit's backward computes
 * (one download in flight; from the second micro-step on they are added on the
 * host), so the backend holds no gradient state between units at all. ddp, zero1
 * and the hybrids keep their gradients on the backend and download the owned part
 * unit by unit during the optimizer step (the next download under this AdamW). With
 * offload_param the owned parameter shard itself stays on the host (fp32: the master
 * is the working shard) and each gather first uploads it into a transient buffer.
 * The arithmetic is the same CPU kernels in the same order, so on the CPU backend an
 * offloaded run is bit-identical to one that is not.
 *
 * fp16 (opts->param_dtype) is the same machinery with IEEE binary16 as the working dtype
 * (pdt) and, with reduce_dtype fp16, as the reduction dtype (gdt); to16/from16 are the
 * only places that pick the conversion. The model's gradients are loss-scaled by
 * the train loop. One addition: once reduced, the owned gradients are rounded to
 * fp16 (zt_shard_finish_grads), so the optimizer always steps with fp16 gradient
 * values and a scaled gradient past 65504 becomes Inf at one rank as at many, with
 * fp32 or fp16 reductions alike (an fp16 reduction already produced fp16 values,
 * for which the rounding changes nothing). That is what makes an overflow, and so
 * the dynamic loss scale, the same at every world size.
 *
 * NVMe (offload_nvme, ZeRO-Infinity): the same host-side state, but it lives in scratch
 * files (zt_nvme.h) and is in host memory only while a unit needs it: u->master, m, v
 * (and, with offload_param, the owned parameter shard: the fp32 master itself or the
 * 16-bit wshard) point into one of the module's buffers between nv_in and nv_out, and
 * are NULL otherwise. Each unit is two records: its optimizer state and its parameter
 * shard (unit_records). The optimizer step takes the units in its order, reading the
 * next unit's record while AdamW steps this one, and the write of the previous one runs
 * meanwhile; a gather reads the parameter record (zt_shard_prefetch starts that read
 * ahead). Checkpoint views stage the records through host memory. The arithmetic is
 * the host offload's, so results are bit-identical to it and to no offload on the CPU
 * backend.
 *
 * Frozen units (t->unit_frozen[u], LoRA's base) hold their parameters only: full
 * (fp32) or wfull (16-bit) where parameters are replicated, shard_p (fp32), master
 * (fp32 under offload_param: it is the working shard) or wshard (16-bit) where they
 * are sharded; no gfull, gshard, m, v, no fp32 master beside a 16-bit copy, and none
 * of the reduction or offload landing buffers. Their gradients are NULL, their
 * grads_ready a no-op, and the optimizer step passes them by (no re-gather: they
 * never change). Gathers treat them as any unit. The I/O view widens a 16-bit
 * frozen copy into an fp32 host staging and rounds a loaded one back (io_round).
 *
 * Pipelines (opts.held): a pipeline rank holds the units of its stages only. The others
 * are absent: nothing allocated, and every loop over units passes them by, so a rank's
 * parameters, gradients and optimizer state are its stages' as the strategy spreads them
 * over its data ranks. Gradients are reduced over the data ranks alone; the root unit,
 * held by the first and the last stage where the head is tied (opts.root_shared), has its two parts summed
 * between those two ranks (one message each way), and the squared norm is summed over the
 * pipeline ranks.
 *
 * Ordering: every rank issues the same collectives in the same order because
 * the train loop calls the step protocol identically everywhere (the ranks of one data
 * group hold the same stages, so their units' collectives match). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_onebit.h"
#include "zt_shard.h"

typedef struct opt_seg {
    int param;
    size_t uoff, len, spos; /* unit offset, length, position in the packed shard */
} opt_seg_t;

#define MAX_REQ 64

typedef struct unit_state {
    zt_unit_layout_t lay;
    size_t S;               /* elements this rank owns (packed, padding included) */
    size_t spos0;           /* displ of this rank in packed order */
    float *full, *shard_p, *gfull, *gshard, *m, *v, *rs_tmp;
    float *master;          /* offload: host fp32 master of the owned elements (S) */
    void *up;               /* offload_param: the shard uploaded for a gather in flight */
    float *dl_dev;          /* host_grads: reduced gradients being downloaded (dl_n) */
    size_t dl_n;
    void *gath;             /* P elements of the working dtype */
    uint16_t *wfull, *wshard;   /* 16-bit (pdt) working copies (P, S) */
    uint16_t *gcomm, *rs16;     /* 16-bit (gdt) gradients in flight (P), landing (S) */
    int frozen;             /* no gradients, no optimizer state (see the file comment) */
    int absent;             /* another pipeline rank's stage's (opts.held): no state at all */
    int gathered, gather_pending, bwd_done;
    zt_request_t gather_req;
    zt_request_t red_req[MAX_REQ];
    int nred, red_pending;  /* red_pending: rs_tmp must be folded into gshard */
    opt_seg_t *oseg;
    int noseg;
    zt_onebit_set_t *onebit; /* 1-bit Adam: the unit's tensors' error feedback */
} unit_state_t;

struct zt_shard {
    const zt_param_table_t *t;
    zt_comm_t *comm;
    const zt_backend_t *be;
    zt_shard_opts_t o;
    zt_group_t *sg, *rg;    /* optimizer-shard group (NULL for ddp), replica group (NULL if none) */
    zt_group_t *obg;        /* 1-bit Adam's exchange group: rg under ddp, sg under zero1/zero2 */
    int n, rank_in_sg;
    int shard_params, persistent_grads, hybrid;
    int micro, nmicro, inference;
    long adam_step;
    unit_state_t *u;
    void *pack_tmp;         /* per_param packing buffer (largest packed unit) */
    size_t pack_tmp_n, pack_es;
    int mixed;              /* 16-bit working copies (bf16 or fp16) */
    int offload, offload_param;
    int host_grads;         /* offload with sharded gradients: gshard in host memory */
    int dl_unit, dl_add;    /* host_grads: the unit whose download is in flight (-1: none),
                             * and whether it lands in hgrad[0] to be added (micro > 0) */
    const zt_backend_t *ob; /* where the optimizer state lives and AdamW runs */
    const zt_backend_t *hb; /* host memory's kernels: the CPU's, or a counting backend itself (a
                             * dry run: its host buffers are address space only, zt_memplan.h) */
    zt_nvme_t *nv;          /* offload_nvme: the files the offloaded state lives in */
    int nv_dry;             /* ...counted only: a dry run's engine (no files, nv NULL) */
    int nvme_param;         /* ...the owned parameter shards among it (offload_param) */
    int nv_early;           /* ...this step's first optimizer records are being read (nv_read_ahead) */
    int comm_ordered;       /* collectives are stream-ordered after uploads (device comm) */
    /* tensor parallelism: the tp group (NULL without), this rank's place in it */
    zt_group_t *tp;
    int tp_rank;
    float *hgrad[2];        /* offload: host landings of owned gradients, by unit parity
                             * (host_grads: hgrad[0] for micro-steps after the first) */
    uint16_t *h16;          /* offload, 16-bit: host rounding of one unit's owned working copy */
    size_t hstage_n;        /* elements of each: the largest owned shard */
    size_t pesz;            /* bytes of a working parameter element */
    zt_dtype_t pdt, gdt;    /* dtype of parameter gathers and of gradient reductions */
    /* mixed: fp32 views of the root unit [0], of the running block [1] and of its LoRA
     * adapter unit [2] (used together with the block) */
    float *scratch[3];
    size_t scratch_n[3];
    int slot_unit[3], slot_held[3];
    zt_shard_mem_t mem, mem_peak;
    /* transient buffers (gathers, unit gradients, landing buffers) are reused by size:
     * returning them to the allocator costs a page fault per 4 KiB on every reuse */
    struct { void *p; size_t bytes; } cache[2];
    int ncache;
};

/* the element type of a precision in transfers and reductions */
static zt_dtype_t comm_dtype(zt_precision_t p)
{
    return p == ZT_PREC_FP16 ? ZT_F16 : p == ZT_PREC_BF16 ? ZT_BF16 : ZT_F32;
}

/* 1-bit Adam's compressed stage: optimizer step `step` (1-based) comes after the freeze */
static int onebit_compressed(const zt_shard_t *s, long step)
{
    return s->o.optimizer == ZT_OPTIM_ONEBIT_ADAM && step > s->o.freeze_step;
}

/* ...under zero1/zero2: no gradient reduce-scatter, each rank keeps its full local
 * gradient (gfull) for its own momentum, and the optimizer step exchanges the momentum */
static int onebit_sharded_compressed(const zt_shard_t *s, long step)
{
    return onebit_compressed(s, step) && s->o.strategy != ZT_DDP;
}

/* zero3 and hybrid_shard free a unit right after its forward (when
 * reshard_after_forward); shard_grad_op keeps it from forward to backward. */
static int frees_after_forward(const zt_shard_t *s)
{
    return (s->o.strategy == ZT_ZERO3 || s->o.strategy == ZT_HYBRID) && s->o.reshard_after_forward;
}

/* ---- memory accounting ----------------------------------------------------- */

enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_COMM, MEM_GATHER, MEM_HOST };

static size_t *mem_slot(zt_shard_mem_t *m, int cat)
{
    switch (cat) {
    case MEM_PARAMS: return &m->params;
    case MEM_GRADS: return &m->grads;
    case MEM_OPTIM: return &m->optim;
    case MEM_COMM: return &m->comm_buffers;
    case MEM_HOST: return &m->host;
    default: return &m->gathered_peak;
    }
}

static int is_transient(int cat) { return cat == MEM_COMM || cat == MEM_GATHER; }

/* Fresh buffers are zero-filled (backend alloc); a reused transient buffer is
 * zeroed only when need_zero, since most are overwritten by a collective. */
static void *balloc_z(zt_shard_t *s, int cat, size_t bytes, int need_zero)
{
    size_t *cur = mem_slot(&s->mem, cat), *pk = mem_slot(&s->mem_peak, cat);
    *cur += bytes;
    if (*cur > *pk) *pk = *cur;
    if (is_transient(cat))
        for (int i = s->ncache - 1; i >= 0; i--)
            if (s->cache[i].bytes == bytes) {
                void *p = s->cache[i].p;
                s->cache[i] = s->cache[--s->ncache];
                if (need_zero) s->be->memzero(p, bytes);
                return p;
            }
    if (cat == MEM_HOST) return s->be->alloc_host(bytes);
    return is_transient(cat) && s->be->alloc_transient ? s->be->alloc_transient(bytes) : s->be->alloc(bytes);
}

static void *balloc(zt_shard_t *s, int cat, size_t bytes) { return balloc_z(s, cat, bytes, 0); }

static float *falloc(zt_shard_t *s, int cat, size_t n) { return balloc(s, cat, n * sizeof(float)); }

static void bfree(zt_shard_t *s, int cat, void *p, size_t bytes)
{
    if (!p) return;
    *mem_slot(&s->mem, cat) -= bytes;
    if (cat == MEM_HOST) {
        s->be->free_host(p);
        return;
    }
    if (!is_transient(cat)) {
        s->be->free(p);
        return;
    }
    const int cap = (int)(sizeof s->cache / sizeof *s->cache);
    if (s->ncache == cap) {
        s->be->free(s->cache[0].p);
        memmove(s->cache, s->cache + 1, (size_t)(cap - 1) * sizeof *s->cache);
        s->ncache--;
    }
    s->cache[s->ncache].p = p;
    s->cache[s->ncache++].bytes = bytes;
}
/* frees and clears a buffer of any element type */
#define BFREE(s, cat, p, bytes) do { bfree((s), (cat), (p), (bytes)); (p) = NULL; } while (0)

static void ffree(zt_shard_t *s, int cat, float **p, size_t n)
{
    BFREE(s, cat, *p, n * sizeof(float));
}

/* where the owned gradient accumulators live */
static int grads_mem(const zt_shard_t *s) { return s->host_grads ? MEM_HOST : MEM_GRADS; }

/* ---- NVMe residency -------------------------------------------------------------- */

/* offload_nvme: what unit ui keeps in the files, as two records: its optimizer state
 * (record ui: the fp32 master, exp_avg, exp_avg_sq, the master left out where it is the
 * parameter shard) and, with nvme_param, its owned parameter shard (record nunits + ui:
 * the fp32 master, or the 16-bit working shard). S: owned elements. The one description
 * of the files, for the engine and its estimate alike. */
static void unit_records(int frozen, int mixed, int nvme_param, size_t S, zt_nvme_rec_t *opt, zt_nvme_rec_t *par)
{
    memset(opt, 0, sizeof *opt);
    memset(par, 0, sizeof *par);
    if (nvme_param) par->bytes[par->nfield++] = S * (mixed ? 2 : 4);
    if (frozen) return;
    if (!nvme_param || mixed) opt->bytes[opt->nfield++] = S * 4;
    opt->bytes[opt->nfield++] = S * 4;
    opt->bytes[opt->nfield++] = S * 4;
}

enum { NV_OPT = 1, NV_PAR = 2 };

/* offload_nvme: unit ui's records `what` into host buffers, the pointers set; those in
 * `read` are read from the file, the others the caller overwrites (no-op without nvme) */
static void nv_in(zt_shard_t *s, int ui, int what, int read)
{
    if (!s->nv) return;
    unit_state_t *u = &s->u[ui];
    if ((what & NV_PAR) && s->nvme_param) {
        void **f = zt_nvme_get(s->nv, s->t->nunits + ui, (read & NV_PAR) != 0);
        if (s->mixed) u->wshard = f[0];
        else u->master = f[0];
    }
    if ((what & NV_OPT) && !u->frozen) {
        void **f = zt_nvme_get(s->nv, ui, (read & NV_OPT) != 0);
        int k = 0;
        if (!s->nvme_param || s->mixed) u->master = f[k++];
        u->m = f[k++];
        u->v = f[k];
    }
}

/* hands the records back (`dirty` ones are written); an upload from them must have
 * landed first, since the buffer goes on to another unit */
static void nv_out(zt_shard_t *s, int ui, int what, int dirty)
{
    if (!s->nv) return;
    unit_state_t *u = &s->u[ui];
    if (!s->be->host_memory) s->be->wait_uploads();
    if ((what & NV_PAR) && s->nvme_param) {
        zt_nvme_put(s->nv, s->t->nunits + ui, (dirty & NV_PAR) != 0);
        if (s->mixed) u->wshard = NULL;
        else u->master = NULL;
    }
    if ((what & NV_OPT) && !u->frozen) {
        zt_nvme_put(s->nv, ui, (dirty & NV_OPT) != 0);
        if (!s->nvme_param || s->mixed) u->master = NULL;
        u->m = u->v = NULL;
    }
}

static void nv_prefetch(zt_shard_t *s, int ui, int what)
{
    if (!s->nv || ui < 0 || ui >= s->t->nunits) return;
    if ((what & NV_PAR) && s->nvme_param) zt_nvme_prefetch(s->nv, s->t->nunits + ui);
    if ((what & NV_OPT) && !s->u[ui].frozen) zt_nvme_prefetch(s->nv, ui);
}

/* fresh buffers hold whatever they held: a new unit's state starts from zeros, as the
 * zero-filled allocations of the other tiers do (padding elements included) */
static void nv_zero(zt_shard_t *s, int ui)
{
    if (!s->nv) return;
    unit_state_t *u = &s->u[ui];
    const size_t S = u->S;
    if (u->master) memset(u->master, 0, S * sizeof(float));
    if (u->m) memset(u->m, 0, S * sizeof(float));
    if (u->v) memset(u->v, 0, S * sizeof(float));
    if (s->nvme_param && s->mixed && u->wshard) memset(u->wshard, 0, S * 2);
}

/* ---- construction ---------------------------------------------------------- */

static void build_opt_segments(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    const zt_unit_layout_t *lay = &u->lay;
    const int r = s->rank_in_sg;
    int cap = 16;
    u->oseg = zt_malloc((size_t)cap * sizeof *u->oseg);
    size_t spos = 0;
    const int first = s->t->unit_first[ui], cnt = s->t->unit_count[ui];
    for (int i = 0; i < lay->nseg[r]; i++) {
        zt_segment_t sg = lay->seg[r][i];
        /* split at parameter boundaries so each piece has one weight-decay rule */
        for (int p = first; p < first + cnt; p++) {
            const zt_param_t *pp = &s->t->params[p];
            size_t lo = ZT_MAX(sg.off, pp->offset), hi = ZT_MIN(sg.off + sg.len, pp->offset + pp->numel);
            if (lo >= hi) continue;
            if (u->noseg == cap) {
                cap *= 2;
                u->oseg = realloc(u->oseg, (size_t)cap * sizeof *u->oseg);
                if (!u->oseg) zt_fatal("out of memory");
            }
            u->oseg[u->noseg++] = (opt_seg_t){p, lo, hi - lo, spos + (lo - sg.off)};
        }
        spos += sg.len;
    }
}

/* value pointer of an owned segment (where the master copy lives) */
static float *seg_value(zt_shard_t *s, unit_state_t *u, const opt_seg_t *g)
{
    if (u->frozen) {
        /* the working copy is the only copy: none in fp32 when it is 16-bit */
        if (s->mixed) return NULL;
        if (s->offload_param) return u->master + g->spos;
        return s->shard_params ? u->shard_p + g->spos : u->full + g->uoff;
    }
    if (s->offload) return u->master + g->spos;
    return s->shard_params || s->mixed ? u->shard_p + g->spos : u->full + g->uoff;
}

static void regather_full(zt_shard_t *s, int ui);

/* fp32 <-> the 16-bit dtype dt (ZT_BF16 or ZT_F16) with backend be's kernels */
static void to16_on(const zt_backend_t *be, zt_dtype_t dt, uint16_t *out, const float *in, size_t n)
{
    (dt == ZT_F16 ? be->to_fp16 : be->to_bf16)(out, in, n);
}

static void to16(const zt_shard_t *s, zt_dtype_t dt, uint16_t *out, const float *in, size_t n)
{
    to16_on(s->be, dt, out, in, n);
}

static void from16(const zt_shard_t *s, zt_dtype_t dt, float *out, const uint16_t *in, size_t n)
{
    (dt == ZT_F16 ? s->be->from_fp16 : s->be->from_bf16)(out, in, n);
}

/* offload: host buffers as large as the largest owned shard: two gradient landings
 * (the next unit's download runs while AdamW steps this one), one 16-bit rounding */
static void grow_host_stage(zt_shard_t *s, size_t S)
{
    if (S <= s->hstage_n) return;
    for (int k = 0; k < 2; k++) ffree(s, MEM_HOST, &s->hgrad[k], s->hstage_n);
    BFREE(s, MEM_HOST, s->h16, s->hstage_n * 2);
    s->hstage_n = S;
    for (int k = 0; k < 2; k++) s->hgrad[k] = falloc(s, MEM_HOST, S);
    /* with offload_param a 16-bit working shard is rounded in place, in host memory */
    if (s->mixed && !s->offload_param) s->h16 = balloc(s, MEM_HOST, S * 2);
}

/* The owned part of the working copy from the host master (offload): one upload
 * per segment, of 16-bit values rounded on the host when the working copy is 16-bit.
 * Asynchronous: it runs while AdamW steps the next unit; wait_uploads before the
 * host changes its source or a collective reads the destination. */
static void upload_owned(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    if (s->offload_param) {
        /* the working shard is host memory: fp32 uses the master itself */
        if (s->mixed) to16_on(s->hb, s->pdt, u->wshard, u->master, u->S);
        return;
    }
    const char *src = (const char *)u->master;
    if (s->mixed) {
        s->be->wait_uploads(); /* the previous unit's upload reads h16 */
        to16_on(s->hb, s->pdt, s->h16, u->master, u->S);
        src = (const char *)s->h16;
    }
    const size_t es = s->pesz;
    if (s->shard_params) {
        s->be->from_host_async(s->mixed ? (void *)u->wshard : (void *)u->shard_p, src, u->S * es);
        return;
    }
    char *dst = s->mixed ? (char *)u->wfull : (char *)u->full;
    const int r = s->rank_in_sg;
    size_t pos = 0;
    for (int i = 0; i < u->lay.nseg[r]; i++) {
        const zt_segment_t *g = &u->lay.seg[r][i];
        s->be->from_host_async(dst + g->off * es, src + pos * es, g->len * es);
        pos += g->len;
    }
}

/* 16-bit on the backend: the owned part of the working copy := pdt(master) */
static void round_owned(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    if (s->shard_params) {
        to16(s, s->pdt, u->wshard, u->shard_p, u->S);
        return;
    }
    const int r = s->rank_in_sg;
    size_t pos = 0;
    for (int i = 0; i < u->lay.nseg[r]; i++) {
        const zt_segment_t *g = &u->lay.seg[r][i];
        to16(s, s->pdt, u->wfull + g->off, u->shard_p + pos, g->len);
        pos += g->len;
    }
}

/* Before uploaded data is used: an MPI collective (or the host) reads it at once,
 * so it must have landed; a device's kernels and its comm backend's stream are
 * ordered after the upload by events, so there the host goes on. */
static void uploads_landed(zt_shard_t *s)
{
    if (!s->comm_ordered) s->be->wait_uploads();
}

/* After the master changed: the working copy follows it. A replicated full copy
 * is completed by an all-gather of every rank's part (bf16: the same rounding
 * everywhere), so this is a collective unless parameters are sharded. */
static void refresh_working(zt_shard_t *s, int ui)
{
    if (s->offload) upload_owned(s, ui);
    else if (s->mixed) round_owned(s, ui);
    if (s->shard_params || s->n == 1) return;
    if (s->offload) uploads_landed(s);
    regather_full(s, ui);
}

/* which fp32 view slot a unit widens into (mixed) */
static int slot_of(const zt_param_table_t *t, int ui)
{
    return ui == t->root_unit ? 0 : t->first_adapter_unit >= 0 && ui >= t->first_adapter_unit ? 2 : 1;
}

/* Fp32 view slot k now holds unit ui widened from its 16-bit copy w16 (ui < 0:
 * nothing). A bf16 copy is offered to the backend, whose bf16 GEMMs may then read
 * the unit's weights from it instead of rounding the view again: the two hold
 * the same values for exactly as long as the slot holds the unit. */
static void slot_set(zt_shard_t *s, int k, int ui, const uint16_t *w16)
{
    s->slot_unit[k] = ui;
    if (!s->be->bf16_view) return;
    const int bf16 = ui >= 0 && s->pdt == ZT_BF16;
    s->be->bf16_view(k, bf16 ? s->scratch[k] : NULL, bf16 ? w16 : NULL, bf16 ? s->u[ui].lay.numel : 0);
}

/* the fp32 views of the working copy are stale after it changed */
static void invalidate_slots(zt_shard_t *s)
{
    for (int k = 0; k < 3; k++) slot_set(s, k, -1, NULL), s->slot_held[k] = 0;
}

/* Initial values of unit elements [uoff, uoff + len) into backend memory dst,
 * through a fixed host staging buffer, so start-up never holds a second copy of
 * a unit (the root unit of GPT-2 124M is 154 MB). */
#define INIT_STAGE ((size_t)1 << 20)
static void init_unit_range(zt_shard_t *s, int ui, size_t uoff, size_t len, float *dst, float *stage,
                            const zt_backend_t *dst_be)
{
    const zt_param_table_t *t = s->t;
    for (size_t done = 0; done < len;) {
        const size_t n = ZT_MIN(INIT_STAGE, len - done), e = uoff + done;
        for (int p = t->unit_first[ui]; p < t->unit_first[ui] + t->unit_count[ui]; p++) {
            const zt_param_t *pp = &t->params[p];
            size_t lo = ZT_MAX(e, pp->offset), hi = ZT_MIN(e + n, pp->offset + pp->numel);
            if (lo < hi) zt_param_init_range(pp, s->o.seed, lo - pp->offset, hi - lo, stage + (lo - e));
        }
        dst_be->from_host(dst + done, stage, n * sizeof(float));
        done += n;
    }
}

static void init_values(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    nv_in(s, ui, NV_OPT | NV_PAR, 0);
    nv_zero(s, ui);
    float *stage = zt_malloc(INIT_STAGE * sizeof(float));
    /* Replicated working copies: every rank computes the whole unit itself (a pure
     * function) instead of gathering at start-up. */
    if (!s->shard_params && s->mixed && (s->n > 1 || s->offload)) {
        float *dev = s->be->alloc(INIT_STAGE * sizeof(float));
        for (size_t off = 0; off < u->lay.numel; off += INIT_STAGE) {
            size_t n = ZT_MIN(INIT_STAGE, u->lay.numel - off);
            init_unit_range(s, ui, off, n, dev, stage, s->be);
            to16(s, s->pdt, (uint16_t *)u->wfull + off, dev, n);
        }
        s->be->free(dev);
    }
    if (!s->shard_params && !s->mixed) init_unit_range(s, ui, 0, u->lay.numel, u->full, stage, s->be);
    /* the owned master, where there is one apart from the full copy */
    float *master = s->offload ? u->master : s->shard_params || s->mixed ? u->shard_p : NULL;
    const zt_backend_t *mbe = s->offload ? &zt_backend_cpu : s->be;
    for (int i = 0; master && i < u->noseg; i++) {
        const opt_seg_t *g = &u->oseg[i];
        init_unit_range(s, ui, g->uoff, g->len, master + g->spos, stage, mbe);
    }
    free(stage);
    /* derive what the code above did not compute, without a collective */
    if (s->offload ? s->shard_params : s->mixed && (s->shard_params || s->n == 1)) refresh_working(s, ui);
    nv_out(s, ui, NV_OPT | NV_PAR, NV_OPT | NV_PAR);
}

/* A frozen unit's initial values go straight into its only copy: the fp32
 * parameters, or rounded into the 16-bit working copy (no fp32 master is kept). */
static void init_frozen(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    nv_in(s, ui, NV_PAR, 0);
    nv_zero(s, ui);
    float *stage = zt_malloc(INIT_STAGE * sizeof(float));
    if (!s->shard_params && !s->mixed) {
        init_unit_range(s, ui, 0, u->lay.numel, u->full, stage, s->be);
    } else if (!s->mixed) {
        const zt_backend_t *dbe = s->offload_param ? &zt_backend_cpu : s->be;
        float *dst = s->offload_param ? u->master : u->shard_p;
        for (int i = 0; i < u->noseg; i++)
            init_unit_range(s, ui, u->oseg[i].uoff, u->oseg[i].len, dst + u->oseg[i].spos, stage, dbe);
    } else {
        /* 16-bit: through an fp32 chunk where the working copy lives (offload_param:
         * the host) */
        const zt_backend_t *wbe = s->offload_param ? &zt_backend_cpu : s->be;
        float *tmp = wbe->alloc(INIT_STAGE * sizeof(float));
        if (!s->shard_params) {
            for (size_t off = 0; off < u->lay.numel; off += INIT_STAGE) {
                const size_t n = ZT_MIN(INIT_STAGE, u->lay.numel - off);
                init_unit_range(s, ui, off, n, tmp, stage, wbe);
                to16_on(wbe, s->pdt, u->wfull + off, tmp, n);
            }
        } else {
            for (int i = 0; i < u->noseg; i++) {
                const opt_seg_t *g = &u->oseg[i];
                for (size_t off = 0; off < g->len; off += INIT_STAGE) {
                    const size_t n = ZT_MIN(INIT_STAGE, g->len - off);
                    init_unit_range(s, ui, g->uoff + off, n, tmp, stage, wbe);
                    to16_on(wbe, s->pdt, u->wshard + g->spos + off, tmp, n);
                }
            }
        }
        wbe->free(tmp);
    }
    free(stage);
    nv_out(s, ui, NV_PAR, NV_PAR);
}

static int unit_is_frozen(const zt_param_table_t *t, int ui) { return t->unit_frozen && t->unit_frozen[ui]; }

/* A unit's 16-bit working copy (sharded where the strategy shards parameters, in host
 * memory under offload_param) and room for its fp32 view in the unit's scratch slot */
static void alloc_working16(zt_shard_t *s, unit_state_t *u, int ui)
{
    if (s->shard_params && s->nvme_param)
        ; /* in the files: a buffer's while in use (nv_in) */
    else if (s->shard_params)
        u->wshard = balloc(s, s->offload_param ? MEM_HOST : MEM_PARAMS, u->S * 2);
    else
        u->wfull = balloc(s, MEM_PARAMS, u->lay.packed * 2);
    const int k = slot_of(s->t, ui);
    s->scratch_n[k] = ZT_MAX(s->scratch_n[k], u->lay.numel);
}

/* offload_nvme: opens this rank's files for every unit's records, agreed over the world */
static int open_nvme(zt_shard_t *s, char *err, size_t errlen)
{
    const int nu = s->t->nunits;
    zt_nvme_rec_t *recs = zt_calloc((size_t)2 * nu, sizeof *recs);
    for (int ui = 0; ui < nu; ui++)
        unit_records(s->u[ui].frozen || s->u[ui].absent, s->mixed, s->nvme_param && !s->u[ui].absent,
                     s->u[ui].absent ? 0 : s->u[ui].S, &recs[ui], &recs[nu + ui]);
    zt_shard_mem_t *m = &s->mem;
    if (s->be->dry) { /* a dry run (zt_memplan.h): the figures zt_nvme_open would allocate, no files */
        m->host += (size_t)s->o.nvme.buffer_count * zt_nvme_buffer_bytes(recs, 2 * nu);
        m->nvme = zt_nvme_file_bytes(recs, 2 * nu);
        free(recs);
        s->nv_dry = 1;
        s->mem_peak.host = m->host;
        s->mem_peak.nvme = m->nvme;
        return 0;
    }
    zt_nvme_opts_t o = s->o.nvme;
    o.rank = s->comm->world.rank;
    s->nv = zt_nvme_open(&o, recs, 2 * nu, err, errlen);
    free(recs);
    if (zt_agree_error(s->comm, s->nv == NULL, err, errlen)) return -1;
    zt_nvme_stats_t st;
    zt_nvme_stats(s->nv, &st);
    m->host += (size_t)st.buffers * st.buffer_bytes;
    m->nvme = st.file_bytes;
    s->mem_peak.host = m->host;
    s->mem_peak.nvme = m->nvme;
    return 0;
}

zt_shard_t *zt_shard_create(const zt_param_table_t *t, zt_comm_t *comm, const zt_backend_t *be,
                            const zt_shard_opts_t *opts)
{
    char err[ZT_ERRLEN];
    zt_shard_t *s = zt_shard_create_err(t, comm, be, opts, err, sizeof err);
    if (!s) zt_fatal("%s", err);
    return s;
}

zt_shard_t *zt_shard_create_err(const zt_param_table_t *t, zt_comm_t *comm, const zt_backend_t *be,
                                const zt_shard_opts_t *opts, char *err, size_t errlen)
{
    zt_shard_t *s = zt_calloc(1, sizeof *s);
    s->t = t;
    s->comm = comm;
    s->be = be;
    s->o = *opts;
    const zt_strategy_t st = opts->strategy;
    s->hybrid = zt_strategy_is_hybrid(st);
    s->shard_params = zt_strategy_shards_params(st);
    s->persistent_grads = !zt_strategy_shards_grads(st);
    s->mixed = opts->param_dtype != ZT_PREC_FP32;
    s->pesz = s->mixed ? 2 : 4;
    s->pdt = comm_dtype(opts->param_dtype);
    s->gdt = comm_dtype(opts->reduce_dtype);
    s->offload = opts->offload_optim != 0;
    s->offload_param = s->offload && opts->offload_param && s->shard_params;
    s->nvme_param = s->offload_param && opts->offload_nvme;
    s->host_grads = s->offload && !s->persistent_grads && !s->hybrid;
    s->dl_unit = -1;
    s->hb = be->dry ? be : &zt_backend_cpu;
    s->ob = s->offload ? s->hb : be;
    s->comm_ordered = comm->dev != NULL;
    s->pack_es = ZT_MAX(s->pesz, zt_dtype_size(s->gdt));
    invalidate_slots(s);
    if (st == ZT_DDP) {
        s->sg = NULL;
        s->rg = comm->data.size > 1 ? &comm->data : NULL;
    } else if (s->hybrid) {
        s->sg = &comm->shard;
        s->rg = comm->replica.size > 1 ? &comm->replica : NULL;
    } else {
        s->sg = &comm->data;
        s->rg = NULL;
    }
    s->tp = t->dims.tp_size > 1 ? &comm->tp : NULL;
    s->tp_rank = s->tp ? t->dims.tp_rank : 0;
    s->n = s->sg ? s->sg->size : 1;
    s->rank_in_sg = s->sg ? s->sg->rank : 0;
    s->u = zt_calloc((size_t)t->nunits, sizeof *s->u);
    for (int ui = 0; ui < t->nunits; ui++) {
        unit_state_t *u = &s->u[ui];
        zt_unit_layout_build(&u->lay, t, ui, s->n, opts->layout);
        u->S = u->lay.count[s->rank_in_sg];
        u->spos0 = u->lay.displ[s->rank_in_sg];
        build_opt_segments(s, ui);
        for (int k = 0; k < MAX_REQ; k++) u->red_req[k].req = MPI_REQUEST_NULL;
        u->gather_req.req = MPI_REQUEST_NULL;
        u->frozen = unit_is_frozen(t, ui);
        u->absent = opts->held && !opts->held[ui];
    }
    if (s->offload && opts->offload_nvme && open_nvme(s, err, errlen)) {
        zt_shard_free(s);
        return NULL;
    }
    for (int ui = 0; ui < t->nunits; ui++) {
        unit_state_t *u = &s->u[ui];
        if (u->absent) continue;
        if (u->frozen) {
            /* the parameters only: fp32, or the 16-bit working copy (sharded where
             * the strategy shards parameters, in host memory under offload_param) */
            if (s->mixed) {
                alloc_working16(s, u, ui);
            } else if (s->shard_params) {
                if (s->nvme_param) ; /* in the files */
                else if (s->offload_param) u->master = falloc(s, MEM_HOST, u->S);
                else u->shard_p = falloc(s, MEM_PARAMS, u->S);
            } else
                u->full = falloc(s, MEM_PARAMS, u->lay.packed);
            if (!be->dry) init_frozen(s, ui); /* a dry run allocates only */
            if (opts->layout == ZT_LAYOUT_PER_PARAM && s->n > 1 && u->lay.packed > s->pack_tmp_n)
                s->pack_tmp_n = u->lay.packed;
            continue;
        }
        /* offload: the master, m and v in host memory; the master is the fp32
         * working shard itself when parameter shards are offloaded too */
        const int optim_mem = s->offload ? MEM_HOST : MEM_OPTIM;
        if (s->offload && !s->nv && !s->nv_dry) u->master = falloc(s, MEM_HOST, u->S);
        if (s->mixed) {
            /* fp32 master with the optimizer state, 16-bit working copy as the params */
            if (!s->offload) u->shard_p = falloc(s, MEM_OPTIM, u->S);
            alloc_working16(s, u, ui);
        } else if (s->shard_params) {
            if (!s->offload_param) u->shard_p = falloc(s, MEM_PARAMS, u->S);
        } else
            u->full = falloc(s, MEM_PARAMS, u->lay.packed);
        if (s->persistent_grads) u->gfull = falloc(s, MEM_GRADS, u->lay.packed);
        if (st != ZT_DDP) u->gshard = falloc(s, grads_mem(s), u->S);
        if (!s->nv && !s->nv_dry) { /* nvme: in the files */
            u->m = falloc(s, optim_mem, u->S);
            u->v = falloc(s, optim_mem, u->S);
        }
        if (s->offload) grow_host_stage(s, u->S);
        if (!be->dry) init_values(s, ui);
        if (opts->optimizer == ZT_OPTIM_ONEBIT_ADAM) {
            /* every parameter of the unit whole (ddp: its opt segments), exchanged over
             * the data ranks: ddp's replicas, or zero1/zero2's shard group */
            if ((st != ZT_DDP && st != ZT_ZERO1 && st != ZT_ZERO2) || s->offload)
                zt_fatal("1-bit Adam runs under ddp, zero1 or zero2 without offload only");
            const int f = t->unit_first[ui], c = t->unit_count[ui], sharded = st != ZT_DDP;
            s->obg = sharded ? (s->n > 1 ? s->sg : NULL) : s->rg;
            /* ZT_ONEBIT_COMPRESS_ALONE (an experiment, doc/performance.md): one data rank
             * compresses its momentum as a group of one would */
            if (!s->obg && getenv("ZT_ONEBIT_COMPRESS_ALONE")) s->obg = &comm->data;
            size_t *numel = zt_malloc((size_t)c * sizeof *numel);
            for (int i = 0; i < c; i++) numel[i] = t->params[f + i].numel;
            /* (its buffers are host memory of its own: a dry run counts them only, and its
             * set, sizes alone, issues the exchange for the traffic estimate) */
            u->onebit = be->dry ? zt_onebit_set_create_dry(numel, c, s->obg) : zt_onebit_set_create(numel, c, s->obg, sharded);
            /* host memory beside m and v, counted with them */
            s->mem.optim += zt_onebit_state_bytes(numel, c, s->obg ? s->obg->size : 1, sharded);
            s->mem_peak.optim = s->mem.optim;
            free(numel);
        }
        if (opts->layout == ZT_LAYOUT_PER_PARAM && s->n > 1 && u->lay.packed > s->pack_tmp_n)
            s->pack_tmp_n = u->lay.packed;
    }
    if (s->pack_tmp_n) s->pack_tmp = balloc(s, MEM_COMM, s->pack_tmp_n * s->pack_es);
    for (int k = 0; k < 3; k++)
        if (s->scratch_n[k]) s->scratch[k] = falloc(s, MEM_COMM, s->scratch_n[k]);
    if (s->offload) s->be->wait_uploads();
    return s;
}

static void drop_gathered(zt_shard_t *s, int ui);
static void reduction_complete(zt_shard_t *s, int ui);
static void grad_download_finish(zt_shard_t *s);

void zt_shard_free(zt_shard_t *s)
{
    if (!s) return;
    /* nothing may still be in flight into a buffer about to be freed (a device's
     * stream-ordered free would hand it to the next allocation) */
    for (int ui = 0; ui < s->t->nunits; ui++) {
        if (s->shard_params) drop_gathered(s, ui);
        reduction_complete(s, ui);
    }
    grad_download_finish(s);
    if (s->nv) {
        zt_nvme_stats_t st;
        zt_nvme_stats(s->nv, &st);
        s->mem.host -= (size_t)st.buffers * st.buffer_bytes;
        s->mem.nvme = 0;
        zt_nvme_close(s->nv);
    }
    for (int ui = 0; ui < s->t->nunits; ui++) {
        unit_state_t *u = &s->u[ui];
        size_t P = u->lay.packed;
        ffree(s, MEM_PARAMS, &u->full, P);
        BFREE(s, MEM_GATHER, u->gath, P * s->pesz);
        ffree(s, s->mixed ? MEM_OPTIM : MEM_PARAMS, &u->shard_p, u->S);
        ffree(s, MEM_HOST, &u->master, u->S);
        BFREE(s, MEM_COMM, u->up, u->S * s->pesz);
        BFREE(s, MEM_PARAMS, u->wfull, P * 2);
        BFREE(s, s->offload_param ? MEM_HOST : MEM_PARAMS, u->wshard, u->S * 2);
        BFREE(s, MEM_COMM, u->gcomm, P * 2);
        BFREE(s, MEM_COMM, u->rs16, u->S * 2);
        ffree(s, s->persistent_grads ? MEM_GRADS : MEM_COMM, &u->gfull, P);
        ffree(s, grads_mem(s), &u->gshard, u->S);
        ffree(s, s->offload ? MEM_HOST : MEM_OPTIM, &u->m, u->S);
        ffree(s, s->offload ? MEM_HOST : MEM_OPTIM, &u->v, u->S);
        ffree(s, MEM_COMM, &u->rs_tmp, u->S);
        free(u->oseg);
        zt_onebit_set_free(u->onebit);
        zt_unit_layout_free(&u->lay);
    }
    BFREE(s, MEM_COMM, s->pack_tmp, s->pack_tmp_n * s->pack_es);
    for (int k = 0; k < 2; k++) ffree(s, MEM_HOST, &s->hgrad[k], s->hstage_n);
    BFREE(s, MEM_HOST, s->h16, s->hstage_n * 2);
    invalidate_slots(s); /* the backend forgets views about to be freed */
    for (int k = 0; k < 3; k++) ffree(s, MEM_COMM, &s->scratch[k], s->scratch_n[k]);
    for (int i = 0; i < s->ncache; i++) s->be->free(s->cache[i].p);
    free(s->u);
    free(s);
}

/* ---- packing for per_param layouts ----------------------------------------- */

static int counts_int(const zt_unit_layout_t *lay, int *counts, int *displs)
{
    for (int r = 0; r < lay->n; r++) {
        if (lay->count[r] > (size_t)INT32_MAX || lay->displ[r] > (size_t)INT32_MAX)
            zt_fatal("unit of %zu elements too large for the int counts of the v-collectives", lay->packed);
        counts[r] = (int)lay->count[r];
        if (displs) displs[r] = (int)lay->displ[r];
    }
    return 0;
}

/* unit order -> rank-packed order (dst may not alias src); es bytes per element */
static void pack(zt_shard_t *s, const zt_unit_layout_t *lay, void *dst, const void *src, size_t es)
{
    size_t pos = 0;
    for (int r = 0; r < lay->n; r++)
        for (int i = 0; i < lay->nseg[r]; i++) {
            s->be->copy((char *)dst + pos * es, (const char *)src + lay->seg[r][i].off * es,
                        lay->seg[r][i].len * es);
            pos += lay->seg[r][i].len;
        }
}

static void unpack(zt_shard_t *s, const zt_unit_layout_t *lay, void *dst, const void *src, size_t es)
{
    size_t pos = 0;
    for (int r = 0; r < lay->n; r++)
        for (int i = 0; i < lay->nseg[r]; i++) {
            s->be->copy((char *)dst + lay->seg[r][i].off * es, (const char *)src + pos * es,
                        lay->seg[r][i].len * es);
            pos += lay->seg[r][i].len;
        }
}

static int is_flat(const zt_shard_t *s) { return s->o.layout == ZT_LAYOUT_FLAT || s->n == 1; }

/* ---- gathering parameters ---------------------------------------------------- */

/* offload_param: the upload a gather read from is no longer needed */
static void gather_done(zt_shard_t *s, unit_state_t *u)
{
    BFREE(s, MEM_COMM, u->up, u->S * s->pesz);
}

static void gather_start(zt_shard_t *s, int ui, int blocking)
{
    unit_state_t *u = &s->u[ui];
    const size_t P = u->lay.packed, es = s->pesz;
    nv_in(s, ui, NV_PAR, NV_PAR); /* nvme_param: the shard from its file (no-op otherwise) */
    /* the owned working shard: bf16, or fp32 (the host master itself under offload_param) */
    const void *src = s->mixed ? (const void *)u->wshard : s->offload_param ? (const void *)u->master
                                                                           : (const void *)u->shard_p;
    u->gath = balloc(s, MEM_GATHER, P * es);
    if (s->n == 1) {
        if (s->offload_param) {
            s->be->from_host_async(u->gath, src, u->S * es);
            uploads_landed(s);
            nv_out(s, ui, NV_PAR, 0);
        } else
            s->be->copy(u->gath, src, u->S * es);
        u->gathered = 1;
        return;
    }
    if (s->offload_param) {
        /* collectives read backend memory: upload the host shard first (queued,
         * so a prefetch does not stall the host) */
        u->up = balloc(s, MEM_COMM, u->S * es);
        s->be->from_host_async(u->up, src, u->S * es);
        uploads_landed(s);
        nv_out(s, ui, NV_PAR, 0);
        src = u->up;
    }
    if (is_flat(s)) {
        if (blocking) {
            zt_allgather(s->comm, s->sg, src, u->gath, u->S, s->pdt);
            gather_done(s, u);
            u->gathered = 1;
        } else {
            zt_iallgather(s->comm, s->sg, src, u->gath, u->S, s->pdt, &u->gather_req);
            u->gather_pending = 1;
        }
        return;
    }
    int *counts = zt_malloc((size_t)s->n * sizeof(int)), *displs = zt_malloc((size_t)s->n * sizeof(int));
    counts_int(&u->lay, counts, displs);
    zt_allgatherv(s->comm, s->sg, src, s->pack_tmp, counts, displs, s->pdt);
    unpack(s, &u->lay, u->gath, s->pack_tmp, es);
    free(counts);
    free(displs);
    gather_done(s, u);
    u->gathered = 1;
}

int zt_shard_holds(const zt_shard_t *s, int ui)
{
    return !s->u[ui].absent;
}

/* a unit of another pipeline rank's stage is a caller's bug: no state to hand out */
static unit_state_t *held_unit(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    if (u->absent) zt_fatal("shard engine: unit %d belongs to another pipeline rank's stage", ui);
    return u;
}

const float *zt_shard_params(zt_shard_t *s, int ui)
{
    unit_state_t *u = held_unit(s, ui);
    if (!s->shard_params && !s->mixed) return u->full;
    if (s->shard_params) {
        if (u->gather_pending) {
            zt_wait(s->comm, &u->gather_req);
            gather_done(s, u);
            u->gather_pending = 0;
            u->gathered = 1;
        }
        if (!u->gathered) gather_start(s, ui, 1);
        if (!s->mixed) return u->gath;
    }
    /* mixed: widen into the unit's fp32 slot, unless it already holds this unit */
    const int k = slot_of(s->t, ui);
    if (s->slot_held[k] && s->slot_unit[k] != ui)
        zt_fatal("shard engine: unit %d requested while unit %d is still in use (16-bit params keep one "
                 "block materialized at a time)", ui, s->slot_unit[k]);
    if (s->slot_unit[k] != ui) {
        const uint16_t *w16 = s->shard_params ? (const uint16_t *)u->gath : u->wfull;
        from16(s, s->pdt, s->scratch[k], w16, u->lay.numel);
        slot_set(s, k, ui, w16);
    }
    s->slot_held[k] = 1;
    return s->scratch[k];
}

void zt_shard_prefetch(zt_shard_t *s, int ui)
{
    if (ui < 0 || ui >= s->t->nunits || !s->shard_params || s->u[ui].absent) return;
    unit_state_t *u = &s->u[ui];
    if (s->nvme_param) {
        /* the gather needs the shard on the host: start its read, and gather when asked */
        if (!u->gathered && !u->gather_pending) nv_prefetch(s, ui, NV_PAR);
        return;
    }
    if (u->gathered || u->gather_pending || !is_flat(s) || s->n == 1) return;
    gather_start(s, ui, 0);
}

static void drop_gathered(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    if (u->gather_pending) {
        zt_wait(s->comm, &u->gather_req);
        gather_done(s, u);
        u->gather_pending = 0;
    }
    BFREE(s, MEM_GATHER, u->gath, u->lay.packed * s->pesz);
    u->gathered = 0;
    const int k = slot_of(s->t, ui);
    if (s->mixed && s->slot_unit[k] == ui) slot_set(s, k, -1, NULL), s->slot_held[k] = 0;
}

void zt_shard_release(zt_shard_t *s, int ui)
{
    const int k = slot_of(s->t, ui);
    if (s->mixed && s->slot_unit[k] == ui) s->slot_held[k] = 0;
    if (!s->shard_params) return;
    if (s->inference || s->u[ui].bwd_done || frees_after_forward(s)) drop_gathered(s, ui);
}

/* ---- gradients ---------------------------------------------------------------- */

void zt_shard_begin_step(zt_shard_t *s)
{
    s->nv_early = 0;
    for (int ui = 0; ui < s->t->nunits; ui++) {
        unit_state_t *u = &s->u[ui];
        if (u->frozen || u->absent) continue;
        if (u->gfull && s->persistent_grads) s->be->memzero(u->gfull, u->lay.packed * sizeof(float));
        /* a zero2 unit's full gradients kept by 1-bit Adam for a step that was skipped */
        else if (u->gfull) ffree(s, MEM_COMM, &u->gfull, u->lay.packed);
        /* host_grads: the first micro-step's download overwrites the whole shard */
        if (u->gshard && !s->host_grads) s->be->memzero(u->gshard, u->S * sizeof(float));
    }
}

void zt_shard_begin_micro(zt_shard_t *s, int micro, int nmicro)
{
    /* a unit's transient gradients must be reduced before the next micro-step
     * accumulates into a fresh buffer (still as the previous micro-step: host_grads
     * decides by it whether a download overwrites or adds) */
    for (int ui = 0; ui < s->t->nunits; ui++) {
        reduction_complete(s, ui);
        s->u[ui].bwd_done = 0;
    }
    s->micro = micro;
    s->nmicro = nmicro;
}

float *zt_shard_grads(zt_shard_t *s, int ui)
{
    unit_state_t *u = held_unit(s, ui);
    if (u->frozen) return NULL;
    if (!u->gfull) u->gfull = balloc_z(s, MEM_COMM, u->lay.packed * sizeof(float), 1);
    return u->gfull;
}

/* host_grads: a unit's reduced owned gradients travel to the host accumulator as
 * soon as they are complete, while the next unit's backward computes. One download
 * is in flight at a time: it is finished (waited for, and after the first
 * micro-step added on the host) before the next starts, which bounds the landing
 * buffers to one and the device buffers kept alive to one unit's owned gradients. */
static void grad_download_finish(zt_shard_t *s)
{
    if (s->dl_unit < 0) return;
    unit_state_t *u = &s->u[s->dl_unit];
    s->be->wait_downloads();
    if (s->dl_add) s->ob->accumulate(u->gshard, s->hgrad[0], u->S);
    ffree(s, MEM_COMM, &u->dl_dev, u->dl_n);
    s->dl_unit = -1;
}

/* Takes over dev (a MEM_COMM buffer of n floats whose first S are the unit's owned
 * gradients of this micro-step) and starts its download. */
static void grad_download_start(zt_shard_t *s, int ui, float *dev, size_t n)
{
    grad_download_finish(s);
    unit_state_t *u = &s->u[ui];
    s->dl_add = s->micro > 0;
    s->be->to_host_async(s->dl_add ? s->hgrad[0] : u->gshard, dev, u->S * sizeof(float));
    u->dl_dev = dev;
    u->dl_n = n;
    s->dl_unit = ui;
}

/* Folds a completed reduce-scatter into the owned gradient shard and frees the
 * transient full gradients of the unit. */
static void reduction_complete(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    for (int k = 0; k < u->nred; k++) zt_wait(s->comm, &u->red_req[k]);
    u->nred = 0;
    if (u->gcomm) {
        /* ddp: the 16-bit all-reduce result replaces the fp32 local sum */
        if (s->o.strategy == ZT_DDP) from16(s, s->gdt, u->gfull, u->gcomm, u->lay.numel);
        BFREE(s, MEM_COMM, u->gcomm, u->lay.packed * 2);
    }
    if (u->red_pending) {
        if (u->rs16) {
            u->rs_tmp = falloc(s, MEM_COMM, u->S);
            from16(s, s->gdt, u->rs_tmp, u->rs16, u->S);
            BFREE(s, MEM_COMM, u->rs16, u->S * 2);
        }
        if (s->host_grads) {
            grad_download_start(s, ui, u->rs_tmp, u->S);
            u->rs_tmp = NULL;
        } else {
            s->be->accumulate(u->gshard, u->rs_tmp, u->S);
            ffree(s, MEM_COMM, &u->rs_tmp, u->S);
        }
        u->red_pending = 0;
    }
    /* (1-bit Adam under zero2 after the freeze keeps it to the optimizer step) */
    if (!s->persistent_grads && !onebit_sharded_compressed(s, s->adam_step + 1))
        ffree(s, MEM_COMM, &u->gfull, u->lay.packed);
}

static void reduce_scatter_unit(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    const void *send = u->gfull;
    void *recv;
    if (s->gdt != ZT_F32) {
        u->gcomm = balloc(s, MEM_COMM, u->lay.packed * 2);
        to16(s, s->gdt, u->gcomm, u->gfull, u->lay.packed);
        send = u->gcomm;
        recv = u->rs16 = balloc(s, MEM_COMM, u->S * 2);
    } else {
        recv = u->rs_tmp = falloc(s, MEM_COMM, u->S);
    }
    u->red_pending = 1;
    if (is_flat(s)) {
        zt_ireduce_scatter(s->comm, s->sg, send, recv, u->S, s->gdt, &u->red_req[0]);
        u->nred = 1;
        return;
    }
    int *counts = zt_malloc((size_t)s->n * sizeof(int));
    counts_int(&u->lay, counts, NULL);
    pack(s, &u->lay, s->pack_tmp, send, zt_dtype_size(s->gdt));
    zt_reduce_scatterv(s->comm, s->sg, s->pack_tmp, recv, counts, s->gdt);
    free(counts);
}

static void tp_sum_partial_grads(zt_shard_t *s, int ui);

/* offload_nvme, the step's last backward: the first records the optimizer step will
 * read (its order: the last unit first) start reading now, into the buffers the
 * previous step's writes have left, so that the backward hides them instead of only
 * the other units' AdamW. Not with nvme_param: the backward's gathers need the buffers. */
static void nv_read_ahead(zt_shard_t *s)
{
    if (!s->nv || s->nvme_param || s->nv_early || s->micro != s->nmicro - 1) return;
    s->nv_early = 1;
    int n = s->o.nvme.buffer_count - 1; /* one left for the optimizer step's own read-ahead */
    for (int ui = s->t->nunits - 1; ui >= 0 && n > 0; ui--)
        if (!s->u[ui].frozen && !s->u[ui].absent) nv_prefetch(s, ui, NV_OPT | (s->mixed ? 0 : NV_PAR)), n--;
}

void zt_shard_grads_ready(zt_shard_t *s, int ui)
{
    unit_state_t *u = held_unit(s, ui);
    u->bwd_done = 1;
    nv_read_ahead(s);
    if (u->frozen) return; /* nothing to reduce, on every rank alike */
    const int last = s->micro == s->nmicro - 1;
    /* partial gradients of replicated parameters (a q/k norm sees its tp rank's heads
     * only) are summed over tp before any data-parallel reduction: once per step where
     * gradients accumulate in place, every micro-step where they are reduced each time */
    if (s->tp && (last || !s->persistent_grads)) tp_sum_partial_grads(s, ui);
    /* the previous unit's reduction has had this unit's backward to progress */
    for (int k = ui + 1; k < s->t->nunits; k++)
        if (s->u[k].nred || s->u[k].red_pending) reduction_complete(s, k);
    if (s->o.strategy == ZT_DDP) {
        /* 1-bit Adam after the freeze: each rank steps its momentum with its own gradient */
        if (!last || !s->rg || onebit_compressed(s, s->adam_step + 1)) return;
        /* all-reduce in buckets so large units do not become one huge message */
        const size_t es = zt_dtype_size(s->gdt);
        char *buf = (char *)u->gfull;
        if (s->gdt != ZT_F32) {
            u->gcomm = balloc(s, MEM_COMM, u->lay.packed * 2);
            to16(s, s->gdt, u->gcomm, u->gfull, u->lay.numel);
            buf = (char *)u->gcomm;
        }
        size_t bucket = ZT_MAX(s->o.bucket_bytes / es, (size_t)1 << 16);
        size_t nb = ZT_CEIL_DIV(u->lay.numel, bucket);
        if (nb > MAX_REQ) bucket = ZT_CEIL_DIV(u->lay.numel, MAX_REQ), nb = ZT_CEIL_DIV(u->lay.numel, bucket);
        for (size_t b = 0; b < nb; b++) {
            size_t off = b * bucket, n = ZT_MIN(bucket, u->lay.numel - off);
            /* at most two buckets in flight on MPI: each holds a temporary of its size
             * (on a device comm backend a wait would only stall compute) */
            if (u->nred >= 2 && !s->comm_ordered) zt_wait(s->comm, &u->red_req[u->nred - 2]);
            zt_iallreduce(s->comm, s->rg, ZT_IN_PLACE, buf + off * es, n, s->gdt, ZT_SUM,
                          &u->red_req[u->nred++]);
        }
        return;
    }
    /* 1-bit Adam after the freeze: the full local gradient stays for the momentum */
    if (onebit_sharded_compressed(s, s->adam_step + 1)) return;
    if (s->o.strategy == ZT_ZERO1 && !last) return; /* no_sync: accumulate locally */
    if (s->n == 1 && s->host_grads) {
        grad_download_start(s, ui, u->gfull, u->lay.packed);
        u->gfull = NULL;
        return;
    }
    if (s->n == 1) {
        s->be->accumulate(u->gshard, u->gfull, u->S);
        if (!s->persistent_grads) ffree(s, MEM_COMM, &u->gfull, u->lay.packed);
        return;
    }
    reduce_scatter_unit(s, ui);
}

/* fp16: x := fp16(x) (see the file comment), through a transient 16-bit buffer of
 * at most ROUND_CHUNK elements */
#define ROUND_CHUNK ((size_t)1 << 20)
static void round_fp16(zt_shard_t *s, float *x, size_t n)
{
    if (s->host_grads) { /* x is host memory: the CPU kernels, through the stack */
        uint16_t b[4096];
        for (size_t off = 0; off < n; off += 4096) {
            const size_t k = ZT_MIN((size_t)4096, n - off);
            s->hb->to_fp16(b, x + off, k);
            s->hb->from_fp16(x + off, b, k);
        }
        return;
    }
    const size_t cap = ZT_MIN(n, ROUND_CHUNK);
    uint16_t *b = balloc(s, MEM_COMM, cap * 2);
    for (size_t off = 0; off < n; off += cap) {
        const size_t k = ZT_MIN(cap, n - off);
        to16(s, ZT_F16, b, x + off, k);
        from16(s, ZT_F16, x + off, b, k);
    }
    BFREE(s, MEM_COMM, b, cap * 2);
}

static void tp_sum_partial_grads(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    for (int p = s->t->unit_first[ui]; p < s->t->unit_first[ui] + s->t->unit_count[ui]; p++) {
        const zt_param_t *pp = &s->t->params[p];
        if (!pp->tp_grad_sum) continue;
        if (pp->tp_share >= s->tp->size) {
            zt_allreduce(s->comm, s->tp, ZT_IN_PLACE, u->gfull + pp->offset, pp->numel, ZT_F32, ZT_SUM);
            continue;
        }
        /* shared by groups of tp ranks (a KV head fewer than tp): each rank puts its
         * partial at its slice's place in a zeroed tensor of the global size, the sum
         * over tp adds each group's partials and nothing else, and each rank takes its
         * slice back. The buffer is a KV projection: small beside the unit. */
        const size_t bytes = pp->numel * sizeof(float), at = (size_t)pp->tp_goff[0] * (size_t)pp->shape[1];
        float *g = s->be->alloc(pp->gnumel * sizeof(float));
        s->be->copy(g + at, u->gfull + pp->offset, bytes);
        zt_allreduce(s->comm, s->tp, ZT_IN_PLACE, g, pp->gnumel, ZT_F32, ZT_SUM);
        s->be->copy(u->gfull + pp->offset, g + at, bytes);
        s->be->free(g);
    }
}

/* The part of a unit's owned gradient sum of squares that lies in parameters other tp
 * ranks hold too (replicated ones): counted by the lowest holder only, so the global
 * norm counts every element once (DeepSpeed PR 5411, Megatron 1446). */
static double tp_shared_sumsq(zt_shard_t *s, int ui, const zt_backend_t *be, const float *buf, int full)
{
    unit_state_t *u = &s->u[ui];
    double x = 0.0;
    for (int i = 0; i < u->noseg; i++) {
        const opt_seg_t *g = &u->oseg[i];
        const zt_param_t *p = &s->t->params[g->param];
        if (p->tp_share > 1 && s->tp_rank % p->tp_share != 0) x += be->sumsq(buf + (full ? g->uoff : g->spos), g->len);
    }
    return x;
}

/* What turns a rank's unreduced ddp gradient (its share of the batch gradient) into the
 * gradient of its own samples, in 1-bit Adam's compressed stage: the replica count (1 elsewhere) */
/* Pipelines: g (n elements of the root unit's reduced gradient: the embedding's part on
 * the first stage, the head's on the last) := the sum of both ends' parts, exchanged with
 * the other end in chunks (the landing buffer stays small beside a vocabulary's
 * embedding); a + b is b + a exactly, so both ends step the same values */
#define ROOT_CHUNK ((size_t)1 << 22)
static void sum_root_parts(zt_shard_t *s, float *g, size_t n)
{
    const int peer = s->comm->pp.rank == 0 ? s->comm->pp.size - 1 : 0;
    const size_t cap = ZT_MAX(ZT_MIN(n, ROOT_CHUNK), (size_t)1);
    /* host_grads: g is the host accumulator, summed on the host */
    const int cat = s->host_grads ? MEM_HOST : MEM_COMM;
    const zt_backend_t *be = s->host_grads ? s->ob : s->be;
    float *other = falloc(s, cat, cap);
    for (size_t off = 0; off < n; off += cap) {
        const size_t k = ZT_MIN(cap, n - off);
        zt_request_t req = {.req = MPI_REQUEST_NULL};
        zt_isendrecv(s->comm, &s->comm->pp, g + off, peer, other, peer, k, ZT_F32, &req);
        zt_wait(s->comm, &req);
        be->accumulate(g + off, other, k);
    }
    ffree(s, cat, &other, cap);
}

static double onebit_grad_factor(const zt_shard_t *s, long step)
{
    return onebit_compressed(s, step) && s->obg ? (double)s->obg->size : 1.0;
}

double zt_shard_finish_grads(zt_shard_t *s)
{
    double local = 0.0;
    for (int ui = s->t->nunits - 1; ui >= 0; ui--) {
        unit_state_t *u = &s->u[ui];
        if (u->frozen || u->absent) continue;
        reduction_complete(s, ui);
        /* pipelines: a unit held by two pipeline ranks (the root) is counted by one */
        const double counted = ui == s->t->root_unit && s->o.root_shared && s->comm->pp.rank != 0 ? 0.0 : 1.0;
        if (s->host_grads) {
            grad_download_finish(s);
            /* pipelines: the root's owned shard summed with the other end's, as below */
            if (ui == s->t->root_unit && s->o.root_shared) sum_root_parts(s, u->gshard, u->S);
            if (s->pdt == ZT_F16) round_fp16(s, u->gshard, u->S);
            local += counted * s->ob->sumsq(u->gshard, u->S);
            if (s->tp) local -= counted * tp_shared_sumsq(s, ui, s->ob, u->gshard, 0);
            continue;
        }
        if (s->o.strategy == ZT_DDP || onebit_sharded_compressed(s, s->adam_step + 1)) {
            if (ui == s->t->root_unit && s->o.root_shared) sum_root_parts(s, zt_shard_grads(s, ui), u->lay.numel);
            if (s->pdt == ZT_F16) round_fp16(s, u->gfull, u->lay.numel);
            local += counted * s->be->sumsq(u->gfull, u->lay.numel) * onebit_grad_factor(s, s->adam_step + 1) *
                     onebit_grad_factor(s, s->adam_step + 1);
            if (s->tp) local -= counted * tp_shared_sumsq(s, ui, s->be, u->gfull, 1);
            continue;
        }
        if (s->rg && s->gdt != ZT_F32) {
            uint16_t *b = balloc(s, MEM_COMM, u->S * 2);
            to16(s, s->gdt, b, u->gshard, u->S);
            zt_allreduce(s->comm, s->rg, ZT_IN_PLACE, b, u->S, s->gdt, ZT_SUM);
            from16(s, s->gdt, u->gshard, b, u->S);
            BFREE(s, MEM_COMM, b, u->S * 2);
        } else if (s->rg) {
            zt_allreduce(s->comm, s->rg, ZT_IN_PLACE, u->gshard, u->S, ZT_F32, ZT_SUM);
        }
        /* pipelines: the root's shard summed with the other end's (the shard layouts of the
         * two ranks' data groups are the same) */
        if (ui == s->t->root_unit && s->o.root_shared) sum_root_parts(s, u->gshard, u->S);
        if (s->pdt == ZT_F16) round_fp16(s, u->gshard, u->S);
        local += counted * s->be->sumsq(u->gshard, u->S);
        if (s->tp) local -= counted * tp_shared_sumsq(s, ui, s->be, u->gshard, 0);
    }
    /* each element counted once: shards are disjoint within sg, replicas not summed,
     * tp slices disjoint and shared parameters counted by one tp rank */
    if (s->sg && s->n > 1 && !onebit_sharded_compressed(s, s->adam_step + 1))
        local = zt_sum_double(s->comm, s->sg, local);
    if (s->tp) local = zt_sum_double(s->comm, s->tp, local);
    /* each stage's units are on one pipeline rank (the root counted on rank 0) */
    if (s->o.pipeline) local = zt_sum_double(s->comm, &s->comm->pp, local);
    return local;
}

void zt_shard_zero_grads(zt_shard_t *s)
{
    for (int ui = 0; ui < s->t->nunits; ui++) reduction_complete(s, ui);
    grad_download_finish(s);
    zt_shard_begin_step(s);
}

/* ---- optimizer ------------------------------------------------------------------ */

/* buf (a unit's elements in unit order, of type dt) := every rank's owned part of it,
 * each rank's own part in place already */
static void gather_owned(zt_shard_t *s, int ui, void *buf, zt_dtype_t dt)
{
    unit_state_t *u = &s->u[ui];
    if (s->n == 1) return;
    if (is_flat(s)) {
        zt_allgather(s->comm, s->sg, ZT_IN_PLACE, buf, u->S, dt);
        return;
    }
    const size_t es = zt_dtype_size(dt);
    int *counts = zt_malloc((size_t)s->n * sizeof(int)), *displs = zt_malloc((size_t)s->n * sizeof(int));
    counts_int(&u->lay, counts, displs);
    pack(s, &u->lay, s->pack_tmp, buf, es);
    zt_allgatherv(s->comm, s->sg, ZT_IN_PLACE, s->pack_tmp, counts, displs, dt);
    unpack(s, &u->lay, buf, s->pack_tmp, es);
    free(counts);
    free(displs);
}

/* Re-creates the replicated full parameters (fp32, or the 16-bit working copy)
 * from every rank's owned part. */
static void regather_full(zt_shard_t *s, int ui)
{
    unit_state_t *u = &s->u[ui];
    gather_owned(s, ui, s->mixed ? (void *)u->wfull : (void *)u->full, s->pdt);
}

/* the owned gradients, packed like m and v (ddp owns the whole unit, in order) */
static const float *owned_grads(const zt_shard_t *s, const unit_state_t *u)
{
    return s->o.strategy == ZT_DDP ? u->gfull : u->gshard;
}

static void download_grads(zt_shard_t *s, int ui, int slot)
{
    unit_state_t *u = &s->u[ui];
    s->be->to_host_async(s->hgrad[slot], owned_grads(s, u), u->S * sizeof(float));
}

/* buf (the unit's elements, unit order, fp32) := the whole of an owned state (m or v,
 * packed like the shard), gathered from every rank's part */
static void gather_state(zt_shard_t *s, int ui, const float *state, float *buf)
{
    unit_state_t *u = &s->u[ui];
    for (int i = 0; i < u->noseg; i++) memcpy(buf + u->oseg[i].uoff, state + u->oseg[i].spos, u->oseg[i].len * sizeof(float));
    gather_owned(s, ui, buf, ZT_F32);
}

/* 1-bit Adam's compressed stage under zero1/zero2. Each rank forms the momentum of
 * every element as ddp does (the shared one of the last step, stepped with its own full
 * gradient), the exchange's reduce-scatter half leaves each chunk with its server and its
 * all-gather half gives everyone the result, of which a rank keeps its shard (masked,
 * into m), steps its parameters there and re-gathers them (refresh_working) as zero1
 * does after AdamW. The shared momentum of the last step comes from the exchange's
 * result (zt_onebit_last); before the first exchange (the freeze, or a resume) from m
 * gathered whole, once, with v for the masks. */
static void onebit_step_sharded(zt_shard_t *s, int ui, const zt_adamw_hp_t *hp)
{
    unit_state_t *u = &s->u[ui];
    const zt_param_table_t *t = s->t;
    const int f = t->unit_first[ui], c = t->unit_count[ui];
    if (s->be->dry) { /* a dry run (zt_memplan.h): a steady step's exchange, counted */
        zt_onebit_allreduce(u->onebit, s->comm, NULL);
        if (!s->persistent_grads) ffree(s, MEM_COMM, &u->gfull, u->lay.packed);
        return;
    }
    const float gscale = hp->grad_scale * (float)onebit_grad_factor(s, hp->step);
    float *mu = falloc(s, MEM_COMM, u->lay.packed); /* (P) the unit's momentum, unit order */
    if (!zt_onebit_has_last(u->onebit)) {
        gather_state(s, ui, u->v, mu);
        for (int i = 0; i < c; i++) zt_onebit_set_keep(u->onebit, i, mu + t->params[f + i].offset);
        gather_state(s, ui, u->m, mu);
    } else {
        for (int i = 0; i < c; i++) zt_onebit_last(u->onebit, i, mu + t->params[f + i].offset);
    }
    float **m = zt_malloc((size_t)c * sizeof *m);
    for (int i = 0; i < c; i++) {
        const zt_param_t *p = &t->params[f + i];
        m[i] = mu + p->offset;
        zt_onebit_moments(m[i], NULL, u->gfull + p->offset, p->numel, hp->beta1, hp->beta2, gscale, 1);
    }
    zt_onebit_allreduce(u->onebit, s->comm, m);
    free(m);
    for (int i = 0; i < u->noseg; i++) {
        const opt_seg_t *g = &u->oseg[i];
        float *mo = u->m + g->spos;
        memcpy(mo, mu + g->uoff, g->len * sizeof(float));
        zt_onebit_mask(mo, u->v + g->spos, g->len);
        const float wd = t->params[g->param].decay ? hp->weight_decay : 0.0f;
        zt_onebit_update(seg_value(s, u, g), mo, u->v + g->spos, g->len, hp->lr, hp->eps, wd);
    }
    ffree(s, MEM_COMM, &mu, u->lay.packed);
    /* zero2's full gradients live from the backward to here only */
    if (!s->persistent_grads) ffree(s, MEM_COMM, &u->gfull, u->lay.packed);
}

/* 1-bit Adam on a unit (ddp: its opt segments are its whole parameters, in order;
 * zero1/zero2: the owned pieces, before the freeze) */
static void onebit_step(zt_shard_t *s, unit_state_t *u, const float *grad, const zt_adamw_hp_t *hp)
{
    const zt_onebit_hp_t oh = {.lr = hp->lr, .b1 = hp->beta1, .b2 = hp->beta2, .eps = hp->eps,
                               .gscale = hp->grad_scale * (float)onebit_grad_factor(s, hp->step),
                               .frozen = onebit_compressed(s, hp->step)};
    zt_onebit_tensor_t *t = zt_malloc((size_t)u->noseg * sizeof *t);
    for (int i = 0; i < u->noseg; i++) {
        const opt_seg_t *g = &u->oseg[i];
        t[i] = (zt_onebit_tensor_t){seg_value(s, u, g), u->m + g->spos, u->v + g->spos, grad + g->spos, g->len,
                                    s->t->params[g->param].decay ? hp->weight_decay : 0.0f};
    }
    zt_onebit_step(u->onebit, s->comm, t, u->noseg, &oh);
    free(t);
}

/* Offload pipelines three things per unit, units in reverse order: the download of
 * unit k-1's gradients (not with host_grads: they are there already), AdamW on unit
 * k on the host, and the upload of unit k+1's working copy. */
void zt_shard_optimizer_step(zt_shard_t *s, const zt_adamw_hp_t *hp)
{
    s->adam_step = hp->step;
    /* offload_param: a gather's upload may still read the host shard AdamW rewrites */
    if (s->offload_param) s->be->wait_uploads();
    /* last unit first: the one download nothing hides is then a block's, and the
     * root unit's (the largest: the embeddings) overlaps AdamW on block 0 */
    /* frozen units never change: no AdamW, no re-gather */
    int *order = zt_malloc((size_t)s->t->nunits * sizeof *order), no = 0;
    for (int ui = s->t->nunits - 1; ui >= 0; ui--)
        if (!s->u[ui].frozen && !s->u[ui].absent) order[no++] = ui;
    /* host_grads: the owned gradients are on the host already */
    const int download = s->offload && !s->host_grads;
    if (download && no) download_grads(s, order[0], 0);
    /* nvme: the records AdamW reads (a 16-bit parameter shard is only written) */
    const int nv_read = NV_OPT | (s->mixed ? 0 : NV_PAR);
    if (no) nv_prefetch(s, order[0], nv_read);
    for (int k = 0; k < no; k++) {
        const int ui = order[k];
        unit_state_t *u = &s->u[ui];
        nv_in(s, ui, NV_OPT | NV_PAR, nv_read);
        if (k + 1 < no) nv_prefetch(s, order[k + 1], nv_read);
        const float *grad = owned_grads(s, u);
        if (download) {
            s->be->wait_downloads();
            if (k + 1 < no) download_grads(s, order[k + 1], (k + 1) & 1);
            grad = s->hgrad[k & 1];
        }
        if (u->onebit && onebit_sharded_compressed(s, hp->step)) {
            onebit_step_sharded(s, ui, hp);
            refresh_working(s, ui);
            continue;
        }
        if (u->onebit) {
            onebit_step(s, u, grad, hp);
            refresh_working(s, ui);
            continue;
        }
        for (int i = 0; i < u->noseg; i++) {
            const opt_seg_t *g = &u->oseg[i];
            const float wd = s->t->params[g->param].decay ? hp->weight_decay : 0.0f;
            s->ob->adamw(seg_value(s, u, g), grad + g->spos, u->m + g->spos, u->v + g->spos, g->len, hp->lr,
                         hp->beta1, hp->beta2, hp->eps, wd, hp->grad_scale, hp->step);
        }
        refresh_working(s, ui);
        nv_out(s, ui, NV_OPT | NV_PAR, NV_OPT | NV_PAR);
    }
    free(order);
    /* the next forward reads the uploads (a device orders itself; the host must not
     * step a master again while its upload may still read it) */
    if (s->offload) s->be->wait_uploads();
    if (s->mixed) invalidate_slots(s);
}

/* ---- inference ------------------------------------------------------------------- */

void zt_shard_begin_inference(zt_shard_t *s) { s->inference = 1; }

void zt_shard_end_inference(zt_shard_t *s)
{
    s->inference = 0;
    if (s->shard_params)
        for (int ui = 0; ui < s->t->nunits; ui++) drop_gathered(s, ui);
}

/* ---- accounting -------------------------------------------------------------------- */

void zt_shard_memory(const zt_shard_t *s, zt_shard_mem_t *out)
{
    *out = s->mem_peak;
}

int zt_shard_nvme_stats(const zt_shard_t *s, zt_nvme_stats_t *st)
{
    if (!s->nv) return 0;
    zt_nvme_stats(s->nv, st);
    return 1;
}

/* ---- checkpoint view ----------------------------------------------------------------- */

/* Where a segment's state lives. */
enum {
    IO_HOST = 0,    /* host memory: handed out as it is */
    IO_DEV,         /* fp32 in memory the host cannot read: staged through host memory */
    IO_W16,         /* a frozen unit's 16-bit working copy (its only copy): widened into,
                     * and rounded back from, an fp32 host staging */
    IO_NVME         /* fp32 in the nvme files: staged through host memory */
};

typedef struct io_src {
    int kind;
    const zt_backend_t *vbe;    /* whose memory value, m and v are (not IO_W16) */
    float *value, *m, *v;       /* where they live; m, v NULL for frozen parameters */
    uint16_t *w16;              /* IO_W16 */
    int nv;                     /* in the nvme files (IO_NVME, or IO_W16 under nvme_param): the
                                 * pointers are found by io_nv_in from unit and pos */
    int unit, moments;          /* nv: the unit, and whether the segment has m and v */
    size_t pos;                 /* element of the owned shard */
} io_src_t;

/* one io_list entry per run of a segment that is contiguous in the global tensor (a
 * tp slice of a column-split weight is one run per row) */
typedef struct io_acc {
    zt_io_seg_t *out;
    io_src_t *src;
    int n, cap, param;
    size_t l0;      /* local element of the segment's first run, where c points */
    io_src_t c;
} io_acc_t;

static void io_add_run(void *arg, size_t gstart, size_t lstart, size_t len)
{
    io_acc_t *a = arg;
    if (a->n + 1 >= a->cap) {
        a->cap = 2 * a->cap + 16;
        a->out = realloc(a->out, (size_t)a->cap * sizeof *a->out);
        a->src = realloc(a->src, (size_t)a->cap * sizeof *a->src);
        if (!a->out || !a->src) zt_fatal("out of memory listing checkpoint segments");
    }
    io_src_t c = a->c;
    const size_t d = lstart - a->l0;
    if (c.value) c.value += d;
    if (c.m) c.m += d, c.v += d;
    if (c.w16) c.w16 += d;
    c.pos += d;
    a->src[a->n] = c;
    a->out[a->n++] = (zt_io_seg_t){
        .param = a->param, .start = gstart, .len = len, .value = c.value, .exp_avg = c.m, .exp_avg_sq = c.v,
    };
}

/* The segments of a view, with pointers where the state lives (segs[i] and srcs[i]),
 * in global element ranges of each parameter. */
static int io_list(zt_shard_t *s, zt_io_mode_t mode, zt_io_seg_t **segs, io_src_t **srcs)
{
    io_acc_t a = {0};
    /* replicas hold identical state: for writing, each takes a 1/R slice */
    const int R = s->rg ? s->rg->size : 1, k = s->rg ? s->rg->rank : 0;
    const int for_write = mode != ZT_IO_READ;
    for (int ui = 0; ui < s->t->nunits; ui++) {
        unit_state_t *u = &s->u[ui];
        if (u->absent || (u->frozen && mode == ZT_IO_WRITE)) continue;
        /* the root unit held at both ends of a pipeline: written by the first stage's rank */
        if (for_write && ui == s->t->root_unit && s->o.root_shared && s->comm->pp.rank != 0) continue;
        for (int i = 0; i < u->noseg; i++) {
            const opt_seg_t *g = &u->oseg[i];
            const zt_param_t *p = &s->t->params[g->param];
            /* what other tp ranks hold too is written by the lowest of them */
            if (for_write && p->tp_share > 1 && s->tp_rank % p->tp_share != 0) continue;
            size_t lo = 0, hi = g->len;
            if (for_write && R > 1) {
                lo = g->len * (size_t)k / (size_t)R;
                hi = g->len * (size_t)(k + 1) / (size_t)R;
            }
            if (hi <= lo) continue;
            io_src_t *c = &a.c;
            memset(c, 0, sizeof *c);
            c->unit = ui;
            c->pos = g->spos + lo;
            c->nv = u->frozen ? s->nvme_param : s->nv != NULL;
            if (c->nv) {
                c->kind = u->frozen && s->mixed ? IO_W16 : IO_NVME;
                c->vbe = &zt_backend_cpu;
                c->moments = !u->frozen;
            } else if (u->frozen && s->mixed) {
                c->kind = IO_W16;
                c->w16 = (s->shard_params ? u->wshard + g->spos : u->wfull + g->uoff) + lo;
            } else {
                c->value = seg_value(s, u, g) + lo;
                if (!u->frozen) {
                    c->m = u->m + g->spos + lo;
                    c->v = u->v + g->spos + lo;
                }
                /* offload: the trainable state, and a frozen fp32 shard under offload_param */
                c->vbe = (u->frozen ? s->offload_param : s->offload) ? &zt_backend_cpu : s->be;
                c->kind = c->vbe->host_memory ? IO_HOST : IO_DEV;
            }
            a.param = g->param;
            a.l0 = g->uoff - p->offset + lo;
            /* a 4-bit weight's share under tp is its own region (zt_qlora.h): its floats as they are */
            if (p->quant) io_add_run(&a, a.l0, a.l0, hi - lo);
            else zt_param_tp_runs(p, a.l0, hi - lo, io_add_run, &a);
        }
    }
    if (!a.out) {
        a.out = zt_calloc(1, sizeof *a.out);
        a.src = zt_calloc(1, sizeof *a.src);
    }
    *segs = a.out;
    *srcs = a.src;
    return a.n;
}

/* the 16-bit working copy is host memory (offload_param keeps it there) */
static int w16_host(const zt_shard_t *s) { return s->offload_param || s->be->host_memory; }

#define IO_CHUNK ((size_t)1 << 20)
/* host fp32 h[0..n) := the 16-bit working elements w[0..n) (CPU conversion kernels) */
static void io_widen(zt_shard_t *s, float *h, const uint16_t *w, size_t n)
{
    void (*conv)(float *, const uint16_t *, size_t) =
        s->pdt == ZT_F16 ? zt_backend_cpu.from_fp16 : zt_backend_cpu.from_bf16;
    if (w16_host(s)) {
        conv(h, w, n);
        return;
    }
    uint16_t *b = zt_malloc(ZT_MAX(ZT_MIN(n, IO_CHUNK), (size_t)1) * 2);
    for (size_t off = 0; off < n; off += IO_CHUNK) {
        const size_t k = ZT_MIN(IO_CHUNK, n - off);
        s->be->to_host(b, w + off, k * 2);
        conv(h + off, b, k);
    }
    free(b);
}

/* the 16-bit working elements w[0..n) := pdt(host fp32 h[0..n)) */
static void io_round(zt_shard_t *s, uint16_t *w, const float *h, size_t n)
{
    if (w16_host(s)) {
        to16_on(&zt_backend_cpu, s->pdt, w, h, n);
        return;
    }
    uint16_t *b = zt_malloc(ZT_MAX(ZT_MIN(n, IO_CHUNK), (size_t)1) * 2);
    for (size_t off = 0; off < n; off += IO_CHUNK) {
        const size_t k = ZT_MIN(IO_CHUNK, n - off);
        to16_on(&zt_backend_cpu, s->pdt, b, h + off, k);
        s->be->from_host(w + off, b, k * 2);
    }
    free(b);
}

/* The view's record, in the spare element after the last segment: one host block
 * staging what is not host memory (value, then exp_avg and exp_avg_sq where there
 * are moments, segment after segment), and where each segment's state lives. */
typedef struct io_stage {
    float *host;
    io_src_t *src;
} io_stage_t;

/* an nvme segment's unit into host buffers: *r = c with its pointers there */
static void io_nv_in(zt_shard_t *s, const io_src_t *c, io_src_t *r)
{
    *r = *c;
    if (!c->nv) return;
    nv_in(s, c->unit, NV_OPT | NV_PAR, NV_OPT | NV_PAR);
    const unit_state_t *u = &s->u[c->unit];
    r->value = u->master ? u->master + c->pos : NULL;
    r->m = c->moments ? u->m + c->pos : NULL;
    r->v = c->moments ? u->v + c->pos : NULL;
    r->w16 = c->kind == IO_W16 ? u->wshard + c->pos : NULL;
}

static void io_nv_out(zt_shard_t *s, const io_src_t *c, int dirty)
{
    if (c->nv) nv_out(s, c->unit, NV_OPT | NV_PAR, dirty ? NV_OPT | NV_PAR : 0);
}

int zt_shard_io_view(zt_shard_t *s, zt_io_mode_t mode, zt_io_seg_t **segs)
{
    io_src_t *src;
    const int n = io_list(s, mode, segs, &src);
    zt_io_seg_t *seg = *segs;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (src[i].kind != IO_HOST) total += (src[i].m || src[i].moments ? 3 : 1) * seg[i].len;
    io_stage_t *st = zt_calloc(1, sizeof *st);
    st->src = src;
    st->host = total ? zt_malloc(total * sizeof(float)) : NULL;
    const int for_write = mode != ZT_IO_READ;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (src[i].kind == IO_HOST) continue;
        float *h = st->host + off;
        const size_t len = seg[i].len, bytes = len * sizeof(float);
        seg[i].value = h;
        if (src[i].nv) { /* nvme: host buffers, copied while the unit is in */
            io_src_t r;
            io_nv_in(s, &src[i], &r);
            if (r.kind == IO_W16) io_widen(s, h, r.w16, len);
            else if (for_write || !r.m) memcpy(h, r.value, bytes);
            if (r.m) {
                seg[i].exp_avg = h + len;
                seg[i].exp_avg_sq = h + 2 * len;
                if (for_write) memcpy(seg[i].exp_avg, r.m, bytes), memcpy(seg[i].exp_avg_sq, r.v, bytes);
            }
            io_nv_out(s, &src[i], 0);
            off += (r.m ? 3 : 1) * len;
            continue;
        }
        const io_src_t *c = &src[i];
        /* a frozen parameter's staging holds its value for a read too: a reader that
         * fills only some segments (a LoRA checkpoint, a PEFT adapter: the adapters)
         * leaves the base as it was when io_done copies every staging back */
        if (c->kind == IO_W16) {
            io_widen(s, h, c->w16, len);
            off += len;
            continue;
        }
        if (for_write || !c->m) s->be->to_host(h, c->value, bytes);
        off += len;
        if (!c->m) continue;
        seg[i].exp_avg = h + len;
        seg[i].exp_avg_sq = h + 2 * len;
        if (for_write) {
            s->be->to_host(seg[i].exp_avg, c->m, bytes);
            s->be->to_host(seg[i].exp_avg_sq, c->v, bytes);
        }
        off += 2 * len;
    }
    memcpy(&seg[n], &st, sizeof st);
    return n;
}

int zt_shard_io_segments(zt_shard_t *s, int for_write, zt_io_seg_t **segs)
{
    return zt_shard_io_view(s, for_write ? ZT_IO_WRITE : ZT_IO_READ, segs);
}

void zt_shard_io_done(zt_shard_t *s, zt_io_seg_t *segs, int n, int loaded)
{
    io_stage_t *st;
    memcpy(&st, &segs[n], sizeof st);
    /* loaded moments: 1-bit Adam's shared momentum is m itself again (gathered once) */
    for (int ui = 0; loaded >= 2 && ui < s->t->nunits; ui++)
        if (s->u[ui].onebit) zt_onebit_forget(s->u[ui].onebit);
    /* offload_param: a gather's upload may still read a 16-bit host shard */
    if (loaded && s->offload_param) s->be->wait_uploads();
    for (int i = 0; loaded && i < n; i++) {
        const io_src_t *c = &st->src[i];
        const size_t bytes = segs[i].len * sizeof(float);
        if (c->nv) {
            io_src_t r;
            io_nv_in(s, c, &r);
            if (r.kind == IO_W16) io_round(s, r.w16, segs[i].value, segs[i].len);
            else memcpy(r.value, segs[i].value, bytes);
            if (loaded == 2 && r.m) memcpy(r.m, segs[i].exp_avg, bytes), memcpy(r.v, segs[i].exp_avg_sq, bytes);
            io_nv_out(s, c, 1);
            continue;
        }
        if (c->kind == IO_W16) {
            io_round(s, c->w16, segs[i].value, segs[i].len);
        } else if (c->kind == IO_DEV) {
            s->be->from_host(c->value, segs[i].value, bytes);
            if (loaded < 2 || !c->m) continue; /* weights only: the moments stay as they are */
            s->be->from_host(c->m, segs[i].exp_avg, bytes);
            s->be->from_host(c->v, segs[i].exp_avg_sq, bytes);
        }
    }
    free(st->host);
    free(st->src);
    free(st);
    free(segs);
}

long zt_shard_adam_step(const zt_shard_t *s) { return s->adam_step; }
void zt_shard_set_adam_step(zt_shard_t *s, long t) { s->adam_step = t; }

void zt_shard_after_load(zt_shard_t *s)
{
    for (int ui = 0; ui < s->t->nunits; ui++) {
        if (s->u[ui].absent) continue;
        if (s->shard_params) drop_gathered(s, ui);
        /* a frozen unit's owned part was loaded into its only copy (io_done rounded
         * it where that is 16-bit): a replicated copy still needs the rest */
        if (!s->u[ui].frozen) {
            nv_in(s, ui, NV_OPT | NV_PAR, NV_OPT | (s->mixed ? 0 : NV_PAR));
            refresh_working(s, ui);
            nv_out(s, ui, NV_OPT | NV_PAR, NV_PAR);
        } else if (!s->shard_params && s->n > 1) regather_full(s, ui);
    }
    if (s->offload) s->be->wait_uploads();
    if (s->mixed) invalidate_slots(s);
}

float *zt_shard_onebit_error(zt_shard_t *s, int ui, int i, int server, size_t *len)
{
    unit_state_t *u = &s->u[ui];
    *len = 0;
    if (!u->onebit) return NULL;
    return server ? zt_onebit_server_error(u->onebit, i, len) : zt_onebit_worker_error(u->onebit, i, len);
}

void zt_shard_onebit_reset(zt_shard_t *s)
{
    for (int ui = 0; ui < s->t->nunits; ui++)
        if (s->u[ui].onebit) zt_onebit_reset(s->u[ui].onebit);
}

double zt_shard_param_sumsq(zt_shard_t *s)
{
    zt_io_seg_t *segs;
    io_src_t *src;
    const int n = io_list(s, ZT_IO_WRITE_ALL, &segs, &src);
    double local = 0.0;
    for (int i = 0; i < n; i++) {
        io_src_t r;
        io_nv_in(s, &src[i], &r);
        if (r.kind != IO_W16) {
            local += r.vbe->sumsq(r.value, segs[i].len);
        } else {
            float *h = zt_malloc(segs[i].len * sizeof(float));
            io_widen(s, h, r.w16, segs[i].len);
            local += zt_backend_cpu.sumsq(h, segs[i].len);
            free(h);
        }
        io_nv_out(s, &src[i], 0);
    }
    free(segs);
    free(src);
    return zt_sum_double(s->comm, &s->comm->world, local);
}
