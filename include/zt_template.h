/* zt_template.h — chat templates as LLaMA-Factory 0.9.5 defines them (data/template.py).
 *
 * A template is data: the slots of its formatters (format_user, format_assistant,
 * format_system, format_prefix), default_system, stop_words, thought_words and the
 * flags of LLaMA-Factory's Template class. A slot is a text (with at most one
 * {{content}}) or the tokenizer's bos / eos token ({"bos_token"} / {"eos_token"}).
 * Encoding follows Template._encode: each message becomes the ids of its elements,
 * every text slot tokenized on its own (encode(text, add_special_tokens=False)),
 * so ids equal LLaMA-Factory's for the same tokenizer. Turn 0 is prefix + system +
 * user; Llama2Template (fuse_system) puts the system text inside the first user
 * message instead. ReasoningTemplate (reasoning) adds the empty thought block
 * "<think>\n\n</think>\n\n" to the response of every turn whose answer has no
 * <think> or </think>, as LLaMA-Factory does with enable_thinking=True (its default).
 *
 * Tools, observations and function calls (format_tools, format_function,
 * format_observation) are not part of this table: ztrain refuses those roles.
 * LLaMA-Factory 0.9.5 has no "system allowed" flag: every template accepts a
 * system message (a template without format_system prepends it as plain text). */
#ifndef ZT_TEMPLATE_H
#define ZT_TEMPLATE_H

#include "zt_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { ZT_SLOT_END = 0, ZT_SLOT_TEXT, ZT_SLOT_BOS, ZT_SLOT_EOS } zt_slot_kind_t;
typedef struct {
    zt_slot_kind_t kind;
    const char *text; /* ZT_SLOT_TEXT only */
} zt_slot_t;

#define ZT_TEMPLATE_SLOTS 4 /* a formatter's slots, ZT_SLOT_END-terminated when fewer */

typedef struct {
    const char *name;
    zt_slot_t format_user[ZT_TEMPLATE_SLOTS];
    zt_slot_t format_assistant[ZT_TEMPLATE_SLOTS];
    zt_slot_t format_system[ZT_TEMPLATE_SLOTS];
    zt_slot_t format_prefix[ZT_TEMPLATE_SLOTS];
    const char *default_system;  /* "" when none */
    const char *stop_words[2];   /* NULL-terminated */
    const char *thought_words[2];
    int efficient_eos;           /* eos once at the end; turn t > 0's prompt label starts with eos */
    int replace_eos;             /* stop_words[0] becomes the eos token */
    int replace_jinja_template;  /* LLaMA-Factory overwrites the tokenizer's chat_template */
    int fuse_system;             /* Llama2Template */
    int reasoning;               /* ReasoningTemplate (enable_thinking = True) */
} zt_template_t;

/* The template called name (default, alpaca, qwen, qwen3, qwen3_nothink, llama3, llama2,
 * mistral, gemma, gemma2, gemma3), or NULL. */
const zt_template_t *zt_template_find(const char *name);
/* "default|alpaca|...": the names, for help texts and errors. */
const char *zt_template_names(void);

/* A growing array of token ids. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} zt_ids_t;
void zt_ids_push(zt_ids_t *a, int32_t id);
void zt_ids_append(zt_ids_t *a, const int32_t *ids, size_t n);
void zt_ids_free(zt_ids_t *a);

/* The special ids a template uses with a tokenizer, as LLaMA-Factory's fix_special_tokens
 * leaves them: eos = stop_words[0] when replace_eos, else the tokenizer's eos_token, else
 * <|endoftext|>; bos = the tokenizer's bos_token or -1 (a bos slot then adds nothing);
 * pad = pad_token, else eos. The tokenizer's names come from tokenizer_config.json beside
 * tokenizer_path (zt_tokenizer_config_token). LLaMA-Factory adds a missing token to the
 * vocabulary (resize_vocab); ztrain cannot, so a needed token that the tokenizer lacks
 * (and any other stop word) is an error naming it. */
typedef struct {
    int32_t bos, eos, pad;
} zt_template_ids_t;
int zt_template_special_ids(const zt_template_t *t, const zt_tokenizer_t *tok, const char *tokenizer_path,
                            zt_template_ids_t *ids, char *err, size_t errlen);

/* Template._encode (+ ReasoningTemplate.encode_multiturn's thought block) of one
 * conversation: msgs[0..n) alternate user, assistant (n even); system NULL or "" means the
 * default system. discard_history_cot: mask_history's removal of history thoughts
 * (reasoning templates only). out[i] (n arrays, appended to) receives message i's ids;
 * pairs (out[2k], out[2k+1]) are encode_multiturn's (source, target). Returns 0 or -1. */
int zt_template_encode(const zt_template_t *t, zt_tokenizer_t *tok, const zt_template_ids_t *ids,
                       const char *system, const char *const *msgs, int n, int discard_history_cot,
                       zt_ids_t *out);

/* The conversation rendered as text (bos/eos as the tokenizer's token strings, NULL ->
 * nothing), the text _encode's pieces come from: for comparing with a jinja chat template.
 * malloc'd, NUL-terminated. */
char *zt_template_render(const zt_template_t *t, const zt_tokenizer_t *tok, const zt_template_ids_t *ids,
                         const char *system, const char *const *msgs, int n);

#endif
