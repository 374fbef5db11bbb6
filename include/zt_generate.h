/* zt_generate.h — `ztrain --generate`: prompts in, completions out, under any strategy.
 *
 * Prompts (generate.prompt, or generate.prompts_file: JSON Lines of OpenAI messages
 * {"messages": [{"role", "content"}, ...]} or alpaca records {"instruction", "input",
 * "system"}) are rendered with data.template as the SFT preprocessing renders a prompt
 * (the conversation up to the assistant's answer) and completed token by token: greedy
 * (generate.temperature = 0) or sampled with temperature, top_k and top_p, until the
 * template's eos / stop words or generate.max_new_tokens. Prompt i goes to rank
 * i mod world, which completes generate.batch_size of its prompts at once (a row whose
 * answer ended takes the rank's next prompt at the next step); all ranks
 * step together (every forward gathers the same units, zero3 included), and the
 * sampling generator of prompt i is seeded by (train.seed, i): the output does not
 * depend on the world size, the strategy or the batch (up to fp32 rounding of batched
 * GEMMs). Rank 0 writes
 * <output_dir>/generations.jsonl in prompt order (generations-<step>.jsonl at each
 * evaluation of a training run with generate.at_eval). */
#ifndef ZT_GENERATE_H
#define ZT_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "zt_comm.h"
#include "zt_config.h"

/* logits (batch, V) of the last of n[b] tokens of each of `batch` sequences, row b
 * untouched where n[b] = 0 (a finished or absent sequence). Every rank calls it once
 * per step with the same batch, each with its own tokens. */
typedef void (*zt_generate_logits_fn)(void *arg, int batch, const int32_t *const *tokens, const int *n,
                                      float *logits);

/* Collective: writes <output_dir>/<name>. context: the most tokens one forward takes
 * (older ones are dropped); batch: the prompts a data-parallel rank completes at once
 * (prompt i is rank i mod world's). 0, or -1 with err on every rank. */
int zt_generate_run(const zt_config_t *cfg, const char *name, int context, int batch, int vocab_size,
                    zt_generate_logits_fn fn, void *arg, zt_comm_t *comm, char *err, size_t errlen);

#endif
