/* zt_ckpt_tool.c — `zt-ckpt`: inspect, verify, consolidate, export and import checkpoints.
 *
 *   zt-ckpt info FILE                       metadata, config and tensor list
 *   zt-ckpt verify FILE                     structure, shapes vs the stored config, NaN/Inf,
 *                                           checksums; exit status 0 (good) or 1
 *   zt-ckpt consolidate SHARDS_DIR OUT.h5   sharded -> consolidated, streaming
 *   zt-ckpt export FILE OUTDIR [--dtype fp32|bf16] [--max-shard-size 5GB]
 *                                           a Hugging Face model directory of the
 *                                           checkpoint's family (OUTDIR/model.safetensors
 *                                           may be given as OUTDIR)
 *   zt-ckpt export FILE OUTDIR              the same as OUTDIR/model.safetensors (any OUT
 *                                           not ending in .safetensors is a directory);
 *                                           missing directories are created (mkdir -p);
 *                                           a LoRA checkpoint gives its PEFT adapter
 *                                           directory (adapter_config.json and
 *                                           adapter_model.safetensors, fp32), with
 *                                           --merge the merged model (the base read
 *                                           from its model.name_or_path)
 *   zt-ckpt import MODEL.safetensors CONFIG.json OUT.h5
 *                                           weights-only checkpoint for model.init_from
 *
 * Works under mpirun or as a singleton; every command is serial (rank 0 works,
 * the others wait). Tensors are streamed through a fixed buffer except on import,
 * which holds one copy of the weights. FILE may be a .h5 file, a .shards directory
 * or a run directory with a `latest` pointer. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libconfig.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_arch.h"
#include "zt_config.h"
#include "zt_hf.h"
#include "zt_hf_model.h"
#include "zt_qlora.h"
#include "zt_quant.h"
#include "zt_safetensors.h"

#define CHUNK (1u << 20)    /* elements per streamed piece */

static void usage(void)
{
    fprintf(stderr,
            "usage: zt-ckpt info FILE\n"
            "       zt-ckpt verify FILE\n"
            "       zt-ckpt consolidate SHARDS_DIR OUT.h5\n"
            "       zt-ckpt export FILE OUTDIR [--dtype fp32|bf16] [--max-shard-size 5GB]\n"
            "                                     a Hugging Face model directory (any family)\n"
            "       zt-ckpt export FILE OUTDIR            (OUTDIR/model.safetensors and OUTDIR/config.json;\n"
            "                                             a LoRA checkpoint: its PEFT adapter directory;\n"
            "                                             --merge: the model merged with it)\n"
            "       zt-ckpt import MODEL.safetensors CONFIG.json OUT.h5\n");
}

/* FILE may name a run directory: follow its `latest`. */
static void resolve(const char *in, char *out, size_t len)
{
    struct stat st;
    char ip[PATH_MAX + 16];
    snprintf(ip, sizeof ip, "%s/index.h5", in);
    if (stat(in, &st) == 0 && S_ISDIR(st.st_mode) && stat(ip, &st) != 0 && zt_ckpt_find_latest(in, out, len) == 0)
        return;
    snprintf(out, len, "%s", in);
}

static zt_ckpt_reader_t *open_reader(const char *arg)
{
    char path[PATH_MAX], err[ZT_ERRLEN];
    resolve(arg, path, sizeof path);
    zt_ckpt_reader_t *r = zt_ckpt_reader_open(path, err, sizeof err);
    if (!r) fprintf(stderr, "zt-ckpt: %s\n", err);
    return r;
}

/* The stored config; only its model section matters here, so data.seq_len is set to 1:
 * a config whose other sections do not validate (seq_len beyond a tiny test model's
 * positions) still names its model. NULL with err. */
static zt_config_t *stored_config(const char *text, char *err, size_t errlen)
{
    zt_config_t *cfg = zt_calloc(1, sizeof *cfg);
    char *over[] = {"data.seq_len=1"};
    if (text && zt_config_parse(cfg, text, "stored config", 1, over, err, errlen) == 0) return cfg;
    free(cfg);
    return NULL;
}

/* The parameter table the stored config describes (any family); NULL if it cannot. */
static zt_param_table_t *table_from_config(const char *text)
{
    char err[ZT_ERRLEN];
    zt_config_t *cfg = stored_config(text, err, sizeof err);
    zt_param_table_t *t = cfg ? zt_arch_table_from_config(cfg, err, sizeof err) : NULL;
    free(cfg);
    return t;
}

static void shape_str(char *b, size_t n, const zt_param_t *p)
{
    if (p->ndim == 1) snprintf(b, n, "(%" PRId64 ",)", p->shape[0]);
    else snprintf(b, n, "(%" PRId64 ", %" PRId64 ")", p->shape[0], p->shape[1]);
}

static int cmd_info(const char *file)
{
    zt_ckpt_reader_t *r = open_reader(file);
    if (!r) return 1;
    const zt_ckpt_meta_t *m = zt_ckpt_reader_meta(r);
    const zt_param_table_t *t = zt_ckpt_reader_tensors(r);
    char b[64];
    printf("checkpoint   %s (%s)\n", file, zt_ckpt_reader_is_sharded(r) ? "sharded" : "consolidated");
    printf("step         %ld\ntokens_seen  %.0f\nsamples_seen %ld\nworld_size   %d\nstrategy     %s\n", m->step,
           m->tokens_seen, m->samples_seen, m->world_size, m->strategy);
    if (zt_ckpt_reader_has_optimizer(r))
        printf("optimizer    AdamW t=%ld lr=%g betas=(%g, %g) eps=%g weight_decay=%g\n", m->adam_step, m->lr,
               m->beta1, m->beta2, m->eps, m->weight_decay);
    else
        printf("optimizer    none (weights only)\n");
    printf("config:\n%s%s", zt_ckpt_reader_config(r),
           strlen(zt_ckpt_reader_config(r)) && zt_ckpt_reader_config(r)[strlen(zt_ckpt_reader_config(r)) - 1] != '\n'
               ? "\n" : "");
    printf("tensors (%d, fp32):\n", t->nparams);
    for (int p = 0; p < t->nparams; p++) {
        char s[64];
        shape_str(s, sizeof s, &t->params[p]);
        printf("  %-44s %-14s %10zu  %s\n", t->params[p].name, s, t->params[p].numel,
               zt_fmt_bytes(4.0 * (double)t->params[p].numel, b, sizeof b));
    }
    int groups = zt_ckpt_reader_has_optimizer(r) ? 3 : 1;
    printf("total        %zu parameters, %s stored (%d group%s)\n", t->total_numel,
           zt_fmt_bytes(4.0 * groups * (double)t->total_numel, b, sizeof b), groups, groups > 1 ? "s" : "");
    zt_ckpt_reader_close(r);
    return 0;
}

static int cmd_verify(const char *file)
{
    zt_ckpt_reader_t *r = open_reader(file);
    if (!r) return 1;
    const zt_param_table_t *t = zt_ckpt_reader_tensors(r);
    static const char *gname[3] = { "/model", "/optimizer/exp_avg", "/optimizer/exp_avg_sq" };
    int bad = 0;
    zt_param_table_t *want = table_from_config(zt_ckpt_reader_config(r));
    if (!want) {
        printf("FAIL %s: the stored config does not describe a model ztrain builds\n", file);
        bad++;
    } else {
        for (int p = 0; p < want->nparams; p++) {
            const zt_param_t *w = &want->params[p];
            int q = -1;
            for (int k = 0; k < t->nparams; k++)
                if (!strcmp(t->params[k].name, w->name)) q = k;
            char a[64], b[64];
            shape_str(b, sizeof b, w);
            if (q < 0) {
                printf("FAIL %s: missing tensor /model/%s %s\n", file, w->name, b);
                bad++;
            } else if (t->params[q].ndim != w->ndim || t->params[q].shape[0] != w->shape[0] ||
                       (w->ndim == 2 && t->params[q].shape[1] != w->shape[1])) {
                shape_str(a, sizeof a, &t->params[q]);
                printf("FAIL %s: tensor /model/%s has shape %s, the stored config needs %s\n", file, w->name, a, b);
                bad++;
            }
        }
        if (t->nparams != want->nparams) {
            printf("FAIL %s: %d tensors stored, the stored config has %d\n", file, t->nparams, want->nparams);
            bad++;
        }
        zt_param_table_free(want);
    }
    float *buf = zt_malloc(CHUNK * sizeof(float));
    char err[ZT_ERRLEN];
    for (int g = 0; g < (zt_ckpt_reader_has_optimizer(r) ? 3 : 1); g++)
        for (int p = 0; p < t->nparams; p++) {
            uint64_t sum = 0, stored;
            size_t nonfinite = 0;
            int ok = 1;
            for (size_t s = 0; s < t->params[p].numel; s += CHUNK) {
                size_t n = ZT_MIN((size_t)CHUNK, t->params[p].numel - s);
                if (zt_ckpt_reader_read(r, g, p, s, n, buf, err, sizeof err)) {
                    printf("FAIL %s\n", err);
                    ok = 0;
                    break;
                }
                for (size_t i = 0; i < n; i++) nonfinite += !isfinite(buf[i]);
                sum += zt_ckpt_checksum(s, buf, n);
            }
            if (!ok) { bad++; continue; }
            if (nonfinite) {
                printf("FAIL %s: tensor %s/%s holds NaN or Inf (%zu elements)\n", file, gname[g], t->params[p].name,
                       nonfinite);
                bad++;
            }
            if (zt_ckpt_reader_checksum(r, g, p, &stored) != 0) {
                printf("FAIL %s: tensor %s/%s has no stored checksum\n", file, gname[g], t->params[p].name);
                bad++;
            } else if (stored != sum) {
                printf("FAIL %s: tensor %s/%s checksum %016" PRIx64 " != stored %016" PRIx64 "\n", file, gname[g],
                       t->params[p].name, sum, stored);
                bad++;
            }
        }
    free(buf);
    printf("%s %s: %d tensors x %d groups checked, %d problem%s\n", bad ? "BAD" : "OK", file, t->nparams,
           zt_ckpt_reader_has_optimizer(r) ? 3 : 1, bad, bad == 1 ? "" : "s");
    zt_ckpt_reader_close(r);
    return bad ? 1 : 0;
}

static int cmd_consolidate(const char *in, const char *out)
{
    char err[ZT_ERRLEN];
    double t0 = zt_now();
    if (zt_ckpt_consolidate(in, out, CHUNK, err, sizeof err)) {
        fprintf(stderr, "zt-ckpt: %s\n", err);
        return 1;
    }
    printf("wrote %s (%.2f s)\n", out, zt_now() - t0);
    return 0;
}


/* A Hugging Face model directory of any family, streamed tensor by tensor through the
 * same writer a run's save_hf uses (zt_hf_model.h). OUT.safetensors means its
 * directory (the file must be model.safetensors); the directory is created. */
/* 4-bit base weight p of a QLoRA checkpoint's base directory d (stored 4-bit, or quantized as the
 * run quantized it), dequantized whole and merged with its adapters. */
static int export_merged_4bit(zt_hf_dir_t *d, const zt_param_table_t *t, int p, const float *all, const size_t *offs,
                              zt_hf_export_t *x, char *err, size_t errlen)
{
    const size_t n = zt_qlora_values(&t->params[p]);
    float *region = zt_malloc(n * sizeof *region), *w = zt_malloc(n * sizeof *w);
    int rc = zt_hf_find(d, t->params[p].name, NULL, NULL, NULL, NULL) < 0
                 ? zt_err(err, errlen, "%s: tensor %s missing: not the QLoRA checkpoint's base", zt_hf_path(d),
                          t->params[p].name)
                 : zt_hf_model_read_4bit(d, t, p, region, err, errlen);
    if (!rc) {
        zt_quant4_view_t v;
        zt_qlora_view(t, &t->params[p], region, &v);
        zt_quant4_dequantize(&v, 0, (int64_t)n, w);
        zt_hf_lora_merge(t, p, all, offs, 0, n, w);
        rc = zt_hf_export_write(x, p, 0, n, w, err, errlen);
    }
    free(region);
    free(w);
    return rc;
}

/* A LoRA checkpoint's merged model: each base weight of DIR (the run's model.name_or_path)
 * with scale B A added, as the run's own hf/ export and PEFT's merge_and_unload */
static int export_merged(zt_ckpt_reader_t *r, const zt_param_table_t *t, const int *q, const char *base,
                         zt_hf_export_t *x, float *buf, char *err, size_t errlen)
{
    size_t *offs = zt_calloc((size_t)t->nparams, sizeof *offs), total = 0;
    for (int p = 0; p < t->nparams; p++)
        if (q[p] >= 0) offs[p] = total, total += t->params[p].numel;
    float *all = zt_malloc((total ? total : 1) * sizeof *all);
    int rc = 0;
    for (int p = 0; p < t->nparams && !rc; p++)
        for (size_t s = 0; q[p] >= 0 && s < t->params[p].numel && !rc; s += CHUNK)
            rc = zt_ckpt_reader_read(r, ZT_CKPT_MODEL, q[p], s, ZT_MIN((size_t)CHUNK, t->params[p].numel - s),
                                     all + offs[p] + s, err, errlen);
    zt_hf_dir_t *d = rc ? NULL : zt_hf_open(base, err, errlen);
    if (!rc && !d) rc = -1;
    for (int p = 0; p < t->nparams && !rc; p++) {
        if (q[p] >= 0) continue; /* the adapters themselves */
        const zt_param_t *pp = &t->params[p];
        if (pp->quant) { /* QLoRA: the 4-bit base dequantized as bitsandbytes does, then merged */
            rc = export_merged_4bit(d, t, p, all, offs, x, err, errlen);
            continue;
        }
        int ndim;
        int64_t shape[8];
        const int k = zt_hf_find(d, pp->name, &ndim, shape, NULL, NULL);
        if (k < 0 || ndim != pp->ndim || shape[0] != pp->shape[0] || (ndim > 1 && shape[1] != pp->shape[1])) {
            rc = zt_err(err, errlen, "%s: tensor %s %s the LoRA checkpoint's base", base, pp->name,
                        k < 0 ? "missing: not" : "of another shape: not");
            break;
        }
        for (size_t s = 0; s < pp->numel && !rc; s += CHUNK) {
            const size_t n = ZT_MIN((size_t)CHUNK, pp->numel - s);
            rc = zt_hf_read(d, k, s, n, buf, err, errlen);
            if (rc) break;
            zt_hf_lora_merge(t, p, all, offs, s, n, buf);
            rc = zt_hf_export_write(x, p, s, n, buf, err, errlen);
        }
    }
    zt_hf_close(d);
    free(all);
    free(offs);
    return rc;
}

static int cmd_export(const char *file, const char *out_arg, const char *dtype, const char *max_shard, int merge)
{
    char dir[PATH_MAX], tmp[PATH_MAX];
    const size_t ol = strlen(out_arg);
    if (ol >= 12 && !strcmp(out_arg + ol - 12, ".safetensors")) {
        snprintf(tmp, sizeof tmp, "%s", out_arg);
        if (strcmp(basename(tmp), "model.safetensors")) {
            fprintf(stderr, "zt-ckpt: export: %s: an HF directory's weights are model.safetensors (or give OUTDIR)\n",
                    out_arg);
            return 1;
        }
        snprintf(tmp, sizeof tmp, "%s", out_arg);
        snprintf(dir, sizeof dir, "%s", dirname(tmp));
    } else if ((size_t)snprintf(dir, sizeof dir, "%s", out_arg) >= sizeof dir) {
        fprintf(stderr, "zt-ckpt: export: %s: path too long\n", out_arg);
        return 1;
    }
    while (strlen(dir) > 1 && dir[strlen(dir) - 1] == '/') dir[strlen(dir) - 1] = 0;
    int64_t shard = zt_hf_parse_size(max_shard);
    if (shard <= 0 || (strcmp(dtype, "fp32") && strcmp(dtype, "bf16"))) {
        fprintf(stderr, "zt-ckpt: export: --dtype fp32|bf16 and --max-shard-size SIZE (\"5GB\") expected\n");
        return 1;
    }
    zt_ckpt_reader_t *r = open_reader(file);
    if (!r) return 1;
    const zt_param_table_t *st = zt_ckpt_reader_tensors(r);
    char err[ZT_ERRLEN] = "";
    zt_config_t *cfg = stored_config(zt_ckpt_reader_config(r), err, sizeof err);
    zt_param_table_t *t = cfg ? zt_arch_table_from_config(cfg, err, sizeof err) : NULL;
    int rc = 0;
    if (!t) rc = zt_err(err, sizeof err, "%s: the stored config does not describe a model (%.300s)", file, err);
    /* a LoRA checkpoint holds the adapters (the base is model.name_or_path's): it
     * exports as the PEFT adapter directory, in fp32 as PEFT saves adapters */
    const int lora = t && t->first_adapter_unit >= 0, adapter = lora && !merge;
    const char *base = cfg ? cfg->model.name_or_path : "";
    if (!rc && merge && !lora) rc = zt_err(err, sizeof err, "%s: --merge: not a LoRA checkpoint", file);
    if (!rc && merge && !base[0])
        rc = zt_err(err, sizeof err, "%s: --merge needs the base, and its model.name_or_path is empty (a LoRA run "
                    "from a seeded model: its own hf/ export is the merged model)", file);
    if (adapter) dtype = "fp32", shard = INT64_MAX;
    int *q = t ? zt_calloc((size_t)t->nparams, sizeof *q) : NULL;
    for (int p = 0; !rc && p < t->nparams; p++) {
        q[p] = -1;
        if (lora && t->params[p].unit < t->first_adapter_unit) continue; /* the base: not in the file */
        q[p] = zt_param_table_find(st, t->params[p].name);
        if (q[p] < 0 || st->params[q[p]].numel != t->params[p].numel)
            rc = zt_err(err, sizeof err, "%s: tensor /model/%s missing or of another size than the stored config says",
                        file, t->params[p].name);
    }
    zt_hf_export_t *x = NULL;
    if (!rc) {
        x = zt_hf_export_begin(dir, t, adapter, dtype, shard, cfg ? cfg->model.name_or_path : "", -1, NULL, err,
                               sizeof err);
        rc = x ? 0 : -1;
    }
    float *buf = zt_malloc(CHUNK * sizeof(float));
    int written = 0;
    if (!rc && merge) rc = export_merged(r, t, q, base, x, buf, err, sizeof err);
    for (int p = 0; !rc && !merge && p < t->nparams; p++) {
        if (q[p] < 0) continue; /* a LoRA checkpoint's frozen base */
        written++;
        for (size_t s = 0; s < t->params[p].numel && !rc; s += CHUNK) {
            const size_t n = ZT_MIN((size_t)CHUNK, t->params[p].numel - s);
            rc = zt_ckpt_reader_read(r, ZT_CKPT_MODEL, q[p], s, n, buf, err, sizeof err);
            if (!rc) rc = zt_hf_export_write(x, p, s, n, buf, err, sizeof err);
        }
    }
    free(buf);
    if (x) {
        char e2[ZT_ERRLEN];
        if (zt_hf_export_finish(x, !rc, rc ? e2 : err, rc ? sizeof e2 : sizeof err) && !rc) rc = -1;
    }
    if (rc) fprintf(stderr, "zt-ckpt: %s\n", err);
    else if (adapter)
        printf("wrote %s: the PEFT LoRA adapter of %s (r=%d), %d tensors, fp32 (adapter_config.json, "
               "adapter_model.safetensors)\n", dir, t->arch->hf_class, t->lora_rank, written);
    else if (merge)
        printf("wrote %s: %s, %s merged with its LoRA adapters (scale %g), %s\n", dir, t->arch->hf_class, base,
               (double)t->lora_scale, dtype);
    else printf("wrote %s: %s, %d tensors, %s (config.json, generation_config.json, safetensors)\n", dir,
                t->arch->hf_class, t->nparams, dtype);
    free(q);
    zt_param_table_free(t);
    free(cfg);
    zt_ckpt_reader_close(r);
    return rc ? 1 : 0;
}

/* Integer value of "key" in HF's config.json object; -1 if absent or not an integer. */
static long json_int(const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    return json_is_integer(v) && json_integer_value(v) <= INT32_MAX ? (long)json_integer_value(v) : -1;
}

static int cmd_import(const char *st_path, const char *cfg_path, const char *out)
{
    char err[ZT_ERRLEN];
    json_error_t je;
    json_t *cfg = json_load_file(cfg_path, JSON_REJECT_DUPLICATES, &je);
    if (!cfg) {
        fprintf(stderr, "zt-ckpt: %s:%d:%d: %s\n", cfg_path, je.line, je.column, je.text);
        return 1;
    }
    long L = json_int(cfg, "n_layer"), NH = json_int(cfg, "n_head"), C = json_int(cfg, "n_embd"),
         V = json_int(cfg, "vocab_size"), T = json_int(cfg, "n_positions");
    json_decref(cfg);
    if (L <= 0 || NH <= 0 || C <= 0 || V <= 0 || T <= 0 || C % NH) {
        fprintf(stderr, "zt-ckpt: %s: needs positive n_layer, n_head, n_embd (divisible by n_head), vocab_size, "
                "n_positions\n", cfg_path);
        return 1;
    }
    zt_st_file_t f;
    if (zt_st_open(st_path, &f, err, sizeof err)) {
        fprintf(stderr, "zt-ckpt: %s\n", err);
        return 1;
    }
    zt_param_table_t *t = zt_arch_gpt2_table((int)L, (int)NH, (int)C, (int)V, (int)T, 0.02f);
    zt_io_seg_t *segs = zt_calloc((size_t)t->nparams, sizeof *segs);
    char *used = zt_calloc((size_t)f.ntensors + 1, 1);
    int rc = 0;
    for (int p = 0; p < t->nparams && !rc; p++) {
        const zt_param_t *pp = &t->params[p];
        int i = zt_st_find(&f, pp->name);
        if (i < 0 && !strncmp(pp->name, "transformer.", 12)) i = zt_st_find(&f, pp->name + 12);
        if (i < 0) {
            rc = zt_err(err, sizeof err, "%s: missing tensor %s", st_path, pp->name);
            break;
        }
        used[i] = 1;
        const zt_st_tensor_t *st = &f.tensors[i];
        int same = st->ndim == pp->ndim && st->shape[0] == pp->shape[0] && (pp->ndim == 1 || st->shape[1] == pp->shape[1]);
        if (!same) {
            char b[64];
            shape_str(b, sizeof b, pp);
            rc = zt_err(err, sizeof err, "%s: tensor %s has %d dims (first %" PRId64 "), the model needs %s", st_path,
                        st->name, st->ndim, st->ndim ? st->shape[0] : 0, b);
            break;
        }
        segs[p].param = p;
        segs[p].start = 0;
        segs[p].len = pp->numel;
        segs[p].value = zt_malloc((pp->numel ? pp->numel : 1) * sizeof(float));
        rc = zt_st_read_f32(&f, i, segs[p].value, err, sizeof err);
    }
    /* buffers and the tied head are expected extras; anything else is reported */
    int wte = zt_param_table_find(t, "transformer.wte.weight");
    for (int i = 0; i < f.ntensors && !rc; i++) {
        const char *n = f.tensors[i].name;
        if (used[i] || strstr(n, "attn.bias") || strstr(n, "attn.masked_bias")) continue;
        if (!strcmp(n, "lm_head.weight") && wte >= 0 && f.tensors[i].numel == t->params[wte].numel) {
            float *h = zt_malloc(f.tensors[i].numel * sizeof(float));
            rc = zt_st_read_f32(&f, i, h, err, sizeof err);
            if (!rc && memcmp(h, segs[wte].value, f.tensors[i].numel * sizeof(float)) != 0)
                rc = zt_err(err, sizeof err, "%s: lm_head.weight differs from wte (untied heads are not supported)",
                            st_path);
            free(h);
            continue;
        }
        fprintf(stderr, "zt-ckpt: warning: %s: ignoring tensor %s\n", st_path, n);
    }
    if (!rc) {
        char dir[PATH_MAX], src[PATH_MAX + 32], cfg[1024];
        snprintf(dir, sizeof dir, "%s.import.tmp", out);
        snprintf(cfg, sizeof cfg,
                 "# imported from %s\nmodel = { arch = \"gpt2\"; n_layer = %ld; n_head = %ld; n_embd = %ld; "
                 "vocab_size = %ld; block_size = %ld; };\n", st_path, L, NH, C, V, T);
        zt_ckpt_meta_t m;
        memset(&m, 0, sizeof m);
        snprintf(m.strategy, sizeof m.strategy, "imported");
        rc = zt_ckpt_write_segments(dir, &m, cfg, 0, 0, segs, t->nparams, t, MPI_COMM_SELF, err,
                                    sizeof err);
        snprintf(src, sizeof src, "%s/ckpt-00000000.h5", dir);
        if (!rc && rename(src, out) != 0) rc = zt_err(err, sizeof err, "%s: rename failed: %s", out, strerror(errno));
        snprintf(src, sizeof src, "%s/latest", dir);
        unlink(src);
        rmdir(dir);
    }
    if (rc) fprintf(stderr, "zt-ckpt: %s\n", err);
    else printf("wrote %s (weights only, %d tensors, %zu parameters)\n", out, t->nparams, t->total_numel);
    for (int p = 0; p < t->nparams; p++) free(segs[p].value);
    free(segs);
    free(used);
    zt_param_table_free(t);
    zt_st_close(&f);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, rc = 2;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        const char *c = argc > 1 ? argv[1] : "";
        if (!strcmp(c, "info") && argc == 3) rc = cmd_info(argv[2]);
        else if (!strcmp(c, "verify") && argc == 3) rc = cmd_verify(argv[2]);
        else if (!strcmp(c, "consolidate") && argc == 4) rc = cmd_consolidate(argv[2], argv[3]);
        else if (!strcmp(c, "export") && argc >= 4) {
            const char *dtype = "fp32", *shard = "5GB";
            int ok = 1, merge = 0;
            for (int i = 4; i < argc; i++) {
                if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
                else if (!strcmp(argv[i], "--max-shard-size") && i + 1 < argc) shard = argv[++i];
                else if (!strcmp(argv[i], "--merge")) merge = 1;
                else ok = 0;
            }
            if (ok) rc = cmd_export(argv[2], argv[3], dtype, shard, merge);
            else usage();
        }
        else if (!strcmp(c, "import") && argc == 5) rc = cmd_import(argv[2], argv[3], argv[4]);
        else usage();
        fflush(stdout);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
