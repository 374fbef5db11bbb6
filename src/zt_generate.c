/* zt_generate.c — prompts in, completions out (zt_generate.h). */
#include "zt_generate.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_sft.h"
#include "zt_template.h"
#include "zt_tokenizer.h"

typedef struct prompt {
    zt_sft_record_t rec;    /* the conversation, the last answer empty */
    char *text;             /* the last user message, for the output */
} prompt_t;

static char *dupstr(const char *s) { return strdup(s ? s : ""); }

/* A record of `nm` messages (user, assistant, ..., user) plus the empty answer */
static void set_record(prompt_t *p, const char *system, const char *const *msgs, int nm)
{
    p->rec.system = dupstr(system);
    p->rec.nmsgs = nm + 1;
    p->rec.msgs = zt_calloc((size_t)nm + 1, sizeof *p->rec.msgs);
    for (int i = 0; i < nm; i++) p->rec.msgs[i] = dupstr(msgs[i]);
    p->rec.msgs[nm] = dupstr("");
    p->text = dupstr(msgs[nm - 1]);
}

/* One JSON Lines record: {"messages": [...]} (OpenAI roles) or alpaca's keys */
static int parse_prompt(const char *file, long line, json_t *j, prompt_t *p, char *err, size_t errlen)
{
    const json_t *m = json_object_get(j, "messages");
    if (json_is_array(m)) {
        const char *system = NULL, *msgs[256];
        int n = 0;
        for (size_t i = 0; i < json_array_size(m); i++) {
            const json_t *e = json_array_get(m, i);
            const char *role = json_string_value(json_object_get(e, "role"));
            const char *content = json_string_value(json_object_get(e, "content"));
            if (!role || !content)
                return zt_err(err, errlen, "%s:%ld: messages[%zu] needs role and content strings", file, line, i);
            if (!strcmp(role, "system") && i == 0) {
                system = content;
                continue;
            }
            const char *want = n % 2 ? "assistant" : "user";
            if (strcmp(role, want) || n == 255)
                return zt_err(err, errlen, "%s:%ld: messages[%zu] is %s, expected %s", file, line, i, role, want);
            msgs[n++] = content;
        }
        if (n % 2 == 0) return zt_err(err, errlen, "%s:%ld: the last message must be the user's", file, line);
        set_record(p, system, msgs, n);
        return 0;
    }
    const char *ins = json_string_value(json_object_get(j, "instruction"));
    if (!ins) return zt_err(err, errlen, "%s:%ld: neither \"messages\" nor \"instruction\"", file, line);
    const char *in = json_string_value(json_object_get(j, "input"));
    char *q = zt_malloc(strlen(ins) + (in ? strlen(in) : 0) + 2);
    sprintf(q, "%s%s%s", ins, in && in[0] ? "\n" : "", in ? in : "");
    const char *msgs[1] = {q};
    set_record(p, json_string_value(json_object_get(j, "system")), msgs, 1);
    free(q);
    return 0;
}

static int read_prompts(const zt_config_t *cfg, prompt_t **out, int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (cfg->generate.prompt[0]) {
        *out = zt_calloc(1, sizeof **out);
        const char *msgs[1] = {cfg->generate.prompt};
        set_record(&(*out)[0], NULL, msgs, 1);
        *n = 1;
        return 0;
    }
    if (!cfg->generate.prompts_file[0])
        return zt_err(err, errlen, "--generate needs generate.prompt or generate.prompts_file");
    size_t len;
    char *text = zt_read_file(cfg->generate.prompts_file, &len, err, errlen);
    if (!text) return -1;
    int cap = 0, rc = 0;
    long line = 0;
    for (char *s = text, *e; !rc && *s; s = e + (*e != 0)) {
        e = strchr(s, '\n');
        if (!e) e = s + strlen(s);
        line++;
        const char c = *e;
        *e = 0;
        const char *t = s;
        while (*t == ' ' || *t == '\t' || *t == '\r') t++;
        if (*t) {
            json_error_t je;
            json_t *j = json_loads(t, 0, &je);
            if (!j) rc = zt_err(err, errlen, "%s:%ld:%d: %s", cfg->generate.prompts_file, line, je.column, je.text);
            if (!rc && *n == cap) {
                cap = cap ? 2 * cap : 16;
                prompt_t *np = realloc(*out, (size_t)cap * sizeof *np);
                if (!np) zt_fatal("out of memory reading %s", cfg->generate.prompts_file);
                *out = np;
            }
            if (!rc) {
                memset(&(*out)[*n], 0, sizeof **out);
                rc = parse_prompt(cfg->generate.prompts_file, line, j, &(*out)[*n], err, errlen);
                if (!rc) (*n)++;
            }
            json_decref(j);
        }
        *e = c;
    }
    free(text);
    if (!rc && !*n) rc = zt_err(err, errlen, "%s: no prompts", cfg->generate.prompts_file);
    return rc;
}

static void free_prompts(prompt_t *p, int n)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < p[i].rec.nmsgs; k++) free(p[i].rec.msgs[k]);
        free(p[i].rec.msgs);
        free(p[i].rec.system);
        free(p[i].text);
    }
    free(p);
}

typedef struct { float logit; int id; } cand_t;

/* most likely first; equal logits by id, so the order is the same everywhere */
static int by_logit(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The next token: argmax (ties to the lowest id), or a draw from softmax(logits / temp)
 * restricted to the top_k most likely and to the smallest set of probability >= top_p */
static int32_t pick(const zt_config_t *cfg, const float *logits, int V, uint64_t *rng, cand_t *c)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (cfg->generate.temperature <= 0) return best;
    const double temp = cfg->generate.temperature;
    for (int v = 0; v < V; v++) c[v] = (cand_t){logits[v], v};
    qsort(c, (size_t)V, sizeof *c, by_logit); /* O(V log V): vocabularies of 10^5 */
    int keep = cfg->generate.top_k > 0 ? ZT_MIN(cfg->generate.top_k, V) : V;
    double sum = 0.0;
    for (int i = 0; i < keep; i++) sum += exp((c[i].logit - logits[best]) / temp);
    double acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += exp((c[i].logit - logits[best]) / temp) / sum;
        if (acc >= cfg->generate.top_p) {
            keep = i + 1;
            sum *= acc;
            break;
        }
    }
    *rng = zt_splitmix64(*rng);
    const double u = (double)(*rng >> 11) / 9007199254740992.0 * sum;
    acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += exp((c[i].logit - logits[best]) / temp);
        if (acc >= u) return c[i].id;
    }
    return c[keep - 1].id;
}

int zt_generate_run(const zt_config_t *cfg, const char *name, int context, int batch, int vocab_size,
                    zt_generate_logits_fn fn, void *arg, zt_comm_t *comm, char *err, size_t errlen)
{
    /* prompts go round the data-parallel positions; the tp, sp and pp ranks of one run it
     * together (same logits, same draws) and the first of them writes it */
    const int rank = comm->dp_rank, world = comm->mesh_dp, writer = comm->tp.rank == 0 && comm->sp.rank == 0 &&
              comm->pp.rank == 0;
    char e[ZT_ERRLEN] = "";
    prompt_t *pr = NULL;
    int np = 0;
    const char *tpath = cfg->data.tokenizer[0] ? cfg->data.tokenizer : cfg->model.name_or_path;
    zt_tokenizer_t *tok = tpath[0] ? zt_tokenizer_load(tpath, e, sizeof e) : zt_tokenizer_byte();
    const zt_template_t *tpl = zt_template_find(cfg->data.template_name[0] ? cfg->data.template_name : "default");
    zt_sft_opts_t o = {.tpl = tpl, .cutoff_len = cfg->data.cutoff_len};
    int rc = tok ? 0 : -1;
    if (!rc && !tpl) rc = zt_err(e, sizeof e, "data.template: unknown \"%s\" (%s)", cfg->data.template_name,
                                 zt_template_names());
    if (!rc) rc = zt_template_special_ids(tpl, tok, tpath[0] ? tpath : NULL, &o.ids, e, sizeof e);
    if (!rc) rc = read_prompts(cfg, &pr, &np, e, sizeof e);
    if (zt_agree_error(comm, rc, e, sizeof e)) {
        free_prompts(pr, np);
        zt_tokenizer_close(tok);
        return zt_err(err, errlen, "%s", e);
    }
    /* the template's stop words end an answer as its eos does */
    int32_t stop[4];
    int nstop = 0;
    if (o.ids.eos >= 0) stop[nstop++] = o.ids.eos;
    for (int i = 0; tpl->stop_words[i] && nstop < 4; i++) {
        const int32_t id = zt_tokenizer_token_id(tok, tpl->stop_words[i], strlen(tpl->stop_words[i]));
        if (id >= 0) stop[nstop++] = id;
    }
    char part[ZT_STRLEN + 64];
    snprintf(part, sizeof part, "%s/%s.rank-%d.part", cfg->train.output_dir, name, rank);
    FILE *f = writer ? fopen(part, "w") : NULL;
    rc = f || !writer ? 0 : zt_err(e, sizeof e, "%s: cannot write", part);
    const int G = ZT_MAX(batch, 1), max_new = cfg->generate.max_new_tokens;
    float *logits = zt_malloc((size_t)G * vocab_size * sizeof *logits);
    cand_t *order = zt_malloc((size_t)vocab_size * sizeof *order);
    /* This rank's prompts are i = rank + k world, k = 0 .. mine - 1. Row b holds prompt
     * idx[b] (-1: none), its k kk[b], its tokens ctx + b W (the prompt from start[b], then
     * what was generated, len[b] in all) and its sampling generator; a row takes the next
     * prompt as soon as its last one ends (continuous batching), and the finished lines
     * wait in line[k] to be written in prompt order. */
    const size_t W = (size_t)context + max_new + 1;
    const int mine = np > rank ? (np - rank + world - 1) / world : 0;
    int32_t *ctx = zt_malloc((size_t)G * W * sizeof *ctx);
    int *idx = zt_malloc((size_t)G * sizeof *idx), *kk = zt_malloc((size_t)G * sizeof *kk);
    int *done = zt_malloc((size_t)G * sizeof *done), *n = zt_malloc((size_t)G * sizeof *n);
    size_t *len = zt_malloc((size_t)G * sizeof *len), *start = zt_malloc((size_t)G * sizeof *start);
    uint64_t *rng = zt_malloc((size_t)G * sizeof *rng);
    const int32_t **win = zt_malloc((size_t)G * sizeof *win);
    char **line = zt_calloc((size_t)ZT_MAX(mine, 1), sizeof *line);
    for (int b = 0; b < G; b++) idx[b] = -1, done[b] = 1;
    for (int next = 0;;) {
        int active = 0;
        for (int b = 0; b < G; b++) {
            /* an ended row: its line, then the next prompt (one that ends at once too) */
            while (done[b]) {
                if (idx[b] >= 0 && writer && !rc) {
                    size_t nb = 0;
                    const int i = idx[b];
                    const int32_t *answer = ctx + (size_t)b * W + start[b];
                    char *out = zt_tokenizer_decode_utf8(tok, answer, len[b] - start[b], &nb);
                    json_t *j = json_pack("{s:i, s:s, s:s%, s:i}", "index", i, "prompt", pr[i].text, "output",
                                          out ? out : "", nb, "new_tokens", (int)(len[b] - start[b]));
                    line[kk[b]] = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
                    json_decref(j);
                    free(out);
                }
                idx[b] = -1;
                if (next >= mine || rc) break;
                const int i = rank + next * world;
                int32_t *c = ctx + (size_t)b * W;
                zt_ids_t ids = {0}, labels = {0};
                size_t plen = 0;
                len[b] = 0;
                rc = zt_sft_encode(&o, tok, &pr[i].rec, &ids, &labels, e, sizeof e);
                /* the prompt: everything before the last answer (its labels are the ids) */
                for (size_t k = 0; !rc && k < labels.n; k++)
                    if (labels.v[k] == -100) plen = k + 1;
                /* a prompt longer than the context keeps its end */
                for (size_t k = plen > (size_t)context ? plen - (size_t)context : 0; k < plen; k++)
                    c[len[b]++] = ids.v[k];
                zt_ids_free(&ids);
                zt_ids_free(&labels);
                if (rc) break;
                idx[b] = i, kk[b] = next++;
                rng[b] = zt_splitmix64((uint64_t)cfg->train.seed ^ zt_splitmix64((uint64_t)i + 1));
                start[b] = len[b];
                done[b] = len[b] == 0 || max_new <= 0;
            }
            active |= !done[b];
        }
        /* every rank steps until all are done: each forward gathers the same units */
        if (!zt_any(comm, active)) break;
        for (int b = 0; b < G; b++) {
            const size_t from = len[b] > (size_t)context ? len[b] - (size_t)context : 0;
            win[b] = ctx + (size_t)b * W + from;
            n[b] = done[b] ? 0 : (int)(len[b] - from);
        }
        fn(arg, G, win, n, logits);
        for (int b = 0; b < G; b++) {
            if (done[b]) continue;
            const int32_t tk = pick(cfg, logits + (size_t)b * vocab_size, vocab_size, &rng[b], order);
            for (int k = 0; k < nstop; k++) done[b] |= tk == stop[k];
            if (!done[b]) ctx[(size_t)b * W + len[b]++] = tk;
            done[b] |= len[b] - start[b] >= (size_t)max_new;
        }
    }
    for (int k = 0; k < mine && writer && !rc; k++)
        if (!line[k] || fprintf(f, "%s\n", line[k]) < 0) rc = zt_err(e, sizeof e, "%s: write failed", part);
    for (int k = 0; k < mine; k++) free(line[k]);
    free(line);
    free(kk);
    free(win);
    free(rng);
    free(start);
    free(len);
    free(n);
    free(done);
    free(idx);
    if (f && fclose(f) != 0 && !rc) rc = zt_err(e, sizeof e, "%s: write failed", part);
    free(ctx);
    free(order);
    free(logits);
    free_prompts(pr, np);
    zt_tokenizer_close(tok);
    if (zt_agree_error(comm, rc, e, sizeof e)) return zt_err(err, errlen, "%s", e);
    /* rank 0 puts the ranks' lines in prompt order: prompt i is line i / world of part
     * i mod world */
    if (comm->world.rank == 0) {
        char path[ZT_STRLEN + 64];
        snprintf(path, sizeof path, "%s/%s", cfg->train.output_dir, name);
        FILE *out = fopen(path, "w");
        FILE **parts = zt_calloc((size_t)world, sizeof *parts);
        for (int k = 0; k < world && out; k++) {
            snprintf(part, sizeof part, "%s/%s.rank-%d.part", cfg->train.output_dir, name, k);
            parts[k] = fopen(part, "r");
        }
        char *buf = NULL;
        size_t cap = 0;
        rc = out ? 0 : zt_err(e, sizeof e, "%s: cannot write", path);
        for (int i = 0; i < np && !rc; i++)
            if (!parts[i % world] || getline(&buf, &cap, parts[i % world]) < 0 || fputs(buf, out) < 0)
                rc = zt_err(e, sizeof e, "%s: merging the ranks' generations failed", path);
        free(buf);
        for (int k = 0; k < world; k++) {
            if (parts[k]) fclose(parts[k]);
            snprintf(part, sizeof part, "%s/%s.rank-%d.part", cfg->train.output_dir, name, k);
            unlink(part);
        }
        free(parts);
        if (out && fclose(out) != 0 && !rc) rc = zt_err(e, sizeof e, "%s: write failed", path);
    }
    if (zt_agree_error(comm, rc, e, sizeof e)) return zt_err(err, errlen, "%s", e);
    return 0;
}
