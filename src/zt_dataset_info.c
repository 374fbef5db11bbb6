/* zt_dataset_info.c — dataset_info.json entries to files and column mappings, as
 * LLaMA-Factory 0.9.5's get_dataset_list and _load_single_dataset read them (see
 * zt_dataset_info.h for what is read and what is refused, and why). */
#include "zt_dataset_info.h"

#include "zt_common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The entry being read, for one-line errors: "FILE: NAME: FIELD: problem". */
typedef struct {
    const char *file, *name;
    char *err;
    size_t errlen;
} where_t;

#define bad(w, fmt, ...) zt_err((w)->err, (w)->errlen, "%s: %s: " fmt, (w)->file, (w)->name, ##__VA_ARGS__)

/* The nearest of names[0..n) to s, NULL when none is a plausible typo. */
static const char *nearest(const char *s, const char *const *names, size_t n)
{
    const char *best = NULL;
    int d = 1000;
    for (size_t i = 0; i < n; i++) {
        const int e = zt_levenshtein(s, names[i]);
        if (e < d) d = e, best = names[i];
    }
    return d <= ZT_MAX(2, (int)strlen(s) / 3) ? best : NULL;
}

static int unknown(const where_t *w, const char *what, const char *key, const char *const *known, size_t n)
{
    const char *s = nearest(key, known, n);
    if (s) return bad(w, "%s'%s': not a key LLaMA-Factory reads (did you mean '%s'?)", what, key, s);
    return bad(w, "%s'%s': not a key LLaMA-Factory reads", what, key);
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const char *const entry_keys[] = {"file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url",
                                         "cloud_file_name", "formatting", "ranking", "subset", "split", "folder",
                                         "num_samples", "columns", "tags"};
static const char *const column_keys[] = {"prompt", "query",  "response", "history",  "messages", "system", "tools",
                                          "images", "videos", "audios",   "chosen",   "rejected", "kto_tag"};
static const char *const tag_keys[] = {"role_tag",        "content_tag",  "user_tag",  "assistant_tag",
                                       "observation_tag", "function_tag", "system_tag"};

/* obj[key] as an owned string into *out: absent -> def, null -> NULL (LLaMA-Factory's None). */
static int mapped(const where_t *w, const char *section, json_t *obj, const char *key, const char *def, char **out)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    const char *s = obj ? NULL : def;
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) return bad(w, "%s.%s: not a string or null", section, key);
        s = json_string_value(v);
    }
    *out = s ? strdup(s) : NULL;
    return 0;
}

/* "columns" / "tags": an object of known keys (LLaMA-Factory ignores others: a typo would
 * silently drop a column). */
static int check_keys(const where_t *w, json_t *obj, const char *section, const char *const *known, size_t n)
{
    if (!obj) return 0;
    if (!json_is_object(obj)) return bad(w, "%s: not an object", section);
    const char *k;
    json_t *v;
    char what[64];
    snprintf(what, sizeof what, "%s: ", section);
    json_object_foreach(obj, k, v) {
        size_t i = 0;
        while (i < n && strcmp(k, known[i]) != 0) i++;
        if (i == n) return unknown(w, what, k, known, n);
    }
    return 0;
}

static void columns_free(zt_sft_columns_t *c)
{
    char *v[] = {(char *)c->prompt,       (char *)c->query,           (char *)c->response,      (char *)c->history,
                 (char *)c->messages,     (char *)c->system,          (char *)c->role_tag,      (char *)c->content_tag,
                 (char *)c->user_tag,     (char *)c->assistant_tag,   (char *)c->observation_tag,
                 (char *)c->function_tag, (char *)c->system_tag,    (char *)c->chosen,        (char *)c->rejected};
    for (size_t i = 0; i < N(v); i++) free(v[i]);
    memset(c, 0, sizeof *c);
}

/* DatasetAttr.join for an SFT entry: formatting, the columns and tags (defaults where the
 * object is absent, None where it is present without the key), and the refusals. */
static int read_mapping(const where_t *w, json_t *e, zt_sft_columns_t *c)
{
    json_t *fmt = json_object_get(e, "formatting"), *cols = json_object_get(e, "columns"),
           *tags = json_object_get(e, "tags"), *v;
    const char *f = fmt && !json_is_null(fmt) ? json_string_value(fmt) : "alpaca";
    if (!f) return bad(w, "formatting: not a string");
    if (strcmp(f, "openai") == 0)
        return bad(w, "formatting 'openai': not read by ztrain (its tool calls are not supported); sharegpt with "
                      "the role/content/user/assistant/system tags reads OpenAI's messages");
    if (strcmp(f, "alpaca") != 0 && strcmp(f, "sharegpt") != 0)
        return bad(w, "formatting '%s': expected alpaca or sharegpt", f);
    c->format = strcmp(f, "alpaca") == 0 ? ZT_SFT_ALPACA : ZT_SFT_SHAREGPT;
    if ((v = json_object_get(e, "ranking")) && !json_is_boolean(v) && !json_is_null(v))
        return bad(w, "ranking: not true or false");
    c->ranking = v && json_is_true(v);
    if (check_keys(w, cols, "columns", column_keys, N(column_keys)) ||
        check_keys(w, tags, "tags", tag_keys, N(tag_keys)))
        return -1;
    static const char *const media[] = {"images", "videos", "audios"};
    for (size_t i = 0; cols && i < 3; i++)
        if ((v = json_object_get(cols, media[i])) && !json_is_null(v))
            return bad(w, "columns.%s: ztrain trains on text only", media[i]);
    if (cols && (v = json_object_get(cols, "kto_tag")) && !json_is_null(v))
        return bad(w, "columns.kto_tag: KTO's preference data: KTO training is not available");
    if (cols && (v = json_object_get(cols, "tools")) && !json_is_null(v))
        return bad(w, "columns.tools: tool descriptions are not supported (ztrain's templates render none)");
    char *s[15] = {0};
    int rc = mapped(w, "columns", cols, "prompt", "instruction", &s[0]) ||
             mapped(w, "columns", cols, "query", "input", &s[1]) ||
             mapped(w, "columns", cols, "response", "output", &s[2]) ||
             mapped(w, "columns", cols, "history", NULL, &s[3]) ||
             mapped(w, "columns", cols, "messages", "conversations", &s[4]) ||
             mapped(w, "columns", cols, "system", NULL, &s[5]);
    for (size_t i = 0; rc == 0 && i < N(tag_keys); i++) {
        static const char *const def[] = {"from", "value", "human", "gpt", "observation", "function_call", "system"};
        rc = mapped(w, "tags", tags, tag_keys[i], def[i], &s[6 + i]);
    }
    rc = rc || mapped(w, "columns", cols, "chosen", NULL, &s[13]) ||
         mapped(w, "columns", cols, "rejected", NULL, &s[14]);
    *c = (zt_sft_columns_t){c->format, s[0], s[1],  s[2],  s[3],  s[4],       s[5],  s[6], s[7],
                            s[8],      s[9], s[10], s[11], s[12], c->ranking, s[13], s[14]};
    if (rc) return -1;
    /* a pair's answers are its chosen and rejected columns, read only with ranking (else
     * LLaMA-Factory reads the response and they would silently do nothing) */
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "rejected" : "chosen", *col = i ? c->rejected : c->chosen;
        if (c->ranking && !col)
            return bad(w, "columns.%s: not mapped: a ranking dataset's pairs need their chosen and rejected answers",
                       name);
        if (!c->ranking && col) return bad(w, "columns.%s: read only with \"ranking\": true", name);
    }
    /* what an SFT sample cannot do without: LLaMA-Factory drops every record (or fails) */
    if (c->format == ZT_SFT_ALPACA && !c->response && !c->ranking)
        return bad(w, "columns.response: not mapped: an SFT sample needs the response");
    if (c->format == ZT_SFT_SHAREGPT) {
        const char *need[] = {c->messages, c->role_tag, c->content_tag, c->user_tag, c->assistant_tag};
        const char *name[] = {"columns.messages", "tags.role_tag", "tags.content_tag", "tags.user_tag",
                              "tags.assistant_tag"};
        for (int i = 0; i < 5; i++)
            if (!need[i]) return bad(w, "%s: not mapped: a sharegpt SFT sample needs it", name[i]);
    }
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *join(const char *dir, const char *name)
{
    const size_t n = strlen(dir) + strlen(name) + 2;
    char *p = zt_malloc(n);
    if (name[0] == '/' || !dir[0]) snprintf(p, n, "%s", name); /* os.path.join: an absolute name wins */
    else snprintf(p, n, "%s%s%s", dir, ends_with(dir, "/") ? "" : "/", name);
    return p;
}

/* file_name -> the file, or the directory's .json / .jsonl files in name order. */
static int read_files(const where_t *w, const char *dataset_dir, json_t *e, zt_dataset_entry_t *d)
{
    static const char *const remote[] = {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"};
    for (size_t i = 0; i < N(remote); i++)
        if (json_object_get(e, remote[i]))
            return bad(w, "%s: ztrain reads local files only (file_name)", remote[i]);
    json_t *fn = json_object_get(e, "file_name"), *v;
    if (!fn) return bad(w, "file_name: missing");
    if (!json_is_string(fn) || !json_string_value(fn)[0]) return bad(w, "file_name: not a file name");
    if ((v = json_object_get(e, "split")) && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "train") != 0))
        return bad(w, "split: a local file has the split train only (ztrain reads it whole)");
    if ((v = json_object_get(e, "num_samples")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return bad(w, "num_samples: not a positive integer");
        d->num_samples = (long)json_integer_value(v);
    }
    d->base = join(dataset_dir, json_string_value(fn));
    struct stat st;
    if (stat(d->base, &st) != 0) return bad(w, "file_name: %s: %s", d->base, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (!ends_with(d->base, ".json") && !ends_with(d->base, ".jsonl"))
            return bad(w, "file_name: %s: not a .json or .jsonl file (ztrain reads JSON and JSON Lines)", d->base);
        d->files = zt_calloc(1, sizeof *d->files);
        d->files[d->nfiles++] = strdup(d->base);
        return 0;
    }
    DIR *dir = opendir(d->base);
    if (!dir) return bad(w, "file_name: %s: %s", d->base, strerror(errno));
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(dir));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (ends_with(de->d_name, ".sft.h5")) continue; /* ztrain's own caches of files in it */
        if (!ends_with(de->d_name, ".json") && !ends_with(de->d_name, ".jsonl")) {
            rc = bad(w, "file_name: %s/%s: not a .json or .jsonl file (a directory is one dataset of JSON files)",
                     d->base, de->d_name);
            break;
        }
        d->files = realloc(d->files, (size_t)(d->nfiles + 1) * sizeof *d->files);
        if (!d->files) zt_fatal("out of memory");
        d->files[d->nfiles++] = join(d->base, de->d_name);
    }
    closedir(dir);
    if (rc == 0 && d->nfiles == 0) rc = bad(w, "file_name: %s: no .json or .jsonl files", d->base);
    if (rc == 0) qsort(d->files, (size_t)d->nfiles, sizeof *d->files, cmp_str);
    return rc;
}

static int read_entry(const where_t *w, const char *dataset_dir, json_t *e, zt_dataset_entry_t *d)
{
    if (!json_is_object(e)) return bad(w, "not an object");
    const char *k;
    json_t *v;
    json_object_foreach(e, k, v) {
        size_t i = 0;
        while (i < N(entry_keys) && strcmp(k, entry_keys[i]) != 0) i++;
        if (i == N(entry_keys)) return unknown(w, "", k, entry_keys, N(entry_keys));
    }
    return read_files(w, dataset_dir, e, d) || read_mapping(w, e, &d->columns) ? -1 : 0;
}

/* The next name of a comma-separated list, stripped of white space, into buf. */
static const char *next_name(const char *p, char *buf, size_t len)
{
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    while (p < end && isspace((unsigned char)*p)) p++;
    const char *q = end;
    while (q > p && isspace((unsigned char)q[-1])) q--;
    snprintf(buf, len, "%.*s", (int)(q - p), p);
    return *end ? end + 1 : NULL;
}

int zt_datasets_load(const char *dataset_dir, const char *names, zt_datasets_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!names || !names[0]) return 0;
    if (!strcmp(dataset_dir, "ONLINE") || !strncmp(dataset_dir, "REMOTE:", 7))
        return zt_err(err, errlen, "data.dataset_dir '%s': ztrain reads a local dataset_info.json only", dataset_dir);
    char *path = join(dataset_dir, "dataset_info.json");
    json_error_t je;
    json_t *info = json_load_file(path, 0, &je);
    int rc = 0;
    if (!info) rc = zt_err(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    else if (!json_is_object(info)) rc = zt_err(err, errlen, "%s: not a JSON object of datasets", path);
    char name[1024];
    for (const char *p = names; rc == 0 && p;) {
        p = next_name(p, name, sizeof name);
        where_t w = {path, name, err, errlen};
        if (!name[0]) {
            rc = zt_err(err, errlen, "%s: an empty dataset name in '%s'", path, names);
            break;
        }
        for (int i = 0; i < out->n; i++)
            if (!strcmp(out->v[i].name, name)) rc = bad(&w, "named twice in '%s'", names);
        json_t *e = json_object_get(info, name);
        if (rc == 0 && !e) {
            const char **keys = zt_calloc(json_object_size(info) + 1, sizeof *keys);
            size_t n = 0;
            const char *k;
            json_t *v;
            json_object_foreach(info, k, v) keys[n++] = k;
            const char *s = nearest(name, keys, n);
            rc = s ? bad(&w, "no such dataset (did you mean '%s'?)", s) : bad(&w, "no such dataset");
            free(keys);
        }
        if (rc) break;
        out->v = realloc(out->v, (size_t)(out->n + 1) * sizeof *out->v);
        if (!out->v) zt_fatal("out of memory");
        zt_dataset_entry_t *d = memset(&out->v[out->n++], 0, sizeof *out->v);
        d->name = strdup(name);
        rc = read_entry(&w, dataset_dir, e, d);
    }
    json_decref(info);
    free(path);
    if (rc) zt_datasets_free(out);
    return rc;
}

void zt_datasets_free(zt_datasets_t *d)
{
    for (int i = 0; i < d->n; i++) {
        zt_dataset_entry_t *e = &d->v[i];
        for (int k = 0; k < e->nfiles; k++) free(e->files[k]);
        free(e->files);
        free(e->name);
        free(e->base);
        columns_free(&e->columns);
    }
    free(d->v);
    memset(d, 0, sizeof *d);
}
