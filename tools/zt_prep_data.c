/* zt_prep_data.c — zt-prep-data: text files -> token files for ztrain.
 *
 *   zt-prep-data [--tokenizer DIR|tokenizer.json | --bpe vocab.json merges.txt] [--val-fraction F]
 *                [--eot-between-files] [--eot-at-line STR] [--bin] -o OUT input.txt [more.txt ...]
 *   zt-prep-data --write-byte-tokenizer tokenizer.json
 *   zt-prep-data --tokenizer DIR --format alpaca|sharegpt|messages --template NAME --cutoff-len N
 *                [--train-on-prompt] [--mask-history] [--packing | --neat-packing] [--max-samples N]
 *                [--ranking] -o OUT.h5 DATA.json [more.json ...]
 *
 * Tokenizes the inputs in order (byte-level by default; a Hugging Face
 * tokenizer.json or a model directory with --tokenizer; GPT-2 BPE with --bpe) into
 * one stream, each file (each document with --eot-at-line) encoded as one text,
 * added/special tokens in it included and splits off its last F of tokens (default 0.1) as validation:
 * OUT-train.h5 and OUT-val.h5. With --val-fraction 0, an OUT ending in .h5 (or
 * .bin) is the single output file. A tail split keeps both files contiguous
 * text; callers wanting an interleaved split (tools/gen-data.sh) split the text
 * themselves and run the tool once per part with --val-fraction 0.
 * --eot-at-line STR turns every line that is exactly STR into one EOT (document
 * separators such as the "%" of fortune files), never two EOTs in a row.
 * HDF5 output carries vocab_size, eot_token and tokenizer ("byte" | "gpt2-bpe" | "hf")
 * so the trainer knows how to decode; --bin writes llm.c shards instead.
 * Files are written under a temporary name and renamed, so a failed run never
 * leaves a half-written dataset behind. Serial: no MPI needed.
 * With --format, the inputs are instruction data (JSON or JSON Lines) and the output is
 * one SFT sample file as LLaMA-Factory's supervised processor makes it (zt_sft.h); with
 * --ranking, preference pairs (chosen and rejected answers) as its pairwise processor makes
 * them, written as a pairs file (zt_data_write_pairs_h5). */
#include "zt_tokenizer.h"
#include "zt_common.h"
#include "zt_data.h"
#include "zt_sft.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: zt-prep-data [options] -o OUT input.txt [more.txt ...]\n"
            "  -o OUT                 output prefix: writes OUT-train.h5 and OUT-val.h5;\n"
            "                         with --val-fraction 0, OUT ending in .h5/.bin is the one file\n"
            "  --tokenizer PATH       a Hugging Face tokenizer: a model directory (its tokenizer.json,\n"
            "                         or vocab.json + merges.txt) or a tokenizer.json file; EOT is\n"
            "                         tokenizer_config.json's eos_token, else <|endoftext|> or <|end_of_text|>\n"
            "  --bpe VOCAB MERGES     GPT-2 BPE from vocab.json (encoder.json) and merges.txt\n"
            "                         (default: byte-level, vocab 257, EOT 256)\n"
            "  --write-byte-tokenizer FILE  write the byte-level tokenizer as a tokenizer.json and exit\n"
            "  --val-fraction F       last fraction F of the tokens goes to validation (default 0.1)\n"
            "  --eot-between-files    put the EOT token between consecutive input files\n"
            "  --eot-at-line STR      a line that is exactly STR separates documents: it becomes EOT\n"
            "  --bin                  write llm.c .bin shards instead of HDF5\n"
            "SFT data (instruction JSON / JSON Lines -> /input_ids, /labels, /sample_offsets[, /segment_ids]):\n"
            "  --format F             alpaca | sharegpt | messages (default: tokens, plain text as above)\n"
            "  --template NAME        chat template: default|alpaca|qwen|qwen3|qwen3_nothink|llama3|llama2|mistral|\n"
            "                         gemma|gemma2|gemma3\n"
            "  --cutoff-len N         LLaMA-Factory's cutoff_len (default 2048)\n"
            "  --train-on-prompt      prompt tokens carry loss too\n"
            "  --mask-history         only the last turn's answer carries loss\n"
            "  --packing              greedy-pack samples into rows of cutoff-len tokens\n"
            "  --neat-packing         the same rows, the samples kept apart: /segment_ids (attention\n"
            "                         within a sample, positions from 0), LLaMA-Factory's neat_packing\n"
            "  --max-samples N        only the first N records of each input (LLaMA-Factory's max_samples)\n"
            "  --ranking              preference pairs: the answers are the records' chosen and rejected\n"
            "                         (LLaMA-Factory's \"ranking\": true); sample 2i chosen, 2i+1 rejected\n"
            "  -h, --help             this text\n");
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zt-prep-data: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}


static int write_one(const char *path, const int32_t *tok, size_t n, const zt_tokenizer_t *t, int bin,
                     char *err, size_t errlen)
{
    char tmp[ZT_ERRLEN];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = bin ? zt_data_write_bin(tmp, tok, n, err, errlen)
                 : zt_data_write_h5_tok(tmp, tok, n, zt_tokenizer_vocab_size(t), zt_tokenizer_eot(t),
                                        zt_tokenizer_kind(t), err, errlen);
    if (rc != 0) {
        remove(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return zt_err(err, errlen, "%s: rename from %s: %s", path, tmp, strerror(errno));
    }
    return 0;
}

typedef struct { int32_t *ids; size_t n, cap; } tokens_t;

static void reserve(tokens_t *t, size_t more)
{
    while (t->n + more > t->cap) {
        t->cap *= 2;
        t->ids = realloc(t->ids, t->cap * sizeof *t->ids);
        if (!t->ids) zt_fatal("out of memory: %zu tokens", t->cap);
    }
}

static void append_text(tokens_t *t, zt_tokenizer_t *tok, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t m = 0;
    if (len == 0) return;
    if (zt_tokenizer_encode(tok, text, len, &ids, &m) != 0) zt_fatal("tokenizer failed");
    reserve(t, m);
    memcpy(t->ids + t->n, ids, m * sizeof *ids);
    t->n += m;
    free(ids);
}

/* Never at the start and never twice in a row: empty documents add nothing. */
static void push_eot(tokens_t *t, int eot)
{
    if (t->n == 0 || t->ids[t->n - 1] == eot) return;
    reserve(t, 1);
    t->ids[t->n++] = eot;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *vocab = NULL, *merges = NULL, *tokpath = NULL;
    double val_fraction = 0.1;
    int eot_between = 0, bin = 0;
    const char *sep = NULL;
    const char *format = NULL, *template_name = NULL;
    int cutoff_len = 2048, train_on_prompt = 0, mask_history = 0, packing = 0, neat = 0, ranking = 0;
    long max_samples = 0;
    const char **inputs = zt_calloc((size_t)argc, sizeof *inputs);
    int ninputs = 0;
    char err[ZT_ERRLEN];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o")) {
            if (i + 1 >= argc) return fail("-o needs a path");
            out = argv[++i];
        } else if (!strcmp(a, "--tokenizer")) {
            if (i + 1 >= argc) return fail("--tokenizer needs a directory or a tokenizer.json");
            tokpath = argv[++i];
        } else if (!strcmp(a, "--write-byte-tokenizer")) {
            if (i + 1 >= argc) return fail("--write-byte-tokenizer needs a path");
            if (zt_tokenizer_write_byte_level_json(argv[i + 1], ZT_BYTE_EOT, err, sizeof err) != 0)
                return fail("%s", err);
            printf("zt-prep-data: wrote %s (byte-level, vocab %d, EOT %d)\n", argv[i + 1], ZT_BYTE_VOCAB, ZT_BYTE_EOT);
            return 0;
        } else if (!strcmp(a, "--bpe")) {
            if (i + 2 >= argc) return fail("--bpe needs two files: vocab.json merges.txt");
            vocab = argv[++i];
            merges = argv[++i];
        } else if (!strcmp(a, "--val-fraction")) {
            char *end;
            if (i + 1 >= argc) return fail("--val-fraction needs a value");
            val_fraction = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(val_fraction >= 0 && val_fraction < 1))
                return fail("--val-fraction '%s' is not a number in [0, 1)", argv[i]);
        } else if (!strcmp(a, "--eot-between-files")) {
            eot_between = 1;
        } else if (!strcmp(a, "--eot-at-line")) {
            if (i + 1 >= argc) return fail("--eot-at-line needs a string");
            sep = argv[++i];
        } else if (!strcmp(a, "--format")) {
            if (i + 1 >= argc) return fail("--format needs alpaca, sharegpt or messages");
            format = argv[++i];
        } else if (!strcmp(a, "--template")) {
            if (i + 1 >= argc) return fail("--template needs a name");
            template_name = argv[++i];
        } else if (!strcmp(a, "--cutoff-len")) {
            char *end;
            if (i + 1 >= argc) return fail("--cutoff-len needs a value");
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 1 || v > (1L << 30))
                return fail("--cutoff-len '%s' is not a positive integer", argv[i]);
            cutoff_len = (int)v;
        } else if (!strcmp(a, "--max-samples")) {
            char *end;
            if (i + 1 >= argc) return fail("--max-samples needs a value");
            errno = 0;
            max_samples = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || errno || max_samples < 1)
                return fail("--max-samples '%s' is not a positive integer", argv[i]);
        } else if (!strcmp(a, "--train-on-prompt")) {
            train_on_prompt = 1;
        } else if (!strcmp(a, "--mask-history")) {
            mask_history = 1;
        } else if (!strcmp(a, "--packing")) {
            packing = 1;
        } else if (!strcmp(a, "--neat-packing")) {
            neat = 1;
        } else if (!strcmp(a, "--ranking")) {
            ranking = 1;
        } else if (!strcmp(a, "--bin")) {
            bin = 1;
        } else if (a[0] == '-' && a[1]) {
            usage(stderr);
            return fail("unknown option '%s'", a);
        } else {
            inputs[ninputs++] = a;
        }
    }
    if (!out) {
        usage(stderr);
        return fail("no output given (-o OUT)");
    }
    if (ninputs == 0) {
        usage(stderr);
        return fail("no input text files given");
    }
    if (format && strcmp(format, "tokens") != 0) {
        if (!ends_with(out, ".h5")) return fail("-o %s: an SFT sample file is one .h5 file", out);
        if (!template_name) return fail("--format %s needs --template (%s)", format, zt_template_names());
        if (!tokpath) return fail("--format %s needs --tokenizer", format);
        if (vocab || bin || sep || eot_between) return fail("--bpe, --bin, --eot-* do not apply to --format %s", format);
        zt_sft_prep_t p = {tokpath, format, template_name, cutoff_len, train_on_prompt, mask_history, packing, neat,
                           max_samples, NULL, 0, 0, 0, NULL, 0, ranking};
        zt_sft_prep_stats_t st;
        if (zt_sft_prep(&p, inputs, ninputs, out, &st, err, sizeof err) != 0) return fail("%s", err);
        printf("zt-prep-data: %zu records -> %s: %zu samples, %zu tokens (%zu with loss)%s; %.0f tokens/s\n",
               st.records, out, st.samples, st.tokens, st.loss_tokens,
               ranking ? ", preference pairs" : neat ? ", neat-packed" : packing ? ", packed" : "",
               st.seconds > 0 ? (double)st.tokens / st.seconds : 0.0);
        if (st.unread) printf("zt-prep-data: %zu records past --max-samples %ld not read\n", st.unread, max_samples);
        if (st.dropped) printf("zt-prep-data: %zu samples longer than cutoff_len dropped (packing)\n", st.dropped);
        free(inputs);
        return 0;
    }
    if (template_name || train_on_prompt || mask_history || packing || neat || max_samples || ranking)
        return fail("--template, --train-on-prompt, --mask-history, --packing, --neat-packing, --ranking, "
                    "--max-samples need --format alpaca|sharegpt|messages");
    const char *ext = bin ? ".bin" : ".h5";
    int single = ends_with(out, ".h5") || ends_with(out, ".bin");
    if (single && val_fraction > 0)
        return fail("-o %s names one file: use --val-fraction 0, or give a prefix for OUT-train/-val files",
                    out);
    if (single && !ends_with(out, ext))
        return fail("-o %s: extension does not match the format (%s)", out, ext);

    if (tokpath && vocab) return fail("--tokenizer and --bpe are exclusive");
    zt_tokenizer_t *tok = tokpath ? zt_tokenizer_load(tokpath, err, sizeof err)
                          : vocab ? zt_tokenizer_open_bpe(vocab, merges, err, sizeof err)
                                  : zt_tokenizer_byte();
    if (!tok) return fail("%s", err);
    int eot = zt_tokenizer_eot(tok);
    if ((eot_between || sep) && eot < 0)
        return fail("%s has no end-of-text token (eos_token, <|endoftext|>, <|end_of_text|>) for EOT separators",
                    tokpath ? tokpath : vocab);
    if (bin && zt_tokenizer_vocab_size(tok) > 65536)
        return fail("--bin stores uint16 ids but the vocabulary has more than 65536 tokens");

    tokens_t all = {zt_malloc(1024 * sizeof(int32_t)), 0, 1024};
    for (int k = 0; k < ninputs; k++) {
        size_t len = 0;
        char *text = zt_read_file(inputs[k], &len, err, sizeof err);
        if (!text) return fail("%s", err);
        if (eot_between && k > 0) push_eot(&all, eot);
        size_t doc = 0, seplen = sep ? strlen(sep) : 0;
        for (size_t p = 0; sep && p < len;) {
            char *nl = memchr(text + p, '\n', len - p);
            size_t end = nl ? (size_t)(nl - text) : len;
            if (end - p == seplen && memcmp(text + p, sep, seplen) == 0) {
                append_text(&all, tok, text + doc, p - doc);
                push_eot(&all, eot);
                doc = nl ? end + 1 : len;
            }
            p = nl ? end + 1 : len;
        }
        append_text(&all, tok, text + doc, len - doc);
        free(text);
    }
    size_t n = all.n;

    size_t nval = (size_t)llround(val_fraction * (double)n);
    if (val_fraction > 0 && (nval == 0 || nval >= n)) {
        snprintf(err, sizeof err, "%zu tokens cannot be split with --val-fraction %g", n, val_fraction);
        return fail("%s", err);
    }
    size_t ntrain = n - nval;
    char train_path[ZT_ERRLEN], val_path[ZT_ERRLEN];
    if (single) snprintf(train_path, sizeof train_path, "%s", out);
    else snprintf(train_path, sizeof train_path, "%s-train%s", out, ext);
    snprintf(val_path, sizeof val_path, "%s-val%s", out, ext);
    if (write_one(train_path, all.ids, ntrain, tok, bin, err, sizeof err) != 0) return fail("%s", err);
    if (nval > 0 && write_one(val_path, all.ids + ntrain, nval, tok, bin, err, sizeof err) != 0)
        return fail("%s", err);
    printf("zt-prep-data: %d file%s, %zu tokens (%s, vocab %d) -> %s (%zu tokens)", ninputs,
           ninputs == 1 ? "" : "s", n, zt_tokenizer_kind(tok), zt_tokenizer_vocab_size(tok), train_path, ntrain);
    if (nval > 0) printf(", %s (%zu tokens)", val_path, nval);
    printf("\n");
    free(all.ids);
    free(inputs);
    zt_tokenizer_close(tok);
    return 0;
}
