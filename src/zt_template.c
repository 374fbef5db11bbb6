/* zt_template.c — LLaMA-Factory's chat templates as a table, and Template._encode.
 *
 * The table transcribes llamafactory 0.9.5 data/template.py's register_template calls
 * for the eleven templates, with register_template's defaults filled in: format_system
 * defaults to the plain "{{content}}" formatter (not to format_user), format_assistant
 * to "{{content}}" + eos (no eos with efficient_eos), format_prefix to nothing,
 * thought_words to ("<think>\n", "\n</think>\n\n"). */
#include "zt_template.h"

#include "zt_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T(s) {ZT_SLOT_TEXT, s}
#define BOS {ZT_SLOT_BOS, NULL}
#define EOS {ZT_SLOT_EOS, NULL}
#define CONTENT T("{{content}}")
#define THINK {"<think>\n", "\n</think>\n\n"}

static const zt_template_t templates[] = {
    {.name = "default",
     .format_user = {T("Human: {{content}}"), EOS, T("\nAssistant:")},
     .format_assistant = {CONTENT, EOS, T("\n")},
     .format_system = {T("System: {{content}}"), EOS, T("\n")},
     .default_system = "",
     .thought_words = THINK,
     .replace_jinja_template = 1},
    {.name = "alpaca",
     .format_user = {T("### Instruction:\n{{content}}\n\n### Response:\n")},
     .format_assistant = {CONTENT, EOS, T("\n\n")},
     .format_system = {CONTENT},
     .default_system = "Below is an instruction that describes a task. Write a response that appropriately "
                       "completes the request.\n\n",
     .thought_words = THINK,
     .replace_jinja_template = 1},
    {.name = "qwen",
     .format_user = {T("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n")},
     .format_assistant = {T("{{content}}<|im_end|>\n")},
     .format_system = {T("<|im_start|>system\n{{content}}<|im_end|>\n")},
     .default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
     .stop_words = {"<|im_end|>"},
     .thought_words = THINK,
     .replace_eos = 1},
    {.name = "qwen3",
     .format_user = {T("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n")},
     .format_assistant = {T("{{content}}<|im_end|>\n")},
     .format_system = {T("<|im_start|>system\n{{content}}<|im_end|>\n")},
     .default_system = "",
     .stop_words = {"<|im_end|>"},
     .thought_words = THINK,
     .replace_eos = 1,
     .reasoning = 1},
    {.name = "qwen3_nothink",
     .format_user = {T("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n")},
     .format_assistant = {T("{{content}}<|im_end|>\n")},
     .format_system = {T("<|im_start|>system\n{{content}}<|im_end|>\n")},
     .default_system = "",
     .stop_words = {"<|im_end|>"},
     .thought_words = THINK,
     .replace_eos = 1},
    {.name = "llama3",
     .format_user = {T("<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n")},
     .format_assistant = {T("{{content}}<|eot_id|>")},
     .format_system = {T("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>")},
     .format_prefix = {BOS},
     .default_system = "",
     .stop_words = {"<|eot_id|>", "<|eom_id|>"},
     .thought_words = THINK,
     .replace_eos = 1},
    {.name = "llama2",
     .format_user = {BOS, T("[INST] {{content}} [/INST]")},
     .format_assistant = {CONTENT, EOS},
     .format_system = {T("<<SYS>>\n{{content}}\n<</SYS>>\n\n")},
     .default_system = "",
     .thought_words = THINK,
     .fuse_system = 1},
    {.name = "mistral", /* mistral tokenizer v3 */
     .format_user = {T("[INST] {{content}}[/INST]")},
     .format_assistant = {T(" {{content}}"), EOS},
     .format_system = {T("{{content}}\n\n")},
     .format_prefix = {BOS},
     .default_system = "",
     .thought_words = THINK,
     .fuse_system = 1},
    /* gemma3 is gemma with a multimodal plugin: for text its samples are gemma's */
#define GEMMA_TURNS                                                                                   \
    .format_user = {T("<start_of_turn>user\n{{content}}<end_of_turn>\n<start_of_turn>model\n")},      \
    .format_assistant = {T("{{content}}<end_of_turn>\n")}, .format_system = {T("{{content}}\n\n")}, \
    .format_prefix = {BOS}, .default_system = "", .thought_words = THINK, .fuse_system = 1
    {.name = "gemma", GEMMA_TURNS, .stop_words = {"<end_of_turn>"}, .replace_eos = 1},
    {.name = "gemma2", GEMMA_TURNS, .stop_words = {"<eos>", "<end_of_turn>"}, .efficient_eos = 1},
    {.name = "gemma3", GEMMA_TURNS, .stop_words = {"<end_of_turn>"}, .replace_eos = 1},
#undef GEMMA_TURNS
};
#define NTEMPLATES (sizeof templates / sizeof templates[0])

const zt_template_t *zt_template_find(const char *name)
{
    for (size_t i = 0; name && i < NTEMPLATES; i++)
        if (strcmp(templates[i].name, name) == 0) return &templates[i];
    return NULL;
}

const char *zt_template_names(void)
{
    return "default|alpaca|qwen|qwen3|qwen3_nothink|llama3|llama2|mistral|gemma|gemma2|gemma3";
}

void zt_ids_push(zt_ids_t *a, int32_t id)
{
    zt_ids_append(a, &id, 1);
}

void zt_ids_append(zt_ids_t *a, const int32_t *ids, size_t n)
{
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 64;
        while (cap < a->n + n) cap *= 2;
        a->v = realloc(a->v, cap * sizeof *a->v);
        if (!a->v) zt_fatal("out of memory: %zu token ids", cap);
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
}

void zt_ids_free(zt_ids_t *a)
{
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

static int token_of(const zt_tokenizer_t *tok, const char *s, const char *what, int32_t *id, char *err,
                    size_t errlen)
{
    *id = zt_tokenizer_token_id(tok, s, strlen(s));
    if (*id < 0)
        return zt_err(err, errlen,
                      "the tokenizer has no token '%s' (%s); LLaMA-Factory would add it to the vocabulary, "
                      "ztrain needs it in tokenizer.json's added_tokens",
                      s, what);
    return 0;
}

int zt_template_special_ids(const zt_template_t *t, const zt_tokenizer_t *tok, const char *tokenizer_path,
                            zt_template_ids_t *ids, char *err, size_t errlen)
{
    char *eos = tokenizer_path ? zt_tokenizer_config_token(tokenizer_path, "eos_token") : NULL;
    char *bos = tokenizer_path ? zt_tokenizer_config_token(tokenizer_path, "bos_token") : NULL;
    char *pad = tokenizer_path ? zt_tokenizer_config_token(tokenizer_path, "pad_token") : NULL;
    int rc = 0;
    ids->bos = ids->eos = ids->pad = -1;
    if (t->replace_eos) rc = token_of(tok, t->stop_words[0], "the template's eos, stop_words[0]", &ids->eos, err, errlen);
    else rc = token_of(tok, eos ? eos : "<|endoftext|>", eos ? "eos_token" : "the eos LLaMA-Factory adds",
                       &ids->eos, err, errlen);
    /* the other stop words: LLaMA-Factory adds them as special tokens */
    for (int i = t->replace_eos; rc == 0 && i < 2 && t->stop_words[i]; i++) {
        int32_t sw;
        rc = token_of(tok, t->stop_words[i], "a stop word, added as a special token", &sw, err, errlen);
    }
    if (rc == 0 && bos) rc = token_of(tok, bos, "bos_token", &ids->bos, err, errlen);
    if (rc == 0) {
        if (pad) rc = token_of(tok, pad, "pad_token", &ids->pad, err, errlen);
        else ids->pad = ids->eos; /* fix_special_tokens: pad_token = eos_token */
    }
    free(eos);
    free(bos);
    free(pad);
    return rc;
}

/* ---- formatting --------------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
} str_t;

static void str_add(str_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        b->s = realloc(b->s, cap);
        if (!b->s) zt_fatal("out of memory");
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* Python's s.replace(key, value, 1) appended to out. */
static void replace_first(str_t *out, const char *s, const char *key, const char *value)
{
    const char *p = value ? strstr(s, key) : NULL;
    if (!p) {
        str_add(out, s, strlen(s));
        return;
    }
    str_add(out, s, (size_t)(p - s));
    str_add(out, value, strlen(value));
    str_add(out, p + strlen(key), strlen(p + strlen(key)));
}

/* StringFormatter.apply on one text slot: each keyword replaced once, in the order the
 * caller passes them (content first, then idx for format_user), so an "{{idx}}" that the
 * content brings in is replaced as LLaMA-Factory replaces it. */
static void format_slot(str_t *out, const char *slot, const char *content, const char *idx)
{
    if (!idx) {
        replace_first(out, slot, "{{content}}", content);
        return;
    }
    str_t tmp = {0};
    replace_first(&tmp, slot, "{{content}}", content);
    replace_first(out, tmp.s ? tmp.s : "", "{{idx}}", idx);
    free(tmp.s);
}

/* One element sink: either token ids (each text element encoded on its own, as
 * _convert_elements_to_ids does) or text (render). */
typedef struct {
    zt_tokenizer_t *tok;       /* NULL: render */
    const zt_tokenizer_t *ctok;
    const zt_template_ids_t *ids;
    zt_ids_t *out;
    str_t *text;
    int rc;
} sink_t;

static void emit_text(sink_t *k, const char *s, size_t n)
{
    if (n == 0) return; /* `if len(elem) != 0` */
    if (k->text) {
        str_add(k->text, s, n);
        return;
    }
    int32_t *v = NULL;
    size_t m = 0;
    if (zt_tokenizer_encode(k->tok, s, n, &v, &m) != 0) k->rc = -1;
    else zt_ids_append(k->out, v, m);
    free(v);
}

static void emit_special(sink_t *k, int32_t id)
{
    if (id < 0) return; /* bos_token_id is None: nothing */
    if (k->text) {
        size_t len = 0;
        const char *s = zt_tokenizer_decode_token(k->ctok, id, &len);
        if (s) str_add(k->text, s, len);
    } else {
        zt_ids_push(k->out, id);
    }
}

static void apply(sink_t *k, const zt_slot_t *slots, const char *content, const char *idx)
{
    for (int i = 0; i < ZT_TEMPLATE_SLOTS && slots[i].kind != ZT_SLOT_END; i++) {
        if (slots[i].kind == ZT_SLOT_BOS) emit_special(k, k->ids->bos);
        else if (slots[i].kind == ZT_SLOT_EOS) emit_special(k, k->ids->eos);
        else {
            str_t s = {0};
            format_slot(&s, slots[i].text, content, idx);
            emit_text(k, s.s ? s.s : "", s.n);
            free(s.s);
        }
    }
}

/* Template.remove_thought: re.sub(open(.*?)close, "", DOTALL) then lstrip("\n"). */
static char *remove_thought(const zt_template_t *t, const char *s)
{
    str_t out = {0};
    const char *o = t->thought_words[0], *c = t->thought_words[1];
    size_t ol = strlen(o), cl = strlen(c);
    const char *p = s;
    for (;;) {
        const char *a = strstr(p, o);
        const char *b = a ? strstr(a + ol, c) : NULL;
        if (!b) break; /* an opening with no closing after it matches nowhere later either */
        str_add(&out, p, (size_t)(a - p));
        p = b + cl;
    }
    str_add(&out, p, strlen(p));
    const char *q = out.s ? out.s : "";
    while (*q == '\n') q++;
    char *r = strdup(q);
    free(out.s);
    return r;
}

/* `thought_words[0].strip() not in content and thought_words[1].strip() not in content` */
static int has_thought(const char *content)
{
    return strstr(content, "<think>") || strstr(content, "</think>");
}

static void encode_messages(sink_t *k, const zt_template_t *t, const char *system, const char *const *msgs,
                            int n)
{
    if (!system || !system[0]) system = t->default_system; /* `system or self.default_system` */
    for (int i = 0; i < n && k->rc == 0; i++) {
        zt_ids_t *dst = k->out ? &k->out[i] : NULL;
        sink_t s = *k;
        s.out = dst;
        char *fused = NULL;
        if (i == 0) {
            apply(&s, t->format_prefix, NULL, NULL);
            if (system[0] && !t->fuse_system) apply(&s, t->format_system, system, NULL);
            if (system[0] && t->fuse_system) {
                /* Llama2Template: format_system.apply(content=system)[0] + the user's content */
                str_t f = {0};
                format_slot(&f, t->format_system[0].text, system, NULL);
                str_add(&f, msgs[0], strlen(msgs[0]));
                fused = f.s;
            }
        }
        if (i % 2 == 0) {
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i / 2);
            apply(&s, t->format_user, fused ? fused : msgs[i], t->fuse_system ? NULL : idx);
        } else {
            apply(&s, t->format_assistant, msgs[i], NULL);
        }
        free(fused);
        k->rc = s.rc;
    }
}

int zt_template_encode(const zt_template_t *t, zt_tokenizer_t *tok, const zt_template_ids_t *ids,
                       const char *system, const char *const *msgs, int n, int discard_history_cot,
                       zt_ids_t *out)
{
    sink_t k = {tok, tok, ids, out, NULL, 0};
    if (!t->reasoning) {
        encode_messages(&k, t, system, msgs, n);
        return k.rc;
    }
    /* ReasoningTemplate.encode_multiturn with enable_thinking = True */
    char **m = zt_calloc((size_t)n, sizeof *m);
    for (int i = 0; i < n; i++)
        m[i] = (discard_history_cot && i % 2 == 1 && i < n - 2) ? remove_thought(t, msgs[i]) : strdup(msgs[i]);
    encode_messages(&k, t, system, (const char *const *)m, n);
    if (k.rc == 0) {
        char empty[64];
        snprintf(empty, sizeof empty, "%s%s", t->thought_words[0], t->thought_words[1]);
        int32_t *th = NULL;
        size_t nth = 0;
        if (zt_tokenizer_encode(tok, empty, strlen(empty), &th, &nth) != 0) k.rc = -1;
        for (int i = discard_history_cot ? n - 2 : 0; k.rc == 0 && i < n; i += 2) {
            if (has_thought(m[i + 1])) continue;
            /* the response starts with the empty thought block: it carries loss */
            zt_ids_t r = {0};
            zt_ids_append(&r, th, nth);
            zt_ids_append(&r, out[i + 1].v, out[i + 1].n);
            zt_ids_free(&out[i + 1]);
            out[i + 1] = r;
        }
        free(th);
    }
    for (int i = 0; i < n; i++) free(m[i]);
    free(m);
    return k.rc;
}

char *zt_template_render(const zt_template_t *t, const zt_tokenizer_t *tok, const zt_template_ids_t *ids,
                         const char *system, const char *const *msgs, int n)
{
    str_t text = {0};
    sink_t k = {NULL, tok, ids, NULL, &text, 0};
    encode_messages(&k, t, system, msgs, n);
    if (!text.s) text.s = strdup("");
    return text.s;
}
