/* zt_dataset_info.h — LLaMA-Factory's dataset_info.json, as its data/parser.py
 * (DatasetAttr, get_dataset_list) and data/loader.py (_load_single_dataset) read it for
 * SFT: the names of data.dataset / data.eval_dataset to local files and the mapping of
 * their records' keys (zt_sft_columns_t).
 *
 * An entry is read as LLaMA-Factory 0.9.5 reads it:
 *  - file_name: DATASET_DIR/file_name, a .json / .jsonl file, or a directory whose files
 *    (all .json / .jsonl) are one dataset, taken in name order (LLaMA-Factory takes
 *    os.listdir's order, which the file system decides);
 *  - formatting: alpaca (default) | sharegpt;
 *  - columns: prompt, query, response, history, messages, system; without "columns" the
 *    defaults instruction, input, output, conversations (history and system not read);
 *    with it, a column it does not list is not read (LLaMA-Factory sets it to None);
 *  - tags (sharegpt): role_tag, content_tag, user_tag, assistant_tag, observation_tag,
 *    function_tag, system_tag; defaults from, value, human, gpt, observation,
 *    function_call, system, and likewise none where "tags" is given without one;
 *  - split: "train" (a local file's only split); subset and folder, which LLaMA-Factory
 *    does not use for local files, are not either;
 *  - num_samples: the records numpy's global state draws (zt_np_random.h, zt_sft_prep_t);
 *  - ranking: true: preference pairs, the answers in the chosen and rejected columns
 *    (both required; LLaMA-Factory's DatasetAttr has no default for them; alpaca's
 *    response is not read); the entry's files become a pairs file (zt_data_write_pairs_h5).
 * Refused, in one line naming the file, the entry and the field: hf_hub_url, ms_hub_url,
 * om_hub_url, script_url, cloud_file_name (ztrain reads local files only), the kto_tag
 * column (no KTO), chosen / rejected without ranking (not read then), ranking with one of
 * them unmapped, the tools column (the templates here render no tool descriptions),
 * images / videos / audios (text only), formatting openai, a split other than train, an unknown
 * key (with the nearest known one), and a mapping that leaves an SFT sample nothing to
 * read (no response without ranking, no messages, no role or content tag, no user or
 * assistant tag). */
#ifndef ZT_DATASET_INFO_H
#define ZT_DATASET_INFO_H

#include "zt_sft.h"

typedef struct {
    char *name;                /* the entry's key in dataset_info.json */
    char *base;                /* DATASET_DIR/file_name: a file or a directory */
    char **files;              /* the file, or the directory's files in name order */
    int nfiles;
    zt_sft_columns_t columns;  /* strings owned here */
    long num_samples;          /* 0: none */
} zt_dataset_entry_t;

typedef struct {
    zt_dataset_entry_t *v;
    int n;
} zt_datasets_t;

/* names: LLaMA-Factory's data.dataset, comma-separated, each name stripped of white space
 * ("" or NULL: none, out->n = 0). Reads DATASET_DIR/dataset_info.json once; an unknown name
 * gets the nearest of the file's names. 0, or -1 with one line in err. */
int zt_datasets_load(const char *dataset_dir, const char *names, zt_datasets_t *out, char *err, size_t errlen);
void zt_datasets_free(zt_datasets_t *d);

#endif
