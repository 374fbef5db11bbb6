/* zt_train_pref.c — preference training's part of the train loop (train.stage = dpo): a
 * DPO micro-step (the reference's sums, the policy's forward, head, loss and backward), LLaMA-
 * Factory's padded rows, the per-sequence sums, the DPO profile's laps, and the table of
 * pref.precompute_ref_log_probs (the reference's sums by pair, shared, saved beside
 * checkpoints). The run's state is zt_train_internal.h's; the losses are zt_pref.c's. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_data.h"
#include "zt_log.h"
#include "zt_model.h"
#include "zt_pref.h"
#include "zt_pref_ref.h"
#include "zt_pref_table.h"
#include "zt_shard.h"
#include "zt_train_internal.h"

/* ---- preference training (train.stage = dpo) ------------------------------------------
 * A micro-batch of B rows holds B/2 pairs: rows 2i (chosen) and 2i + 1 (rejected), each
 * one sequence whose targets >= 0 are its response tokens. Per micro-step: the reference's
 * log-prob sums (LoRA: the same model with the adapters off, forward only, its
 * activations overwritten by the policy's), the policy's forward and head with its sums
 * and logit sums, the loss (zt_pref.h) and its per-sequence weights, then the head's
 * backward with each token's dlogits scaled by its sequence's weight. As LLaMA-Factory's
 * trainer (HF Trainer, DDP), the step's loss is the mean over micro-steps and data ranks
 * of each micro-batch's mean over its pairs; so are the metrics. */

/* LLaMA-Factory's DPO micro-batch, of which logits/chosen and /rejected average every logit
 * (PairwiseDataCollatorWithPadding with pad_to_multiple_of 8): each row its whole sample, the
 * last token too, then the pad token up to the next multiple of 8 past the longest sample of
 * the micro-batch's rows, at positions going on, the attention mask hiding the pad keys from
 * every query (a pad query sees its sample alone, not itself). The rows (inp, tgt: (B, Tm),
 * this rank's tokens, their padding the pad token already) become that: each row's last
 * token (its last target, which the input leaves out: it predicts nothing) at its position,
 * and *seg (B, whole rows: micro-batch mi's of r->pref_seg) 1 on the sample and -1 on its padding (zt_backend.h),
 * NULL where no row has padding (plain causal attention); trimmed in place to the padded
 * length where trim_padding trims. The sample's positions compute what they did (nothing
 * before them changed) and the padding carries no loss, so the loss, the log-probs and the
 * gradients are those of the plain rows. Returns the positions each row runs; *P: LLaMA-
 * Factory's padded length, at most data.seq_len (the positions a row has). */
int zt_tr_pref_lf_rows(run_t *r, int32_t *inp, int32_t *tgt, int mi, int32_t **seg, int *P)
{
    const int B = r->B, Tm = r->Tm, V = r->table->dims.V;
    const size_t N = (size_t)B * Tm;
    /* per row: its last target's position x V + its token, over every sp rank */
    double *last = zt_malloc((size_t)B * sizeof *last);
    for (int b = 0; b < B; b++) last[b] = -1.0;
    for (size_t i = 0; i < N; i++)
        if (tgt[i] >= 0) {
            const int b = zt_tr_token_row(r, i, Tm);
            last[b] = ZT_MAX(last[b], (double)zt_tr_token_pos(r, i, Tm) * V + tgt[i]);
        }
    if (r->comm->mesh_sp > 1) zt_allreduce(r->comm, &r->comm->sp, ZT_IN_PLACE, last, (size_t)B, ZT_F64, ZT_MAX);
    int longest = 0;
    for (int b = 0; b < B; b++) longest = ZT_MAX(longest, last[b] < 0 ? 0 : (int)(last[b] / V) + 2);
    *P = ZT_MIN(r->T, ZT_MAX(8, (longest + 7) / 8 * 8));
    for (size_t i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, i, Tm);
        if (last[b] >= 0 && zt_tr_token_pos(r, i, Tm) == (int)(last[b] / V) + 1) inp[i] = (int32_t)fmod(last[b], V);
    }
    const int T = zt_tr_rows_trimmable(r) ? zt_tr_trim_rows(r, inp, tgt, NULL, *P) : Tm;
    const int Tw = T * ZT_MAX(r->comm->mesh_sp, 1); /* a whole row's positions */
    if (!r->pref_seg) r->pref_seg = r->be->alloc_host((size_t)r->A * B * r->T * sizeof(int32_t));
    int32_t *sg = r->pref_seg + (size_t)mi * B * r->T;
    *seg = NULL;
    for (int b = 0; b < B; b++) {
        const int n = last[b] < 0 ? Tw : (int)(last[b] / V) + 2; /* a row without a target: no padding */
        for (int t = 0; t < Tw; t++) sg[(size_t)b * Tw + t] = t < n ? 1 : -1;
        if (n < Tw) *seg = sg;
    }
    free(last);
    return T;
}

/* Per row of the micro-batch (B rows of T), over its tokens on every sp rank: into sum (B)
 * minus the sum of x's per-token losses (tl) or plus the sum of x (not tl); into len (B,
 * or NULL) its response tokens. */
void zt_tr_row_sums(run_t *r, const float *x, int tl, const int32_t *tgt, int T, double *sum, double *len)
{
    const size_t N = (size_t)r->B * T;
    const int n = len ? 2 * r->B : r->B;
    double *acc = zt_calloc((size_t)n, sizeof *acc);
    for (size_t i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, i, T);
        acc[b] += tl ? -(double)x[i] : (double)x[i];
        if (len) acc[r->B + b] += tgt[i] >= 0;
    }
    if (r->comm->mesh_sp > 1) zt_allreduce(r->comm, &r->comm->sp, ZT_IN_PLACE, acc, (size_t)n, ZT_F64, ZT_SUM);
    memcpy(sum, acc, (size_t)r->B * sizeof *acc);
    if (len) memcpy(len, acc + r->B, (size_t)r->B * sizeof *acc);
    free(acc);
}

/* the time since t[0] (wall) and t[1] (the thread's CPU) into the DPO profile's part k;
 * t := now */
void zt_tr_pref_lap(run_t *r, pref_part_t k, double *t)
{
    const double now = zt_now(), cpu = zt_thread_seconds();
    r->pref_seconds[k] += now - t[0];
    r->pref_cpu[k] += cpu - t[1];
    t[0] = now, t[1] = cpu;
}

/* The reference's log-prob sums of the micro-batch's rows (inp, tgt: (B, T)) into ref (B):
 * the frozen copy (full fine-tuning, pref.ref_model), or LoRA's base: this model without
 * its adapters; forward only (its activations are overwritten by the policy's), its head
 * on the loss-bearing rows with the logits of one chunk at a time. With pref.share_prompt
 * each pair's prompt is computed once and no padding (zt_pref_ref.h), the same sums to
 * rounding; not where the model cannot share rows (sequence parallelism splits a row over
 * ranks, tp's sequence-parallel residual splits the compact tokens over tp ranks:
 * zt_model_can_share_rows), nor under a pipeline, which run every row's positions. */
void zt_tr_pref_reference(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, int T, double *ref,
                           double *now)
{
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[t->root_unit];
    const int share = r->cfg->pref.share_prompt && r->plan.pp <= 1 && zt_model_can_share_rows(r->model);
    zt_pref_share_t sh = {0};
    zt_shard_t *rs = r->ref_shard ? r->ref_shard : r->shard;
    if (r->ref_shard) zt_shard_begin_inference(rs);
    const float *root;
    r->pref_ref_pos[1] += (double)r->B * T;
    if (share) {
        zt_pref_share_make(&sh, inp, tgt, r->B, T);
        r->pref_ref_pos[0] += sh.n;
        zt_model_set_batch(r->model, sh.inp, sh.tgt, sh.B, sh.T);
        zt_model_set_segments(r->model, NULL, sh.pos);
        zt_model_set_shared_rows(r->model, r->B, T, sh.full, sh.own);
        root = zt_tr_forward_set_batch(r, rs, 0);
    } else {
        root = zt_tr_train_forward(r, rs, inp, tgt, seg, NULL, NULL, 0, T);
        r->pref_ref_pos[0] += (double)r->B * T;
    }
    zt_tr_pref_lap(r, PT_REF_BLOCKS, now);
    if (frozen_head) zt_model_pref_head(r->model, root, 1);
    else zt_model_forward_head(r->model, root);
    zt_shard_release(rs, t->root_unit);
    if (r->ref_shard) zt_shard_end_inference(rs);
    if (share) zt_pref_share_sums(&sh, zt_model_token_losses(r->model), r->B, ref);
    else zt_tr_row_sums(r, zt_model_token_losses(r->model), 1, tgt, T, ref, NULL);
    zt_pref_share_free(&sh);
    zt_tr_pref_lap(r, PT_REF_HEAD, now);
}

/* The policy's head after its forward through the blocks of model m (B rows of T of the
 * micro-batch whose targets are tgt): on the head unit's weights hw (its unit hu of
 * r->shard), its per-sequence sums and logit sums, the loss against the reference's row
 * sums ref (B, NULL without a reference) with metrics += the micro-batch's (Tp: its rows'
 * length as LLaMA-Factory pads them, pref_lf_rows), and the head's
 * backward at each sequence's factor (factor: the gradient's share), which leaves dL/d(the
 * last block's output) for the blocks' backward and, with a trained head, its gradients
 * accumulated; the caller readies and releases the unit. *now: the DPO profile's clock.
 * With a frozen head (LoRA) the head runs once (zt_model_pref_head: dL/dxf kept at factor 1
 * until the loss gives each sequence's factor); a trained head (full fine-tuning) runs
 * forward for the sums, then again with the factors (zt_model_train_head), its weight
 * gradient needing each token's dlogits at its factor. */
double zt_tr_pref_policy_head(run_t *r, zt_model_t *m, const float *hw, int hu, const int32_t *tgt, int T, int Tp,
                               const double *ref, float factor, double *metrics, double *now)
{
    const zt_pref_cfg_t *pc = &r->cfg->pref.fn;
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[hu];
    const int B = r->B, np = B / 2, N = B * T;
    double *w = zt_calloc(7 * (size_t)B, sizeof *w);
    double *rf = w, *pol = w + B, *len = w + 2 * B, *lg = w + 3 * B, *cnt = w + 4 * B, *d = w + 5 * B;
    double *c6 = w + 6 * B; /* scratch (B) */
    if (ref) memcpy(rf, ref, (size_t)B * sizeof *rf);
    float *lsum = zt_malloc((size_t)N * sizeof *lsum);
    zt_model_set_logit_sums(m, lsum);
    if (frozen_head) zt_model_pref_head(m, hw, 0);
    else zt_model_forward_head(m, hw);
    zt_tr_row_sums(r, zt_model_token_losses(m), 1, tgt, T, pol, len);
    /* LLaMA-Factory's logits/chosen and /rejected: the mean of every logit of its padded
     * batch (pref_lf_rows: Tp positions a row), on every mesh */
    for (int i = 0; i < N; i++)
        if (zt_tr_token_pos(r, (size_t)i, T) >= Tp) lsum[i] = 0.0f;
    zt_tr_row_sums(r, lsum, 0, tgt, T, lg, NULL);
    zt_tr_pref_lap(r, PT_HEAD, now);
    for (int b = 0; b < B; b++) cnt[b] = (double)Tp * t->dims.V;
    /* rows to pairs: [chosen of each pair | rejected of each pair] per quantity */
    double *q[5] = {pol, rf, len, lg, cnt};
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < np; i++) c6[i] = q[k][2 * i], c6[np + i] = q[k][2 * i + 1];
        memcpy(q[k], c6, (size_t)B * sizeof *c6);
    }
    const int uses_ref = zt_pref_uses_ref(pc->loss);
    const zt_pref_batch_t pb = {np, pol, pol + np, uses_ref ? rf : NULL, uses_ref ? rf + np : NULL, len, len + np,
                                lg, lg + np, cnt, cnt + np};
    double met[ZT_PREF_NMETRICS];
    const double loss = zt_pref_loss(pc, &pb, met, d, d + np);
    for (int k = 0; k < ZT_PREF_NMETRICS; k++) metrics[k] += met[k];
    /* d logp / d logits = -d CE / d logits: each token's factor is minus its sequence's weight */
    float *scale = zt_malloc((size_t)N * sizeof *scale);
    for (int i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, (size_t)i, T);
        scale[i] = (float)(-d[(b % 2) * np + b / 2] * factor);
    }
    zt_tr_pref_lap(r, PT_LOSS, now);
    if (frozen_head) {
        zt_model_pref_head_backward(m, hw, scale);
        zt_tr_pref_lap(r, PT_HEAD, now);
    } else {
        zt_model_set_token_scales(m, scale);
        zt_model_train_head(m, hw, zt_shard_grads(r->shard, hu), 0.0f);
        zt_tr_pref_lap(r, PT_BWD, now);
    }
    free(scale);
    free(lsum);
    free(w);
    return loss;
}

/* ---- pref.precompute_ref_log_probs: the reference's sums by pair (zt_pref_table.h) ----------
 * The step's pairs are the global pairs samples_seen / 2 + p, p < G / 2, in the order the
 * micro-batches take them (micro-step m of data rank d: p = (m dp + d) B / 2 + its pair), so
 * every rank knows every pair's record without a message. A micro-batch whose pairs the table
 * holds runs no reference pass; one with a pair it lacks runs the pass as without the table
 * (the same rows: the same sums, bit for bit), records the new pairs' sums, and the data group
 * sums them after the step (each computed by one rank, zeros elsewhere: the sum is the value),
 * so the table is the same everywhere. A pipeline is refused: its reference forwards are
 * actions of the schedule (zt_tr_build_steps). */

/* The record of global pair g: a pairs file's sample (shuffled or not), or of a token
 * file's rows 2g, 2g + 1 (read in order: check_dpo) the first's half */
static int64_t pref_record(const run_t *r, int64_t g)
{
    const uint64_t seed = (uint64_t)r->cfg->data.seed;
    if (zt_data_is_pairs(r->train)) return zt_data_sample_index(r->train, g, seed, r->cfg->data.shuffle);
    return zt_data_sample_index(r->train, 2 * g, seed, r->cfg->data.shuffle) / 2;
}

/* The table of the training set's pairs, empty, where the key asks for it and the loss reads
 * a reference: 0, or -1 with one line (logged) on every rank */
int zt_tr_pref_table_setup(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    if (cfg->train.stage != ZT_STAGE_DPO || !cfg->pref.precompute_ref || !zt_pref_uses_ref(cfg->pref.fn.loss))
        return 0;
    char err[ZT_ERRLEN] = "";
    const int64_t S = zt_data_num_samples(r->train), n = zt_data_is_pairs(r->train) ? S : S / 2;
    int rc = 0;
    if (r->plan.pp > 1)
        rc = zt_err(err, sizeof err, "pref.precompute_ref_log_probs with parallel.pipeline_parallel_size %d: the "
                                     "reference's forwards are actions of the pipeline's schedule, which has no "
                                     "step without them; use pp 1 or pref.precompute_ref_log_probs = false", r->plan.pp);
    else if (!zt_data_is_pairs(r->train) && S % 2)
        rc = zt_err(err, sizeof err, "pref.precompute_ref_log_probs: the token file's %lld rows make no whole pairs "
                                     "(rows 2i, 2i + 1)", (long long)S);
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        return -1;
    }
    r->pref_table = zt_pref_table_create(n);
    r->pref_rec = zt_malloc((size_t)r->G / 2 * sizeof *r->pref_rec);
    r->pref_new = zt_malloc((size_t)r->G / 2 * 3 * sizeof *r->pref_new);
    zt_log("dpo: pref.precompute_ref_log_probs: the reference's log-probs of the %lld pairs, each computed once "
           "(%.1f KB per rank)", (long long)n, (double)n * (2 * sizeof(double) + 1) / 1e3);
    return 0;
}

/* A table with every pair: the frozen reference copy (full fine-tuning, pref.ref_model) is
 * read no more, so its memory goes back; every rank at once (the table is the same everywhere) */
static void pref_table_release_ref(run_t *r)
{
    if (!r->pref_table || !r->ref_shard || !zt_pref_table_complete(r->pref_table)) return;
    zt_shard_mem_t mem;
    zt_shard_memory(r->ref_shard, &mem);
    zt_shard_free(r->ref_shard);
    zt_param_table_free(r->ref_table);
    r->ref_shard = NULL;
    r->ref_table = NULL;
    char b[32];
    zt_log("dpo: the reference table holds every pair: the frozen reference copy is freed (%s per rank)",
           zt_fmt_bytes((double)(mem.params + mem.host), b, sizeof b));
}

/* Before the step's passes: its pairs' records, and whether the table lacks any of them */
void zt_tr_pref_table_begin_step(run_t *r)
{
    if (!r->pref_table) return;
    const int64_t np = r->G / 2, g0 = r->samples_seen / 2;
    r->pref_step_new = 0;
    for (int64_t p = 0; p < np; p++) {
        double c, j;
        r->pref_rec[p] = pref_record(r, g0 + p);
        if (!zt_pref_table_get(r->pref_table, r->pref_rec[p], &c, &j)) r->pref_step_new = 1;
    }
    if (r->pref_step_new) memset(r->pref_new, 0, (size_t)np * 3 * sizeof *r->pref_new);
}

/* After the step's passes (every rank alike): the sums the data ranks computed, into every
 * rank's table */
void zt_tr_pref_table_end_step(run_t *r)
{
    if (!r->pref_table || !r->pref_step_new) return;
    const size_t np = (size_t)r->G / 2;
    zt_allreduce(r->comm, &r->comm->data, ZT_IN_PLACE, r->pref_new, 3 * np, ZT_F64, ZT_SUM);
    for (size_t p = 0; p < np; p++)
        if (r->pref_new[3 * p + 2] > 0)
            zt_pref_table_put(r->pref_table, r->pref_rec[p], r->pref_new[3 * p], r->pref_new[3 * p + 1]);
    pref_table_release_ref(r);
}

/* The reference's sums of micro-step m's rows (inp, tgt: (B, T), seg: pref_lf_rows') into ref
 * (B): from the table where it holds every pair, else from the reference's pass, each pair the
 * table holds then taking the table's (a pair's reference is its first computation) and the
 * others recorded for the step's exchange */
static void pref_reference_of(run_t *r, int m, const int32_t *inp, const int32_t *tgt, const int32_t *seg, int T,
                              double *ref, double *now)
{
    const int np = r->B / 2;
    const int64_t p0 = ((int64_t)m * r->dp + r->drank) * np;
    int have = 0;
    for (int i = 0; r->pref_table && i < np; i++)
        have += zt_pref_table_get(r->pref_table, r->pref_rec[p0 + i], &ref[2 * i], &ref[2 * i + 1]);
    if (r->pref_table) r->pref_table_micros[1]++;
    if (r->pref_table && have == np) {
        r->pref_table_micros[0]++;
        return;
    }
    zt_tr_pref_reference(r, inp, tgt, seg, T, ref, now);
    /* the sp ranks of a row hold the same sums: one of them adds them to the exchange */
    for (int i = 0; r->pref_table && i < np; i++) {
        double *o = r->pref_new + 3 * (p0 + i);
        if (zt_pref_table_get(r->pref_table, r->pref_rec[p0 + i], &ref[2 * i], &ref[2 * i + 1])) continue;
        if (r->comm->sp.rank == 0) o[0] = ref[2 * i], o[1] = ref[2 * i + 1], o[2] = 1.0;
    }
}

/* pref_table_save's file for the checkpoint of step in dir */
static void pref_table_path(char *buf, size_t len, const char *dir, long step)
{
    snprintf(buf, len, "%s/prefref-%08ld.h5", dir, step);
}

/* Beside the checkpoint of r->step (before it is published: a published checkpoint has its
 * table), written by rank 0: 0, or -1 with err on every rank */
int zt_tr_pref_table_save(run_t *r, char *err, size_t errlen)
{
    if (!r->pref_table) return 0;
    char path[ZT_STRLEN + 32];
    pref_table_path(path, sizeof path, r->cfg->train.output_dir, r->step);
    const int rc = r->rank == 0 ? zt_pref_table_save(r->pref_table, path, err, errlen) : 0;
    return zt_agree_error(r->comm, rc, err, errlen) ? -1 : 0;
}

/* After the checkpoint ckpt (a file or a directory of shards; or the directory holding them)
 * of step was loaded: its table, beside it, read by rank 0 and broadcast; none there (a
 * checkpoint of a run without the key) leaves the table empty, to fill again. 0, or -1 with
 * one line (logged) on every rank. */
int zt_tr_pref_table_resume(run_t *r, const char *ckpt, long step)
{
    zt_pref_table_t *t = r->pref_table;
    if (!t) return 0;
    char dir[ZT_STRLEN], path[ZT_STRLEN + 32], err[ZT_ERRLEN] = "";
    snprintf(dir, sizeof dir, "%s", ckpt);
    const size_t n = strlen(dir);
    const int named = (n > 3 && !strcmp(dir + n - 3, ".h5")) || (n > 7 && !strcmp(dir + n - 7, ".shards"));
    char *slash = strrchr(dir, '/');
    if (named) {
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    pref_table_path(path, sizeof path, dir, step);
    int rc = 0, found = 0;
    if (r->rank == 0 && access(path, F_OK) == 0) {
        found = 1;
        rc = zt_pref_table_load(t, path, err, sizeof err);
    }
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        return -1;
    }
    zt_bcast(r->comm, &r->comm->world, &found, 1, ZT_I32, 0);
    if (!found) {
        zt_log("dpo: no reference table beside the checkpoint (%s): each pair's reference is computed again "
               "the first time it is seen", path);
        return 0;
    }
    zt_bcast(r->comm, &r->comm->world, t->have, (size_t)t->n, ZT_U8, 0);
    zt_bcast(r->comm, &r->comm->world, t->ref, 2 * (size_t)t->n, ZT_F64, 0);
    t->filled = 0;
    for (int64_t i = 0; i < t->n; i++) t->filled += t->have[i];
    zt_log("dpo: reference table %s: %lld of %lld pairs", path, (long long)t->filled, (long long)t->n);
    pref_table_release_ref(r);
    return 0;
}

/* One DPO micro-step (micro-step m of the step) on the micro-batch's rows (inp, tgt: (B, Tm), padded and trimmed in
 * place as LLaMA-Factory pads its batch (pref_lf_rows): a pair's two rows are in it, so both
 * keep every position that carries a loss); factor: the gradient's share (loss scale /
 * (micro-steps x data-parallel replicas)); metrics (ZT_PREF_NMETRICS) += this micro-batch's;
 * the micro-batch's loss; *T the positions run. The reference's pass (or the table's sums:
 * pref_reference_of), the policy's forward, its head and loss (pref_policy_head), the
 * blocks' backward. */
double zt_tr_pref_micro(run_t *r, int m, int32_t *inp, int32_t *tgt, float factor, double *metrics, int *Tout)
{
    const zt_pref_cfg_t *pc = &r->cfg->pref.fn;
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[t->root_unit];
    int32_t *seg; /* LLaMA-Factory's padding (pref_lf_rows) */
    int Tp;       /* its padded length */
    const int T = *Tout = zt_tr_pref_lf_rows(r, inp, tgt, 0, &seg, &Tp);
    double *ref = zt_calloc((size_t)r->B, sizeof *ref);
    double now[2] = {zt_now(), zt_thread_seconds()};
    if (zt_pref_uses_ref(pc->loss)) pref_reference_of(r, m, inp, tgt, seg, T, ref, now);
    const float *root = zt_tr_train_forward(r, r->shard, inp, tgt, seg, NULL, NULL, 1, T);
    zt_tr_pref_lap(r, PT_FWD, now);
    const double loss = zt_tr_pref_policy_head(r, r->model, root, t->root_unit, tgt, T, Tp,
                                         zt_pref_uses_ref(pc->loss) ? ref : NULL, factor, metrics, now);
    zt_tr_backward_from_head(r, frozen_head ? NULL : zt_shard_grads(r->shard, t->root_unit));
    zt_tr_pref_lap(r, PT_BWD, now);
    free(ref);
    return loss;
}
