#!/usr/bin/env python3
"""make_dataset_info_fixtures.py — dataset_info.json read by LLaMA-Factory itself, for ztrain's tests.

Writes tests/reference/sft/dataset_info/:
  dataset_info.json   entries with several mappings of the same kind of records:
      alpaca with its own column names, system and history mapped; alpaca records that
      hold system and history that no column maps (not read); "columns" naming only some
      columns (the others not read, input included); sharegpt with LLaMA-Factory's
      default tags, a record's system key not mapped; sharegpt with its own list, tags
      and roles; OpenAI-style messages as sharegpt with role/content tags; a directory of
      .json and .jsonl files; num_samples (fewer records than the file's, more, over a
      directory, two datasets drawing in turn); and entries ztrain refuses (named only by the tests of
      refusals, never loaded here);
  *.json, *.jsonl, shards/   the records;
  cases.json   per case: the data.dataset names, template, tokenizer (tests/reference/sft/tok/),
      cutoff_len, max_samples (the num_samples cases: seed, what transformers.set_seed gives
      numpy before the datasets load, as get_train_args does) and LLaMA-Factory's input_ids / labels: its own
      get_dataset_list, _load_single_dataset (which applies max_samples and aligns with
      its converters), concatenated in data.dataset's order as merge_dataset does, and
      SupervisedDatasetProcessor with its template.

LLaMA-Factory lists a directory's files with os.listdir, in the order the file system
gives; ztrain takes them in name order. Here os.listdir is sorted, so that the two
compare record by record whatever the file system.

Run with a venv holding llamafactory 0.9.5 and datasets 4.0.0 beside the packages of
tools/make-venv.sh (tests/reference/README.md):
    /root/.cache/lf-venv/bin/python tests/reference/make_dataset_info_fixtures.py
"""
import copy
import json
import os
import sys
import tempfile
from types import SimpleNamespace

_listdir = os.listdir
os.listdir = lambda path=".": sorted(_listdir(path))  # see the docstring

import datasets  # noqa: E402
import llamafactory  # noqa: E402
import transformers  # noqa: E402
from llamafactory.data.loader import _load_single_dataset  # noqa: E402
from llamafactory.data.parser import get_dataset_list  # noqa: E402
from llamafactory.data.processor.supervised import SupervisedDatasetProcessor  # noqa: E402
from llamafactory.data.template import TEMPLATES, get_template_and_fix_tokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_sft_fixtures as sft  # noqa: E402  (the fixture tokenizers)

OUT = os.path.join(sft.OUT, "dataset_info")
CACHE = tempfile.mkdtemp(prefix="lf-datasets-")  # the datasets library's cache, not kept

# alpaca records under their own names; "sys" and "turns" are read only where mapped
CUSTOM = [
    {"question": "Name a prime.", "context": "Below ten.", "answer": "Seven.", "sys": "Answer in one word.",
     "turns": [["Are you ready?", "Yes."]]},
    {"question": "And an even one?", "context": None, "answer": "Two.", "sys": None, "turns": None},
    {"question": "", "context": "Just the context this time.", "answer": "Noted.", "sys": "Be kind.",
     "turns": [["First?", "One."], ["Second?", "Two, 世界."]]},
]
# the default names, with system and history that no column maps in the plain entry
PLAIN = [
    {"instruction": "Say hi.", "input": "", "output": "Hi!", "system": "You are shy.",
     "history": [["Hello?", "...hello."]]},
    {"instruction": "Add.", "input": "2 and 3", "output": "5", "system": "Be exact.", "history": []},
    {"instruction": "Spell cat.", "input": None, "output": "C-A-T", "system": None, "history": None},
]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Ping?"}, {"from": "gpt", "value": "Pong."}],
     "system": "Ignored: the entry maps no system column."},
    {"conversations": [{"from": "system", "value": "Talk like a robot."}, {"from": "human", "value": "Status?"},
                       {"from": "gpt", "value": "ALL SYSTEMS GO."}, {"from": "human", "value": "And now?"},
                       {"from": "gpt", "value": "STILL GO."}], "system": "Not read either."},
]
DIALOG = [
    {"dialog": [{"speaker": "narrator", "text": "A quiet library."}, {"speaker": "customer", "text": "A book?"},
                {"speaker": "agent", "text": "Aisle three."}], "sys_prompt": "Whispered: the turn wins."},
    {"dialog": [{"speaker": "customer", "text": "Open late?"}, {"speaker": "agent", "text": "Till nine."},
                {"speaker": "customer", "text": "Sundays?"}, {"speaker": "agent", "text": "Closed."}],
     "sys_prompt": "You are the librarian."},
]
MESSAGES = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sky colour?"},
                  {"role": "assistant", "content": "Blue."}]},
    {"messages": [{"role": "user", "content": "One more?"}, {"role": "assistant", "content": "Green."}]},
]
# a directory: a JSON array and JSON Lines, named so that name order is not creation order
SHARDS = {
    "b.jsonl": [{"instruction": f"Shard b, record {i}.", "input": "", "output": f"b{i}"} for i in range(3)],
    "a.json": [{"instruction": f"Shard a, record {i}.", "input": "x" * i, "output": f"a{i}"} for i in range(2)],
    "c.jsonl": [{"instruction": "Shard c.", "input": "", "output": "c0"}],
}

ALPACA_MAPPED = {"prompt": "question", "query": "context", "response": "answer", "system": "sys", "history": "turns"}
INFO = {
    "custom": {"file_name": "custom.json", "columns": ALPACA_MAPPED},
    "plain": {"file_name": "plain.jsonl"},
    "plain_mapped": {"file_name": "plain.jsonl", "formatting": "alpaca",
                     "columns": {"prompt": "instruction", "query": "input", "response": "output",
                                 "system": "system", "history": "history"}},
    "plain_partial": {"file_name": "plain.jsonl", "columns": {"prompt": "instruction", "response": "output"}},
    "sharegpt_default": {"file_name": "sharegpt.json", "formatting": "sharegpt"},
    "dialog": {"file_name": "dialog.jsonl", "formatting": "sharegpt",
               "columns": {"messages": "dialog", "system": "sys_prompt"},
               "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "customer",
                        "assistant_tag": "agent", "system_tag": "narrator"}},
    "messages": {"file_name": "messages.json", "formatting": "sharegpt",
                 "columns": {"messages": "messages"},
                 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                          "assistant_tag": "assistant", "system_tag": "system"}},
    "shards": {"file_name": "shards", "split": "train", "subset": None, "folder": None},
    # num_samples: numpy's draws from the seed (fewer than the records, more, over a directory)
    "sampled": {"file_name": "plain.jsonl", "num_samples": 2},
    "oversampled": {"file_name": "custom.json", "columns": ALPACA_MAPPED, "num_samples": 7},
    "sampled_shards": {"file_name": "shards", "num_samples": 5},
    # refused by ztrain, one line naming the entry and the field (tests/unit/test_sft.c)
    "hub": {"hf_hub_url": "someone/some-data"},
    "hub_and_file": {"file_name": "plain.jsonl", "ms_hub_url": "someone/some-data"},
    "script": {"script_url": "my_script"},
    "cloud": {"cloud_file_name": "s3://bucket/data.json"},
    "ranked": {"file_name": "plain.jsonl", "ranking": True},
    "kto": {"file_name": "plain.jsonl", "columns": {"prompt": "instruction", "response": "output", "kto_tag": "k"}},
    "pictures": {"file_name": "plain.jsonl", "columns": {"prompt": "instruction", "response": "output",
                                                         "images": "images"}},
    "videos": {"file_name": "plain.jsonl", "columns": {"response": "output", "videos": "v"}},
    "tools": {"file_name": "sharegpt.json", "formatting": "sharegpt", "columns": {"messages": "conversations",
                                                                                  "tools": "tools"}},
    "openai": {"file_name": "messages.json", "formatting": "openai"},
    "bad_samples": {"file_name": "plain.jsonl", "num_samples": 0},
    "test_split": {"file_name": "plain.jsonl", "split": "test"},
    "typo": {"file_name": "plain.jsonl", "colums": {"prompt": "instruction"}},
    "column_typo": {"file_name": "plain.jsonl", "columns": {"promt": "instruction", "response": "output"}},
    "no_response": {"file_name": "plain.jsonl", "columns": {"prompt": "instruction"}},
    "no_user_tag": {"file_name": "sharegpt.json", "formatting": "sharegpt", "tags": {"role_tag": "from",
                                                                                     "content_tag": "value"}},
    "csv": {"file_name": "table.csv"},
    "missing": {"file_name": "nowhere.json"},
    "no_file": {"formatting": "alpaca"},
    "yaml_format": {"file_name": "plain.jsonl", "formatting": "yaml"},
}


def write_data():
    os.makedirs(os.path.join(OUT, "shards"), exist_ok=True)

    def dump_array(path, recs):
        with open(os.path.join(OUT, path), "w") as f:
            json.dump(recs, f, indent=1, ensure_ascii=False)
            f.write("\n")

    def dump_lines(path, recs):
        with open(os.path.join(OUT, path), "w") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    dump_array("custom.json", CUSTOM)
    dump_lines("plain.jsonl", PLAIN)
    dump_array("sharegpt.json", SHAREGPT)
    dump_lines("dialog.jsonl", DIALOG)
    dump_array("messages.json", MESSAGES)
    for name, recs in SHARDS.items():
        (dump_array if name.endswith(".json") else dump_lines)(os.path.join("shards", name), recs)
    with open(os.path.join(OUT, "dataset_info.json"), "w") as f:
        json.dump(INFO, f, indent=2)
        f.write("\n")


def lf_setup(template_name, cutoff_len, dataset_dir, max_samples=None):
    """The tokenizer, template and arguments LLaMA-Factory's loader and processors read."""
    tokenizer = sft.hf_tokenizer(sft.TEMPLATE_TOKENIZER[template_name])
    n_before = len(tokenizer)
    data_args = SimpleNamespace(template=template_name, train_on_prompt=False, mask_history=False,
                                cutoff_len=cutoff_len, tool_format=None, default_system=None, enable_thinking=True,
                                preserve_thinking=False, neat_packing=False, packing=False, dataset_dir=dataset_dir,
                                media_dir=dataset_dir, streaming=False, max_samples=max_samples,
                                preprocessing_num_workers=None, overwrite_cache=True)
    model_args = SimpleNamespace(cache_dir=CACHE, hf_hub_token=None)
    training_args = SimpleNamespace(local_process_index=0, dataloader_num_workers=0)
    TEMPLATES.update(copy.deepcopy(sft.PRISTINE))  # get_template_and_fix_tokenizer mutates the template
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    assert len(tokenizer) == n_before, f"{template_name}: LLaMA-Factory added tokens: the fixture lacks them"
    return tokenizer, template, data_args, model_args, training_args


def write_cases(out, generator, cases):
    doc = {"generator": generator,
           "versions": f"llamafactory {llamafactory.__version__}, datasets {datasets.__version__}, "
                       f"transformers {transformers.__version__}",
           "cases": cases}
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


def lf_samples(names, template_name, cutoff_len, max_samples=None, seed=42):
    tokenizer, template, data_args, model_args, training_args = lf_setup(template_name, cutoff_len, OUT, max_samples)
    proc = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None, data_args=data_args)
    ids, labels = [], []
    transformers.set_seed(seed)  # get_train_args seeds numpy's global state before the datasets load
    for attr in get_dataset_list([n.strip() for n in names.split(",")], OUT):
        aligned = _load_single_dataset(attr, model_args, data_args, training_args)  # merge_dataset: concat
        part = proc.preprocess_dataset(aligned[:])
        assert len(part["input_ids"]) == len(aligned), f"{names}: LLaMA-Factory dropped a record"
        ids += part["input_ids"]
        labels += part["labels"]
    return ids, labels


def main():
    datasets.disable_caching()
    write_data()
    cases = []

    def case(names, template_name, cutoff_len=1024, max_samples=None, seed=None):
        ids, labels = lf_samples(names, template_name, cutoff_len, max_samples, seed or 42)
        c = {"dataset": names, "template": template_name,
             "tokenizer": "tok/" + sft.TEMPLATE_TOKENIZER[template_name], "cutoff_len": cutoff_len,
             "max_samples": max_samples or 0, "input_ids": ids, "labels": labels}
        if seed is not None:  # the num_samples cases: LLaMA-Factory's seed (train.seed)
            c["seed"] = seed
        cases.append(c)

    for names in ("custom", "plain", "plain_mapped", "plain_partial", "sharegpt_default", "dialog", "messages",
                  "shards"):
        case(names, "qwen")
    case("custom, dialog,shards", "llama3")
    case("custom", "qwen", cutoff_len=24)
    case("shards", "qwen", max_samples=4)  # the directory's first 4 records: across its files
    case("plain,shards", "default", max_samples=2)  # per dataset
    case("sampled", "qwen", seed=42)
    case("plain, oversampled", "qwen", seed=42)
    case("oversampled", "llama3", seed=1337)
    case("sampled_shards,dialog", "qwen", seed=7)
    case("sampled_shards", "qwen", max_samples=3, seed=42)  # max_samples of what num_samples drew
    case("sampled, plain, oversampled", "qwen", seed=42)  # the second draws from where the first left numpy
    case("sampled_shards,sampled", "default", seed=1337, max_samples=4)
    write_cases(OUT, "tests/reference/make_dataset_info_fixtures.py", cases)

if __name__ == "__main__":
    sys.exit(main())
