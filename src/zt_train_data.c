/* zt_train_data.c — the run's datasets: data.train_files / data.val_files, or
 * data.dataset's dataset_info.json entries, made into SFT sample files once (a cache every
 * rank shares) and opened; and the rows a rank reads for a micro-batch (its data-parallel
 * share, its sequence-parallel chunk). The loop asks for rows by global sample index; how
 * they are tokenized, cached and cut per rank stays here. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_dataset_info.h"
#include "zt_log.h"
#include "zt_sft.h"
#include "zt_train_internal.h"

/* Sequence parallelism: this rank's chunk of a row of T tokens into dst, as row b of B
 * rows of T / sp (ring attention: chunks i and 2 sp - 1 - i of 2 sp, chunk-major over
 * the B rows) */
void zt_tr_sp_chunk(const run_t *r, const int32_t *row, int T, int b, int B, int32_t *dst)
{
    const int sp = r->comm->mesh_sp, i = r->comm->sp.rank, Tm = T / sp;
    if (!r->ltable->dims.sp_ring) {
        memcpy(dst + (size_t)b * Tm, row + (size_t)i * Tm, (size_t)Tm * sizeof(int32_t));
        return;
    }
    const size_t c = (size_t)Tm / 2;
    for (int h = 0; h < 2; h++)
        memcpy(dst + ((size_t)h * B + b) * c, row + (size_t)zt_model_ring_chunk(sp, i, h) * c, c * sizeof(int32_t));
}

/* Reads rows [g0 + ...] of a dataset into inp/tgt (B rows), and their segments and
 * positions into seg/pos when not NULL; 0 or -1 with err. */
int zt_tr_read_rows(run_t *r, zt_dataset_t *ds, int64_t g0, int shuffle, int32_t *inp, int32_t *tgt, int32_t *seg,
                     int32_t *pos, char *err, size_t errlen)
{
    const int T = r->T, Tm = r->Tm;
    int rc = 0;
    if (zt_data_is_pairs(ds)) {
        /* rows b, b + 1 are pair (g0 + b) / 2's chosen and rejected (B and g0 are even) */
        int32_t *buf = Tm == T ? NULL : zt_malloc(4 * (size_t)T * sizeof *buf);
        for (int b = 0; b < r->B && rc == 0; b += 2) {
            if (!buf) {
                rc = zt_data_read_pair_rows(ds, (g0 + b) / 2, (uint64_t)r->cfg->data.seed, shuffle,
                                            inp + (size_t)b * T, tgt + (size_t)b * T, NULL, NULL, err, errlen);
                continue;
            }
            rc = zt_data_read_pair_rows(ds, (g0 + b) / 2, (uint64_t)r->cfg->data.seed, shuffle, buf, buf + 2 * T,
                                        NULL, NULL, err, errlen);
            for (int h = 0; h < 2; h++) {
                zt_tr_sp_chunk(r, buf + (size_t)h * T, T, b + h, r->B, inp);
                zt_tr_sp_chunk(r, buf + 2 * (size_t)T + (size_t)h * T, T, b + h, r->B, tgt);
            }
        }
        free(buf);
        return rc;
    }
    for (int b = 0; b < r->B && rc == 0; b++) {
        /* seg: whole rows, since attention runs over every position of a sequence (under
         * sequence parallelism too); pos: the positions of the tokens this rank runs */
        int32_t *sb = seg ? seg + (size_t)b * T : NULL;
        if (Tm == T) {
            rc = zt_data_read_row(ds, g0 + b, (uint64_t)r->cfg->data.seed, shuffle, inp + (size_t)b * T,
                                  tgt + (size_t)b * T, sb, pos ? pos + (size_t)b * T : NULL, err, errlen);
            continue;
        }
        /* sequence parallelism: the sp ranks of a row read it alike and take their chunk
         * (a packed row's segments stay whole: the model cuts them per chunk) */
        rc = zt_data_read_row(ds, g0 + b, (uint64_t)r->cfg->data.seed, shuffle, r->row_tmp, r->row_tmp + T, sb,
                              pos ? r->row_tmp + 2 * (size_t)T : NULL, err, errlen);
        zt_tr_sp_chunk(r, r->row_tmp, T, b, r->B, inp);
        zt_tr_sp_chunk(r, r->row_tmp + T, T, b, r->B, tgt);
        if (pos) zt_tr_sp_chunk(r, r->row_tmp + 2 * (size_t)T, T, b, r->B, pos);
    }
    return rc;
}

/* Targets that carry a loss among n */
long zt_tr_loss_tokens(const int32_t *tgt, size_t n)
{
    long k = 0;
    for (size_t i = 0; i < n; i++) k += tgt[i] >= 0;
    return k;
}

/* One SFT sample file of the trainer, from files (a data.train_files file, or the files of
 * a dataset_info.json entry), unless the cache (zt_sft_cache_path) already holds it: made
 * by every rank (each tokenizes a share, rank 0 writes); every rank then opens it. */
static int sft_cache(run_t *r, const zt_sft_prep_t *p, const char *const *files, int nfiles, const char *base,
                     const char *what, char *out, size_t outlen, char *err, size_t errlen)
{
    if (zt_agree_error(r->comm, zt_sft_cache_path(p, files, nfiles, base, out, outlen, err, errlen), err, errlen))
        return -1;
    /* rank 0's view of the cache decides for all: the preprocessing is collective */
    if (zt_any(r->comm, r->rank == 0 && access(out, F_OK) != 0)) {
        zt_sft_prep_stats_t st;
        if (zt_sft_prep_ranks(p, files, nfiles, out, r->comm, &st, err, errlen)) return -1;
        zt_log("data: %s -> %s: %zu records, %zu samples, %zu tokens (%zu with loss), %.2f s on %d ranks "
               "(%.2f s with the write; rank 0's share %.2f s of CPU)", what, out, st.records, st.samples,
               st.tokens, st.loss_tokens, st.seconds, r->comm->world.size, st.total_seconds, st.share_cpu);
        if (st.unread)
            zt_log("data: %s: the first %zu records (data.max_samples = %ld); %zu more not read", what, st.records,
                   p->max_samples, st.unread);
    } else {
        zt_log("data: %s: cached in %s", what, out);
    }
    return 0;
}

static zt_sft_prep_t sft_options(const zt_config_t *cfg)
{
    const char *tok = cfg->data.tokenizer[0] ? cfg->data.tokenizer : cfg->model.name_or_path;
    return (zt_sft_prep_t){.tokenizer = tok, .format = cfg->data.format, .template_name = cfg->data.template_name,
                           .cutoff_len = cfg->data.cutoff_len, .train_on_prompt = cfg->data.train_on_prompt,
                           .mask_history = cfg->data.mask_history, .packing = cfg->data.packing,
                           .neat_packing = cfg->data.neat_packing, .max_samples = cfg->data.max_samples,
                           .ranking = cfg->data.ranking};
}

/* data.format != tokens: each input becomes its SFT sample file. */
static int sft_inputs(run_t *r, const char (*in)[ZT_STRLEN], int n, char (*out)[ZT_STRLEN + 64], char *err,
                      size_t errlen)
{
    const zt_sft_prep_t p = sft_options(r->cfg);
    if (!p.tokenizer[0]) /* the same on every rank: the configuration is */
        return zt_err(err, errlen, "data.format = %s needs data.tokenizer (or model.name_or_path)", p.format);
    for (int i = 0; i < n; i++) {
        const char *one[1] = {in[i]};
        if (sft_cache(r, &p, one, 1, in[i], in[i], out[i], sizeof out[i], err, errlen)) return -1;
    }
    return 0;
}

/* LLaMA-Factory's num_samples draws, in the order it loads the datasets (data.dataset's,
 * then data.eval_dataset's), all from numpy's one global state: (records, num_samples) of
 * each, and before[l][i], how many come before entry i of list l. */
typedef struct {
    size_t pairs[2 * 2 * ZT_MAX_FILES];
    int before[2][ZT_MAX_FILES];
} draws_t;

/* data.dataset / data.eval_dataset: each dataset_info.json entry becomes one SFT sample
 * file (a directory's files together, as LLaMA-Factory loads them as one dataset). */
static int sft_datasets(run_t *r, const zt_datasets_t *ds, const draws_t *dr, const int *before,
                        char (*out)[ZT_STRLEN + 64], char *err, size_t errlen)
{
    zt_sft_prep_t p = sft_options(r->cfg);
    for (int i = 0; i < ds->n; i++) {
        const zt_dataset_entry_t *e = &ds->v[i];
        char what[ZT_STRLEN + 64];
        snprintf(what, sizeof what, "dataset %s (%s)", e->name, e->base);
        p.format = e->columns.format == ZT_SFT_ALPACA ? "alpaca" : "sharegpt";
        p.columns = &e->columns;
        p.one_dataset = 1;
        /* LLaMA-Factory's set_seed(seed) seeds numpy before the datasets load */
        p.num_samples = e->num_samples;
        p.num_samples_seed = r->cfg->train.seed;
        p.prior_draws = dr->pairs;
        p.nprior = before[i];
        if (sft_cache(r, &p, (const char *const *)e->files, e->nfiles, e->base, what, out[i], sizeof out[i], err,
                      errlen))
            return -1;
    }
    return 0;
}

/* Both lists of dataset_info.json entries, read by every rank before any is made, and the
 * sizes of those with num_samples. */
static int load_datasets(run_t *r, zt_datasets_t ds[2], draws_t *dr, char *err, size_t errlen)
{
    const zt_config_t *cfg = r->cfg;
    const char *names[2] = {cfg->data.dataset, cfg->data.eval_dataset};
    int rc = sft_options(cfg).tokenizer[0] ? 0 : zt_err(err, errlen, "data.dataset needs data.tokenizer (or "
                                                                     "model.name_or_path)");
    memset(ds, 0, 2 * sizeof *ds);
    for (int l = 0; rc == 0 && l < 2; l++)
        rc = zt_datasets_load(cfg->data.dataset_dir, names[l], &ds[l], err, errlen);
    int nd = 0;
    for (int l = 0; rc == 0 && l < 2; l++) {
        if (ds[l].n > ZT_MAX_FILES) rc = zt_err(err, errlen, "%s: more than %d datasets", names[l], ZT_MAX_FILES);
        for (int i = 0; rc == 0 && i < ds[l].n; i++) {
            const zt_dataset_entry_t *e = &ds[l].v[i];
            dr->before[l][i] = nd;
            if (!e->num_samples) continue;
            rc = zt_sft_count_records((const char *const *)e->files, e->nfiles, &dr->pairs[2 * nd], err, errlen);
            dr->pairs[2 * nd++ + 1] = (size_t)e->num_samples;
        }
    }
    return zt_agree_error(r->comm, rc, err, errlen);
}

int zt_tr_open_data(run_t *r, char *err, size_t errlen)
{
    const zt_config_t *cfg = r->cfg;
    const char *files[ZT_MAX_FILES];
    static char sft[2][ZT_MAX_FILES][ZT_STRLEN + 64];
    const int from_info = cfg->data.dataset[0] != 0, is_sft = from_info || strcmp(cfg->data.format, "tokens") != 0;
    int ntrain = cfg->data.n_train_files, nval = cfg->data.n_val_files;
    if (from_info) {
        zt_datasets_t ds[2];
        static draws_t dr;
        int rc = load_datasets(r, ds, &dr, err, errlen);
        if (rc == 0)
            rc = sft_datasets(r, &ds[0], &dr, dr.before[0], sft[0], err, errlen) ||
                 sft_datasets(r, &ds[1], &dr, dr.before[1], sft[1], err, errlen);
        ntrain = ds[0].n, nval = ds[1].n;
        zt_datasets_free(&ds[0]);
        zt_datasets_free(&ds[1]);
        if (rc) return -1;
    } else if (is_sft && (sft_inputs(r, cfg->data.train_files, cfg->data.n_train_files, sft[0], err, errlen) != 0 ||
                          sft_inputs(r, cfg->data.val_files, cfg->data.n_val_files, sft[1], err, errlen) != 0)) {
        return -1;
    }
    for (int i = 0; i < ntrain; i++) files[i] = is_sft ? sft[0][i] : cfg->data.train_files[i];
    /* train.stage = dpo: instruction data must be preference pairs (a pair's halves read
     * together: zt_data_open_pairs refuses any other file); token files give consecutive
     * rows 2i, 2i + 1 as chosen and rejected, every token with a loss */
    if (is_sft && cfg->train.stage == ZT_STAGE_DPO)
        r->train = zt_data_open_pairs(files, ntrain, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
    else
        r->train = zt_data_open(files, ntrain, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
    if (!r->train) return -1;
    if (nval > 0) {
        for (int i = 0; i < nval; i++) files[i] = is_sft ? sft[1][i] : cfg->data.val_files[i];
        r->val = zt_data_open(files, nval, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
        if (!r->val) return -1;
    }
    return 0;
}
