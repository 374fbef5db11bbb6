/* test_layout.c — shard arithmetic: ranges, padding, owners, per-parameter splits,
 * and the strategy table. Pure functions, so every property is checked exhaustively
 * over world sizes that divide nothing (3, 5, 7) as well as those that do. */
#include <stdlib.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_model.h"
#include "zt_memplan.h"
#include "zt_shard.h"
#include "zt_test.h"

static zt_param_table_t *tiny_table(void)
{
    /* V = 67 and C = 12: unit sizes divide by almost nothing */
    return zt_arch_gpt2_table(2, 2, 12, 67, 9, 0.02f);
}

/* Every element of the unit is owned by exactly one rank, segments stay inside
 * the unit, and counts/displacements describe the packed order. */
static void check_partition(const zt_param_table_t *t, int unit, int n, zt_layout_t kind)
{
    zt_unit_layout_t lay;
    zt_unit_layout_build(&lay, t, unit, n, kind);
    const size_t numel = t->unit_numel[unit];
    CU_ASSERT_EQUAL(lay.numel, numel);
    int *owner = calloc(numel, sizeof *owner);
    size_t packed = 0;
    for (int r = 0; r < n; r++) {
        CU_ASSERT_EQUAL(lay.displ[r], packed);
        size_t owned = 0;
        for (int i = 0; i < lay.nseg[r]; i++) {
            zt_segment_t s = lay.seg[r][i];
            CU_ASSERT(s.len > 0);
            CU_ASSERT(s.off + s.len <= numel);
            for (size_t e = s.off; e < s.off + s.len && e < numel; e++) owner[e]++;
            owned += s.len;
        }
        if (kind == ZT_LAYOUT_PER_PARAM) {
            CU_ASSERT_EQUAL(owned, lay.count[r]);
        } else {
            CU_ASSERT(owned <= lay.count[r]); /* padding is owned but not real */
        }
        packed += lay.count[r];
    }
    CU_ASSERT_EQUAL(packed, lay.packed);
    size_t bad = 0;
    for (size_t e = 0; e < numel; e++) bad += owner[e] != 1;
    CU_ASSERT_EQUAL(bad, 0);
    free(owner);
    zt_unit_layout_free(&lay);
}

static void t_partition_all(void)
{
    zt_param_table_t *t = tiny_table();
    for (int n = 1; n <= 8; n++)
        for (int u = 0; u < t->nunits; u++) {
            check_partition(t, u, n, ZT_LAYOUT_FLAT);
            check_partition(t, u, n, ZT_LAYOUT_PER_PARAM);
        }
    zt_param_table_free(t);
}

static void t_flat_padding(void)
{
    zt_param_table_t *t = tiny_table();
    /* root unit: 67*12 + 9*12 + 24 = 936 elements; 7 ranks -> S = 134, padded 938 */
    CU_ASSERT_EQUAL(t->unit_numel[0], 936);
    zt_unit_layout_t lay;
    zt_unit_layout_build(&lay, t, 0, 7, ZT_LAYOUT_FLAT);
    CU_ASSERT_EQUAL(lay.packed, 938);
    for (int r = 0; r < 7; r++) {
        CU_ASSERT_EQUAL(lay.count[r], 134);
        CU_ASSERT_EQUAL(lay.nseg[r], 1);
        CU_ASSERT_EQUAL(lay.seg[r][0].off, (size_t)r * 134);
    }
    CU_ASSERT_EQUAL(lay.seg[6][0].len, 936 - 6 * 134); /* the last rank holds the padding */
    zt_unit_layout_free(&lay);
    zt_param_table_free(t);
}

static void t_per_param_rows(void)
{
    zt_param_table_t *t = tiny_table();
    /* wte is (67, 12): 3 ranks get 23, 22, 22 rows; the first segment of each rank is its
     * wte row block, starting at the row boundary */
    zt_unit_layout_t lay;
    zt_unit_layout_build(&lay, t, 0, 3, ZT_LAYOUT_PER_PARAM);
    CU_ASSERT_EQUAL(lay.seg[0][0].off, 0);
    CU_ASSERT_EQUAL(lay.seg[0][0].len, 23 * 12);
    CU_ASSERT_EQUAL(lay.seg[1][0].off, 23 * 12);
    CU_ASSERT_EQUAL(lay.seg[1][0].len, 22 * 12);
    CU_ASSERT_EQUAL(lay.seg[2][0].off, 45 * 12);
    /* every segment lies inside one parameter and starts on a row boundary */
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < lay.nseg[r]; i++) {
            zt_segment_t s = lay.seg[r][i];
            int inside = 0;
            for (int p = t->unit_first[0]; p < t->unit_first[0] + t->unit_count[0]; p++) {
                const zt_param_t *pp = &t->params[p];
                size_t rowlen = pp->numel / (size_t)pp->shape[0];
                if (s.off >= pp->offset && s.off + s.len <= pp->offset + pp->numel &&
                    (s.off - pp->offset) % rowlen == 0 && s.len % rowlen == 0)
                    inside = 1;
            }
            CU_ASSERT(inside);
        }
    /* more ranks than rows (ln_f has 12 "rows" of 1): ranks beyond get nothing of it, and
     * the layout is still a partition */
    zt_unit_layout_free(&lay);
    check_partition(t, 0, 13, ZT_LAYOUT_PER_PARAM);
    zt_param_table_free(t);
}

static void t_strategy_names(void)
{
    CU_ASSERT_STRING_EQUAL(zt_strategy_name(ZT_ZERO3), "zero3");
    /* residency table of the design */
    CU_ASSERT(!zt_strategy_shards_optim(ZT_DDP));
    CU_ASSERT(zt_strategy_shards_optim(ZT_ZERO1) && !zt_strategy_shards_grads(ZT_ZERO1));
    CU_ASSERT(zt_strategy_shards_grads(ZT_ZERO2) && !zt_strategy_shards_params(ZT_ZERO2));
    CU_ASSERT(zt_strategy_shards_params(ZT_SHARD_GRAD_OP) && zt_strategy_shards_params(ZT_ZERO3));
    CU_ASSERT(zt_strategy_is_hybrid(ZT_HYBRID) && !zt_strategy_is_hybrid(ZT_ZERO3));
    /* auto, unresolved, shards nothing */
    CU_ASSERT(!zt_strategy_shards_optim(ZT_STRATEGY_AUTO) && !zt_strategy_shards_params(ZT_STRATEGY_AUTO));
    CU_ASSERT_STRING_EQUAL(zt_strategy_name(ZT_STRATEGY_AUTO), "auto");
}

/* the engine's memory for rank 0 of `data` ranks in shard groups of shard_n: a dry run */
static void dry_engine(const zt_param_table_t *t, const zt_shard_opts_t *o, int data, int shard_n, zt_shard_mem_t *m)
{
    zt_memplan_req_t q = {.table = t, .opts = *o, .data = data, .tp = 1, .shard_n = shard_n, .nmicro = 2};
    zt_memplan_t p;
    zt_memplan_run(&q, &p);
    *m = p.mem;
}

static void t_memory_estimate(void)
{
    zt_param_table_t *t = tiny_table();
    zt_shard_opts_t o = {.strategy = ZT_ZERO3, .layout = ZT_LAYOUT_FLAT, .reshard_after_forward = 1};
    zt_shard_mem_t m1, m4;
    dry_engine(t, &o, 1, 1, &m1);
    dry_engine(t, &o, 4, 4, &m4);
    /* zero3 fp32 Adam: 16 bytes per parameter, divided by N up to padding */
    size_t state1 = m1.params + m1.grads + m1.optim, state4 = m4.params + m4.grads + m4.optim;
    CU_ASSERT_EQUAL(state1, 16 * t->total_numel);
    CU_ASSERT(state4 * 4 >= state1 && state4 * 4 <= state1 + 16 * 4 * (size_t)t->nunits);
    o.strategy = ZT_DDP;
    dry_engine(t, &o, 4, 4, &m4);
    CU_ASSERT_EQUAL(m4.params + m4.grads + m4.optim, 16 * t->total_numel);
    zt_param_table_free(t);
}

static const zt_test_t tests[] = {
    {"every element owned once (n = 1..8, both layouts)", t_partition_all},
    {"flat padding", t_flat_padding},
    {"per-parameter row blocks", t_per_param_rows},
    {"strategy names and residency", t_strategy_names},
    {"memory estimate formulas", t_memory_estimate},
    {NULL, NULL}};
ZT_TEST_MAIN("layout", tests)
