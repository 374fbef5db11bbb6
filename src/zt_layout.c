/* zt_layout.c — shard geometry: which elements of a unit each rank owns.
 *
 * Pure arithmetic, no communication, so it is unit-tested on its own and every
 * rank derives the same answer independently. See zt_shard.h for the layouts. */
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_shard.h"

static void push_seg(zt_unit_layout_t *lay, int r, int *cap, size_t off, size_t len)
{
    if (len == 0) return;
    if (lay->nseg[r] == cap[r]) {
        cap[r] = cap[r] ? 2 * cap[r] : 8;
        zt_segment_t *ns = realloc(lay->seg[r], (size_t)cap[r] * sizeof *ns);
        if (!ns) zt_fatal("out of memory building a shard layout");
        lay->seg[r] = ns;
    }
    lay->seg[r][lay->nseg[r]++] = (zt_segment_t){off, len};
}

void zt_unit_layout_build(zt_unit_layout_t *lay, const zt_param_table_t *t, int unit, int n,
                          zt_layout_t kind)
{
    memset(lay, 0, sizeof *lay);
    lay->numel = t->unit_numel[unit];
    lay->n = n;
    lay->count = zt_calloc((size_t)n, sizeof *lay->count);
    lay->displ = zt_calloc((size_t)n, sizeof *lay->displ);
    lay->nseg = zt_calloc((size_t)n, sizeof *lay->nseg);
    lay->seg = zt_calloc((size_t)n, sizeof *lay->seg);
    int *cap = zt_calloc((size_t)n, sizeof *cap);
    if (kind == ZT_LAYOUT_FLAT) {
        /* pad to a multiple of n so every rank owns exactly S elements */
        const size_t S = ZT_CEIL_DIV(lay->numel, (size_t)n);
        for (int r = 0; r < n; r++) {
            lay->count[r] = S;
            lay->displ[r] = (size_t)r * S;
            size_t start = (size_t)r * S;
            if (start < lay->numel) push_seg(lay, r, cap, start, ZT_MIN(S, lay->numel - start));
        }
        lay->packed = S * (size_t)n;
    } else {
        /* every parameter split along dim 0 into near-equal row blocks: the first
         * (rows % n) ranks get one extra row */
        const int first = t->unit_first[unit], cnt = t->unit_count[unit];
        for (int i = first; i < first + cnt; i++) {
            const zt_param_t *p = &t->params[i];
            const size_t rows = (size_t)p->shape[0], rowlen = p->numel / rows;
            const size_t base = rows / (size_t)n, extra = rows % (size_t)n;
            size_t row = 0;
            for (int r = 0; r < n; r++) {
                size_t nr = base + ((size_t)r < extra ? 1 : 0);
                push_seg(lay, r, cap, p->offset + row * rowlen, nr * rowlen);
                lay->count[r] += nr * rowlen;
                row += nr;
            }
        }
        size_t d = 0;
        for (int r = 0; r < n; r++) {
            lay->displ[r] = d;
            d += lay->count[r];
        }
        lay->packed = d;
    }
    free(cap);
}

void zt_unit_layout_free(zt_unit_layout_t *lay)
{
    for (int r = 0; r < lay->n; r++) free(lay->seg[r]);
    free(lay->seg);
    free(lay->nseg);
    free(lay->count);
    free(lay->displ);
    memset(lay, 0, sizeof *lay);
}
