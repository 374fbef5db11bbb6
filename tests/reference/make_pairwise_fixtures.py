#!/usr/bin/env python3
"""make_pairwise_fixtures.py — preference pairs as LLaMA-Factory 0.9.5 makes them, for ztrain's tests.

Writes tests/reference/sft/pairwise/:
  dataset_info.json   "ranking": true entries: alpaca with data.format's fixed names
      (instruction, input, chosen, rejected, system, history), sharegpt with LLaMA-Factory's
      default tags (conversations, chosen and rejected turns, system), OpenAI-style messages
      as sharegpt with role/content tags, alpaca under its own names; and entries ztrain
      refuses (named only by the tests of refusals, never loaded here);
  *.json, *.jsonl     the records: system prompts, history, multi-turn prompts, answers of
      unequal lengths, thoughts in the history and in one answer (qwen3's reasoning);
  cases.json   per case: the data.dataset name, template, tokenizer (tests/reference/sft/tok/),
      cutoff_len (small ones cut the prompt, the answers or both) and LLaMA-Factory's
      chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels: its own
      get_dataset_list, _load_single_dataset (its converters with ranking) and
      PairwiseDatasetProcessor with the template.

Run with the venv holding llamafactory 0.9.5 and datasets 4.0.0 (tests/reference/README.md):
    /root/.cache/lf-trainer-venv/bin/python tests/reference/make_pairwise_fixtures.py
"""
import json
import os
import sys

import datasets
from llamafactory.data.loader import _load_single_dataset
from llamafactory.data.parser import get_dataset_list
from llamafactory.data.processor.pairwise import PairwiseDatasetProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_dataset_info_fixtures as dsinfo  # noqa: E402  (LLaMA-Factory's loader set up as there)
import make_sft_fixtures as sft  # noqa: E402  (the fixture tokenizers)

OUT = os.path.join(sft.OUT, "pairwise")

LONG = ("The quick brown fox jumps over the lazy dog, again and again, while the farmer counts sheep: "
        "one, two, three, four, five, six, seven, eight, nine, ten. ") * 2

# data.format = alpaca with data.ranking: instruction, input, chosen, rejected, system, history
ALPACA = [
    {"instruction": "Name a prime.", "input": "Below ten.", "chosen": "Seven.", "rejected": "Nine, I think."},
    {"instruction": "Summarize the text.", "input": LONG, "chosen": "A fox jumps; a farmer counts sheep.",
     "rejected": "The text is about " + "animals and numbers, " * 6 + "mostly.", "system": "Be terse."},
    {"instruction": "And the capital of Italy?", "input": "", "chosen": "Rome.", "rejected": "Milan.",
     "history": [["What is the capital of France?", "<think>\nEasy.\n</think>\n\nParis."],
                 ["And of Germany?", "Berlin, 世界."]]},
    {"instruction": "", "input": "Only an input here.", "chosen": "<think>\nIt asks nothing.\n</think>\n\nNoted.",
     "rejected": "What?", "system": None, "history": None},
]
# data.format = sharegpt with data.ranking: the prompt's turns end with the user's
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Ping?"}], "chosen": {"from": "gpt", "value": "Pong."},
     "rejected": {"from": "gpt", "value": "I do not play games, " + "sorry, " * 10 + "really."}},
    {"conversations": [{"from": "system", "value": "Talk like a robot."}, {"from": "human", "value": "Status?"},
                       {"from": "gpt", "value": "ALL SYSTEMS GO."}, {"from": "human", "value": "And now? " + LONG}],
     "chosen": {"from": "gpt", "value": "STILL GO."}, "rejected": {"from": "gpt", "value": "I am a person."},
     "system": "Not read: the leading system turn wins."},
    {"conversations": [{"from": "human", "value": "Count to three."}], "system": "Count well.",
     "chosen": {"from": "gpt", "value": "1, 2, 3."}, "rejected": {"from": "gpt", "value": "1, 3, 2."}},
]
MESSAGES = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sky colour?"}],
     "chosen": {"role": "assistant", "content": "Blue."}, "rejected": {"role": "assistant", "content": "Plaid."}},
    {"messages": [{"role": "user", "content": "One more?"}, {"role": "assistant", "content": "Green."},
                  {"role": "user", "content": "Another?"}], "system": "Colours only.",
     "chosen": {"role": "assistant", "content": "Red."}, "rejected": {"role": "assistant", "content": ""
                                                                       "Another colour, maybe red or green."}},
]
# alpaca under its own names (orca_pairs' layout in LLaMA-Factory's own dataset_info.json)
CUSTOM = [
    {"question": "Is water wet?", "better": "It wets things; whether it is wet is a matter of words.",
     "worse": "No.", "sys": "You are a careful scientist."},
    {"question": "Two plus two?", "better": "Four.", "worse": "Five.", "sys": ""},
]

FIXED_ALPACA = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected",
                "system": "system", "history": "history"}
INFO = {
    "alpaca_pairs": {"file_name": "alpaca_pairs.json", "ranking": True, "columns": FIXED_ALPACA},
    "sharegpt_pairs": {"file_name": "sharegpt_pairs.jsonl", "formatting": "sharegpt", "ranking": True,
                       "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                                   "system": "system"}},
    "messages_pairs": {"file_name": "messages_pairs.json", "formatting": "sharegpt", "ranking": True,
                       "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected",
                                   "system": "system"},
                       "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                "assistant_tag": "assistant", "system_tag": "system"}},
    "custom_pairs": {"file_name": "custom_pairs.jsonl", "ranking": True,
                     "columns": {"prompt": "question", "chosen": "better", "rejected": "worse", "system": "sys"}},
    # refused by ztrain, one line naming the entry and the field (tests/unit/test_sft.c)
    "ranked_unmapped": {"file_name": "alpaca_pairs.json", "ranking": True},
    "ranked_no_rejected": {"file_name": "alpaca_pairs.json", "ranking": True,
                           "columns": {"prompt": "instruction", "chosen": "chosen"}},
    "chosen_unranked": {"file_name": "alpaca_pairs.json", "columns": {"prompt": "instruction", "response": "chosen",
                                                                      "chosen": "chosen"}},
    "ranking_string": {"file_name": "alpaca_pairs.json", "ranking": "yes", "columns": FIXED_ALPACA},
    "kto": {"file_name": "alpaca_pairs.json", "columns": {"prompt": "instruction", "response": "chosen",
                                                          "kto_tag": "k"}},
}


def write_data():
    os.makedirs(OUT, exist_ok=True)

    def dump(path, recs):
        with open(os.path.join(OUT, path), "w") as f:
            if path.endswith(".jsonl"):
                for r in recs:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            else:
                json.dump(recs, f, indent=1, ensure_ascii=False)
                f.write("\n")

    dump("alpaca_pairs.json", ALPACA)
    dump("sharegpt_pairs.jsonl", SHAREGPT)
    dump("messages_pairs.json", MESSAGES)
    dump("custom_pairs.jsonl", CUSTOM)
    with open(os.path.join(OUT, "dataset_info.json"), "w") as f:
        json.dump(INFO, f, indent=2)
        f.write("\n")


def lf_pairs(name, template_name, cutoff_len):
    tokenizer, template, data_args, model_args, training_args = dsinfo.lf_setup(template_name, cutoff_len, OUT)
    processor = sft.GEMMA3_PROCESSOR if template_name == "gemma3" else None
    proc = PairwiseDatasetProcessor(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    (attr,) = get_dataset_list([name], OUT)
    assert attr.ranking
    aligned = _load_single_dataset(attr, model_args, data_args, training_args)
    out = proc.preprocess_dataset(aligned[:])
    assert len(out["chosen_input_ids"]) == len(aligned), f"{name}: LLaMA-Factory dropped a record"
    return {k: out[k] for k in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")}


def main():
    datasets.disable_caching()
    write_data()
    cases = []
    for name in ("alpaca_pairs", "sharegpt_pairs", "messages_pairs", "custom_pairs"):
        for template_name, cutoff_len in (("qwen3_nothink", 1024), ("llama3", 1024), ("gemma3", 1024),
                                          ("qwen3", 1024), ("gemma2", 1024), ("qwen3_nothink", 40),
                                          ("llama3", 24), ("gemma2", 30), ("qwen3", 50)):
            c = {"dataset": name, "template": template_name,
                 "tokenizer": "tok/" + sft.TEMPLATE_TOKENIZER[template_name], "cutoff_len": cutoff_len}
            c.update(lf_pairs(name, template_name, cutoff_len))
            cases.append(c)
    dsinfo.write_cases(OUT, "tests/reference/make_pairwise_fixtures.py", cases)

if __name__ == "__main__":
    sys.exit(main())
