/* zt_sft.h — supervised fine-tuning samples from instruction data, as LLaMA-Factory 0.9.5
 * makes them (data/converter.py, data/processor/supervised.py).
 *
 * Records (zt_sft_read) come from a JSON array or JSON Lines file in one of three formats
 * (zt_sft_columns; a dataset_info.json entry maps other names, zt_dataset_info.h):
 *  - alpaca:   {"instruction"?, "input"?, "output", "system"?, "history"?: [[q, a], ...]};
 *              the user turn is "instruction\ninput" (either part left out when empty);
 *  - sharegpt: {"conversations": [{"from": "system"?|"human"|"gpt", "value"}...], "system"?};
 *  - messages: {"messages": [{"role": "system"?|"user"|"assistant", "content"}...]}, OpenAI's
 *              layout, read as LLaMA-Factory reads it with sharegpt formatting and the
 *              role/content/user/assistant/system tags.
 * A leading system turn is the system message; turns must then alternate user, assistant
 * and end with an assistant turn. Tool turns (observation, function_call, tool, function)
 * are refused. Errors are one line: "FILE: record I: KEY: problem" (I counts from 0), or
 * "FILE:LINE:COL: not JSON: ..." — where LLaMA-Factory warns and drops a broken example,
 * ztrain stops, so bad data is never silently thrown away.
 *
 * Preference pairs (columns with ranking, LLaMA-Factory's "ranking": true): a record is a
 * prompt (alpaca's history and "instruction\ninput"; sharegpt's turns, ending with a user
 * turn) and two answers, chosen (alpaca: a string; sharegpt: one assistant turn
 * {role_tag: assistant_tag, content_tag: ...}) and rejected likewise. Refused, one line
 * each: a chosen or rejected that is missing, of the wrong kind or empty, the two equal, a
 * wrong role (a prompt not ending with the user's turn, an answer not the assistant's).
 *
 * Samples (zt_sft_build): Template.encode_multiturn, then per turn (the last first with
 * mask_history) infer_seqlen's truncation to what is left of cutoff_len, prompt labels
 * -100 unless train_on_prompt, history targets -100 with mask_history. A sample whose
 * labels are all -100 is kept, as LLaMA-Factory keeps it (it adds no loss; the trainer's
 * mean is over loss-bearing tokens). With packing, LLaMA-Factory's packing: cutoff_len
 * is lowered by one (as DataArguments does), each group of 1000 records
 * (preprocessing_batch_size) is greedy-knapsacked into rows that are padded to
 * cutoff_len with pad (labels -100); a sample longer than the knapsack is dropped.
 * With neat_packing (which implies packing, as in LLaMA-Factory) the rows are the same
 * and each token also gets its segment id, LLaMA-Factory's neat attention_mask: 1 + the
 * index of its sample in the row (the knapsack's order), 0 on the padding; the trainer
 * then keeps the packed samples from attending to each other and restarts positions at
 * each (zt_data_read_row). Packing's groups count from the first record given, so a
 * share of the records that starts at a multiple of ZT_SFT_PACK_BATCH packs as it does
 * in the whole. */
#ifndef ZT_SFT_H
#define ZT_SFT_H

#include "zt_template.h"
#include "zt_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { ZT_SFT_ALPACA = 1, ZT_SFT_SHAREGPT, ZT_SFT_MESSAGES } zt_sft_format_t;

#define ZT_SFT_PACK_BATCH 1000 /* LLaMA-Factory's preprocessing_batch_size: packing is per group */

/* "alpaca" | "sharegpt" | "messages" -> format, 0 for anything else. */
zt_sft_format_t zt_sft_format(const char *name);

/* Which keys of a record make its conversation: LLaMA-Factory's DatasetAttr columns and
 * tags for SFT. NULL is LLaMA-Factory's None: that column is not read (a record's "system"
 * or "history" counts only where a column maps it) or that role is not recognised.
 * alpaca: history pairs, then "prompt\nquery" (either part left out when empty), then
 * response; sharegpt: the turns of the messages list, a leading system_tag turn being the
 * system message (else the system column's). Turns tagged observation_tag or function_tag
 * are refused: ztrain does no tool calling. */
typedef struct {
    zt_sft_format_t format; /* ZT_SFT_ALPACA or ZT_SFT_SHAREGPT */
    const char *prompt, *query, *response, *history; /* alpaca */
    const char *messages;                            /* sharegpt */
    const char *system;                              /* both */
    const char *role_tag, *content_tag, *user_tag, *assistant_tag, *observation_tag, *function_tag, *system_tag;
    int ranking;                    /* preference pairs: the answers are chosen and rejected */
    const char *chosen, *rejected;  /* with ranking: their columns (alpaca: strings; sharegpt: turns) */
} zt_sft_columns_t;

/* data.format's fixed names (NULL for an unknown format): alpaca's instruction, input,
 * output, system, history; sharegpt's conversations, system and LLaMA-Factory's default
 * tags; messages as sharegpt with the role/content/user/assistant/system tags (tool and
 * function turns refused). With ranking (preference pairs) the answers are the columns
 * chosen and rejected, alpaca's output not read. */
const zt_sft_columns_t *zt_sft_columns(zt_sft_format_t fmt, int ranking);

typedef struct {
    char *system;   /* "" when none: the template's default_system applies */
    char **msgs;    /* user, assistant, user, assistant, ... (nmsgs even, >= 2) */
    int nmsgs;
    char *rejected; /* a preference pair: the rejected answer, msgs' last being the chosen one; else NULL */
} zt_sft_record_t;

typedef struct {
    zt_sft_record_t *rec;
    size_t n;
} zt_sft_records_t;

/* Reads path (JSON array when its first non-blank byte is '[', else JSON Lines). */
int zt_sft_read(const char *path, zt_sft_format_t fmt, zt_sft_records_t *out, char *err, size_t errlen);
/* The same from memory (name is used in errors). */
int zt_sft_parse(const char *name, const char *text, size_t len, zt_sft_format_t fmt, zt_sft_records_t *out,
                 char *err, size_t errlen);

/* zt_sft_parse in two steps, so that ranks can share a file. zt_sft_index finds where each
 * record's JSON is (a byte scan: the elements of a JSON array, the non-blank lines of JSON
 * Lines), with the errors zt_sft_parse gives for a rejected array or an empty file;
 * zt_sft_parse_range then parses and converts records [begin, end) only, with the
 * indices, lines and messages zt_sft_parse gives them. A JSON array's syntax comes first,
 * as when jansson parses it whole: a syntax error anywhere in the range returns
 * ZT_SFT_SYNTAX (with the whole file's message) before any record's content is
 * checked; every other error returns -1. */
typedef struct {
    size_t n;              /* records */
    size_t *off, *len;     /* each record's JSON text in the file's */
    size_t *line;          /* JSON Lines: its line (from 1); 0 in a JSON array */
    int array;             /* a JSON array, else JSON Lines */
} zt_sft_index_t;
#define ZT_SFT_SYNTAX (-2)
int zt_sft_index(const char *name, const char *text, size_t len, zt_sft_index_t *ix, char *err, size_t errlen);
void zt_sft_index_free(zt_sft_index_t *ix);
int zt_sft_parse_range(const char *name, const char *text, size_t len, const zt_sft_index_t *ix, size_t begin,
                       size_t end, const zt_sft_columns_t *cols, zt_sft_records_t *out, char *err, size_t errlen);
void zt_sft_records_free(zt_sft_records_t *r);

typedef struct {
    const zt_template_t *tpl;
    zt_template_ids_t ids; /* zt_template_special_ids */
    int cutoff_len;        /* data.cutoff_len (LLaMA-Factory default 2048) */
    int train_on_prompt;
    int mask_history;
    int packing;
    int neat_packing; /* implies packing; rows keep their samples' boundaries (segment_ids) */
    int ranking;      /* preference pairs (zt_sft_encode_pair); not with packing, train_on_prompt, mask_history */
} zt_sft_opts_t;

/* LLaMA-Factory's infer_seqlen: lengths of source and target after cutting to cutoff. */
void zt_sft_infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff, int64_t *new_source,
                         int64_t *new_target);

/* One record -> input_ids, labels (appended; equal lengths). 0 or -1 with err. */
int zt_sft_encode(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_record_t *r, zt_ids_t *input_ids,
                  zt_ids_t *labels, char *err, size_t errlen);

/* One preference pair -> chosen and rejected samples, as LLaMA-Factory's
 * PairwiseDatasetProcessor: Template.encode_oneturn of the conversation ending with each
 * answer (the prompt: every message before the answer, history thoughts removed), eos
 * after each answer with efficient_eos, infer_seqlen(prompt, the longer answer, cutoff_len)
 * cutting the shared prompt and both answers alike; labels -100 on the prompt.
 * ids[0], labels[0]: chosen; ids[1], labels[1]: rejected (appended). 0 or -1 with err. */
int zt_sft_encode_pair(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_record_t *r, zt_ids_t ids[2],
                       zt_ids_t labels[2], char *err, size_t errlen);

/* The samples of a file: ids and labels concatenated, offsets[nsamples + 1]; with
 * neat_packing segment_ids beside them (per token: 1 + its sample's index in the row, 0
 * on padding), else segment_ids.n = 0. */
typedef struct {
    zt_ids_t input_ids, labels, segment_ids;
    int64_t *offsets;
    size_t nsamples, cap;
    size_t dropped; /* packing: samples longer than the knapsack */
    size_t failed;  /* after an error: the record of recs that failed (SIZE_MAX: the options) */
    int pairs;      /* preference pairs: sample 2i is record i's chosen, 2i + 1 its rejected */
} zt_sft_samples_t;

int zt_sft_build(const zt_sft_opts_t *o, zt_tokenizer_t *tok, const zt_sft_records_t *recs, zt_sft_samples_t *out,
                 char *err, size_t errlen);
void zt_sft_samples_free(zt_sft_samples_t *s);

/* JSON files -> one SFT sample file (zt_data_write_sft_h5; written as OUT.tmp, renamed):
 * what zt-prep-data --format does and the trainer runs for data.format != tokens. */
typedef struct {
    const char *tokenizer;     /* model directory or tokenizer.json (zt_tokenizer_load) */
    const char *format;        /* alpaca | sharegpt | messages */
    const char *template_name; /* zt_template_find */
    int cutoff_len, train_on_prompt, mask_history, packing;
    int neat_packing; /* implies packing; writes /segment_ids */
    long max_samples; /* LLaMA-Factory's max_samples: each input's first records only (0 = all) */
    const zt_sft_columns_t *columns; /* a dataset_info.json entry's mapping, in place of format (NULL: format's) */
    int one_dataset; /* the inputs are one dataset (a directory's files): max_samples counts over them together */
    long num_samples;      /* LLaMA-Factory's num_samples (0 = none), of the inputs as one dataset, before
                            * max_samples: the records numpy's np.random.permutation / choice draw */
    long num_samples_seed; /* the seed transformers.set_seed gave numpy's global state (LLaMA-Factory's seed) */
    const size_t *prior_draws; /* (records, num_samples) of each dataset LLaMA-Factory draws for before this one,
                                * in order: numpy's state has moved on by their draws */
    int nprior;
    int ranking; /* format's files hold preference pairs (data.ranking; columns say it for themselves):
                  * the file is written as pairs (zt_data_write_pairs_h5) */
} zt_sft_prep_t;
typedef struct {
    size_t records, samples, tokens, loss_tokens, dropped;
    size_t unread;        /* records past max_samples in their inputs (counted, never parsed) */
    double seconds;       /* reading, templating, tokenizing, masking, gathering (not the HDF5 write) */
    double total_seconds; /* all of it, the write included */
    double share_cpu;     /* CPU seconds this process spent parsing and tokenizing its share (the
                           * part that divides over the ranks; MPI's waits spin, so not the rest) */
} zt_sft_prep_stats_t;
int zt_sft_prep(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *out_path,
                zt_sft_prep_stats_t *st, char *err, size_t errlen);

/* The records of inputs (as zt_sft_index counts them): a dataset's size, which its
 * num_samples draws depend on. 0, or -1 with zt_sft_index's error. */
int zt_sft_count_records(const char *const *inputs, int ninputs, size_t *count, char *err, size_t errlen);

/* zt_sft_prep over the ranks of comm's world (NULL: this process alone), collectively:
 * every rank reads and indexes the inputs, parses, templates and tokenizes its share of
 * the records (a contiguous range of whole packing groups, ZT_SFT_PACK_BATCH records, so
 * the packed rows are those of one process), and rank 0 gathers the samples in record
 * order and writes out_path: the same file one process writes. An error is the one a
 * single process meets first (the file order, a JSON array's syntax before its records,
 * the first bad record), one line on every rank, and every rank returns -1. */
struct zt_comm;
int zt_sft_prep_ranks(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *out_path,
                      struct zt_comm *comm, zt_sft_prep_stats_t *st, char *err, size_t errlen);

/* The cache of inputs for the trainer (one data.train_files file, or the files of one
 * dataset_info.json entry): "BASE.<16 hex digits>.sft.h5", the digits an FNV-1a hash of
 * everything that decides the samples: the inputs' bytes, the tokenizer's files
 * (tokenizer.json or vocab.json + merges.txt, tokenizer_config.json), format or columns,
 * template, cutoff_len, the flags (neat_packing, ranking too), max_samples and a version of this
 * code. A change to any of them names another file; old ones are left for the user to
 * delete. */
int zt_sft_cache_path(const zt_sft_prep_t *p, const char *const *inputs, int ninputs, const char *base, char *out,
                      size_t outlen, char *err, size_t errlen);

#endif
