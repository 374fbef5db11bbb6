/* test_data.c — token files, the sampler and the tokenizers (zt_data.h, zt_tokenizer.h).
 *
 * Every file is written into a fresh mkdtemp directory: HDF5 through the module's
 * own writer, .bin files by hand here so that broken headers can be made. */
#include "zt_tokenizer.h"
#include "zt_common.h"
#include "zt_data.h"
#include "zt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];
static char err[ZT_ERRLEN];

static const char *tpath(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void setup_dir(void)
{
    if (tmpdir[0]) return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/zt_test_data.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(2);
    }
}

static void write_raw_bin(const char *path, int magic, int version, int hdr_n, const int32_t *tok, int n)
{
    int32_t hdr[256] = {magic, version, hdr_n};
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < n; i++) {
        uint16_t v = (uint16_t)tok[i];
        fwrite(&v, 2, 1, f);
    }
    fclose(f);
}

static int32_t *pattern(int n, int mul, int add, int mod)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) t[i] = (i * mul + add) % mod;
    return t;
}

/* Sample i of an unshuffled single file is tokens [i*T, i*T + T + 1). */
static void check_sequential(const char *path, const int32_t *tok, int n, int T)
{
    const char *files[] = {path};
    zt_dataset_t *ds = zt_data_open(files, 1, T, 257, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    int64_t S = (n - 1) / T;
    CU_ASSERT_EQUAL(zt_data_num_samples(ds), S);
    CU_ASSERT_EQUAL(zt_data_num_tokens(ds), n);
    int32_t out[64];
    for (int64_t g = 0; g < 2 * S; g++) {
        CU_ASSERT_EQUAL_FATAL(zt_data_read(ds, g, 1, 0, out, err, sizeof err), 0);
        int64_t i = g % S;
        CU_ASSERT_EQUAL(memcmp(out, tok + i * T, sizeof(int32_t) * (size_t)(T + 1)), 0);
    }
    zt_data_close(ds);
}

static void t_h5_sequential(void)
{
    setup_dir();
    int n = 1000, T = 16;
    int32_t *tok = pattern(n, 7, 3, 257);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("seq.h5"), tok, (size_t)n, 257, 256, err, sizeof err), 0);
    check_sequential(tpath("seq.h5"), tok, n, T);
    free(tok);
}

/* An SFT sample longer than seq_len is cut to one row: T inputs, T targets, and nothing
 * written past them (zt_data_read_pair once wrote input T into the caller's T-long row). */
static void t_sft_long_sample(void)
{
    setup_dir();
    enum { T = 4, N = 10 };
    int32_t ids[N], labels[N];
    for (int i = 0; i < N; i++) ids[i] = 10 + i, labels[i] = i < 3 ? -100 : 10 + i;
    int64_t off[2] = {0, N};
    CU_ASSERT_EQUAL_FATAL(
        zt_data_write_sft_h5(tpath("long.h5"), ids, labels, NULL, N, off, 1, 257, 256, "byte", err, sizeof err), 0);
    const char *files[1] = {tpath("long.h5")};
    zt_dataset_t *ds = zt_data_open(files, 1, T, 257, err, sizeof err);
    CU_ASSERT_FATAL(ds != NULL);
    int32_t inp[T + 1], tgt[T + 1];
    inp[T] = tgt[T] = 777; /* canaries just past the row */
    CU_ASSERT_EQUAL(zt_data_read_pair(ds, 0, 0, 0, inp, tgt, err, sizeof err), 0);
    CU_ASSERT(inp[T] == 777 && tgt[T] == 777);
    for (int t = 0; t < T; t++) {
        CU_ASSERT_EQUAL(inp[t], 10 + t);
        CU_ASSERT_EQUAL(tgt[t], t + 1 < 3 ? -1 : 11 + t);
    }
    zt_data_close(ds);
}

static void t_bin_sequential(void)
{
    setup_dir();
    int n = 777, T = 8;
    int32_t *tok = pattern(n, 5, 1, 257);
    write_raw_bin(tpath("seq.bin"), 20240520, 1, n, tok, n);
    check_sequential(tpath("seq.bin"), tok, n, T);
    /* The module's own .bin writer produces the same readable file. */
    CU_ASSERT_EQUAL_FATAL(zt_data_write_bin(tpath("seq2.bin"), tok, (size_t)n, err, sizeof err), 0);
    check_sequential(tpath("seq2.bin"), tok, n, T);
    free(tok);
}

/* Files of 50 (h5), 40 (bin), 10 (h5: too short for a sample) and 33 (h5) tokens, T = 16:
 * 3 + 2 + 0 + 2 = 7 samples, and each sample lies inside one file. */
static void t_multi_file(void)
{
    setup_dir();
    int T = 16, lens[4] = {50, 40, 10, 33};
    int32_t *tok[4];
    for (int k = 0; k < 4; k++) tok[k] = pattern(lens[k], 1, 60 * k, 257);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("m0.h5"), tok[0], 50, 257, 256, err, sizeof err), 0);
    write_raw_bin(tpath("m1.bin"), 20240520, 1, 40, tok[1], 40);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("m2.h5"), tok[2], 10, 257, 256, err, sizeof err), 0);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("m3.h5"), tok[3], 33, 257, 256, err, sizeof err), 0);
    const char *files[] = {tpath("m0.h5"), tpath("m1.bin"), tpath("m2.h5"), tpath("m3.h5")};
    zt_dataset_t *ds = zt_data_open(files, 4, T, 257, err, sizeof err);
    if (!ds) printf("\n  %s\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    CU_ASSERT_EQUAL(zt_data_num_samples(ds), 7);
    CU_ASSERT_EQUAL(zt_data_num_tokens(ds), 133);
    int file_of[7] = {0, 0, 0, 1, 1, 3, 3}, first_of[4] = {0, 3, 5, 5};
    int32_t out[17];
    for (int g = 0; g < 14; g++) {
        int i = g % 7, k = file_of[i], off = (i - first_of[k]) * T;
        CU_ASSERT_EQUAL_FATAL(zt_data_read(ds, g, 0, 0, out, err, sizeof err), 0);
        CU_ASSERT(off + T + 1 <= lens[k]); /* never straddles */
        CU_ASSERT_EQUAL(memcmp(out, tok[k] + off, sizeof out), 0);
    }
    zt_data_close(ds);
    for (int k = 0; k < 4; k++) free(tok[k]);
}

static void check_permutation(zt_dataset_t *ds, uint64_t seed)
{
    int64_t S = zt_data_num_samples(ds);
    char *seen = calloc((size_t)S, 1);
    int64_t same_as_e0 = 0, same_as_seed = 0, identity = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        memset(seen, 0, (size_t)S);
        for (int64_t p = 0; p < S; p++) {
            int64_t g = epoch * S + p;
            int64_t idx = zt_data_sample_index(ds, g, seed, 1);
            CU_ASSERT_FATAL(idx >= 0 && idx < S);
            CU_ASSERT(!seen[idx]);
            seen[idx] = 1;
            CU_ASSERT_EQUAL(idx, zt_data_sample_index(ds, g, seed, 1)); /* deterministic */
            if (epoch == 1) same_as_e0 += idx == zt_data_sample_index(ds, p, seed, 1);
            if (epoch == 0) {
                same_as_seed += idx == zt_data_sample_index(ds, g, seed + 1, 1);
                identity += idx == p;
            }
        }
    }
    /* Two independent random permutations agree on about one position. */
    if (S >= 50) {
        CU_ASSERT(same_as_e0 < S / 4);
        CU_ASSERT(same_as_seed < S / 4);
        CU_ASSERT(identity < S / 4);
    }
    free(seen);
}

static void t_shuffle(void)
{
    setup_dir();
    int n = 5001;
    int32_t *tok = pattern(n, 1, 0, 257);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("shuf.h5"), tok, (size_t)n, 257, 256, err, sizeof err), 0);
    const char *files[] = {tpath("shuf.h5")};
    int Ts[] = {1, 3, 100, 2500, 5000};
    for (int k = 0; k < 5; k++) {
        zt_dataset_t *ds = zt_data_open(files, 1, Ts[k], 257, err, sizeof err);
        CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
        check_permutation(ds, 1234);
        zt_data_close(ds);
    }
    /* A shuffled read returns the sample the mapping names. */
    zt_dataset_t *ds = zt_data_open(files, 1, 10, 257, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    int32_t out[11];
    for (int64_t g = 0; g < 1000; g += 37) {
        int64_t idx = zt_data_sample_index(ds, g, 99, 1);
        CU_ASSERT_EQUAL_FATAL(zt_data_read(ds, g, 99, 1, out, err, sizeof err), 0);
        CU_ASSERT_EQUAL(memcmp(out, tok + idx * 10, sizeof out), 0);
    }
    CU_ASSERT_EQUAL(zt_data_sample_index(ds, 5, 99, 0), 5);
    zt_data_close(ds);
    free(tok);
}

static void expect_open_error(const char *path, int T, int vocab, const char *needle)
{
    const char *files[] = {path};
    err[0] = 0;
    zt_dataset_t *ds = zt_data_open(files, 1, T, vocab, err, sizeof err);
    CU_ASSERT_PTR_NULL(ds);
    if (ds) zt_data_close(ds);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    if (!strstr(err, path) || !strstr(err, needle)) printf("\n  got: %s\n", err);
}

static void t_errors(void)
{
    setup_dir();
    int32_t *tok = pattern(200, 1, 0, 257);
    expect_open_error(tpath("nonexistent.h5"), 8, 257, "cannot open: No such file or directory");
    write_raw_bin(tpath("trunc.bin"), 20240520, 1, 200, tok, 150);
    expect_open_error(tpath("trunc.bin"), 8, 257, "truncated: header says 200 tokens, file holds 150");
    write_raw_bin(tpath("magic.bin"), 12345, 1, 200, tok, 200);
    expect_open_error(tpath("magic.bin"), 8, 257, "bad magic 12345");
    write_raw_bin(tpath("version.bin"), 20240520, 7, 200, tok, 200);
    expect_open_error(tpath("version.bin"), 8, 257, "version 7");
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("short.h5"), tok, 64, 257, 256, err, sizeof err), 0);
    expect_open_error(tpath("short.h5"), 64, 257, "no samples:");
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "holds 64 tokens, need at least seq_len+1 = 65"));
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("empty.h5"), tok, 0, 257, 256, err, sizeof err), 0);
    expect_open_error(tpath("empty.h5"), 4, 257, "no samples:");
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("bigvocab.h5"), tok, 200, 50257, 50256, err, sizeof err), 0);
    expect_open_error(tpath("bigvocab.h5"), 8, 257, "vocab_size attribute 50257 > model.vocab_size (257)");
    FILE *f = fopen(tpath("text.txt"), "w");
    fputs("just some text, neither HDF5 nor .bin\n", f);
    fclose(f);
    expect_open_error(tpath("text.txt"), 4, 257, "too short");

    /* Out-of-range ids are found when the sample holding them is read. */
    tok[123] = 300;
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("badtok.h5"), tok, 200, 257, 256, err, sizeof err), 0);
    const char *files[] = {tpath("badtok.h5")};
    zt_dataset_t *ds = zt_data_open(files, 1, 10, 257, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    int32_t out[11];
    CU_ASSERT_EQUAL(zt_data_read(ds, 0, 0, 0, out, err, sizeof err), 0);
    CU_ASSERT_EQUAL(zt_data_read(ds, 12, 0, 0, out, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, tpath("badtok.h5")));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "token id 300 at position 123 >= model.vocab_size (257)"));
    zt_data_close(ds);
    free(tok);
}

static void t_tokenizer_attr(void)
{
    setup_dir();
    int32_t *tok = pattern(100, 1, 0, 257);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5_tok(tpath("bpe.h5"), tok, 100, 50257, 50256, "gpt2-bpe", err,
                                               sizeof err), 0);
    CU_ASSERT_EQUAL_FATAL(zt_data_write_h5(tpath("byte.h5"), tok, 100, 257, 256, err, sizeof err), 0);
    const char *f1[] = {tpath("bpe.h5")}, *f2[] = {tpath("byte.h5")};
    zt_dataset_t *ds = zt_data_open(f1, 1, 8, 50304, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    CU_ASSERT_STRING_EQUAL(zt_data_tokenizer(ds), "gpt2-bpe");
    CU_ASSERT_EQUAL(zt_data_eot_token(ds), 50256);
    zt_data_close(ds);
    ds = zt_data_open(f2, 1, 8, 257, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
    CU_ASSERT_STRING_EQUAL(zt_data_tokenizer(ds), "byte");
    CU_ASSERT_EQUAL(zt_data_eot_token(ds), 256);
    zt_data_close(ds);
    const char *mixed[] = {tpath("byte.h5"), tpath("bpe.h5")};
    CU_ASSERT_PTR_NULL(zt_data_open(mixed, 2, 8, 50304, err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tokenizer"));
    free(tok);
}

/* ---- tokenizers ---------------------------------------------------------------- */

static void t_byte_tokenizer(void)
{
    zt_tokenizer_t *t = zt_tokenizer_byte();
    CU_ASSERT_EQUAL(zt_tokenizer_vocab_size(t), ZT_BYTE_VOCAB);
    CU_ASSERT_EQUAL(zt_tokenizer_eot(t), ZT_BYTE_EOT);
    CU_ASSERT_STRING_EQUAL(zt_tokenizer_kind(t), "byte");
    char text[300];
    for (int i = 0; i < 300; i++) text[i] = (char)(i * 13 + 1);
    int32_t *ids;
    size_t n, len;
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, text, sizeof text, &ids, &n), 0);
    CU_ASSERT_EQUAL_FATAL(n, sizeof text);
    for (size_t i = 0; i < n; i++) CU_ASSERT(ids[i] == (unsigned char)text[i]);
    char *back = zt_tokenizer_decode(t, ids, n, &len);
    CU_ASSERT_EQUAL(len, sizeof text);
    CU_ASSERT_EQUAL(memcmp(back, text, len), 0);
    free(back);
    free(ids);
    const char *s = zt_tokenizer_decode_token(t, ZT_BYTE_EOT, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_EQUAL(len, 13);
    CU_ASSERT_EQUAL(memcmp(s, "<|endoftext|>", 13), 0);
    CU_ASSERT_PTR_NULL(zt_tokenizer_decode_token(t, 257, &len));
    CU_ASSERT_PTR_NULL(zt_tokenizer_decode_token(t, -1, &len));
}

/* GPT-2's byte alphabet, written independently of zt_tokenizer.c. */
static int is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

static void cp_json(FILE *f, int cp)
{
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", cp);
    else if (cp < 128) fputc(cp, f);
    else if (cp % 2) fprintf(f, "\\u%04x", cp); /* half escaped, half raw UTF-8 */
    else if (cp < 0x800) fprintf(f, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
}

/* Tiny vocabulary: 256 bytes (ids 0..255 in byte-alphabet order), then he, Ġt, Ġthe, ll, eĠ, EOT.
 * Merges (rank order): h e, e Ġ, Ġ t, Ġt he, l l. */
enum { ID_HE = 256, ID_GT, ID_GTHE, ID_LL, ID_EG, ID_EOT };

static void write_tiny_bpe(const char *vocab, const char *merges)
{
    int cp_of[256], n = 0;
    for (int b = 0; b < 256; b++) cp_of[b] = is_printable(b) ? b : 256 + n++;
    FILE *f = fopen(vocab, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{", f);
    for (int b = 0; b < 256; b++) {
        fputs(b ? ",\n \"" : "\"", f);
        cp_json(f, cp_of[b]);
        fprintf(f, "\": %d", b);
    }
    fprintf(f, ", \"he\": %d, \"\\u0120t\": %d, \"\\u0120the\": %d, \"ll\": %d, \"e\\u0120\": %d,"
               " \"<|endoftext|>\": %d}\n", ID_HE, ID_GT, ID_GTHE, ID_LL, ID_EG, ID_EOT);
    fclose(f);
    f = fopen(merges, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("#version: 0.2\nh e\ne \xc4\xa0\n\xc4\xa0 t\n\xc4\xa0t he\nl l\n", f);
    fclose(f);
}

static void t_bpe(void)
{
    setup_dir();
    write_tiny_bpe(tpath("vocab.json"), tpath("merges.txt"));
    zt_tokenizer_t *t = zt_tokenizer_open_bpe(tpath("vocab.json"), tpath("merges.txt"), err, sizeof err);
    if (!t) printf("\n  %s\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(zt_tokenizer_vocab_size(t), ID_EOT + 1);
    CU_ASSERT_EQUAL(zt_tokenizer_eot(t), ID_EOT);
    CU_ASSERT_STRING_EQUAL(zt_tokenizer_kind(t), "gpt2-bpe");

    int32_t *ids;
    size_t n, len;
    /* "hello" -> he ll o; " the" -> Ġthe (three merges in rank order); in " xe t" the
     * better-ranked e+Ġ must not merge across the pre-token boundary " xe" | " t". */
    const char *s1 = "hello the xe t";
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, s1, strlen(s1), &ids, &n), 0);
    int32_t want[] = {ID_HE, ID_LL, 'o', ID_GTHE, ' ', 'x', 'e', ID_GT};
    CU_ASSERT_EQUAL_FATAL(n, sizeof want / sizeof *want);
    CU_ASSERT_EQUAL(memcmp(ids, want, sizeof want), 0);
    free(ids);
    /* Spaces before a word: the last one joins the word ("e", " ", " the"). */
    CU_ASSERT_EQUAL(zt_tokenizer_encode(t, "e  the", 6, &ids, &n), 0);
    int32_t want2[] = {'e', ' ', ID_GTHE};
    CU_ASSERT_EQUAL_FATAL(n, 3);
    CU_ASSERT_EQUAL(memcmp(ids, want2, sizeof want2), 0);
    free(ids);

    const char *texts[] = {"Hello, world! It's 2024; they'll see 3.14 cafés.\n\n  Indented\ttab\r\n",
                           "", " ", "\x01\x02\xff\xfe raw bytes \xc3", "don't  stop   the\nthe\n\n\nthe  "};
    for (int k = 0; k < 5; k++) {
        size_t tl = strlen(texts[k]);
        CU_ASSERT_EQUAL(zt_tokenizer_encode(t, texts[k], tl, &ids, &n), 0);
        CU_ASSERT(n <= tl);
        for (size_t i = 0; i < n; i++) CU_ASSERT(ids[i] >= 0 && ids[i] < ID_EOT);
        char *back = zt_tokenizer_decode(t, ids, n, &len);
        CU_ASSERT_EQUAL(len, tl);
        CU_ASSERT_STRING_EQUAL(back, texts[k]);
        free(back);
        free(ids);
    }
    const char *eot = zt_tokenizer_decode_token(t, ID_EOT, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(eot);
    CU_ASSERT_EQUAL(len, 13);
    CU_ASSERT_EQUAL(memcmp(eot, "<|endoftext|>", 13), 0);
    const char *gt = zt_tokenizer_decode_token(t, ID_GT, &len);
    CU_ASSERT_EQUAL(len, 2);
    CU_ASSERT_EQUAL(memcmp(gt, " t", 2), 0);
    zt_tokenizer_close(t);

    /* Errors name the file. */
    CU_ASSERT_PTR_NULL(zt_tokenizer_open_bpe(tpath("nope.json"), tpath("merges.txt"), err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "nope.json: cannot open"));
    FILE *f = fopen(tpath("badmerges.txt"), "w");
    fputs("#version: 0.2\nh e\nq z\n", f);
    fclose(f);
    CU_ASSERT_PTR_NULL(zt_tokenizer_open_bpe(tpath("vocab.json"), tpath("badmerges.txt"), err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "badmerges.txt:3:"));
    f = fopen(tpath("badvocab.json"), "w");
    fputs("{\"a\": 0, \"b\" 1}", f);
    fclose(f);
    CU_ASSERT_PTR_NULL(zt_tokenizer_open_bpe(tpath("badvocab.json"), tpath("merges.txt"), err, sizeof err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "badvocab.json:1:"));
    CU_ASSERT_PTR_NULL(zt_tokenizer_open("sentencepiece", NULL, NULL, err, sizeof err));
    CU_ASSERT(zt_tokenizer_open("byte", NULL, NULL, err, sizeof err) == zt_tokenizer_byte());
}

static void t_cleanup(void)
{
    /* Remove what the tests wrote; the directory itself must then be empty. */
    char cmd[600];
    if (getenv("ZT_KEEP_TMP")) {
        printf("\n  kept %s\n", tmpdir);
        return;
    }
    snprintf(cmd, sizeof cmd, "rm -f %s/* && rmdir %s", tmpdir, tmpdir);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

static const zt_test_t tests[] = {
    {"h5 sequential samples", t_h5_sequential},
    {"bin sequential samples", t_bin_sequential},
    {"sft sample longer than seq_len", t_sft_long_sample},
    {"multi-file boundaries", t_multi_file},
    {"shuffle is a deterministic permutation", t_shuffle},
    {"errors name the file", t_errors},
    {"tokenizer attribute", t_tokenizer_attr},
    {"byte tokenizer", t_byte_tokenizer},
    {"gpt2 bpe", t_bpe},
    {"cleanup", t_cleanup},
    {NULL, NULL},
};
ZT_TEST_MAIN("test_data", tests)
