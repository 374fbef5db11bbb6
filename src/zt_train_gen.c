/* zt_train_gen.c — generation on the training run's model: the logits callbacks that
 * zt_sample.c (train.sample_tokens) and zt_generate.c (--generate, generate.at_eval) call,
 * the forward they run (through the pipeline's stages, under tp and sp), and the KV cache
 * kept between calls. The samplers know no model and the model knows no mesh; this file
 * joins them through the run's engine, so the cache's state stays out of the loop. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_log.h"
#include "zt_sample.h"
#include "zt_tokenizer.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

/* Prompts generated at once: at most T = data.seq_len, as their new tokens are one row */
int zt_tr_gen_batch_of(int batch, int T) { return ZT_MAX(1, ZT_MIN(batch, T)); }

/* Sequences generation's KV cache holds for `batch` prompts at once: one each and a spare
 * (batch_logits), or 0 where there is no cache (generate.use_cache off, sequence
 * parallelism, tp_sequence_parallel) */
int zt_tr_kv_sequences(const zt_config_t *cfg, int sp, int tp_seq, int batch)
{
    if (!cfg->generate.use_cache || sp > 1 || tp_seq) return 0;
    return batch > 1 ? batch + 1 : 1;
}

/* Generation's forward of one batch (B, T) under a pipeline: the stages in order, each on
 * its rank, the residual stream passed from stage to stage (the KV cache of a block is
 * on the rank whose stage holds it); at pp 1 forward_blocks. Returns the head's unit
 * (zt_params_head_unit) gathered on the last stage's rank, which runs the head
 * (gen_last_stage) and releases it, NULL elsewhere. */
static const float *gen_forward(run_t *r, const int32_t *inp, const int32_t *pos, int B, int T)
{
    if (r->plan.pp == 1) return zt_tr_forward_blocks(r, inp, NULL, NULL, pos, B, T);
    zt_comm_t *c = r->comm;
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_param_table_t *t = r->table;
    const int L = t->dims.L, S = r->steps.stages, me = c->pp.rank;
    const zt_model_dims_t *d = &r->ltable->dims;
    const size_t n = (size_t)B * T / (d->tp_seq ? (size_t)d->tp_size : 1) * (size_t)d->C;
    zt_model_set_batch(m, inp, NULL, B, T);
    if (pos) zt_model_set_segments(m, NULL, pos);
    /* the embedding's unit on the first stage's rank, the head's (the root again when tied)
     * on the last's: each gathered where it runs, the head's kept for the caller */
    const int head = zt_params_head_unit(t), last = zt_schedule_stage_rank(&r->steps, S - 1) == me;
    const float *root = NULL;
    for (int st = me; st < S; st += r->plan.pp) {
        const int first = r->plan.stage_first[st], end = r->plan.stage_first[st + 1];
        zt_request_t q;
        if (first > 0) {
            zt_irecv(c, &c->pp, zt_model_residual(m, first - 1), (st - 1) % r->plan.pp, st, n, ZT_F32, &q);
            zt_wait(c, &q);
        }
        if (first == 0) {
            zt_model_forward_embed(m, zt_shard_params(s, t->root_unit));
            zt_shard_release(s, t->root_unit);
        }
        zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 1);
        if (st < S - 1) {
            zt_isend(c, &c->pp, zt_model_residual(m, end - 1), (st + 1) % r->plan.pp, st + 1, n, ZT_F32, &q);
            zt_wait(c, &q);
        }
    }
    if (last) root = zt_shard_params(s, head);
    return root;
}

/* whether this rank runs the head in generation: the last stage's (every rank at pp 1) */
static int gen_last_stage(const run_t *r)
{
    return zt_schedule_stage_rank(&r->steps, r->steps.stages - 1) == r->comm->pp.rank;
}

/* a generated row's logits (V), from the last stage's rank to the pipeline's others */
static void gen_share_logits(run_t *r, float *logits)
{
    if (r->plan.pp > 1)
        zt_bcast(r->comm, &r->comm->pp, logits, (size_t)r->table->dims.V, ZT_F32,
                 zt_schedule_stage_rank(&r->steps, r->steps.stages - 1));
}

/* the KV cache's slot holds tokens[0, n - 1): a forward of the last token alone continues it */
static int extends_cached(const run_t *r, int slot, const int32_t *tokens, int n)
{
    const int k = r->kv_n[slot];
    return n == k + 1 && !memcmp(tokens, r->kv_tok + (size_t)slot * r->T, (size_t)k * sizeof *tokens);
}

/* The logits of the last of n tokens of one sequence (KV cache slot `slot`) into logits
 * (V) over units the shard engine gathers. Every rank of the model's tp x sp group calls
 * it with the same tokens; logits NULL: a rank that needs none. Under sequence
 * parallelism or tp_sequence_parallel the tokens are padded at the end to whole shares
 * (attention is causal: what follows position n - 1 leaves its logits alone), each rank
 * runs its chunk, the ranks that hold position n - 1 run the head on that row alone, and
 * the other sp ranks get its logits by broadcast. With the KV cache (generation_begin) a
 * call that adds one token to the slot's tokens runs that token alone. */
static void seq_logits(run_t *r, int slot, const int32_t *tokens, int n, float *logits)
{
    zt_watchdog_mark("generation", -1, r->step);
    const zt_model_dims_t *d = &r->ltable->dims;
    const int sp = r->comm->mesh_sp, q = r->plan.gen_quantum;
    const int np = (n + q - 1) / q * q, Tl = np / sp;
    const int32_t *mine = tokens;
    int owner = 0, t = n - 1;
    if (q > 1) {
        int32_t *row = r->row_tmp, *chunk = r->row_tmp + r->T; // (T) padded, (T / sp) this rank's
        memcpy(row, tokens, (size_t)n * sizeof *row);
        for (int k = n; k < np; k++) row[k] = tokens[n - 1];
        mine = row;
        if (sp > 1) {
            zt_tr_sp_chunk(r, row, np, 0, 1, chunk);
            mine = chunk;
            if (d->sp_ring) {
                /* chunk k of 2 sp holds position n - 1: rank k's first half, or the second
                 * half of the rank the chunk rule (its own inverse) gives */
                const int c = Tl / 2, k = (n - 1) / c, h = k >= sp;
                owner = zt_model_ring_chunk(sp, k, h);
                t = h * c + (n - 1) % c;
            } else {
                owner = (n - 1) / Tl;
                t = (n - 1) % Tl;
            }
        }
    }
    /* the KV cache (never with q > 1): a sequence that extends the cached one by a token
     * runs that token alone at its position; any other starts the cache again */
    int past = 0;
    if (r->kv_on) {
        int32_t *held = r->kv_tok + (size_t)slot * r->T;
        if (extends_cached(r, slot, tokens, n)) past = r->kv_n[slot];
        memcpy(held + past, tokens + past, (size_t)(n - past) * sizeof *tokens);
        for (int k = past; k < n; k++) r->kv_pos[k - past] = k;
        r->kv_n[slot] = n;
        zt_model_kv_seq(r->model, slot, past);
        mine = tokens + past;
        t = n - past - 1;
    }
    const float *root = gen_forward(r, mine, r->kv_on ? r->kv_pos : NULL, 1, q > 1 ? Tl : n - past);
    /* under tp the row is gathered from every tp rank, under sp and pp broadcast: all take part */
    if (!logits && (r->comm->mesh_tp > 1 || sp > 1 || r->plan.pp > 1)) logits = r->tp_logits;
    if (gen_last_stage(r)) {
        if (r->comm->sp.rank == owner) {
            zt_model_forward_head_row(r->model, root, 0, t);
            if (logits) zt_model_logits_row(r->model, 0, t, logits);
        }
        if (sp > 1) zt_bcast(r->comm, &r->comm->sp, logits, (size_t)r->table->dims.V, ZT_F32, owner);
    }
    if (root) zt_shard_release(r->shard, zt_params_head_unit(r->table));
    gen_share_logits(r, logits);
}

/* zt_sample_logits_fn: one sequence, the cache's first slot */
static void last_logits(void *arg, const int32_t *tokens, int n, float *logits)
{
    seq_logits(arg, 0, tokens, n, logits);
}

/* Batched generation (zt_generate_logits_fn): the logits (G, V) of the last tokens of G
 * sequences; n[b] = 0: row b has nothing to run. Without the cache each row runs as
 * one sequence (a row with nothing runs one token, so that every rank runs as many
 * forwards). With it, a row that is not its slot's cached tokens plus one runs whole
 * into its slot, and then the rows that add a token to theirs run those tokens as one
 * batch (1, rows), each attending to its own cache (zt_model_kv_rows): every weight is
 * read once for all of them. The data-parallel ranks agree how many whole runs and
 * whether a batch follow, so that every forward (and the gathers in it) is the same on
 * all; a rank with fewer runs one token into the spare slot. */
void zt_tr_batch_logits(void *arg, int G, const int32_t *const *tokens, const int *n, float *logits)
{
    run_t *r = arg;
    const size_t V = (size_t)r->table->dims.V;
    const int32_t none = 0;
    if (!r->kv_on || r->kv_nseq < 2) {
        for (int b = 0; b < G; b++) seq_logits(r, 0, n[b] ? tokens[b] : &none, n[b] ? n[b] : 1, logits + b * V);
        return;
    }
    if (G > r->kv_nseq - 1) zt_fatal("generation: %d sequences at once, the KV cache holds %d", G, r->kv_nseq - 1);
    const int spare = r->kv_nseq - 1;
    int whole = 0, add = 0;
    for (int b = 0; b < G; b++) {
        if (!n[b]) continue;
        if (extends_cached(r, b, tokens[b], n[b])) add++;
        else whole++;
    }
    zt_group_t *dg = &r->comm->data;
    const int whole_all = (int)zt_max_double(r->comm, dg, whole), add_any = zt_max_double(r->comm, dg, add) > 0;
    for (int b = 0; b < G; b++)
        if (n[b] && !extends_cached(r, b, tokens[b], n[b])) seq_logits(r, b, tokens[b], n[b], logits + b * V);
    for (int k = whole; k < whole_all; k++) seq_logits(r, spare, &none, 1, NULL);
    if (!add_any) return;
    /* one token per extended row, at its position, into its slot */
    int32_t *inp = r->kv_inp;
    int nd = 0;
    for (int b = 0; b < G; b++) {
        if (!n[b] || r->kv_n[b] != n[b] - 1) continue; /* a whole run just made kv_n[b] = n[b] */
        inp[nd] = tokens[b][n[b] - 1];
        r->kv_pos[nd] = r->kv_past[nd] = n[b] - 1;
        r->kv_slot[nd++] = b;
        r->kv_tok[(size_t)b * r->T + n[b] - 1] = tokens[b][n[b] - 1];
        r->kv_n[b] = n[b];
    }
    if (!nd) inp[nd] = 0, r->kv_pos[nd] = r->kv_past[nd] = 0, r->kv_slot[nd++] = spare;
    zt_watchdog_mark("generation", -1, r->step);
    zt_model_kv_rows(r->model, nd, r->kv_slot, r->kv_past);
    const float *root = gen_forward(r, inp, r->kv_pos, 1, nd);
    const int hr = zt_model_head_rows_kept(r->model);
    for (int i0 = 0; i0 < nd && gen_last_stage(r); i0 += hr) {
        const int rows = ZT_MIN(hr, nd - i0);
        zt_model_forward_head_rows(r->model, root, 0, i0, rows);
        for (int i = i0; i < i0 + rows; i++)
            if (r->kv_slot[i] != spare) zt_model_logits_row(r->model, 0, i, logits + (size_t)r->kv_slot[i] * V);
    }
    if (root) zt_shard_release(r->shard, zt_params_head_unit(r->table));
    for (int i = 0; i < nd; i++)
        if (r->kv_slot[i] != spare) gen_share_logits(r, logits + (size_t)r->kv_slot[i] * V);
}

/* Around generation: the shard engine's inference mode, and the KV cache where it
 * applies (without sequence parallelism or tp_sequence_parallel) for `batch` sequences
 * at once (at most data.seq_len: the batch of their new tokens is one row) */
void zt_tr_generation_begin(run_t *r, int batch)
{
    zt_shard_begin_inference(r->shard);
    r->gen_batch = zt_tr_gen_batch_of(batch, r->T);
    r->kv_nseq = zt_tr_kv_sequences(r->cfg, r->comm->mesh_sp, r->ltable->dims.tp_seq, r->gen_batch);
    r->kv_on = r->kv_nseq > 0;
    if (!r->kv_on) return;
    zt_model_kv_cache(r->model, r->kv_nseq);
    r->kv_tok = zt_malloc((size_t)r->kv_nseq * r->T * sizeof *r->kv_tok);
    r->kv_pos = zt_malloc((size_t)r->T * sizeof *r->kv_pos);
    r->kv_n = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_n);
    r->kv_slot = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_slot);
    r->kv_past = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_past);
    r->kv_inp = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_inp);
}

void zt_tr_generation_end(run_t *r)
{
    if (r->kv_on) {
        zt_model_kv_cache(r->model, 0);
        free(r->kv_tok);
        free(r->kv_pos);
        free(r->kv_n);
        free(r->kv_slot);
        free(r->kv_past);
        free(r->kv_inp);
        r->kv_tok = r->kv_pos = r->kv_inp = NULL;
        r->kv_n = r->kv_slot = r->kv_past = NULL;
        r->kv_on = 0;
        r->kv_nseq = 0;
    }
    zt_shard_end_inference(r->shard);
}

void zt_tr_generate_sample(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    if (cfg->train.sample_tokens <= 0) return;
    const int q = r->plan.gen_quantum;
    if (r->T % q) {
        zt_log("sample: skipped (data.seq_len %d does not split into whole shares of %d tokens for the mesh)", r->T,
               q);
        return;
    }
    zt_tokenizer_t *tok = zt_sample_tokenizer(zt_data_tokenizer(r->train), cfg->data.tokenizer,
                                              cfg->data.vocab_file, cfg->data.merges_file, cfg->model.name_or_path);
    const zt_sample_opts_t o = {
        .tokens = cfg->train.sample_tokens, .context = r->T, .vocab_size = cfg->model.vocab_size,
        .temperature = ZT_SAMPLE_TEMPERATURE, .seed = (uint64_t)cfg->train.seed,
        .prompt = cfg->train.sample_prompt, .eot = zt_data_eot_token(r->train),
    };
    zt_sample_t smp;
    zt_tr_generation_begin(r, 1);
    zt_sample_generate(&o, tok, last_logits, r, r->comm, &smp);
    zt_tr_generation_end(r);
    if (r->rank == 0) zt_sample_print(&o, tok, &smp, stdout);
    zt_sample_free(&smp);
    zt_tokenizer_close(tok);
}
