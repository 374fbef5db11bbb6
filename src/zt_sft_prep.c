/* zt_sft_prep.c — instruction JSON files to one SFT sample file: read, template,
 * tokenize, mask, write. Shared by zt-prep-data and the trainer. */
#include "zt_sft.h"

#include "zt_comm.h"
#include "zt_common.h"
#include "zt_data.h"
#include "zt_np_random.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }

/* The world's verdict: the lowest failing rank's message on every rank (one process: its own). */
static int agree(zt_comm_t *comm, int rc, char *err, size_t errlen)
{
    return comm ? zt_agree_error(comm, rc, err, errlen) : rc;
}

/* The error one process would have met first, on every rank. key orders errors as the
 * serial reading does, file by file: 2k for file k unreadable or rejected whole (a JSON
 * array's syntax, no records), 2k + 1 for its first bad record; a record's rank is the
 * lowest holding that key, and ranks hold records in order. INT64_MAX: no error. */
static int agree_first(zt_comm_t *comm, int64_t key, char *err, size_t errlen)
{
    int64_t first = key;
    if (comm) zt_allreduce(comm, &comm->world, &key, &first, 1, ZT_I64, ZT_MIN);
    if (first == INT64_MAX) return 0;
    return agree(comm, key == first ? -1 : 0, err, errlen) ? -1 : 0;
}

typedef struct {
    char **text;
    size_t *len;
    int *mapped;
    zt_sft_index_t *ix;
    size_t *first; /* (ninputs + 1) global index of each file's first record */
} inputs_t;

/* Input k's bytes: mapped where it is a regular file, so that the ranks of a node share
 * the page cache rather than each holding a copy; read otherwise (a pipe, an empty file). */
static int input_open(inputs_t *in, int k, const char *path, char *err, size_t errlen)
{
    struct stat st;
    const int fd = open(path, O_RDONLY);
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            close(fd);
            in->text[k] = p, in->len[k] = (size_t)st.st_size, in->mapped[k] = 1;
            return 0;
        }
    }
    if (fd >= 0) close(fd);
    in->text[k] = zt_read_file(path, &in->len[k], err, errlen);
    return in->text[k] ? 0 : -1;
}

static void inputs_free(inputs_t *in, int n)
{
    for (int k = 0; k < n; k++) {
        if (in->mapped[k]) munmap(in->text[k], in->len[k]);
        else free(in->text[k]);
        zt_sft_index_free(&in->ix[k]);
    }
    free(in->text);
    free(in->len);
    free(in->mapped);
    free(in->ix);
    free(in->first);
}

/* LLaMA-Factory's num_samples (data/loader.py): the records np.random.permutation and
 * np.random.choice draw from the dataset's (all files') records, from numpy's global state
 * as transformers.set_seed(seed) leaves it, become in's one input: their JSON texts in the
 * drawn order as JSON Lines (a record's line breaks are white space, blanked). */
static void select_records(inputs_t *in, int n, const zt_sft_prep_t *p)
{
    const size_t N = in->first[n], k = (size_t)p->num_samples;
    size_t *sel = zt_malloc(k * sizeof *sel), bytes = 0;
    zt_np_random_t rng;
    zt_np_seed(&rng, (uint32_t)p->num_samples_seed);
    for (int d = 0; d < p->nprior; d++) { /* the draws of the datasets before */
        size_t *skip = zt_malloc((p->prior_draws[2 * d + 1] ? p->prior_draws[2 * d + 1] : 1) * sizeof *skip);
        zt_np_num_samples(&rng, p->prior_draws[2 * d], p->prior_draws[2 * d + 1], skip);
        free(skip);
    }
    zt_np_num_samples(&rng, N, k, sel);
    zt_sft_index_t ix = {.n = k, .off = zt_malloc(k * sizeof(size_t)), .len = zt_malloc(k * sizeof(size_t)),
                         .line = zt_malloc(k * sizeof(size_t)), .array = 0};
    int *file = zt_malloc(k * sizeof *file);
    for (size_t i = 0; i < k; i++) {
        int f = 0;
        while (sel[i] >= in->first[f + 1]) f++;
        file[i] = f;
        sel[i] -= in->first[f];
        bytes += in->ix[f].len[sel[i]] + 1;
    }
    char *text = zt_malloc(bytes ? bytes : 1), *e = text;
    for (size_t i = 0; i < k; i++) {
        const zt_sft_index_t *fx = &in->ix[file[i]];
        ix.off[i] = (size_t)(e - text), ix.len[i] = fx->len[sel[i]], ix.line[i] = i + 1;
        memcpy(e, in->text[file[i]] + fx->off[sel[i]], ix.len[i]);
        for (size_t j = 0; j < ix.len[i]; j++)
            if (e[j] == '\n' || e[j] == '\r') e[j] = ' ';
        e += ix.len[i];
        *e++ = '\n';
    }
    inputs_free(in, n);
    *in = (inputs_t){zt_calloc(1, sizeof *in->text), zt_calloc(1, sizeof *in->len), zt_calloc(1, sizeof *in->mapped),
                     zt_calloc(1, sizeof *in->ix), zt_calloc(2, sizeof *in->first)};
    in->text[0] = text, in->len[0] = bytes, in->ix[0] = ix, in->first[1] = k;
    free(sel);
    free(file);
}

/* Records [a, b) of the concatenated files, converted; key as agree_first's. */
static int64_t parse_share(const inputs_t *in, const char *const *inputs, int nfiles, size_t a, size_t b,
                           const zt_sft_columns_t *cols, zt_sft_records_t *all, char *err, size_t errlen)
{
    for (int k = 0; k < nfiles; k++) {
        const size_t lo = ZT_MAX(a, in->first[k]), hi = ZT_MIN(b, in->first[k + 1]);
        if (lo >= hi) continue;
        zt_sft_records_t r;
        const int rc = zt_sft_parse_range(inputs[k], in->text[k], in->len[k], &in->ix[k], lo - in->first[k],
                                          hi - in->first[k], cols, &r, err, errlen);
        if (rc) return 2 * (int64_t)k + (rc == ZT_SFT_SYNTAX ? 0 : 1);
        all->rec = realloc(all->rec, (all->n + r.n) * sizeof *all->rec);
        if (!all->rec) zt_fatal("out of memory");
        memcpy(all->rec + all->n, r.rec, r.n * sizeof *r.rec);
        all->n += r.n;
        free(r.rec);
    }
    return INT64_MAX;
}

/* Every rank's samples in rank order on rank 0 (offsets rebased; with neat packing the
 * segment ids too); counts[r] = rank r's tokens, samples, dropped, loss tokens, known
 * everywhere. */
static int gather_samples(zt_comm_t *comm, zt_sft_samples_t *mine, int neat, int64_t *counts,
                          zt_sft_samples_t *all, char *err, size_t errlen)
{
    int64_t loss = 0, c[4] = {(int64_t)mine->input_ids.n, (int64_t)mine->nsamples, (int64_t)mine->dropped, 0};
    for (size_t i = 0; i < mine->labels.n; i++) loss += mine->labels.v[i] != -100;
    c[3] = loss;
    const int W = comm ? comm->world.size : 1, rank = comm ? comm->world.rank : 0;
    if (comm) zt_allgather(comm, &comm->world, c, counts, 4, ZT_I64);
    else memcpy(counts, c, sizeof c);
    int64_t tokens = 0, samples = 0;
    for (int r = 0; r < W; r++) tokens += counts[4 * r], samples += counts[4 * r + 1];
    if (tokens > INT32_MAX || samples > INT32_MAX) /* MPI's counts and displacements are int */
        return zt_err(err, errlen, "%lld tokens in %lld samples: more than one SFT file can gather (2^31)",
                      (long long)tokens, (long long)samples);
    if (!comm) {
        *all = *mine;
        memset(mine, 0, sizeof *mine);
        if (!all->offsets) all->offsets = zt_calloc(1, sizeof *all->offsets); /* no samples: /sample_offsets [0] */
        return 0;
    }
    int *cn = zt_calloc((size_t)W, sizeof *cn), *dp = zt_calloc((size_t)W, sizeof *dp);
    int *sn = zt_calloc((size_t)W, sizeof *sn), *sp = zt_calloc((size_t)W, sizeof *sp);
    for (int r = 0; r < W; r++) {
        cn[r] = (int)counts[4 * r];
        sn[r] = (int)counts[4 * r + 1];
        if (r) dp[r] = dp[r - 1] + cn[r - 1], sp[r] = sp[r - 1] + sn[r - 1];
    }
    memset(all, 0, sizeof *all);
    if (rank == 0) {
        all->input_ids.v = zt_malloc((size_t)(tokens ? tokens : 1) * sizeof(int32_t));
        all->labels.v = zt_malloc((size_t)(tokens ? tokens : 1) * sizeof(int32_t));
        all->input_ids.n = all->labels.n = (size_t)tokens;
        all->input_ids.cap = all->labels.cap = (size_t)(tokens ? tokens : 1);
        all->offsets = zt_calloc((size_t)samples + 1, sizeof *all->offsets);
        all->nsamples = (size_t)samples;
    }
    zt_gatherv(comm, &comm->world, mine->input_ids.v, all->input_ids.v, cn, dp, ZT_I32, 0);
    zt_gatherv(comm, &comm->world, mine->labels.v, all->labels.v, cn, dp, ZT_I32, 0);
    if (neat) { /* the segment ids count within a row, so they need no rebasing */
        if (rank == 0) {
            all->segment_ids.v = zt_malloc((size_t)(tokens ? tokens : 1) * sizeof(int32_t));
            all->segment_ids.n = (size_t)tokens, all->segment_ids.cap = (size_t)(tokens ? tokens : 1);
        }
        zt_gatherv(comm, &comm->world, mine->segment_ids.v, all->segment_ids.v, cn, dp, ZT_I32, 0);
    }
    /* each rank's sample ends, its own offsets[1..], land at all->offsets[1 + its first sample] */
    zt_gatherv(comm, &comm->world, mine->nsamples ? mine->offsets + 1 : NULL, rank == 0 ? all->offsets + 1 : NULL,
               sn, sp, ZT_I64, 0);
    for (int r = 0; rank == 0 && r < W; r++)
        for (int i = 0; i < sn[r]; i++) all->offsets[1 + sp[r] + i] += dp[r];
    free(cn);
    free(dp);
    free(sn);
    free(sp);
    return 0;
}

int zt_sft_count_records(const char *const *inputs, int ninputs, size_t *count, char *err, size_t errlen)
{
    inputs_t in = {zt_calloc((size_t)ninputs, sizeof *in.text), zt_calloc((size_t)ninputs, sizeof *in.len),
                   zt_calloc((size_t)ninputs, sizeof *in.mapped), zt_calloc((size_t)ninputs, sizeof *in.ix),
                   zt_calloc((size_t)ninputs + 1, sizeof *in.first)};
    int rc = 0;
    *count = 0;
    for (int k = 0; rc == 0 && k < ninputs; k++) {
        rc = input_open(&in, k, inputs[k], err, errlen) ||
             zt_sft_index(inputs[k], in.text[k], in.len[k], &in.ix[k], err, errlen);
        *count += in.ix[k].n;
    }
    inputs_free(&in, ninputs);
    return rc ? -1 : 0;
}

int zt_sft_prep(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *out_path,
                zt_sft_prep_stats_t *st, char *err, size_t errlen)
{
    return zt_sft_prep_ranks(p, inputs, ninputs, out_path, NULL, st, err, errlen);
}

int zt_sft_prep_ranks(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *out_path,
                      zt_comm_t *comm, zt_sft_prep_stats_t *st, char *err, size_t errlen)
{
    const double t0 = now();
    const int rank = comm ? comm->world.rank : 0, W = comm ? comm->world.size : 1;
    zt_sft_prep_stats_t s = {0};
    zt_sft_opts_t o = {0};
    zt_tokenizer_t *tok = NULL;
    int rc = 0;
    const zt_sft_columns_t *cols = p->columns ? p->columns : zt_sft_columns(zt_sft_format(p->format), p->ranking);
    if (!cols) rc = zt_err(err, errlen, "data format '%s': expected alpaca, sharegpt or messages", p->format);
    else if (!(o.tpl = zt_template_find(p->template_name)))
        rc = zt_err(err, errlen, "template '%s': expected one of %s", p->template_name ? p->template_name : "",
                    zt_template_names());
    else if (!p->tokenizer || !p->tokenizer[0])
        rc = zt_err(err, errlen, "SFT data needs a tokenizer (a model directory or tokenizer.json)");
    else if (ninputs < 1) rc = zt_err(err, errlen, "no input JSON files");
    else if (!(tok = zt_tokenizer_load(p->tokenizer, err, errlen))) rc = -1;
    else if (zt_template_special_ids(o.tpl, tok, p->tokenizer, &o.ids, err, errlen) != 0) {
        char tmp[ZT_ERRLEN];
        snprintf(tmp, sizeof tmp, "%s", err);
        rc = zt_err(err, errlen, "%s: template %s: %s", p->tokenizer, o.tpl->name, tmp);
    }
    if (agree(comm, rc, err, errlen)) {
        zt_tokenizer_close(tok);
        return -1;
    }
    o.cutoff_len = p->cutoff_len;
    o.train_on_prompt = p->train_on_prompt;
    o.mask_history = p->mask_history;
    o.packing = p->packing;
    o.neat_packing = p->neat_packing;
    o.ranking = cols ? cols->ranking : 0;

    /* every rank reads and indexes every file (a byte scan); nfiles = those before the
     * first that fails on any rank, whose records are still checked first */
    inputs_t in = {zt_calloc((size_t)ninputs, sizeof *in.text), zt_calloc((size_t)ninputs, sizeof *in.len),
                   zt_calloc((size_t)ninputs, sizeof *in.mapped), zt_calloc((size_t)ninputs, sizeof *in.ix),
                   zt_calloc((size_t)ninputs + 1, sizeof *in.first)};
    char read_err[ZT_ERRLEN] = "";
    int64_t nfiles = ninputs;
    for (int k = 0; k < ninputs && nfiles == ninputs; k++) {
        if (input_open(&in, k, inputs[k], read_err, sizeof read_err) ||
            zt_sft_index(inputs[k], in.text[k], in.len[k], &in.ix[k], read_err, sizeof read_err))
            nfiles = k;
        in.first[k + 1] = in.first[k] + in.ix[k].n;
    }
    int64_t mine = nfiles;
    if (comm) zt_allreduce(comm, &comm->world, &mine, &nfiles, 1, ZT_I64, ZT_MIN);
    /* LLaMA-Factory's num_samples, then max_samples of what it selected */
    char sel_name[4200];
    const char *sel_names[1] = {sel_name};
    if (p->num_samples > 0 && nfiles == ninputs) {
        snprintf(sel_name, sizeof sel_name, "%s%s (num_samples = %ld)", inputs[0], ninputs > 1 ? " ..." : "",
                 p->num_samples);
        select_records(&in, ninputs, p);
        ninputs = 1, nfiles = mine = 1, inputs = sel_names;
    }
    /* LLaMA-Factory selects range(max_samples) of each dataset as loaded, before its
     * preprocessing and the merge's shuffle: the file's first records, or the first of
     * the files together where they are one dataset (a directory's) */
    for (int k = 0; k < nfiles; k++) {
        const size_t before = p->one_dataset ? in.first[k] : 0;
        const size_t left = (size_t)p->max_samples > before ? (size_t)p->max_samples - before : 0;
        if (p->max_samples > 0 && in.ix[k].n > left) {
            s.unread += in.ix[k].n - left;
            in.ix[k].n = left;
        }
        in.first[k + 1] = in.first[k] + in.ix[k].n;
    }

    /* this rank's records: a contiguous share of whole packing groups (one record each
     * without packing), so every group packs as it does in one process */
    const size_t N = in.first[nfiles], group = p->packing || p->neat_packing ? ZT_SFT_PACK_BATCH : 1;
    const size_t ngroups = (N + group - 1) / group;
    const size_t a = ZT_MIN(N, ngroups * (size_t)rank / (size_t)W * group);
    const size_t b = ZT_MIN(N, ngroups * (size_t)(rank + 1) / (size_t)W * group);
    zt_sft_records_t recs = {0};
    double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    int64_t key = parse_share(&in, inputs, (int)nfiles, a, b, cols, &recs, err, errlen);
    if (key == INT64_MAX && mine < ninputs) { /* this rank's unreadable file, after the records before it */
        key = 2 * mine;
        snprintf(err, errlen, "%s", read_err);
    }
    s.share_cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    rc = agree_first(comm, key, err, errlen);
    s.records = N;
    zt_sft_samples_t smp = {0}, all = {0};
    if (rc == 0) {
        c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        rc = zt_sft_build(&o, tok, &recs, &smp, err, errlen);
        s.share_cpu += clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (rc != 0 && smp.failed != SIZE_MAX) { /* name the file and the record */
            const size_t g = a + smp.failed;
            int k = 0;
            while (k + 1 < nfiles && g >= in.first[k + 1]) k++;
            char tmp[ZT_ERRLEN];
            snprintf(tmp, sizeof tmp, "%s", err);
            zt_err(err, errlen, "%s: record %zu: %s", inputs[k], g - in.first[k], tmp);
        }
        rc = agree(comm, rc, err, errlen);
    }
    zt_sft_records_free(&recs);
    inputs_free(&in, ninputs);
    int64_t *counts = zt_calloc(4 * (size_t)W, sizeof *counts);
    if (rc == 0) rc = agree(comm, gather_samples(comm, &smp, p->neat_packing, counts, &all, err, errlen), err, errlen);
    for (int r = 0; rc == 0 && r < W; r++) {
        s.tokens += (size_t)counts[4 * r];
        s.samples += (size_t)counts[4 * r + 1];
        s.dropped += (size_t)counts[4 * r + 2];
        s.loss_tokens += (size_t)counts[4 * r + 3];
    }
    free(counts);
    s.seconds = now() - t0;
    if (rc == 0) {
        if (rank == 0) {
            char tmp[ZT_ERRLEN];
            snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
            if (o.ranking)
                rc = zt_data_write_pairs_h5(tmp, all.input_ids.v, all.labels.v, all.input_ids.n, all.offsets,
                                            all.nsamples, zt_tokenizer_vocab_size(tok), o.ids.pad,
                                            zt_tokenizer_kind(tok), err, errlen);
            else
                rc = zt_data_write_sft_h5(tmp, all.input_ids.v, all.labels.v,
                                          p->neat_packing ? all.segment_ids.v : NULL, all.input_ids.n, all.offsets,
                                          all.nsamples, zt_tokenizer_vocab_size(tok), o.ids.pad,
                                          zt_tokenizer_kind(tok), err, errlen);
            if (rc == 0 && rename(tmp, out_path) != 0)
                rc = zt_err(err, errlen, "%s: rename from %s: %s", out_path, tmp, strerror(errno));
            if (rc != 0) remove(tmp);
        }
        rc = agree(comm, rc, err, errlen);
    }
    s.total_seconds = now() - t0;
    zt_sft_samples_free(&smp);
    zt_sft_samples_free(&all);
    zt_tokenizer_close(tok);
    if (st) *st = s;
    return rc;
}

#define SFT_CACHE_VERSION "ztrain-sft-1" /* bump when the samples' rules change */

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    return fnv(h, s ? s : "", (s ? strlen(s) : 0) + 1); /* the NUL separates fields */
}

/* A file's bytes into the hash; a missing optional file counts as its absence. */
static int fnv_file(uint64_t *h, const char *path, int required, char *err, size_t errlen)
{
    if (!required && access(path, F_OK) != 0) {
        *h = fnv_str(*h, "-");
        return 0;
    }
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return -1;
    *h = fnv(fnv_str(*h, "+"), text, n);
    free(text);
    return 0;
}

/* A mapping into the hash: every column and tag, "-" for one not mapped. */
static uint64_t fnv_columns(uint64_t h, const zt_sft_columns_t *c)
{
    const char *v[] = {c->prompt, c->query, c->response, c->history, c->messages, c->system, c->role_tag,
                       c->content_tag, c->user_tag, c->assistant_tag, c->observation_tag, c->function_tag,
                       c->system_tag};
    h = fnv_str(h, c->format == ZT_SFT_ALPACA ? "alpaca" : "sharegpt");
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = fnv_str(h, v[i] ? v[i] : "-");
    if (c->ranking) /* only when set: the caches of SFT mappings keep their names */
        h = fnv_str(fnv_str(fnv_str(h, "ranking"), c->chosen ? c->chosen : "-"), c->rejected ? c->rejected : "-");
    return h;
}

int zt_sft_cache_path(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *base, char *out,
                      size_t outlen, char *err, size_t errlen)
{
    uint64_t h = 14695981039346656037ULL;
    char buf[64];
    h = fnv_str(h, SFT_CACHE_VERSION);
    h = fnv_str(h, p->format);
    h = fnv_str(h, p->template_name);
    /* neat_packing implies packing (the same rows); it is hashed only when set, so the
     * caches of runs without it keep their names */
    snprintf(buf, sizeof buf, "%d %d %d %d", p->cutoff_len, p->train_on_prompt, p->mask_history,
             p->packing || p->neat_packing);
    h = fnv_str(h, buf);
    if (p->neat_packing) h = fnv_str(h, "neat_packing");
    if (p->ranking) h = fnv_str(h, "ranking"); /* likewise: data.format's preference pairs */
    if (p->max_samples > 0) { /* likewise only when set: caches of whole files keep their names */
        snprintf(buf, sizeof buf, "max_samples %ld", p->max_samples);
        h = fnv_str(h, buf);
    }
    if (p->num_samples > 0) {
        snprintf(buf, sizeof buf, "num_samples %ld seed %ld", p->num_samples, p->num_samples_seed);
        h = fnv_str(h, buf);
        for (int d = 0; d < p->nprior; d++) {
            snprintf(buf, sizeof buf, "after %zu of %zu", p->prior_draws[2 * d + 1], p->prior_draws[2 * d]);
            h = fnv_str(h, buf);
        }
    }
    if (p->columns) { /* likewise: caches of data.format's files keep their names */
        h = fnv_columns(fnv_str(h, p->one_dataset ? "dataset_info one dataset" : "dataset_info"), p->columns);
        snprintf(buf, sizeof buf, "%d files", ninputs);
        h = fnv_str(h, buf);
    }
    for (int i = 0; i < ninputs; i++)
        if (fnv_file(&h, inputs[i], 1, err, errlen) != 0) return -1;
    struct stat st;
    char f[4200];
    if (!p->tokenizer || stat(p->tokenizer, &st) != 0)
        return zt_err(err, errlen, "%s: cannot open the tokenizer", p->tokenizer ? p->tokenizer : "(none)");
    if (S_ISDIR(st.st_mode)) {
        static const char *names[] = {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"};
        for (int i = 0; i < 4; i++) {
            snprintf(f, sizeof f, "%s/%s", p->tokenizer, names[i]);
            if (fnv_file(&h, f, 0, err, errlen) != 0) return -1;
        }
    } else {
        if (fnv_file(&h, p->tokenizer, 1, err, errlen) != 0) return -1;
        snprintf(f, sizeof f, "%s", p->tokenizer);
        char *slash = strrchr(f, '/');
        snprintf(slash ? slash + 1 : f, sizeof f - (size_t)(slash ? slash + 1 - f : 0), "tokenizer_config.json");
        if (fnv_file(&h, f, 0, err, errlen) != 0) return -1;
    }
    if ((size_t)snprintf(out, outlen, "%s.%016llx.sft.h5", base, (unsigned long long)h) >= outlen)
        return zt_err(err, errlen, "%s: path too long for its SFT cache", base);
    return 0;
}
