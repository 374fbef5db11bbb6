#!/usr/bin/env python3
"""make_sft_fixtures.py — SFT samples made by LLaMA-Factory itself, for ztrain's tests.

Writes tests/reference/sft/:
  tok/<name>/tokenizer.json, tokenizer_config.json   the trained fixture tokenizers of
      tests/reference/tokenizers/ with the special tokens the chat templates need added
      as added tokens (so LLaMA-Factory adds none and both sides split them alike);
  alpaca.json, sharegpt.jsonl, messages.json          the instruction data;
  cases.json   per case: template, tokenizer, data file, options and LLaMA-Factory's
               input_ids / labels (SupervisedDatasetProcessor or
               PackedSupervisedDatasetProcessor over its own converters, template and
               fix_special_tokens), for neat_packing cases also its attention_mask (the
               segment ids: 1 + the sample's index in the row, 0 on padding) and
               position_ids, and per template the text transformers'
               apply_chat_template gives with the jinja template LLaMA-Factory makes
               (Template.fix_jinja_template).

Run with the venv of tools/make-venv.sh plus llamafactory 0.9.5 (pip install --no-deps
llamafactory==0.9.5 datasets torchaudio):
    ~/.cache/ztrain-venv/bin/python tests/reference/make_sft_fixtures.py
"""
import copy
import json
import os
import sys
from types import SimpleNamespace

import llamafactory
import tokenizers
import transformers
from llamafactory.data.converter import AlpacaDatasetConverter, SharegptDatasetConverter
from llamafactory.data.parser import DatasetAttr
from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor, SupervisedDatasetProcessor
from llamafactory.data.template import TEMPLATES, get_template_and_fix_tokenizer
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "sft")

# name: (base fixture, special tokens added, non-special added tokens, bos, eos)
TOKENIZERS = {
    # default, alpaca, llama2: GPT-2-style BPE; <s> </s> as Llama-2's bos/eos, [INST] stays text
    "gpt2": ("gpt2.json", ["<s>", "</s>"], [], "<s>", "</s>"),
    # mistral v3: [INST] [/INST] are control tokens
    "mistral": ("gpt2.json", ["<s>", "</s>", "[INST]", "[/INST]"], [], "<s>", "</s>"),
    # llama3: the header and turn tokens (<|begin_of_text|> is in the fixture already)
    "llama3": ("llama3.json", ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"], [],
               "<|begin_of_text|>", "<|end_of_text|>"),
    # qwen, qwen3: <|im_start|> <|im_end|> are in the fixture; <think> </think> as Qwen3 has them
    # (added, not special); no bos, as Qwen's tokenizer_config says
    "qwen": ("qwen2.json", [], ["<think>", "</think>"], None, "<|endoftext|>"),
    # gemma, gemma2, gemma3: the turn tokens as Gemma 3 has them; pad_token <pad> as Gemma's tokenizer_config says
    "gemma": ("gemma.json", ["<start_of_turn>", "<end_of_turn>"], [], "<bos>", "<eos>"),
}
PAD = {"gemma": "<pad>"}  # the others have none: LLaMA-Factory pads with eos


def make_tokenizers():
    for name, (base, special, plain, bos, eos) in TOKENIZERS.items():
        d = os.path.join(OUT, "tok", name)
        os.makedirs(d, exist_ok=True)
        tok = Tokenizer.from_file(os.path.join(HERE, "tokenizers", base))
        if special:
            tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
        if plain:
            tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        cfg = {"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
        if name in PAD:
            cfg["pad_token"] = PAD[name]
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")


def hf_tokenizer(name):
    d = os.path.join(OUT, "tok", name)
    _, _, _, bos, eos = TOKENIZERS[name]
    kw = {"eos_token": eos}
    if bos:
        kw["bos_token"] = bos
    if name in PAD:
        kw["pad_token"] = PAD[name]
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"), **kw)


LONG = ("The quick brown fox jumps over the lazy dog, again and again, while the farmer counts "
        "sheep: one, two, three, four, five, six, seven, eight, nine, ten. ") * 3

ALPACA = [
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep well."},
    {"instruction": "Translate to French.", "input": "Good morning, my friend!",
     "output": "Bonjour, mon ami ! Café ?"},
    {"instruction": "Summarize the text.", "input": LONG, "output": "A fox jumps; a farmer counts. " * 4,
     "system": "You are a terse assistant."},
    {"instruction": "And the capital of Italy?", "input": "", "output": "Rome.",
     "history": [["What is the capital of France?", "Paris."], ["And of Germany?", "Berlin, 世界."]]},
    {"instruction": "", "input": "Only an input here, no instruction.", "output": "Understood."},
    {"instruction": "Think first.", "output": "<think>\nTwo plus two.\n</think>\n\nFour.",
     "history": [["Warm up: 1+1?", "<think>\nEasy.\n</think>\n\nTwo."]]},
    {"instruction": "Write a long answer.", "input": None, "output": LONG, "system": None},
]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hi there!"}, {"from": "gpt", "value": "Hello! How can I help?"}]},
    {"conversations": [{"from": "system", "value": "You speak like a pirate."},
                       {"from": "human", "value": "Where is the treasure?"},
                       {"from": "gpt", "value": "Arr, under the old oak tree."},
                       {"from": "human", "value": "How deep?"},
                       {"from": "gpt", "value": "Ten paces, matey."},
                       {"from": "human", "value": "Thanks."},
                       {"from": "gpt", "value": "Fair winds!"}]},
    {"conversations": [{"from": "human", "value": LONG}, {"from": "gpt", "value": LONG},
                       {"from": "human", "value": "Shorter please."}, {"from": "gpt", "value": LONG[:120]}]},
    {"system": "System text from the record's own key.",
     "conversations": [{"from": "human", "value": "Line one\nline two\n\n  indented"},
                       {"from": "gpt", "value": "Seen: 3 lines.\n"}]},
    # StringFormatter replaces {{idx}} after {{content}}: a literal "{{idx}}" in a user turn becomes the turn number
    {"conversations": [{"from": "human", "value": "Echo {{idx}} and {{content}}."}, {"from": "gpt", "value": "{{idx}}"},
                       {"from": "human", "value": "Again {{idx}} {{idx}}"}, {"from": "gpt", "value": "ok"}]},
    {"conversations": [{"from": "human", "value": "Reason?"},
                       {"from": "gpt", "value": "<think>\nhmm\n</think>\n\nYes."},
                       {"from": "human", "value": "Again?"}, {"from": "gpt", "value": "No."}]},
]

MESSAGES = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
                  {"role": "assistant", "content": "Blue."}]},
    {"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "1, 2, 3."},
                  {"role": "user", "content": "Backwards?"}, {"role": "assistant", "content": "3, 2, 1."}]},
]

TEMPLATE_TOKENIZER = {"default": "gpt2", "alpaca": "gpt2", "llama2": "gpt2", "mistral": "mistral",
                      "llama3": "llama3", "qwen": "qwen", "qwen3": "qwen", "qwen3_nothink": "qwen"}
# added later: their cases and renders come after the others', so those stay as they were
GEMMA_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma"}
TEMPLATE_TOKENIZER.update(GEMMA_TEMPLATES)
# gemma3's mm_plugin (Gemma3Plugin) wants a processor with an image processor, even for text: a stand-in with
# what its process_messages reads, which only a message with an <image> placeholder would use
GEMMA3_PROCESSOR = SimpleNamespace(image_processor=object(), boi_token="<start_of_image>",
                                   full_image_sequence="<start_of_image>", image_do_pan_and_scan=False)

# packing works per preprocessing batch of 1000 records: 1100 short records of varied lengths
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
PACK = [{"instruction": " ".join(WORDS[(i * 7 + k) % 12] for k in range(1 + i % 3)),
         "output": " ".join(WORDS[(i * 5 + k) % 12] for k in range(1 + (i * 3) % 4))} for i in range(1100)]

DATA = {"alpaca.json": ("alpaca", ALPACA), "sharegpt.jsonl": ("sharegpt", SHAREGPT),
        "messages.json": ("messages", MESSAGES), "packing.jsonl": ("alpaca", PACK)}


def write_data():
    with open(os.path.join(OUT, "alpaca.json"), "w") as f:
        json.dump(ALPACA, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(OUT, "sharegpt.jsonl"), "w") as f:
        for r in SHAREGPT:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "packing.jsonl"), "w") as f:
        for r in PACK:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(OUT, "messages.json"), "w") as f:
        json.dump(MESSAGES, f, indent=1, ensure_ascii=False)
        f.write("\n")


def converter(fmt, data_args):
    if fmt == "alpaca":
        attr = DatasetAttr("file", "fixture", formatting="alpaca", system="system", history="history")
        return AlpacaDatasetConverter(attr, data_args)
    attr = DatasetAttr("file", "fixture", formatting="sharegpt", system="system")
    if fmt == "messages":  # LLaMA-Factory's OpenAI layout: sharegpt formatting with these tags
        attr = DatasetAttr("file", "fixture", formatting="sharegpt", system="system", messages="messages",
                           role_tag="role", content_tag="content", user_tag="user", assistant_tag="assistant",
                           system_tag="system")
    return SharegptDatasetConverter(attr, data_args)


COLUMNS = {"alpaca": ["instruction", "input", "output", "system", "history"],
           "sharegpt": ["conversations", "system"], "messages": ["messages", "system"]}


def lf_samples(template_name, tok_name, data_file, cutoff_len, train_on_prompt=False, mask_history=False,
               packing=False, neat_packing=False):
    fmt, records = DATA[data_file]
    tokenizer = hf_tokenizer(tok_name)
    n_before = len(tokenizer)
    packing = packing or neat_packing  # DataArguments.__post_init__
    data_args = SimpleNamespace(template=template_name, train_on_prompt=train_on_prompt, mask_history=mask_history,
                                cutoff_len=cutoff_len - (1 if packing else 0), tool_format=None,
                                default_system=None, enable_thinking=True, preserve_thinking=False,
                                neat_packing=neat_packing, packing=packing)
    TEMPLATES.update(copy.deepcopy(PRISTINE))  # get_template_and_fix_tokenizer mutates the template
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    assert len(tokenizer) == n_before, f"{template_name}: LLaMA-Factory added tokens: the fixture lacks them"
    conv = converter(fmt, data_args)
    # HF datasets give every JSON column to every row, None where a record lacks it
    rows = [conv({k: r.get(k) for k in COLUMNS[fmt]}) for r in records]
    examples = {k: [r[k] for r in rows] for k in rows[0]}
    cls = PackedSupervisedDatasetProcessor if packing else SupervisedDatasetProcessor
    processor = GEMMA3_PROCESSOR if template_name == "gemma3" else None
    proc = cls(template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)
    keys = ["input_ids", "labels"] + (["attention_mask", "position_ids"] if neat_packing else [])
    out = {k: [] for k in keys}
    for b in range(0, len(rows), 1000):  # dataset.map(batched=True, batch_size=preprocessing_batch_size=1000)
        part = proc.preprocess_dataset({k: v[b:b + 1000] for k, v in examples.items()})
        for k in keys:
            out[k] += part[k]
    assert len(out["input_ids"]) == (len(records) if not packing else len(out["input_ids"]))
    special = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}
    if neat_packing:
        special["neat"] = {"attention_mask": out["attention_mask"], "position_ids": out["position_ids"]}
    return out["input_ids"], out["labels"], special, tokenizer, template


def main():
    make_tokenizers()
    write_data()
    cases = []

    def case(name, template_name, data_file, cutoff_len, **opt):
        tok_name = TEMPLATE_TOKENIZER[template_name]
        ids, labels, special, _, _ = lf_samples(template_name, tok_name, data_file, cutoff_len, **opt)
        neat = special.pop("neat", None)
        c = {"name": name, "template": template_name, "tokenizer": "tok/" + tok_name,
             "data": data_file, "format": DATA[data_file][0], "cutoff_len": cutoff_len,
             "train_on_prompt": opt.get("train_on_prompt", False),
             "mask_history": opt.get("mask_history", False), "packing": opt.get("packing", False),
             "special": special, "input_ids": ids, "labels": labels}
        if neat:  # only these cases carry the key, so the others stay as they were
            c.update(neat_packing=True, **neat)
        cases.append(c)

    for t in (t for t in TEMPLATE_TOKENIZER if t not in GEMMA_TEMPLATES):
        case(f"{t}-alpaca", t, "alpaca.json", 1024)
        case(f"{t}-sharegpt", t, "sharegpt.jsonl", 1024)
        case(f"{t}-sharegpt-cut40", t, "sharegpt.jsonl", 40)  # infer_seqlen on every turn
    case("alpaca-alpaca-cut24", "alpaca", "alpaca.json", 24)
    case("llama3-alpaca-train-on-prompt", "llama3", "alpaca.json", 1024, train_on_prompt=True)
    case("llama3-sharegpt-mask-history", "llama3", "sharegpt.jsonl", 1024, mask_history=True)
    case("llama3-sharegpt-mask-history-cut40", "llama3", "sharegpt.jsonl", 40, mask_history=True)
    case("qwen3-alpaca-mask-history", "qwen3", "alpaca.json", 1024, mask_history=True)
    case("qwen3-sharegpt-mask-history", "qwen3", "sharegpt.jsonl", 1024, mask_history=True)
    case("qwen-messages", "qwen", "messages.json", 1024)
    case("llama2-messages", "llama2", "messages.json", 1024)
    case("qwen-alpaca-packing", "qwen", "alpaca.json", 128, packing=True)
    case("default-sharegpt-packing", "default", "sharegpt.jsonl", 96, packing=True)
    case("qwen3_nothink-1100-packing", "qwen3_nothink", "packing.jsonl", 100, packing=True)
    # neat_packing: the same rows, with the segment ids and positions
    case("qwen-alpaca-neat-packing", "qwen", "alpaca.json", 128, neat_packing=True)
    case("default-sharegpt-neat-packing", "default", "sharegpt.jsonl", 96, neat_packing=True)
    case("qwen3_nothink-1100-neat-packing", "qwen3_nothink", "packing.jsonl", 100, neat_packing=True)
    case("llama3-alpaca-train-on-prompt-neat-packing", "llama3", "alpaca.json", 256, train_on_prompt=True,
         neat_packing=True)
    for t in GEMMA_TEMPLATES:
        case(f"{t}-alpaca", t, "alpaca.json", 1024)
        case(f"{t}-sharegpt", t, "sharegpt.jsonl", 1024)
        case(f"{t}-sharegpt-cut40", t, "sharegpt.jsonl", 40)
        case(f"{t}-alpaca-cut24", t, "alpaca.json", 24)
    case("gemma-messages", "gemma", "messages.json", 1024)
    case("gemma2-sharegpt-mask-history", "gemma2", "sharegpt.jsonl", 1024, mask_history=True)  # efficient_eos
    case("gemma-sharegpt-packing", "gemma", "sharegpt.jsonl", 96, packing=True)
    # text only, gemma3 makes gemma's samples
    by_name = {c["name"]: c for c in cases}
    for suffix in ("alpaca", "sharegpt", "sharegpt-cut40", "alpaca-cut24"):
        a, b = by_name["gemma-" + suffix], by_name["gemma3-" + suffix]
        assert (a["input_ids"], a["labels"], a["special"]) == (b["input_ids"], b["labels"], b["special"]), suffix

    # chat template text: LLaMA-Factory's jinja (fix_jinja_template) through transformers
    conv = [{"role": "system", "content": "You are 'helpful'."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"}]
    renders = []
    for t, tok_name in TEMPLATE_TOKENIZER.items():  # the gemma ones last
        for msgs in (conv, conv[1:]):
            _, _, _, tokenizer, template = lf_samples(t, tok_name, "messages.json", 1024)
            text = tokenizer.apply_chat_template(msgs, tokenize=False)
            system = msgs[0]["content"] if msgs[0]["role"] == "system" else ""
            turns = [m["content"] for m in msgs if m["role"] != "system"]
            renders.append({"template": t, "tokenizer": "tok/" + tok_name, "system": system, "msgs": turns,
                            "text": text})

    doc = {"generator": "tests/reference/make_sft_fixtures.py",
           "versions": f"llamafactory {llamafactory.__version__}, transformers {transformers.__version__}, "
                       f"tokenizers {tokenizers.__version__}",
           "cases": cases, "renders": renders}
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases, {len(renders)} renders to {OUT}")


PRISTINE = copy.deepcopy(TEMPLATES)

if __name__ == "__main__":
    sys.exit(main())
