/* zt_data.h — token datasets and the deterministic sampler.
 *
 * A dataset is one or more token files read as one concatenated stream:
 *  - HDF5: a 1-D integer dataset /tokens, attributes vocab_size and eot_token;
 *  - llm.c .bin shards: 256 x int32 header (magic 20240520, version 1, token
 *    count at [2]), then uint16 tokens.
 * Sample i of an epoch is tokens [i*T, i*T + T + 1) of the stream (the +1 is
 * the last target); samples never straddle two files, each file contributes
 * floor((n_tokens - 1) / T) samples.
 *
 * Ordering: with shuffle off, epoch order is file order. With shuffle on, the
 * order is a permutation that is a pure function of (seed, epoch) — the same on
 * every rank and at every world size, so the same global batch is seen whatever
 * the parallel layout. Global sample g of the run is (epoch g / S, position
 * g % S) for S samples per epoch.
 *
 * Errors (missing file, truncated file, bad magic, token id >= vocab_size,
 * no samples) are returned as one-line messages naming the file, never fatal:
 * the caller makes them a collective decision. */
#ifndef ZT_DATA_H
#define ZT_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct zt_dataset zt_dataset_t;

/* Opens files (HDF5 or .bin, detected by content), checks headers and sizes.
 * vocab_size bounds token ids (checked on every sample read, and against the
 * file's vocab_size attribute when present). Returns NULL and fills err. */
zt_dataset_t *zt_data_open(const char *const *files, int nfiles, int seq_len, int vocab_size,
                           char *err, size_t errlen);
void zt_data_close(zt_dataset_t *ds);

/* Samples per epoch (> 0 for an open dataset). */
int64_t zt_data_num_samples(const zt_dataset_t *ds);
int64_t zt_data_num_tokens(const zt_dataset_t *ds);

/* Reads global sample g (see above) into out[0 .. seq_len] (seq_len + 1 tokens).
 * Returns 0 or -1 with err (e.g. a token id out of range, naming file and offset). */
int zt_data_read(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *out,
                 char *err, size_t errlen);

/* SFT sample files (zt-prep-data --format ...; LLaMA-Factory's supervised samples): HDF5
 * with /input_ids (int32, the samples concatenated), /labels (int32, -100 where a token
 * carries no loss), /sample_offsets (int64, n + 1), attributes vocab_size, eot_token
 * (the padding id) and tokenizer. Sample i of the epoch is one sample (a packed row with
 * --packing). Neat-packed files (--neat-packing) add /segment_ids (int32, beside
 * /input_ids): per token 1 + the index of its sample in the packed row, 0 on padding
 * (LLaMA-Factory's neat_packing attention_mask). */
int zt_data_is_sft(const zt_dataset_t *ds);
/* 1 when a file of the dataset holds /segment_ids (then zt_data_read_row gives segments) */
int zt_data_has_segments(const zt_dataset_t *ds);
/* Global sample g as a training row of seq_len positions: inputs, and the targets the
 * model predicts there (-1: no loss). A token stream gives tokens [i T, i T + T) and the
 * same shifted by one (zt_data_read); an SFT sample gives input_ids[0 .. n-1) and
 * labels[1 .. n) (-100 -> -1), cut at seq_len and padded with eot_token / -1. */
int zt_data_read_pair(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                      char *err, size_t errlen);
/* The same, and the row's attention segments and positions (seq_len each; seg and pos may
 * be NULL), what zt_model_set_segments takes. A neat-packed row: seg = /segment_ids (0 on
 * the padding, the trainer's padding included), positions restarting at 0 with every
 * sample (0 on the padding: LLaMA-Factory's position_ids), and no target on a sample's
 * last token (there labels[t + 1] is the next sample's first label: the sample would be
 * trained to predict a token it cannot see; LLaMA-Factory's labels are -100 there unless
 * train_on_prompt). Any other row: seg 1 everywhere (one sequence) and positions t. */
int zt_data_read_row(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                     int32_t *seg, int32_t *pos, char *err, size_t errlen);
/* segment_ids: NULL, or per token (neat packing: written as /segment_ids) */
int zt_data_write_sft_h5(const char *path, const int32_t *input_ids, const int32_t *labels,
                         const int32_t *segment_ids, size_t ntokens, const int64_t *sample_offsets, size_t nsamples,
                         int vocab_size, int eot_token, const char *tokenizer, char *err, size_t errlen);
/* Preference pairs (LLaMA-Factory's pairwise samples): an SFT sample file whose sample 2i is
 * pair i's chosen sample and 2i + 1 its rejected one (the same prompt), with the root
 * attribute pairs = 1 (nsamples even, no /segment_ids). So that a pair's halves never
 * part, zt_data_open_pairs reads the file pair by pair; zt_data_open refuses it
 * ("preference pairs need train.stage = dpo"), so that no SFT step trains on the rejected
 * answers. */
int zt_data_write_pairs_h5(const char *path, const int32_t *input_ids, const int32_t *labels, size_t ntokens,
                           const int64_t *sample_offsets, size_t nsamples, int vocab_size, int eot_token,
                           const char *tokenizer, char *err, size_t errlen);

/* Pairs files only (zt_data_write_pairs_h5), the others refused: sample i of the epoch is
 * pair i, so zt_data_num_samples counts pairs and the shuffle permutes whole pairs (the same
 * order on every rank and world size, as for samples). */
zt_dataset_t *zt_data_open_pairs(const char *const *files, int nfiles, int seq_len, int vocab_size, char *err,
                                 size_t errlen);
int zt_data_is_pairs(const zt_dataset_t *ds);
/* Global pair g as two rows of zt_data_read_row, chosen then rejected: inp, tgt (and seg,
 * pos when not NULL) hold 2 * seq_len, [0, T) the chosen row and [T, 2T) the rejected. A
 * pairs dataset has no single rows (zt_data_read_row refuses it). */
int zt_data_read_pair_rows(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                           int32_t *seg, int32_t *pos, char *err, size_t errlen);

/* The position within epoch that global sample g maps to (exposed for tests). */
int64_t zt_data_sample_index(const zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle);

/* Writes tokens to an HDF5 token file (serial HDF5; used by the prep tool and tests). */
int zt_data_write_h5(const char *path, const int32_t *tokens, size_t n, int vocab_size,
                     int eot_token, char *err, size_t errlen);

/* Tokenizer the files were made with: the HDF5 attribute `tokenizer` written by
 * zt-prep-data ("byte" or "gpt2-bpe"); an HDF5 file without it is "byte" when its
 * vocab_size is 257, else unknown; .bin files say nothing. The first file that
 * knows decides (files that disagree fail zt_data_open); all-.bin is "gpt2-bpe"
 * (llm.c's convention); otherwise "".
 * (Additive to the original interface: the trainer uses it to decode samples.) */
const char *zt_data_tokenizer(const zt_dataset_t *ds);
/* EOT token id from the files' eot_token attribute (50256 for GPT-2 BPE), -1 if unknown. */
int zt_data_eot_token(const zt_dataset_t *ds);

/* As zt_data_write_h5, also storing the `tokenizer` attribute (NULL = none). */
int zt_data_write_h5_tok(const char *path, const int32_t *tokens, size_t n, int vocab_size,
                         int eot_token, const char *tokenizer, char *err, size_t errlen);
/* Writes an llm.c .bin token file (ids must be < 65536). */
int zt_data_write_bin(const char *path, const int32_t *tokens, size_t n, char *err, size_t errlen);

/* Byte-level tokenizer used when no BPE files are given: token = byte value
 * (vocab 256 + 1 EOT = 257). GPT-2 BPE lives in zt_tokenizer.h. */
#define ZT_BYTE_VOCAB 257
#define ZT_BYTE_EOT 256

#endif
