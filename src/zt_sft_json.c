/* zt_sft_json.c — instruction data files (alpaca, sharegpt, messages) to conversations,
 * as LLaMA-Factory's AlpacaDatasetConverter and SharegptDatasetConverter align them. */
#include "zt_sft.h"

#include "zt_common.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zt_sft_format_t zt_sft_format(const char *name)
{
    if (!name) return 0;
    if (strcmp(name, "alpaca") == 0) return ZT_SFT_ALPACA;
    if (strcmp(name, "sharegpt") == 0) return ZT_SFT_SHAREGPT;
    if (strcmp(name, "messages") == 0) return ZT_SFT_MESSAGES;
    return 0;
}

/* Where a record came from, for one-line errors. */
typedef struct {
    const char *file;
    size_t index;
    size_t line; /* JSON Lines: its line; 0 in a JSON array */
    char *err;
    size_t errlen;
} where_t;

static int bad(const where_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const where_t *w, const char *fmt, ...)
{
    char msg[ZT_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->line) return zt_err(w->err, w->errlen, "%s: record %zu (line %zu): %s", w->file, w->index, w->line, msg);
    return zt_err(w->err, w->errlen, "%s: record %zu: %s", w->file, w->index, msg);
}

static void add_msg(zt_sft_record_t *r, const char *s)
{
    r->msgs = realloc(r->msgs, (size_t)(r->nmsgs + 1) * sizeof *r->msgs);
    if (!r->msgs) zt_fatal("out of memory");
    r->msgs[r->nmsgs++] = strdup(s);
}

static void record_free(zt_sft_record_t *r)
{
    for (int i = 0; i < r->nmsgs; i++) free(r->msgs[i]);
    free(r->msgs);
    free(r->system);
    free(r->rejected);
    memset(r, 0, sizeof *r);
}

/* A key that may be absent or null (LLaMA-Factory's missing columns are None): "" then. */
static int opt_string(const where_t *w, json_t *obj, const char *key, const char **out)
{
    json_t *v = json_object_get(obj, key);
    *out = "";
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad(w, "%s: not a string", key);
    *out = json_string_value(v);
    return 0;
}

static int req_string(const where_t *w, json_t *obj, const char *key, const char **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return bad(w, "%s: missing", key);
    if (!json_is_string(v)) return bad(w, "%s: not a string", key);
    *out = json_string_value(v);
    return 0;
}

/* data.format's fixed names: LLaMA-Factory's DatasetAttr with every column these formats
 * name mapped (system and history included), messages being sharegpt with OpenAI's tags;
 * [1][fmt] the same for preference pairs, the answers in chosen and rejected. */
#define SHAREGPT_TAGS .role_tag = "from", .content_tag = "value", .user_tag = "human", .assistant_tag = "gpt", \
                      .observation_tag = "observation", .function_tag = "function_call", .system_tag = "system"
#define MESSAGES_TAGS .role_tag = "role", .content_tag = "content", .user_tag = "user", .assistant_tag = "assistant", \
                      .observation_tag = "tool", .function_tag = "function", .system_tag = "system"
#define PAIRS .ranking = 1, .chosen = "chosen", .rejected = "rejected"
static const zt_sft_columns_t fixed_columns[2][ZT_SFT_MESSAGES + 1] = {
    {[ZT_SFT_ALPACA] = {.format = ZT_SFT_ALPACA, .prompt = "instruction", .query = "input", .response = "output",
                        .history = "history", .system = "system"},
     [ZT_SFT_SHAREGPT] = {.format = ZT_SFT_SHAREGPT, .messages = "conversations", .system = "system", SHAREGPT_TAGS},
     [ZT_SFT_MESSAGES] = {.format = ZT_SFT_SHAREGPT, .messages = "messages", .system = "system", MESSAGES_TAGS}},
    {[ZT_SFT_ALPACA] = {.format = ZT_SFT_ALPACA, .prompt = "instruction", .query = "input", .history = "history",
                        .system = "system", PAIRS},
     [ZT_SFT_SHAREGPT] = {.format = ZT_SFT_SHAREGPT, .messages = "conversations", .system = "system", SHAREGPT_TAGS,
                          PAIRS},
     [ZT_SFT_MESSAGES] = {.format = ZT_SFT_SHAREGPT, .messages = "messages", .system = "system", MESSAGES_TAGS,
                          PAIRS}},
};

const zt_sft_columns_t *zt_sft_columns(zt_sft_format_t fmt, int ranking)
{
    return fmt == ZT_SFT_ALPACA || fmt == ZT_SFT_SHAREGPT || fmt == ZT_SFT_MESSAGES ? &fixed_columns[!!ranking][fmt]
                                                                                      : NULL;
}

/* A mapped column's string, "" where the column is not mapped or the record's value is
 * absent or null (LLaMA-Factory's None). */
static int col_string(const where_t *w, json_t *o, const char *col, const char **out)
{
    *out = "";
    return col ? opt_string(w, o, col, out) : 0;
}

/* A preference pair's answers, read by get (a string, or a turn's content): present and
 * not empty, and not the same, so that the pair teaches a preference. chosen becomes the
 * conversation's last message, rejected r->rejected. */
static int pair_answers(const where_t *w, json_t *o, const zt_sft_columns_t *c, zt_sft_record_t *r,
                        int (*get)(const where_t *, json_t *, const char *, const zt_sft_columns_t *, const char **))
{
    const char *ans[2], *col[2] = {c->chosen, c->rejected};
    for (int k = 0; k < 2; k++) {
        if (get(w, o, col[k], c, &ans[k]) != 0) return -1;
        if (!ans[k][0]) return bad(w, "%s: empty: a preference pair needs both answers", col[k]);
    }
    if (strcmp(ans[0], ans[1]) == 0)
        return bad(w, "%s and %s are the same answer: a pair must prefer one to the other", col[0], col[1]);
    add_msg(r, ans[0]);
    r->rejected = strdup(ans[1]);
    return 0;
}

/* alpaca's answer: a string */
static int answer_string(const where_t *w, json_t *o, const char *col, const zt_sft_columns_t *c, const char **out)
{
    (void)c;
    return req_string(w, o, col, out);
}

/* AlpacaDatasetConverter: history pairs (when mapped), then "prompt\nquery" (each part
 * left out when empty or not mapped), then the response. */
static int from_alpaca(const where_t *w, json_t *o, const zt_sft_columns_t *c, zt_sft_record_t *r)
{
    const char *instruction, *input, *output = NULL, *system;
    if (col_string(w, o, c->prompt, &instruction) || col_string(w, o, c->query, &input) ||
        (!c->ranking && req_string(w, o, c->response, &output)) || col_string(w, o, c->system, &system))
        return -1;
    json_t *h = c->history ? json_object_get(o, c->history) : NULL;
    if (h && !json_is_null(h)) {
        if (!json_is_array(h)) return bad(w, "%s: not a list of [instruction, response] pairs", c->history);
        size_t i;
        json_t *p;
        json_array_foreach(h, i, p) {
            if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_string(json_array_get(p, 0)) ||
                !json_is_string(json_array_get(p, 1)))
                return bad(w, "%s[%zu]: not an [instruction, response] pair of strings", c->history, i);
            add_msg(r, json_string_value(json_array_get(p, 0)));
            add_msg(r, json_string_value(json_array_get(p, 1)));
        }
    }
    /* "\n".join of the non-empty ones: "instruction\ninput" */
    size_t li = strlen(instruction), ln = strlen(input);
    char *q = zt_malloc(li + ln + 2), *e = q;
    if (li) e = memcpy(e, instruction, li), e += li;
    if (li && ln) *e++ = '\n';
    if (ln) e = memcpy(e, input, ln), e += ln;
    *e = 0;
    add_msg(r, q);
    free(q);
    r->system = strdup(system);
    if (c->ranking) return pair_answers(w, o, c, r, answer_string);
    add_msg(r, output);
    return 0;
}

static int is_tag(const char *role, const char *tag) { return tag && strcmp(role, tag) == 0; }

/* sharegpt's answer: one turn, the assistant's */
static int answer_turn(const where_t *w, json_t *o, const char *col, const zt_sft_columns_t *t, const char **out)
{
    json_t *m = json_object_get(o, col), *c;
    const char *role;
    if (!m) return bad(w, "%s: missing", col);
    if (!json_is_object(m))
        return bad(w, "%s: not a turn ({\"%s\": ..., \"%s\": ...})", col, t->role_tag, t->content_tag);
    if (req_string(w, m, t->role_tag, &role) != 0) return bad(w, "%s.%s: missing or not a string", col, t->role_tag);
    if (is_tag(role, t->function_tag))
        return bad(w, "%s.%s: '%s': tool turns are not supported", col, t->role_tag, role);
    if (!is_tag(role, t->assistant_tag))
        return bad(w, "%s.%s: '%s' where '%s' is expected (an answer is the assistant's turn)", col, t->role_tag, role,
                   t->assistant_tag);
    if (!(c = json_object_get(m, t->content_tag))) return bad(w, "%s.%s: missing", col, t->content_tag);
    if (!json_is_string(c)) return bad(w, "%s.%s: not a string", col, t->content_tag);
    *out = json_string_value(c);
    return 0;
}

/* SharegptDatasetConverter: a list of turns whose keys and roles the tags name. */
static int from_turns(const where_t *w, json_t *o, const zt_sft_columns_t *t, zt_sft_record_t *r)
{
    json_t *list = json_object_get(o, t->messages);
    if (!list) return bad(w, "%s: missing", t->messages);
    if (!json_is_array(list)) return bad(w, "%s: not a list of turns", t->messages);
    size_t n = json_array_size(list), first = 0;
    const char *system = "";
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(list, i);
        if (!json_is_object(m)) return bad(w, "%s[%zu]: not an object", t->messages, i);
        const char *role, *content;
        json_t *c = json_object_get(m, t->content_tag);
        if (req_string(w, m, t->role_tag, &role) != 0)
            return bad(w, "%s[%zu].%s: missing or not a string", t->messages, i, t->role_tag);
        if (!c) return bad(w, "%s[%zu].%s: missing", t->messages, i, t->content_tag);
        if (!json_is_string(c)) return bad(w, "%s[%zu].%s: not a string", t->messages, i, t->content_tag);
        content = json_string_value(c);
        if (is_tag(role, t->observation_tag) || is_tag(role, t->function_tag)) /* ztrain does no tool calling */
            return bad(w, "%s[%zu].%s: '%s': tool turns are not supported", t->messages, i, t->role_tag, role);
        if (i == 0 && is_tag(role, t->system_tag)) {
            system = content; /* a leading system turn */
            first = 1;
            continue;
        }
        const char *want = (i - first) % 2 == 0 ? t->user_tag : t->assistant_tag;
        if (!is_tag(role, want))
            return bad(w, "%s[%zu].%s: '%s' where '%s' is expected (turns alternate %s, %s after an optional "
                          "leading %s)",
                       t->messages, i, t->role_tag, role, want ? want : "(no tag)", t->user_tag ? t->user_tag : "-",
                       t->assistant_tag ? t->assistant_tag : "-", t->system_tag ? t->system_tag : "(no system tag)");
        add_msg(r, content);
    }
    if (r->nmsgs == 0) return bad(w, "%s: no %s/%s turns", t->messages, t->user_tag, t->assistant_tag);
    if (t->ranking && r->nmsgs % 2 == 0) /* the answers are the chosen and rejected turns */
        return bad(w, "%s: ends with a '%s' turn: a preference pair's prompt ends with the '%s' turn", t->messages,
                   t->assistant_tag, t->user_tag);
    if (!t->ranking && r->nmsgs % 2)
        return bad(w, "%s: ends with a '%s' turn, not '%s'", t->messages, t->user_tag, t->assistant_tag);
    if (!first && col_string(w, o, t->system, &system) != 0) return -1;
    r->system = strdup(system);
    return t->ranking ? pair_answers(w, o, t, r, answer_turn) : 0;
}

static int convert(const where_t *w, json_t *o, const zt_sft_columns_t *c, zt_sft_records_t *out)
{
    if (!json_is_object(o)) return bad(w, "not a JSON object");
    zt_sft_record_t r = {0};
    int rc = c->format == ZT_SFT_ALPACA ? from_alpaca(w, o, c, &r) : from_turns(w, o, c, &r);
    if (rc != 0) {
        record_free(&r);
        return -1;
    }
    if ((out->n & (out->n - 1)) == 0) { /* grow at powers of two */
        out->rec = realloc(out->rec, (out->n ? 2 * out->n : 1) * sizeof *out->rec);
        if (!out->rec) zt_fatal("out of memory");
    }
    out->rec[out->n++] = r;
    return 0;
}

/* JSON's white space, as jansson skips it */
static int json_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The end of the JSON value at text[p] (a string, a bracketed value with strings skipped,
 * or a bare scalar), or 0 where brackets do not close. Only the extent: what is inside is
 * jansson's to check. */
static size_t value_end(const char *text, size_t len, size_t p)
{
    int depth = 0;
    for (; p < len; p++) {
        const char c = text[p];
        if (c == '"') {
            for (p++; p < len && text[p] != '"'; p++)
                if (text[p] == '\\') p++;
            if (p >= len) return 0;
            if (depth == 0) return p + 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return p; /* a bare scalar ends at the array's close */
            if (--depth == 0) return p + 1;
        } else if (depth == 0 && (c == ',' || json_ws(c))) {
            return p;
        }
    }
    return depth == 0 ? p : 0;
}

static void index_add(zt_sft_index_t *ix, size_t off, size_t len, size_t line)
{
    if ((ix->n & (ix->n - 1)) == 0) { /* grow at powers of two */
        const size_t cap = ix->n ? 2 * ix->n : 1;
        ix->off = realloc(ix->off, cap * sizeof *ix->off);
        ix->len = realloc(ix->len, cap * sizeof *ix->len);
        ix->line = realloc(ix->line, cap * sizeof *ix->line);
        if (!ix->off || !ix->len || !ix->line) zt_fatal("out of memory");
    }
    ix->off[ix->n] = off;
    ix->len[ix->n] = len;
    ix->line[ix->n++] = line;
}

/* The whole text through jansson, for the message of a JSON array it rejects: the one
 * zt_sft_parse always gave. */
static int array_error(const char *name, const char *text, size_t len, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return zt_err(err, errlen, "%s:%d:%d: not JSON: %s", name, je.line, je.column, je.text);
    json_decref(root);
    return zt_err(err, errlen, "%s: the record scanner and jansson disagree about this JSON array", name);
}

int zt_sft_index(const char *name, const char *text, size_t len, zt_sft_index_t *ix, char *err, size_t errlen)
{
    memset(ix, 0, sizeof *ix);
    size_t p = 0;
    while (p < len && json_ws(text[p])) p++;
    if (p < len && text[p] == '[') {
        /* [ value (, value)* ] and nothing but white space after it */
        ix->array = 1;
        for (p++; p < len && json_ws(text[p]); p++) {}
        int bad = p >= len;
        if (!bad && text[p] == ']') p++;
        else
            while (!bad) {
                const size_t e = value_end(text, len, p);
                if (!(bad = e <= p)) index_add(ix, p, e - p, 0);
                for (p = e; !bad && p < len && json_ws(text[p]); p++) {}
                if (bad || p >= len || (text[p] != ',' && text[p] != ']')) {
                    bad = 1;
                    break;
                }
                if (text[p++] == ']') break;
                while (p < len && json_ws(text[p])) p++;
            }
        while (!bad && p < len && json_ws(text[p])) p++;
        if (bad || p != len) {
            zt_sft_index_free(ix);
            return array_error(name, text, len, err, errlen);
        }
    } else {
        size_t line = 1;
        for (size_t s = 0; s < len; line++) {
            const char *nl = memchr(text + s, '\n', len - s);
            size_t e = nl ? (size_t)(nl - text) : len, q = s;
            while (q < e && (text[q] == ' ' || text[q] == '\t' || text[q] == '\r')) q++;
            if (q < e) index_add(ix, s, e - s, line); /* blank lines are skipped, as JSON Lines readers do */
            s = e + 1;
        }
    }
    if (ix->n == 0) {
        zt_sft_index_free(ix);
        return zt_err(err, errlen, "%s: no records", name);
    }
    return 0;
}

void zt_sft_index_free(zt_sft_index_t *ix)
{
    free(ix->off);
    free(ix->len);
    free(ix->line);
    memset(ix, 0, sizeof *ix);
}

int zt_sft_parse_range(const char *name, const char *text, size_t len, const zt_sft_index_t *ix, size_t begin,
                       size_t end, const zt_sft_columns_t *cols, zt_sft_records_t *out, char *err,
                       size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!cols) return zt_err(err, errlen, "%s: unknown data format (expected alpaca, sharegpt or messages)", name);
    if (end > ix->n || begin > end) zt_fatal("zt_sft_parse_range: records [%zu, %zu) of %zu", begin, end, ix->n);
    json_error_t je;
    where_t w = {name, 0, 0, err, errlen};
    int rc = 0;
    if (ix->array) {
        /* every record's syntax before any record's content, as a parse of the whole array */
        json_t **v = zt_calloc(end - begin + 1, sizeof *v);
        for (size_t i = begin; rc == 0 && i < end; i++)
            if (!(v[i - begin] = json_loadb(text + ix->off[i], ix->len[i], JSON_DECODE_ANY, &je)))
                rc = array_error(name, text, len, err, errlen) ? ZT_SFT_SYNTAX : 0;
        for (w.index = begin; rc == 0 && w.index < end; w.index++) rc = convert(&w, v[w.index - begin], cols, out);
        for (size_t i = begin; i < end; i++) json_decref(v[i - begin]);
        free(v);
    } else {
        for (w.index = begin; rc == 0 && w.index < end; w.index++) {
            json_t *o = json_loadb(text + ix->off[w.index], ix->len[w.index], 0, &je);
            w.line = ix->line[w.index];
            if (!o) rc = zt_err(err, errlen, "%s:%zu:%d: not JSON: %s", name, w.line, je.column, je.text);
            else rc = convert(&w, o, cols, out);
            json_decref(o);
        }
    }
    if (rc != 0) zt_sft_records_free(out);
    return rc;
}

int zt_sft_parse(const char *name, const char *text, size_t len, zt_sft_format_t fmt, zt_sft_records_t *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (fmt != ZT_SFT_ALPACA && fmt != ZT_SFT_SHAREGPT && fmt != ZT_SFT_MESSAGES)
        return zt_err(err, errlen, "%s: unknown data format (expected alpaca, sharegpt or messages)", name);
    zt_sft_index_t ix;
    if (zt_sft_index(name, text, len, &ix, err, errlen) != 0) return -1;
    const int rc = zt_sft_parse_range(name, text, len, &ix, 0, ix.n, zt_sft_columns(fmt, 0), out, err, errlen);
    zt_sft_index_free(&ix);
    return rc ? -1 : 0;
}

int zt_sft_read(const char *path, zt_sft_format_t fmt, zt_sft_records_t *out, char *err, size_t errlen)
{
    size_t len = 0;
    memset(out, 0, sizeof *out);
    char *text = zt_read_file(path, &len, err, errlen);
    if (!text) return -1;
    int rc = zt_sft_parse(path, text, len, fmt, out, err, errlen);
    free(text);
    return rc;
}

void zt_sft_records_free(zt_sft_records_t *r)
{
    for (size_t i = 0; i < r->n; i++) record_free(&r->rec[i]);
    free(r->rec);
    r->rec = NULL;
    r->n = 0;
}
