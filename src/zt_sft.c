/* zt_sft.c — LLaMA-Factory's supervised processor: turns -> input_ids and labels
 * (SupervisedDatasetProcessor._encode_data_example), and its packing
 * (PackedSupervisedDatasetProcessor with greedy_knapsack), neat or not; its pairwise
 * processor (PairwiseDatasetProcessor._encode_data_example): preference pairs -> chosen
 * and rejected samples. */
#include "zt_sft.h"

#include "zt_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IGNORE_INDEX (-100)

void zt_sft_infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff, int64_t *new_source,
                         int64_t *new_target)
{
    int64_t max_target;
    if (target_len * 2 < cutoff) max_target = cutoff; /* truncate the source */
    else if (source_len * 2 < cutoff) max_target = cutoff - source_len; /* truncate the target */
    else /* both: int(cutoff * (target / (source + target))) in float64, as Python computes it */
        max_target = (int64_t)((double)cutoff * ((double)target_len / (double)(source_len + target_len)));
    int64_t t = max_target < target_len ? max_target : target_len;
    int64_t max_source = cutoff - t > 0 ? cutoff - t : 0;
    *new_target = t;
    *new_source = max_source < source_len ? max_source : source_len;
}

static void fill(zt_ids_t *a, int32_t v, size_t n)
{
    for (size_t i = 0; i < n; i++) zt_ids_push(a, v);
}

/* Template._encode of msgs[0..n): n arrays of ids (free with enc_free), NULL with err. */
static zt_ids_t *encode(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const char *system, const char *const *msgs,
                        int n, int discard_history_cot, char *err, size_t errlen)
{
    zt_ids_t *enc = zt_calloc((size_t)n, sizeof *enc);
    if (zt_template_encode(o->tpl, tok, &o->ids, system, msgs, n, discard_history_cot, enc) == 0) return enc;
    for (int i = 0; i < n; i++) zt_ids_free(&enc[i]);
    free(enc);
    zt_err(err, errlen, "tokenizer failed");
    return NULL;
}

static void enc_free(zt_ids_t *enc, int n)
{
    for (int i = 0; i < n; i++) zt_ids_free(&enc[i]);
    free(enc);
}

int zt_sft_encode(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_record_t *r, zt_ids_t *input_ids,
                  zt_ids_t *labels, char *err, size_t errlen)
{
    const zt_template_t *t = o->tpl;
    int n = r->nmsgs, npairs = n / 2;
    /* discarding_history_cot = mask_history and not preserve_thinking (False) */
    zt_ids_t *enc = encode(o, tok, r->system, (const char *const *)r->msgs, n, o->mask_history, err, errlen);
    if (!enc) return -1;
    /* with mask_history the turns are taken last first (the last turn has priority) and
     * the sample is built back to front: build each turn, then join them reversed */
    zt_ids_t *ti = zt_calloc((size_t)npairs, sizeof *ti), *tl = zt_calloc((size_t)npairs, sizeof *tl);
    int64_t total = t->efficient_eos ? 1 : 0;
    int used = 0;
    for (int k = 0; k < npairs; k++) {
        int p = o->mask_history ? npairs - 1 - k : k;
        const zt_ids_t *src = &enc[2 * p], *tgt = &enc[2 * p + 1];
        if (total >= o->cutoff_len) break;
        int64_t sl, tlen;
        zt_sft_infer_seqlen((int64_t)src->n, (int64_t)tgt->n, o->cutoff_len - total, &sl, &tlen);
        total += sl + tlen;
        zt_ids_append(&ti[k], src->v, (size_t)sl);
        zt_ids_append(&ti[k], tgt->v, (size_t)tlen);
        if (o->train_on_prompt) {
            zt_ids_append(&tl[k], src->v, (size_t)sl);
        } else if (t->efficient_eos && k != 0) {
            /* LLaMA-Factory writes [eos] + [-100] * (len - 1) even for an empty source */
            zt_ids_push(&tl[k], o->ids.eos);
            if (sl > 1) fill(&tl[k], IGNORE_INDEX, (size_t)(sl - 1));
        } else {
            fill(&tl[k], IGNORE_INDEX, (size_t)sl);
        }
        if (o->mask_history && k != 0) fill(&tl[k], IGNORE_INDEX, (size_t)tlen); /* train on the last turn only */
        else zt_ids_append(&tl[k], tgt->v, (size_t)tlen);
        used = k + 1;
    }
    for (int j = 0; j < used; j++) {
        int k = o->mask_history ? used - 1 - j : j;
        zt_ids_append(input_ids, ti[k].v, ti[k].n);
        zt_ids_append(labels, tl[k].v, tl[k].n);
    }
    if (t->efficient_eos) {
        zt_ids_push(input_ids, o->ids.eos);
        zt_ids_push(labels, o->ids.eos);
    }
    for (int i = 0; i < npairs; i++) zt_ids_free(&ti[i]), zt_ids_free(&tl[i]);
    enc_free(enc, n);
    free(ti);
    free(tl);
    return 0;
}

int zt_sft_encode_pair(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_record_t *r, zt_ids_t ids[2],
                       zt_ids_t labels[2], char *err, size_t errlen)
{
    const int n = r->nmsgs;
    if (!r->rejected || n < 2 || n % 2) return zt_err(err, errlen, "not a preference pair");
    const char **m = zt_malloc((size_t)n * sizeof *m);
    memcpy(m, r->msgs, (size_t)n * sizeof *m);
    zt_ids_t prompt = {0}, ans[2] = {{0}};
    int rc = 0;
    for (int k = 0; rc == 0 && k < 2; k++) {
        /* encode_oneturn: the reasoning templates drop the history's thoughts (as
         * discarding_history_cot does) and give the answer an empty thought block */
        m[n - 1] = k == 0 ? r->msgs[n - 1] : r->rejected;
        zt_ids_t *enc = encode(o, tok, r->system, m, n, 1, err, errlen);
        if (!enc) {
            rc = -1;
            break;
        }
        for (int i = 0; k == 0 && i < n - 1; i++) zt_ids_append(&prompt, enc[i].v, enc[i].n);
        zt_ids_append(&ans[k], enc[n - 1].v, enc[n - 1].n);
        if (o->tpl->efficient_eos) zt_ids_push(&ans[k], o->ids.eos); /* before the cut: it may be cut off */
        enc_free(enc, n);
    }
    if (rc == 0) {
        /* "consider the response is more important": the longer answer decides the cut */
        int64_t sl, tl;
        zt_sft_infer_seqlen((int64_t)prompt.n, (int64_t)ZT_MAX(ans[0].n, ans[1].n), o->cutoff_len, &sl, &tl);
        for (int k = 0; k < 2; k++) {
            const size_t keep = ZT_MIN(ans[k].n, (size_t)tl);
            zt_ids_append(&ids[k], prompt.v, (size_t)sl);
            zt_ids_append(&ids[k], ans[k].v, keep);
            fill(&labels[k], IGNORE_INDEX, (size_t)sl);
            zt_ids_append(&labels[k], ans[k].v, keep);
        }
    }
    zt_ids_free(&prompt);
    zt_ids_free(&ans[0]);
    zt_ids_free(&ans[1]);
    free(m);
    return rc;
}

/* segs: the row's segment ids (neat packing), or NULL */
static void add_sample(zt_sft_samples_t *s, const int32_t *ids, const int32_t *labels, const int32_t *segs,
                       size_t n)
{
    if (s->nsamples + 2 > s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->offsets = realloc(s->offsets, s->cap * sizeof *s->offsets);
        if (!s->offsets) zt_fatal("out of memory");
    }
    if (s->nsamples == 0) s->offsets[0] = 0;
    zt_ids_append(&s->input_ids, ids, n);
    zt_ids_append(&s->labels, labels, n);
    if (segs) zt_ids_append(&s->segment_ids, segs, n);
    s->offsets[++s->nsamples] = (int64_t)s->input_ids.n;
}

/* greedy_knapsack: lengths sorted ascending; each knapsack repeatedly takes the largest
 * length that still fits (bisect_right - 1), removing it. */
typedef struct {
    int64_t len;
    size_t index; /* the sample, for length2indexes[length].pop(): the last one of that length */
} item_t;

static int cmp_item(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index; /* stable: pop() takes the largest index */
}

static void pack_batch(const zt_sft_opts_t *o, zt_sft_samples_t *out, const zt_ids_t *ids, const zt_ids_t *lab,
                       size_t n)
{
    int64_t cap = o->cutoff_len; /* already lowered by one */
    item_t *items = zt_malloc((n ? n : 1) * sizeof *items);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)ids[i].n > cap) {
            out->dropped++; /* "Dropped lengthy example" */
            continue;
        }
        items[m++] = (item_t){(int64_t)ids[i].n, i};
    }
    qsort(items, m, sizeof *items, cmp_item);
    zt_ids_t row = {0}, rowl = {0}, rows = {0};
    while (m > 0) {
        int64_t left = cap;
        int32_t k = 0; /* samples in the row so far */
        row.n = rowl.n = rows.n = 0;
        for (;;) {
            /* bisect_right(lengths, left) - 1 */
            size_t lo = 0, hi = m;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (items[mid].len <= left) lo = mid + 1;
                else hi = mid;
            }
            if (lo == 0) break;
            int64_t len = items[lo - 1].len;
            /* the sample: the last-added index of this length still unused, i.e. the
             * largest index among equal lengths (they sit together, sorted by index) */
            size_t j = lo - 1;
            size_t idx = items[j].index;
            memmove(items + j, items + j + 1, (m - j - 1) * sizeof *items);
            m--;
            left -= len;
            zt_ids_append(&row, ids[idx].v, ids[idx].n);
            zt_ids_append(&rowl, lab[idx].v, lab[idx].n);
            fill(&rows, ++k, ids[idx].n); /* "[i + 1] * len": ids from 1 in the knapsack's order */
        }
        /* pad to cutoff_len + 1 (the original cutoff_len) */
        size_t want = (size_t)cap + 1;
        if (row.n < want) {
            size_t pad = want - row.n;
            fill(&row, o->ids.pad, pad);
            fill(&rowl, IGNORE_INDEX, pad);
            fill(&rows, 0, pad); /* neat packing's padding: segment 0 */
        }
        add_sample(out, row.v, rowl.v, o->neat_packing ? rows.v : NULL, row.n);
    }
    zt_ids_free(&row);
    zt_ids_free(&rowl);
    zt_ids_free(&rows);
    free(items);
}

/* Each record's chosen sample, then its rejected one: a pair stays two consecutive samples. */
static int build_pairs(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_records_t *recs,
                       zt_sft_samples_t *out, char *err, size_t errlen)
{
    zt_ids_t ids[2] = {{0}}, lab[2] = {{0}};
    int rc = 0;
    out->pairs = 1;
    for (size_t i = 0; rc == 0 && i < recs->n; i++) {
        ids[0].n = ids[1].n = lab[0].n = lab[1].n = 0;
        if ((rc = zt_sft_encode_pair(o, tok, &recs->rec[i], ids, lab, err, errlen)) != 0) {
            zt_sft_samples_free(out);
            out->failed = i;
            break;
        }
        for (int k = 0; k < 2; k++) add_sample(out, ids[k].v, lab[k].v, NULL, ids[k].n);
    }
    for (int k = 0; k < 2; k++) zt_ids_free(&ids[k]), zt_ids_free(&lab[k]);
    return rc;
}

int zt_sft_build(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_records_t *recs, zt_sft_samples_t *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    zt_sft_opts_t oo = *o;
    oo.packing = o->packing || o->neat_packing; /* DataArguments: neat_packing sets packing */
    o = &oo;
    out->failed = SIZE_MAX;
    if (o->cutoff_len < 1 + (o->packing ? 1 : 0))
        return zt_err(err, errlen, "cutoff_len %d is too small", o->cutoff_len);
    if (o->mask_history && o->train_on_prompt)
        return zt_err(err, errlen, "mask_history is incompatible with train_on_prompt (as in LLaMA-Factory)");
    if (o->train_on_prompt && o->tpl->efficient_eos)
        return zt_err(err, errlen, "template %s does not support train_on_prompt", o->tpl->name);
    /* LLaMA-Factory's pairwise processor reads none of these: they would silently do nothing */
    if (o->ranking && (o->packing || o->train_on_prompt || o->mask_history))
        return zt_err(err, errlen, "%s: not for preference pairs (LLaMA-Factory's pairwise processor neither packs "
                                   "nor trains on the prompt, and takes the history as prompt)",
                      o->packing ? "packing" : o->train_on_prompt ? "train_on_prompt" : "mask_history");
    if (o->ranking) return build_pairs(o, tok, recs, out, err, errlen);
    if (o->packing) oo.cutoff_len -= 1; /* DataArguments.__post_init__: "avoid pad_to_multiple_of" */
    size_t batch = o->packing ? ZT_SFT_PACK_BATCH : 1;
    zt_ids_t *ids = zt_calloc(batch, sizeof *ids), *lab = zt_calloc(batch, sizeof *lab);
    int rc = 0;
    for (size_t b = 0; rc == 0 && b < recs->n; b += batch) {
        size_t n = recs->n - b < batch ? recs->n - b : batch;
        for (size_t i = 0; i < n; i++) {
            ids[i].n = lab[i].n = 0;
            if ((rc = zt_sft_encode(&oo, tok, &recs->rec[b + i], &ids[i], &lab[i], err, errlen)) != 0) {
                out->failed = b + i;
                break;
            }
            if (!o->packing) add_sample(out, ids[i].v, lab[i].v, NULL, ids[i].n);
        }
        if (rc == 0 && o->packing) pack_batch(&oo, out, ids, lab, n);
    }
    for (size_t i = 0; i < batch; i++) zt_ids_free(&ids[i]), zt_ids_free(&lab[i]);
    free(ids);
    free(lab);
    if (rc != 0) {
        const size_t failed = out->failed;
        zt_sft_samples_free(out);
        out->failed = failed;
    }
    return rc;
}

void zt_sft_samples_free(zt_sft_samples_t *s)
{
    zt_ids_free(&s->input_ids);
    zt_ids_free(&s->labels);
    zt_ids_free(&s->segment_ids);
    free(s->offsets);
    memset(s, 0, sizeof *s);
}
