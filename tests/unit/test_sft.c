/* test_sft.c — chat templates (zt_template.h) and SFT samples (zt_sft.h) against
 * LLaMA-Factory 0.9.5 itself.
 *
 * tests/reference/sft/cases.json comes from tests/reference/make_sft_fixtures.py: for
 * each case (template x data file x cutoff_len / train_on_prompt / mask_history /
 * packing, neat_packing) the input_ids and labels LLaMA-Factory's converters, template
 * and supervised processor give with the fixture tokenizers of tests/reference/sft/tok/
 * (with neat_packing also its attention_mask, the segment ids, and position_ids), and per
 * template the text transformers' apply_chat_template renders with LLaMA-Factory's
 * jinja template. tests/reference/sft/dataset_info/ (make_dataset_info_fixtures.py) and
 * tests/reference/sft/pairwise/ (make_pairwise_fixtures.py: preference pairs, LLaMA-Factory's
 * PairwiseDatasetProcessor) hold dataset_info.json entries and their samples likewise.
 * Only those committed files are needed here. */
#include "zt_common.h"
#include "zt_data.h"
#include "zt_dataset_info.h"
#include "zt_np_random.h"
#include "zt_sft.h"
#include "zt_template.h"
#include "zt_test.h"
#include "zt_tokenizer.h"

#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char err[ZT_ERRLEN];
static json_t *doc;

static const char *fixture(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tests/reference/sft/%s", ZT_SRCDIR, name);
    return buf[k];
}

static json_t *cases(const char *key)
{
    if (!doc) {
        json_error_t je;
        doc = json_load_file(fixture("cases.json"), 0, &je);
        if (!doc) printf("\n  cases.json:%d: %s\n", je.line, je.text);
    }
    return doc ? json_object_get(doc, key) : NULL;
}

static int32_t jid(json_t *v)
{
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1; /* null: no such token */
}

/* Compares one sample; prints the first difference (why: a bare CU_ASSERT says nothing). */
static int same_ids(const char *what, const char *name, size_t s, json_t *want, const int32_t *got, size_t n)
{
    if (json_array_size(want) != n) {
        printf("\n  %s sample %zu %s: length %zu, LLaMA-Factory %zu\n", name, s, what, n, json_array_size(want));
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (jid(json_array_get(want, i)) != got[i]) {
            printf("\n  %s sample %zu %s[%zu]: %d, LLaMA-Factory %d\n", name, s, what, i, got[i],
                   jid(json_array_get(want, i)));
            return 0;
        }
    return 1;
}

/* A case's options and LLaMA-Factory's special ids; the tokenizer loaded into *tok */
static zt_sft_opts_t case_opts(json_t *c, zt_tokenizer_t **tok)
{
    const char *tokdir = fixture(json_string_value(json_object_get(c, "tokenizer")));
    *tok = zt_tokenizer_load(tokdir, err, sizeof err);
    if (!*tok) printf("\n  %s\n", err);
    CU_ASSERT_FATAL(*tok != NULL);
    zt_sft_opts_t o = {0};
    o.tpl = zt_template_find(json_string_value(json_object_get(c, "template")));
    CU_ASSERT_FATAL(o.tpl != NULL);
    CU_ASSERT_FATAL(zt_template_special_ids(o.tpl, *tok, tokdir, &o.ids, err, sizeof err) == 0);
    o.cutoff_len = (int)json_integer_value(json_object_get(c, "cutoff_len"));
    o.train_on_prompt = json_is_true(json_object_get(c, "train_on_prompt"));
    o.mask_history = json_is_true(json_object_get(c, "mask_history"));
    o.packing = json_is_true(json_object_get(c, "packing"));
    o.neat_packing = json_is_true(json_object_get(c, "neat_packing"));
    return o;
}

static void t_cases(void)
{
    json_t *cs = cases("cases");
    CU_ASSERT_FATAL(json_array_size(cs) >= 30);
    size_t i;
    json_t *c;
    int templates_seen = 0, neat_seen = 0;
    json_array_foreach(cs, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        zt_tokenizer_t *tok;
        zt_sft_opts_t o = case_opts(c, &tok);
        json_t *sp = json_object_get(c, "special");
        CU_ASSERT(o.ids.bos == jid(json_object_get(sp, "bos")));
        CU_ASSERT(o.ids.eos == jid(json_object_get(sp, "eos")));
        CU_ASSERT(o.ids.pad == jid(json_object_get(sp, "pad")));
        zt_sft_records_t recs;
        int rc = zt_sft_read(fixture(json_string_value(json_object_get(c, "data"))),
                             zt_sft_format(json_string_value(json_object_get(c, "format"))), &recs, err, sizeof err);
        if (rc) printf("\n  %s\n", err);
        CU_ASSERT_FATAL(rc == 0);
        zt_sft_samples_t s;
        CU_ASSERT_FATAL(zt_sft_build(&o, tok, &recs, &s, err, sizeof err) == 0);
        json_t *ids = json_object_get(c, "input_ids"), *labels = json_object_get(c, "labels");
        json_t *mask = json_object_get(c, "attention_mask"); /* neat_packing cases only */
        int ok = s.nsamples == json_array_size(ids);
        if (!ok) printf("\n  %s: %zu samples, LLaMA-Factory %zu\n", name, s.nsamples, json_array_size(ids));
        /* segment ids exactly when neat-packed, beside every token */
        CU_ASSERT(s.segment_ids.n == (o.neat_packing ? s.input_ids.n : 0));
        CU_ASSERT(!o.neat_packing || json_array_size(mask) == s.nsamples);
        for (size_t k = 0; ok && k < s.nsamples; k++) {
            size_t a = (size_t)s.offsets[k], n = (size_t)(s.offsets[k + 1] - s.offsets[k]);
            ok = same_ids("input_ids", name, k, json_array_get(ids, k), s.input_ids.v + a, n) &&
                 same_ids("labels", name, k, json_array_get(labels, k), s.labels.v + a, n) &&
                 (!o.neat_packing ||
                  same_ids("segment_ids", name, k, json_array_get(mask, k), s.segment_ids.v + a, n));
        }
        CU_ASSERT(ok);
        neat_seen += o.neat_packing;
        templates_seen += strstr(name, "-alpaca") && !strchr(strstr(name, "-alpaca") + 1, '-');
        zt_sft_samples_free(&s);
        zt_sft_records_free(&recs);
        zt_tokenizer_close(tok);
    }
    CU_ASSERT(templates_seen == 11); /* every template has its plain alpaca case */
    CU_ASSERT(neat_seen >= 4);
}

/* The trainer's rows of a neat-packed file (zt_data_read_row, T = cutoff_len - 1, the
 * packed row's input positions): input ids, segments and positions are LLaMA-Factory's
 * input_ids, attention_mask and position_ids; the targets are its labels shifted by one
 * (what its model's loss compares), except that the target a sample's last token would
 * have, the next sample's first label, is dropped. Without train_on_prompt that label is
 * -100 anyway, so the targets equal LLaMA-Factory's shifted labels exactly; with it (the
 * llama3 case) they differ at exactly those tokens, counted here. */
static void t_neat_rows(void)
{
    json_t *cs = cases("cases");
    size_t i;
    json_t *c;
    int checked = 0;
    json_array_foreach(cs, i, c) {
        if (!json_is_true(json_object_get(c, "neat_packing"))) continue;
        const char *name = json_string_value(json_object_get(c, "name"));
        zt_tokenizer_t *tok;
        zt_sft_opts_t o = case_opts(c, &tok);
        zt_sft_records_t recs;
        CU_ASSERT_FATAL(zt_sft_read(fixture(json_string_value(json_object_get(c, "data"))),
                                    zt_sft_format(json_string_value(json_object_get(c, "format"))), &recs, err,
                                    sizeof err) == 0);
        zt_sft_samples_t s;
        CU_ASSERT_FATAL(zt_sft_build(&o, tok, &recs, &s, err, sizeof err) == 0);
        char path[64];
        snprintf(path, sizeof path, "/tmp/zt_test_neat_%d.h5", (int)getpid());
        CU_ASSERT_FATAL(zt_data_write_sft_h5(path, s.input_ids.v, s.labels.v, s.segment_ids.v, s.input_ids.n,
                                             s.offsets, s.nsamples, zt_tokenizer_vocab_size(tok), o.ids.pad, "hf", err,
                                             sizeof err) == 0);
        const int T = o.cutoff_len - 1;
        const char *files[1] = {path};
        zt_dataset_t *ds = zt_data_open(files, 1, T, zt_tokenizer_vocab_size(tok), err, sizeof err);
        if (!ds) printf("\n  %s\n", err);
        CU_ASSERT_FATAL(ds != NULL);
        CU_ASSERT(zt_data_has_segments(ds));
        json_t *ids = json_object_get(c, "input_ids"), *labels = json_object_get(c, "labels");
        json_t *mask = json_object_get(c, "attention_mask"), *posj = json_object_get(c, "position_ids");
        CU_ASSERT_FATAL(zt_data_num_samples(ds) == (int64_t)json_array_size(ids));
        int32_t *inp = zt_malloc((size_t)T * 4), *tgt = zt_malloc((size_t)T * 4), *seg = zt_malloc((size_t)T * 4),
                *pos = zt_malloc((size_t)T * 4);
        long bad = 0, dropped = 0, loss = 0;
        for (int64_t g = 0; g < zt_data_num_samples(ds); g++) {
            CU_ASSERT_FATAL(zt_data_read_row(ds, g, 0, 0, inp, tgt, seg, pos, err, sizeof err) == 0);
            json_t *ri = json_array_get(ids, (size_t)g), *rl = json_array_get(labels, (size_t)g);
            json_t *rm = json_array_get(mask, (size_t)g), *rp = json_array_get(posj, (size_t)g);
            CU_ASSERT_FATAL(json_array_size(ri) == (size_t)T + 1);
            for (int t = 0; t < T; t++) {
                const int32_t m = jid(json_array_get(rm, (size_t)t)), m1 = jid(json_array_get(rm, (size_t)t + 1));
                const int32_t y = jid(json_array_get(rl, (size_t)t + 1)), want = y == -100 ? -1 : y;
                bad += inp[t] != jid(json_array_get(ri, (size_t)t)) || seg[t] != m ||
                       pos[t] != jid(json_array_get(rp, (size_t)t));
                if (m1 != m && want >= 0) { /* the next sample's first label: dropped */
                    dropped++;
                    bad += tgt[t] != -1;
                } else {
                    bad += tgt[t] != want;
                }
                loss += tgt[t] >= 0;
            }
        }
        printf("\n    %s: %lld rows, %ld loss targets, %ld dropped at sample boundaries, %ld differences", name,
               (long long)zt_data_num_samples(ds), loss, dropped, bad);
        CU_ASSERT(bad == 0);
        CU_ASSERT(loss > 0);
        CU_ASSERT(o.train_on_prompt ? dropped > 0 : dropped == 0);
        checked++;
        free(inp), free(tgt), free(seg), free(pos);
        zt_data_close(ds);
        remove(path);
        zt_sft_samples_free(&s);
        zt_sft_records_free(&recs);
        zt_tokenizer_close(tok);
    }
    CU_ASSERT(checked >= 4);
}

static void t_render(void)
{
    json_t *rs = cases("renders");
    CU_ASSERT_FATAL(json_array_size(rs) == 22); /* each template with and without a system */
    size_t i;
    json_t *r;
    json_array_foreach(rs, i, r) {
        const char *tokdir = fixture(json_string_value(json_object_get(r, "tokenizer")));
        zt_tokenizer_t *tok = zt_tokenizer_load(tokdir, err, sizeof err);
        CU_ASSERT_FATAL(tok != NULL);
        const zt_template_t *t = zt_template_find(json_string_value(json_object_get(r, "template")));
        CU_ASSERT_FATAL(t != NULL);
        zt_template_ids_t ids;
        CU_ASSERT_FATAL(zt_template_special_ids(t, tok, tokdir, &ids, err, sizeof err) == 0);
        json_t *m = json_object_get(r, "msgs");
        const char *msgs[16];
        int n = (int)json_array_size(m);
        for (int k = 0; k < n && k < 16; k++) msgs[k] = json_string_value(json_array_get(m, (size_t)k));
        char *text = zt_template_render(t, tok, &ids, json_string_value(json_object_get(r, "system")), msgs, n);
        const char *want = json_string_value(json_object_get(r, "text"));
        if (strcmp(text, want) != 0) printf("\n  %s: rendered\n%s\n  jinja:\n%s\n", t->name, text, want);
        CU_ASSERT(strcmp(text, want) == 0);
        free(text);
        zt_tokenizer_close(tok);
    }
}

/* Values of LLaMA-Factory's infer_seqlen, computed by hand from its three branches. */
static void t_infer_seqlen(void)
{
    static const int64_t c[][5] = {
        /* source, target, cutoff -> source', target' */
        {10, 3, 20, 10, 3},   /* 2 target < cutoff: the target stays, the source fills the rest */
        {30, 3, 20, 17, 3},   /* ... the source is cut */
        {3, 30, 20, 3, 17},   /* 2 source < cutoff: the target is cut */
        {30, 10, 20, 15, 5},  /* both: int(20 * 10/40) = 5, source 15 */
        {10, 10, 20, 10, 10}, /* both: int(20 * 0.5) = 10, all fits */
        {7, 13, 9, 4, 5},     /* int(9 * 13/20) = int(5.85) = 5, the source gets the other 4 */
        {0, 0, 5, 0, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int64_t s, t;
        zt_sft_infer_seqlen(c[i][0], c[i][1], c[i][2], &s, &t);
        if (s != c[i][3] || t != c[i][4])
            printf("\n  infer_seqlen(%ld, %ld, %ld) = (%ld, %ld), want (%ld, %ld)\n", (long)c[i][0],
                   (long)c[i][1], (long)c[i][2], (long)s, (long)t, (long)c[i][3], (long)c[i][4]);
        CU_ASSERT(s == c[i][3] && t == c[i][4]);
    }
}

/* rc and r of a parse that must fail: one line holding want, naming the file bad.json */
static int refused(int rc, zt_sft_records_t *r, const char *text, const char *want)
{
    if (rc == 0) {
        zt_sft_records_free(r);
        printf("\n  accepted: %s\n", text);
        return 0;
    }
    const int ok = strstr(err, want) != NULL && strncmp(err, "bad.json", 8) == 0 && !strchr(err, '\n');
    if (!ok) printf("\n  error '%s' lacks '%s'\n", err, want);
    return ok;
}

static int parse_fails(const char *text, zt_sft_format_t fmt, const char *want)
{
    zt_sft_records_t r;
    return refused(zt_sft_parse("bad.json", text, strlen(text), fmt, &r, err, sizeof err), &r, text, want);
}

static void t_bad_data(void)
{
    CU_ASSERT(parse_fails("[{\"instruction\": \"a\", \"output\": }]", ZT_SFT_ALPACA, "bad.json:1:"));
    CU_ASSERT(parse_fails("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": 1", ZT_SFT_ALPACA,
                          "bad.json:2:"));
    CU_ASSERT(parse_fails("[{\"instruction\": \"a\", \"output\": \"b\"}, {\"instruction\": \"a\"}]", ZT_SFT_ALPACA,
                          "bad.json: record 1: output: missing"));
    CU_ASSERT(parse_fails("[{\"instruction\": \"a\", \"output\": 3}]", ZT_SFT_ALPACA, "record 0: output: not a string"));
    CU_ASSERT(parse_fails("{\"instruction\": \"a\", \"output\": \"b\", \"history\": [[\"q\"]]}\n", ZT_SFT_ALPACA,
                          "record 0 (line 1): history[0]: not an [instruction, response] pair"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}]}]", ZT_SFT_SHAREGPT,
                          "record 0: conversations[0].from: 'gpt' where 'human' is expected"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"system\", \"value\": \"s\"}, {\"from\": \"human\", "
                          "\"value\": \"q\"}, {\"from\": \"human\", \"value\": \"q\"}]}]",
                          ZT_SFT_SHAREGPT, "conversations[2].from: 'human' where 'gpt' is expected"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}]}]", ZT_SFT_SHAREGPT,
                          "conversations: ends with a 'human' turn"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": "
                          "\"function_call\", \"value\": \"{}\"}]}]",
                          ZT_SFT_SHAREGPT, "conversations[1].from: 'function_call': tool turns are not supported"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": "
                          "\"observation\", \"value\": \"{}\"}]}]",
                          ZT_SFT_SHAREGPT, "'observation': tool turns are not supported"));
    CU_ASSERT(parse_fails("[{\"conversations\": [{\"from\": \"human\"}]}]", ZT_SFT_SHAREGPT,
                          "conversations[0].value: missing"));
    CU_ASSERT(parse_fails("[{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", "
                          "\"content\": \"x\"}]}]",
                          ZT_SFT_MESSAGES, "messages[1].role: 'tool'"));
    CU_ASSERT(parse_fails("[{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}]",
                          ZT_SFT_MESSAGES, "messages[0].content: not a string"));
    CU_ASSERT(parse_fails("[{\"conversations\": []}]", ZT_SFT_MESSAGES, "record 0: messages: missing"));
    CU_ASSERT(parse_fails("[3]", ZT_SFT_ALPACA, "record 0: not a JSON object"));
    CU_ASSERT(parse_fails("  \n", ZT_SFT_ALPACA, "no records"));
    /* accepted: JSON Lines with blank lines, null optional keys */
    zt_sft_records_t r;
    const char *ok = "\n{\"instruction\": \"a\", \"input\": null, \"output\": \"b\", \"system\": null}\n\n"
                     "{\"instruction\": \"c\", \"input\": \"d\", \"output\": \"e\"}\n";
    CU_ASSERT_FATAL(zt_sft_parse("ok.jsonl", ok, strlen(ok), ZT_SFT_ALPACA, &r, err, sizeof err) == 0);
    CU_ASSERT(r.n == 2 && r.rec[1].nmsgs == 2 && strcmp(r.rec[1].msgs[0], "c\nd") == 0 &&
              strcmp(r.rec[0].msgs[0], "a") == 0 && strcmp(r.rec[0].system, "") == 0);
    zt_sft_records_free(&r);
}

/* zt_sft_index + zt_sft_parse_range, what the ranks use to share a file: the byte scan
 * finds a JSON array's elements through strings with brackets, escaped quotes, nesting
 * and bare scalars; any share of the records converts to what the whole parse gives
 * them (global indices in errors); and an array the scan rejects, or a syntax error in a
 * share, gives jansson's message for the whole file, before any record's content. */
#define ALPACA_COLS zt_sft_columns(ZT_SFT_ALPACA, 0)

static void t_index_ranges(void)
{
    const char *arr = " [ {\"instruction\": \"a ] } [\", \"output\": \"b \\\" ]\"},\n"
                      "{\"instruction\": \"c\", \"output\": \"d\", \"history\": [[\"x\", \"{y}\"]]} ,"
                      "{\"instruction\":\"e\",\"output\":\"f\",\"input\":\"\\\\\"}, 7 ]\n ";
    const char *lines = "{\"instruction\": \"a\", \"output\": \"b\"}\n\n  \n{\"instruction\": \"c\", \"output\": \"d\"}\r\n"
                        "{\"instruction\": \"e\", \"output\": 5}\n";
    zt_sft_index_t ix;
    CU_ASSERT_FATAL(zt_sft_index("arr.json", arr, strlen(arr), &ix, err, sizeof err) == 0);
    CU_ASSERT(ix.array && ix.n == 4 && ix.off[3] == (size_t)(strrchr(arr, '7') - arr) && ix.len[3] == 1);
    zt_sft_records_t whole, part;
    /* the whole fails at record 3 (a bare 7), a share that stops before it does not */
    CU_ASSERT(zt_sft_parse("arr.json", arr, strlen(arr), ZT_SFT_ALPACA, &whole, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "arr.json: record 3: not a JSON object") != NULL);
    CU_ASSERT(zt_sft_parse_range("arr.json", arr, strlen(arr), &ix, 3, 4, ALPACA_COLS, &part, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "arr.json: record 3: not a JSON object") != NULL);
    CU_ASSERT_FATAL(zt_sft_parse_range("arr.json", arr, strlen(arr), &ix, 1, 3, ALPACA_COLS, &part, err,
                                       sizeof err) == 0);
    CU_ASSERT(part.n == 2 && part.rec[0].nmsgs == 4 && strcmp(part.rec[0].msgs[1], "{y}") == 0 &&
              strcmp(part.rec[1].msgs[0], "e\n\\") == 0);
    zt_sft_records_free(&part);
    CU_ASSERT_FATAL(zt_sft_parse_range("arr.json", arr, strlen(arr), &ix, 0, 1, ALPACA_COLS, &part, err,
                                       sizeof err) == 0);
    CU_ASSERT(part.n == 1 && strcmp(part.rec[0].msgs[0], "a ] } [") == 0 && strcmp(part.rec[0].msgs[1], "b \" ]") == 0);
    zt_sft_records_free(&part);
    zt_sft_index_free(&ix);
    /* JSON Lines: blank lines skipped, each record keeps its line */
    CU_ASSERT_FATAL(zt_sft_index("l.jsonl", lines, strlen(lines), &ix, err, sizeof err) == 0);
    CU_ASSERT(!ix.array && ix.n == 3 && ix.line[0] == 1 && ix.line[1] == 4 && ix.line[2] == 5);
    CU_ASSERT(zt_sft_parse_range("l.jsonl", lines, strlen(lines), &ix, 1, 3, ALPACA_COLS, &part, err, sizeof err) ==
              -1);
    CU_ASSERT(strstr(err, "l.jsonl: record 2 (line 5): output: not a string") != NULL);
    zt_sft_index_free(&ix);
    /* rejected arrays: the message jansson gives the whole file */
    const char *bad[] = {"[1,]", "[{} {}]", "[{}] x", "[{\"a\": \"]\"", "[", "[{\"instruction\": }]", "[{]}]",
                         "[\"a\" 1]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_error_t je;
        json_t *j = json_loadb(bad[i], strlen(bad[i]), 0, &je);
        CU_ASSERT_FATAL(j == NULL);
        char want[ZT_ERRLEN];
        snprintf(want, sizeof want, "b.json:%d:%d: not JSON: %s", je.line, je.column, je.text);
        const int rc = zt_sft_parse("b.json", bad[i], strlen(bad[i]), ZT_SFT_ALPACA, &whole, err, sizeof err);
        if (strcmp(err, want)) printf("\n  %s: '%s', jansson '%s'\n", bad[i], err, want);
        CU_ASSERT(rc != 0 && strcmp(err, want) == 0);
    }
    /* a content error in record 0 and a syntax error in record 2: the syntax error, also
     * from a share that holds both, and ZT_SFT_SYNTAX tells it apart */
    const char *mixed = "[{\"instruction\": \"a\"}, {\"instruction\": \"b\", \"output\": \"c\"}, {\"output\": tru}]";
    CU_ASSERT_FATAL(zt_sft_index("m.json", mixed, strlen(mixed), &ix, err, sizeof err) == 0);
    CU_ASSERT(zt_sft_parse_range("m.json", mixed, strlen(mixed), &ix, 0, 3, ALPACA_COLS, &part, err, sizeof err) ==
              ZT_SFT_SYNTAX);
    CU_ASSERT(strncmp(err, "m.json:1:", 9) == 0 && strstr(err, "not JSON") != NULL);
    CU_ASSERT(zt_sft_parse_range("m.json", mixed, strlen(mixed), &ix, 0, 2, ALPACA_COLS, &part, err, sizeof err) ==
              -1);
    CU_ASSERT(strstr(err, "m.json: record 0: output: missing") != NULL);
    zt_sft_index_free(&ix);
}

static void t_special_ids(void)
{
    /* llama3's <|eot_id|> is not in the gpt2 fixture: refused, naming it */
    const char *dir = fixture("tok/gpt2");
    zt_tokenizer_t *tok = zt_tokenizer_load(dir, err, sizeof err);
    CU_ASSERT_FATAL(tok != NULL);
    zt_template_ids_t ids;
    CU_ASSERT(zt_template_special_ids(zt_template_find("llama3"), tok, dir, &ids, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "<|eot_id|>") != NULL);
    CU_ASSERT(zt_template_find("chatml") == NULL);
    /* options LLaMA-Factory refuses */
    zt_sft_opts_t o = {zt_template_find("qwen"), {-1, 0, 0}, 64, 1, 1, 0, 0};
    zt_sft_records_t r = {0};
    zt_sft_samples_t s;
    CU_ASSERT(zt_sft_build(&o, tok, &r, &s, err, sizeof err) != 0 && strstr(err, "mask_history"));
    zt_tokenizer_close(tok);
}

/* One 1-D dataset of an SFT file, whole (NULL when absent). */
static void *h5_read(hid_t f, const char *name, hid_t type, size_t elem, size_t *n)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t dim = 0;
    void *v = NULL;
    if (sp >= 0 && H5Sget_simple_extent_dims(sp, &dim, NULL) == 1) {
        v = zt_malloc(dim ? dim * elem : 1);
        if (dim && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) free(v), v = NULL;
    }
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    *n = (size_t)dim;
    return v;
}

/* A fixture's cases.json (NULL, said why, when unreadable) */
static json_t *load_cases(const char *name)
{
    json_error_t je;
    json_t *d = json_load_file(fixture(name), 0, &je);
    if (!d) printf("\n  %s:%d: %s\n", name, je.line, je.text);
    return d;
}

/* tests/reference/sft/dataset_info/cases.json (make_dataset_info_fixtures.py): every
 * data.dataset of a case through zt_datasets_load and zt_sft_prep, as the trainer makes
 * each entry's sample file, concatenated in the names' order = LLaMA-Factory's samples
 * (its get_dataset_list, _load_single_dataset with num_samples' numpy draws from the
 * case's seed and max_samples, converters, supervised processor). */
static void t_dataset_info(void)
{
    json_t *d = load_cases("dataset_info/cases.json"), *cs = json_object_get(d, "cases");
    CU_ASSERT_FATAL(json_array_size(cs) >= 19);
    size_t i;
    json_t *c;
    json_array_foreach(cs, i, c) {
        const char *names = json_string_value(json_object_get(c, "dataset"));
        zt_datasets_t ds;
        int rc = zt_datasets_load(fixture("dataset_info"), names, &ds, err, sizeof err);
        if (rc) printf("\n  %s: %s\n", names, err);
        CU_ASSERT_FATAL(rc == 0);
        json_t *ids = json_object_get(c, "input_ids"), *labels = json_object_get(c, "labels");
        size_t k = 0, draws[64];
        int ok = 1, nd = 0;
        for (int e = 0; ok && e < ds.n; e++) {
            zt_sft_prep_t p = {.tokenizer = fixture(json_string_value(json_object_get(c, "tokenizer"))),
                               .template_name = json_string_value(json_object_get(c, "template")),
                               .cutoff_len = (int)json_integer_value(json_object_get(c, "cutoff_len")),
                               .max_samples = (long)json_integer_value(json_object_get(c, "max_samples")),
                               .columns = &ds.v[e].columns,
                               .one_dataset = 1,
                               .num_samples = ds.v[e].num_samples,
                               .num_samples_seed = (long)json_integer_value(json_object_get(c, "seed")),
                               .prior_draws = draws,
                               .nprior = nd};
            if (ds.v[e].num_samples) { /* the next draws from where this one leaves numpy's state */
                CU_ASSERT_FATAL(nd < 32 && zt_sft_count_records((const char *const *)ds.v[e].files, ds.v[e].nfiles,
                                                                &draws[2 * nd], err, sizeof err) == 0);
                draws[2 * nd++ + 1] = (size_t)ds.v[e].num_samples;
            }
            char path[256];
            snprintf(path, sizeof path, "/tmp/zt_test_dsinfo_%d.h5", (int)getpid());
            rc = zt_sft_prep(&p, (const char *const *)ds.v[e].files, ds.v[e].nfiles, path, NULL, err, sizeof err);
            if (rc) printf("\n  %s: %s\n", names, err);
            CU_ASSERT_FATAL(rc == 0);
            hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
            CU_ASSERT_FATAL(f >= 0);
            size_t nt, nl, no;
            int32_t *ti = h5_read(f, "input_ids", H5T_NATIVE_INT32, 4, &nt);
            int32_t *tl = h5_read(f, "labels", H5T_NATIVE_INT32, 4, &nl);
            int64_t *off = h5_read(f, "sample_offsets", H5T_NATIVE_INT64, 8, &no);
            H5Fclose(f);
            remove(path);
            CU_ASSERT_FATAL(ti && tl && off && nt == nl && no >= 1);
            for (size_t s = 0; ok && s + 1 < no; s++, k++) {
                const size_t a = (size_t)off[s], n = (size_t)(off[s + 1] - off[s]);
                ok = k < json_array_size(ids) && same_ids("input_ids", names, k, json_array_get(ids, k), ti + a, n) &&
                     same_ids("labels", names, k, json_array_get(labels, k), tl + a, n);
                if (k >= json_array_size(ids)) printf("\n  %s: more samples than LLaMA-Factory's\n", names);
            }
            free(ti), free(tl), free(off);
        }
        if (ok && k != json_array_size(ids)) printf("\n  %s: %zu samples, LLaMA-Factory %zu\n", names, k,
                                                    json_array_size(ids));
        CU_ASSERT(ok && k == json_array_size(ids));
        zt_datasets_free(&ds);
    }
    json_decref(d);
}

/* zt_datasets_load refuses what ztrain cannot serve, in one line naming the entry and the field. */
static int dsinfo_fails(const char *names, const char *want)
{
    zt_datasets_t ds;
    if (zt_datasets_load(fixture("dataset_info"), names, &ds, err, sizeof err) == 0) {
        zt_datasets_free(&ds);
        printf("\n  accepted: %s\n", names);
        return 0;
    }
    if (!strstr(err, want) || strchr(err, '\n')) printf("\n  error '%s' lacks '%s'\n", err, want);
    return strstr(err, want) != NULL && strchr(err, '\n') == NULL && ds.n == 0;
}

static void t_dataset_info_refusals(void)
{
    static const char *const refused[][2] = { /* data.dataset, the error */
        {"hub", "dataset_info.json: hub: hf_hub_url: ztrain reads local files only"},
        {"hub_and_file", "hub_and_file: ms_hub_url: ztrain reads local files only"},
        {"script", "script: script_url: ztrain reads local files only"},
        {"cloud", "cloud: cloud_file_name: ztrain reads local files only"},
        {"plain, ranked", "ranked: columns.chosen: not mapped: a ranking dataset's pairs need"},
        {"kto", "kto: columns.kto_tag: KTO's preference data: KTO training is not available"},
        {"pictures", "pictures: columns.images: ztrain trains on text only"},
        {"videos", "videos: columns.videos: ztrain trains on text only"},
        {"tools", "tools: columns.tools: tool descriptions are not supported"},
        {"openai", "openai: formatting 'openai': not read by ztrain"},
        {"yaml_format", "yaml_format: formatting 'yaml': expected alpaca or sharegpt"},
        {"bad_samples", "bad_samples: num_samples: not a positive integer"},
        {"test_split", "test_split: split: a local file has the split train only"},
        {"typo", "typo: 'colums': not a key LLaMA-Factory reads (did you mean 'columns'?)"},
        {"column_typo", "column_typo: columns: 'promt': not a key LLaMA-Factory reads (did you mean 'prompt'?)"},
        {"no_response", "no_response: columns.response: not mapped"},
        {"no_user_tag", "no_user_tag: tags.user_tag: not mapped"},
        {"csv", "csv: file_name: "},
        {"missing", "missing: file_name: "},
        {"no_file", "no_file: file_name: missing"},
        {"plian", "plian: no such dataset (did you mean 'plain'?)"},
        {"plain,,custom", "an empty dataset name in 'plain,,custom'"},
        {"plain, plain", "plain: named twice"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        CU_ASSERT(dsinfo_fails(refused[i][0], refused[i][1]));
    /* a directory's files in name order, whatever order the file system lists them in (written
     * scrambled: ext4 lists in hash order, tmpfs newest first); ztrain's own caches skipped, any
     * other file refused */
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "/tmp/zt_test_dsdir_%d", (int)getpid());
    snprintf(path, sizeof path, "%s/d", dir);
    CU_ASSERT_FATAL(zt_mkdir_p(path, err, sizeof err) == 0);
    const char *names = "mcxaqbzekf", *extra[] = {"d/old.json.0123.sft.h5", "dataset_info.json"};
    for (const char *c = names; *c; c++) {
        snprintf(path, sizeof path, "%s/d/%c.json%s", dir, *c, *c > 'm' ? "l" : "");
        FILE *f = fopen(path, "w");
        CU_ASSERT_FATAL(f != NULL);
        fputs("{\"instruction\": \"a\", \"output\": \"b\"}\n", f);
        fclose(f);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, extra[i]);
        FILE *f = fopen(path, "w");
        CU_ASSERT_FATAL(f != NULL);
        fputs("{\"d\": {\"file_name\": \"d\"}}\n", f);
        fclose(f);
    }
    zt_datasets_t ds;
    CU_ASSERT_FATAL(zt_datasets_load(dir, "d", &ds, err, sizeof err) == 0);
    CU_ASSERT(ds.n == 1 && ds.v[0].nfiles == (int)strlen(names));
    for (int i = 1; i < ds.v[0].nfiles; i++) CU_ASSERT(strcmp(ds.v[0].files[i - 1], ds.v[0].files[i]) < 0);
    zt_datasets_free(&ds);
    snprintf(path, sizeof path, "%s/d/notes.txt", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fclose(f);
    CU_ASSERT(zt_datasets_load(dir, "d", &ds, err, sizeof err) != 0 && strstr(err, ": d: file_name: ") &&
              strstr(err, "/d/notes.txt: not a .json or .jsonl file"));
    zt_rm_rf(dir);
    CU_ASSERT(zt_datasets_load("/nonexistent", "plain", &ds, err, sizeof err) != 0 &&
              strstr(err, "/nonexistent/dataset_info.json"));
}

/* A row of zt_data_read_row (T positions) = LLaMA-Factory's sample: input_ids[0 .. n-1) and
 * labels[1 .. n) (-100 -> -1), cut at T, then padding without a target. */
static int row_is(json_t *ids, json_t *labels, const int32_t *inp, const int32_t *tgt, int T)
{
    const int n = (int)ZT_MIN(json_array_size(ids), (size_t)T + 1);
    for (int t = 0; t < T; t++) {
        const int32_t y = t < n - 1 ? jid(json_array_get(labels, (size_t)t + 1)) : -1;
        if ((t < n - 1 && inp[t] != jid(json_array_get(ids, (size_t)t))) || tgt[t] != (y == -100 ? -1 : y)) return 0;
    }
    return 1;
}

/* zt_data_open_pairs: pair g of the epoch, in file order and shuffled, is both rows of one
 * pair of LLaMA-Factory's (want: chosen ids, labels, rejected ids, labels), each pair once. */
static int pair_rows(const char *path, const char *what, json_t *const want[4])
{
    enum { T = 48 }; /* cuts the longer samples */
    zt_dataset_t *ds = zt_data_open_pairs((const char *[]){path}, 1, T, 1 << 20, err, sizeof err);
    const int64_t n = (int64_t)json_array_size(want[0]);
    if (!ds || zt_data_num_samples(ds) != n || !zt_data_is_pairs(ds)) {
        printf("\n  %s: zt_data_open_pairs: %s\n", what, ds ? "not one sample per pair" : err);
        zt_data_close(ds);
        return 0;
    }
    int32_t inp[2 * T], tgt[2 * T];
    int ok = zt_data_read_row(ds, 0, 0, 0, inp, tgt, NULL, NULL, err, sizeof err) != 0; /* no single rows */
    char *seen = zt_calloc((size_t)n, 1);
    for (int shuffle = 0; ok && shuffle < 2; shuffle++) {
        memset(seen, 0, (size_t)n);
        for (int64_t g = 0; ok && g < n; g++) {
            const int64_t p = zt_data_sample_index(ds, g, 1234, shuffle);
            ok = zt_data_read_pair_rows(ds, g, 1234, shuffle, inp, tgt, NULL, NULL, err, sizeof err) == 0 &&
                 p >= 0 && p < n && !seen[p]++ &&
                 row_is(json_array_get(want[0], (size_t)p), json_array_get(want[1], (size_t)p), inp, tgt, T) &&
                 row_is(json_array_get(want[2], (size_t)p), json_array_get(want[3], (size_t)p), inp + T, tgt + T, T);
            if (!ok) printf("\n  %s: pair row %lld (shuffle %d, pair %lld) differs\n", what, (long long)g, shuffle,
                            (long long)p);
        }
    }
    free(seen);
    zt_data_close(ds);
    return ok;
}

/* A preference pairs file (zt_sft_prep with ranking): the root attribute pairs = 1, sample 2i
 * = chosen i and 2i + 1 = rejected i of LLaMA-Factory's pairwise processor; and the trainer's
 * zt_data_open refuses it, naming the file. */
static int same_pairs(const char *path, const char *what, json_t *c)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return printf("\n  %s: %s: not HDF5\n", what, path), 0;
    int pairs = 0;
    hid_t a = H5Aexists(f, "pairs") > 0 ? H5Aopen(f, "pairs", H5P_DEFAULT) : -1;
    if (a >= 0) H5Aread(a, H5T_NATIVE_INT, &pairs), H5Aclose(a);
    size_t nt, nl, no;
    int32_t *ti = h5_read(f, "input_ids", H5T_NATIVE_INT32, 4, &nt);
    int32_t *tl = h5_read(f, "labels", H5T_NATIVE_INT32, 4, &nl);
    int64_t *off = h5_read(f, "sample_offsets", H5T_NATIVE_INT64, 8, &no);
    const int segs = H5Lexists(f, "segment_ids", H5P_DEFAULT) > 0;
    H5Fclose(f);
    json_t *want[4] = {json_object_get(c, "chosen_input_ids"), json_object_get(c, "chosen_labels"),
                       json_object_get(c, "rejected_input_ids"), json_object_get(c, "rejected_labels")};
    const size_t n = json_array_size(want[0]);
    int ok = ti && tl && off && nt == nl && pairs == 1 && !segs && no == 2 * n + 1;
    if (!ok) printf("\n  %s: pairs %d, %zu samples, LLaMA-Factory %zu pairs\n", what, pairs, no ? no - 1 : 0, n);
    for (size_t i = 0; ok && i < n; i++)
        for (int k = 0; ok && k < 2; k++) {
            const size_t s = 2 * i + (size_t)k, b = (size_t)off[s], len = (size_t)(off[s + 1] - off[s]);
            ok = same_ids(k ? "rejected input_ids" : "chosen input_ids", what, i, json_array_get(want[2 * k], i),
                          ti + b, len) &&
                 same_ids(k ? "rejected labels" : "chosen labels", what, i, json_array_get(want[2 * k + 1], i),
                          tl + b, len);
        }
    free(ti), free(tl), free(off);
    zt_dataset_t *ds = zt_data_open((const char *[]){path}, 1, 64, 1 << 20, err, sizeof err);
    if (ds || !strstr(err, "preference pairs need train.stage = dpo") || !strstr(err, path)) {
        printf("\n  %s: zt_data_open: %s\n", what, ds ? "accepted a pairs file" : err);
        ok = 0;
    }
    zt_data_close(ds);
    return ok && pair_rows(path, what, want);
}

/* tests/reference/sft/pairwise/cases.json (make_pairwise_fixtures.py): each "ranking": true
 * entry through zt_datasets_load and zt_sft_prep, as the trainer makes its file, and the
 * entries whose names are data.format's (alpaca_pairs, sharegpt_pairs, messages_pairs)
 * also as data.format with data.ranking (zt-prep-data --format F --ranking) = LLaMA-Factory's
 * converters and PairwiseDatasetProcessor, every template and cutoff_len. */
static void t_pairwise(void)
{
    json_t *d = load_cases("pairwise/cases.json"), *cs = json_object_get(d, "cases");
    CU_ASSERT_FATAL(json_array_size(cs) >= 36);
    char path[256];
    snprintf(path, sizeof path, "/tmp/zt_test_pairs_%d.h5", (int)getpid());
    size_t i, formats = 0;
    json_t *c;
    json_array_foreach(cs, i, c) {
        const char *name = json_string_value(json_object_get(c, "dataset"));
        char what[128];
        snprintf(what, sizeof what, "%s %s cutoff %d", name, json_string_value(json_object_get(c, "template")),
                 (int)json_integer_value(json_object_get(c, "cutoff_len")));
        zt_datasets_t ds;
        int rc = zt_datasets_load(fixture("pairwise"), name, &ds, err, sizeof err);
        if (rc) printf("\n  %s: %s\n", name, err);
        CU_ASSERT_FATAL(rc == 0 && ds.n == 1 && ds.v[0].columns.ranking);
        zt_sft_prep_t p = {.tokenizer = fixture(json_string_value(json_object_get(c, "tokenizer"))),
                           .template_name = json_string_value(json_object_get(c, "template")),
                           .cutoff_len = (int)json_integer_value(json_object_get(c, "cutoff_len")),
                           .columns = &ds.v[0].columns,
                           .one_dataset = 1};
        rc = zt_sft_prep(&p, (const char *const *)ds.v[0].files, ds.v[0].nfiles, path, NULL, err, sizeof err);
        if (rc) printf("\n  %s: %s\n", what, err);
        CU_ASSERT(rc == 0 && same_pairs(path, what, c));
        remove(path);
        /* data.format's fixed names */
        static const char *const fmts[][2] = {{"alpaca_pairs", "alpaca"}, {"sharegpt_pairs", "sharegpt"},
                                              {"messages_pairs", "messages"}};
        for (int k = 0; k < 3; k++) {
            if (strcmp(name, fmts[k][0]) != 0) continue;
            p.columns = NULL, p.one_dataset = 0;
            p.format = fmts[k][1];
            p.ranking = 1;
            rc = zt_sft_prep(&p, (const char *const *)ds.v[0].files, 1, path, NULL, err, sizeof err);
            if (rc) printf("\n  data.format %s: %s\n", what, err);
            CU_ASSERT(rc == 0 && same_pairs(path, what, c));
            remove(path);
            formats++;
        }
        zt_datasets_free(&ds);
    }
    CU_ASSERT(formats >= 27);
    json_decref(d);
}

/* Bad preference records: one line naming the file, the record and the key. */
static int pair_fails(const char *text, zt_sft_format_t fmt, const char *want)
{
    zt_sft_index_t ix;
    zt_sft_records_t r;
    int rc = zt_sft_index("bad.json", text, strlen(text), &ix, err, sizeof err);
    if (rc == 0) rc = zt_sft_parse_range("bad.json", text, strlen(text), &ix, 0, ix.n, zt_sft_columns(fmt, 1), &r, err,
                                         sizeof err);
    zt_sft_index_free(&ix);
    return refused(rc, &r, text, want);
}

static void t_pairwise_refusals(void)
{
    /* alpaca */
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"rejected\": \"b\"}]", ZT_SFT_ALPACA,
                         "bad.json: record 0: chosen: missing"));
    CU_ASSERT(pair_fails("{\"instruction\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
                         "{\"instruction\": \"q\", \"chosen\": \"a\"}\n",
                         ZT_SFT_ALPACA, "bad.json: record 1 (line 2): rejected: missing"));
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"chosen\": \"\", \"rejected\": \"b\"}]", ZT_SFT_ALPACA,
                         "record 0: chosen: empty: a preference pair needs both answers"));
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"chosen\": \"a\", \"rejected\": \"\"}]", ZT_SFT_ALPACA,
                         "record 0: rejected: empty"));
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"chosen\": \"a\", \"rejected\": null}]", ZT_SFT_ALPACA,
                         "record 0: rejected: not a string"));
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\"}, "
                         "{\"instruction\": \"q\", \"chosen\": \"same\", \"rejected\": \"same\"}]",
                         ZT_SFT_ALPACA, "record 1: chosen and rejected are the same answer"));
    CU_ASSERT(pair_fails("[{\"instruction\": \"q\", \"chosen\": {\"from\": \"gpt\", \"value\": \"a\"}, "
                         "\"rejected\": \"b\"}]", ZT_SFT_ALPACA, "record 0: chosen: not a string"));
    /* sharegpt / messages: the prompt ends with the user's turn, the answers are the assistant's */
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", "
                         "\"value\": \"a\"}], \"chosen\": {\"from\": \"gpt\", \"value\": \"a\"}, "
                         "\"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: conversations: ends with a 'gpt' turn: a preference pair's "
                                          "prompt ends with the 'human' turn"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"gpt\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"gpt\", \"value\": \"a\"}, \"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: conversations[0].from: 'gpt' where 'human' is expected"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"human\", \"value\": \"a\"}, \"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: chosen.from: 'human' where 'gpt' is expected"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"gpt\", \"value\": \"a\"}, \"rejected\": {\"from\": \"function_call\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: rejected.from: 'function_call': tool turns are not supported"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": \"a\", "
                         "\"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: chosen: not a turn"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"gpt\", \"value\": \"a\"}}]", ZT_SFT_SHAREGPT, "record 0: rejected: missing"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"gpt\"}, \"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: chosen.value: missing"));
    CU_ASSERT(pair_fails("[{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}], \"chosen\": {\"from\": "
                         "\"gpt\", \"value\": \"\"}, \"rejected\": {\"from\": \"gpt\", \"value\": \"b\"}}]",
                         ZT_SFT_SHAREGPT, "record 0: chosen: empty"));
    CU_ASSERT(pair_fails("[{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": {\"role\": "
                         "\"assistant\", \"content\": \"x\"}, \"rejected\": {\"role\": \"assistant\", \"content\": "
                         "\"x\"}}]", ZT_SFT_MESSAGES, "record 0: chosen and rejected are the same answer"));
    CU_ASSERT(pair_fails("[{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": {\"role\": "
                         "\"user\", \"content\": \"x\"}, \"rejected\": {\"role\": \"assistant\", \"content\": "
                         "\"y\"}}]", ZT_SFT_MESSAGES, "record 0: chosen.role: 'user' where 'assistant' is expected"));
    /* dataset_info.json entries */
    static const char *const refused[][2] = {
        {"ranked_unmapped", "pairwise/dataset_info.json: ranked_unmapped: columns.chosen: not mapped: a ranking "
                            "dataset's pairs need their chosen and rejected answers"},
        {"ranked_no_rejected", "ranked_no_rejected: columns.rejected: not mapped"},
        {"chosen_unranked", "chosen_unranked: columns.chosen: read only with \"ranking\": true"},
        {"ranking_string", "ranking_string: ranking: not true or false"},
        {"kto", "kto: columns.kto_tag: KTO's preference data: KTO training is not available"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        zt_datasets_t ds;
        const int rc = zt_datasets_load(fixture("pairwise"), refused[i][0], &ds, err, sizeof err);
        if (rc == 0) zt_datasets_free(&ds);
        if (rc == 0 || !strstr(err, refused[i][1])) printf("\n  %s: '%s'\n", refused[i][0], rc ? err : "accepted");
        CU_ASSERT(rc != 0 && strstr(err, refused[i][1]) && !strchr(err, '\n'));
    }
    /* what LLaMA-Factory's pairwise processor does not read: refused, not ignored */
    const char *dir = fixture("tok/qwen");
    zt_tokenizer_t *tok = zt_tokenizer_load(dir, err, sizeof err);
    CU_ASSERT_FATAL(tok != NULL);
    static const char *const opt[] = {"packing", "train_on_prompt", "mask_history", "packing"};
    for (int k = 0; k < 4; k++) {
        zt_sft_opts_t o = {.tpl = zt_template_find("qwen"), .cutoff_len = 64, .ranking = 1, .packing = k == 0,
                           .train_on_prompt = k == 1, .mask_history = k == 2, .neat_packing = k == 3};
        zt_sft_records_t r = {0};
        zt_sft_samples_t s;
        CU_ASSERT(zt_sft_build(&o, tok, &r, &s, err, sizeof err) != 0 && strstr(err, opt[k]) &&
                  strstr(err, "not for preference pairs"));
    }
    zt_tokenizer_close(tok);
    /* a pairs file is whole pairs */
    const int32_t ids[3] = {1, 2, 3};
    const int64_t off[4] = {0, 1, 2, 3};
    CU_ASSERT(zt_data_write_pairs_h5("/tmp/zt_test_odd_pairs.h5", ids, ids, 3, off, 3, 10, 0, "hf", err, sizeof err) !=
                  0 && strstr(err, "3 samples: not whole preference pairs"));
    /* and only a pairs file is read as pairs */
    char path[128];
    snprintf(path, sizeof path, "/tmp/zt_test_sft_%d.h5", (int)getpid());
    CU_ASSERT_FATAL(zt_data_write_sft_h5(path, ids, ids, NULL, 3, off, 3, 10, 0, "hf", err, sizeof err) == 0);
    zt_dataset_t *ds = zt_data_open_pairs((const char *[]){path}, 1, 8, 10, err, sizeof err);
    CU_ASSERT(ds == NULL && strstr(err, path) && strstr(err, "not a preference pairs file"));
    zt_data_close(ds);
    remove(path);
}

/* numpy's own numbers (numpy 2.4.6): np.random.seed(42); np.random.permutation(10);
 * np.random.choice(10, 5) — and permutation(100000)[:5], whose draws are rejected above
 * a 17-bit mask */
static void t_np_random(void)
{
    static const size_t want[15] = {8, 1, 5, 0, 7, 2, 9, 4, 3, 6, 2, 6, 7, 4, 3};
    static const size_t big[5] = {75721, 80184, 19864, 76699, 92991};
    size_t got[15], *many = zt_malloc(100000 * sizeof *many);
    zt_np_random_t r;
    zt_np_seed(&r, 42);
    zt_np_num_samples(&r, 10, 15, got);
    CU_ASSERT(memcmp(got, want, sizeof want) == 0);
    zt_np_seed(&r, 42);
    zt_np_num_samples(&r, 100000, 5, many);
    CU_ASSERT(memcmp(many, big, sizeof big) == 0);
    free(many);
}

static const zt_test_t tests[] = {
    {"LLaMA-Factory input_ids and labels, every template and option", t_cases},
    {"neat-packed rows = LLaMA-Factory's ids, attention_mask, position_ids", t_neat_rows},
    {"chat text equals LLaMA-Factory's jinja template", t_render},
    {"infer_seqlen", t_infer_seqlen},
    {"bad data: one line naming file, record and key", t_bad_data},
    {"special tokens the template needs", t_special_ids},
    {"records indexed and parsed in shares, as the ranks do", t_index_ranges},
    {"numpy's legacy permutation and choice", t_np_random},
    {"dataset_info.json entries = LLaMA-Factory's samples, every mapping", t_dataset_info},
    {"dataset_info.json: what ztrain cannot serve, one line naming entry and field", t_dataset_info_refusals},
    {"preference pairs = LLaMA-Factory's pairwise samples, dataset_info and data.format", t_pairwise},
    {"preference pairs: bad records, entries and options refused in one line", t_pairwise_refusals},
    {NULL, NULL},
};

ZT_TEST_MAIN("sft", tests)
