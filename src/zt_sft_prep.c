/* zt_sft_prep.c — instruction JSON files to one SFT sample file: read, template,
 * tokenize, mask, write. Shared by zt-prep-data and the trainer. */
#include "zt_sft.h"

#include "zt_common.h"
#include "zt_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int zt_sft_prep(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *out_path,
                zt_sft_prep_stats_t *st, char *err, size_t errlen)
{
    zt_sft_prep_stats_t s = {0};
    zt_sft_opts_t o = {0};
    zt_sft_format_t fmt = zt_sft_format(p->format);
    if (!fmt) return zt_err(err, errlen, "data format '%s': expected alpaca, sharegpt or messages", p->format);
    if (!(o.tpl = zt_template_find(p->template_name)))
        return zt_err(err, errlen, "template '%s': expected one of %s", p->template_name ? p->template_name : "",
                      zt_template_names());
    if (!p->tokenizer || !p->tokenizer[0])
        return zt_err(err, errlen, "SFT data needs a tokenizer (a model directory or tokenizer.json)");
    if (ninputs < 1) return zt_err(err, errlen, "no input JSON files");
    o.cutoff_len = p->cutoff_len;
    o.train_on_prompt = p->train_on_prompt;
    o.mask_history = p->mask_history;
    o.packing = p->packing;
    o.neat_packing = p->neat_packing;
    zt_tokenizer_t *tok = zt_tokenizer_load(p->tokenizer, err, errlen);
    if (!tok) return -1;
    int rc = zt_template_special_ids(o.tpl, tok, p->tokenizer, &o.ids, err, errlen);
    if (rc != 0) {
        char tmp[ZT_ERRLEN];
        snprintf(tmp, sizeof tmp, "%s", err);
        zt_err(err, errlen, "%s: template %s: %s", p->tokenizer, o.tpl->name, tmp);
    }
    double t0 = now();
    zt_sft_records_t all = {0};
    for (int k = 0; rc == 0 && k < ninputs; k++) {
        zt_sft_records_t r;
        if ((rc = zt_sft_read(inputs[k], fmt, &r, err, errlen)) != 0) break;
        all.rec = realloc(all.rec, (all.n + r.n) * sizeof *all.rec);
        if (!all.rec) zt_fatal("out of memory");
        memcpy(all.rec + all.n, r.rec, r.n * sizeof *r.rec);
        all.n += r.n;
        free(r.rec);
    }
    zt_sft_samples_t smp = {0};
    if (rc == 0) rc = zt_sft_build(&o, tok, &all, &smp, err, errlen);
    s.seconds = now() - t0;
    s.records = all.n;
    zt_sft_records_free(&all);
    if (rc == 0) {
        s.samples = smp.nsamples;
        s.tokens = smp.input_ids.n;
        s.dropped = smp.dropped;
        for (size_t i = 0; i < smp.labels.n; i++) s.loss_tokens += smp.labels.v[i] != -100;
        char tmp[ZT_ERRLEN];
        snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
        rc = zt_data_write_sft_h5(tmp, smp.input_ids.v, smp.labels.v, p->neat_packing ? smp.segment_ids.v : NULL,
                                  smp.input_ids.n, smp.offsets, smp.nsamples, zt_tokenizer_vocab_size(tok), o.ids.pad,
                                  zt_tokenizer_kind(tok), err, errlen);
        if (rc == 0 && rename(tmp, out_path) != 0)
            rc = zt_err(err, errlen, "%s: rename from %s: %s", out_path, tmp, strerror(errno));
        if (rc != 0) remove(tmp);
    }
    zt_sft_samples_free(&smp);
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

int zt_sft_cache_path(const zt_sft_prep_t *p, const char *input, char *out, size_t outlen, char *err,
                      size_t errlen)
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
    if (fnv_file(&h, input, 1, err, errlen) != 0) return -1;
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
    if ((size_t)snprintf(out, outlen, "%s.%016llx.sft.h5", input, (unsigned long long)h) >= outlen)
        return zt_err(err, errlen, "%s: path too long for its SFT cache", input);
    return 0;
}
