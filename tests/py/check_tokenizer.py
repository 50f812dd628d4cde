#!/usr/bin/env python3
"""Tokenizers and LLaVA's templates, the oracle side: transformers' own Llama tokenizers and LLaVA's
preprocess_* functions produce the ids and labels headroom must reproduce.

    check_tokenizer.py make OUT [N]
        Trains a small SentencePiece BPE model with Debian's spm_train, Llama's settings (byte fallback, split
        digits, identity normalisation, dummy prefix, whitespace kept), on text written here. Saves it through
        transformers as four tokenizers, each with "<image>" added after the vocabulary as llava-hf does:
        OUT/slow_legacy and OUT/slow (LlamaTokenizer, legacy True / False: tokenizer.model +
        tokenizer_config.json), OUT/fast_legacy and OUT/fast (LlamaTokenizerFast converted from them; their
        tokenizer.json is read by `tokenizers` itself). Writes OUT/cases.json: N strings (default 10,000: Unicode,
        whitespace runs, digits, special tokens, empty strings, "▁"), each variant's input_ids for them
        (add_special_tokens=True) and the fast tokenizers' decode(skip_special_tokens=True); and LLaVA's
        conversations with the ids and labels of preprocess_plain / preprocess_v1 / preprocess_llama_2
        (transcribed from haotian-liu/LLaVA llava/train/train.py and llava/conversation.py) per slow tokenizer.

The C++ side (test_tokenizer, Tokenizer.MatchesTransformers and Templates.MatchLlava) compares. Exit 0 on
success; 2 when a package is missing (the message names it).
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("transformers", "sentencepiece", "tokenizers")
# Debian's sentencepiece ships protobuf code generated for protobuf 3, which the venv's protobuf 4 only loads
# with its pure-Python implementation (transformers reads tokenizer.model through it when converting to fast).
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

from tokenizers import Tokenizer  # noqa: E402
from transformers import AddedToken, LlamaTokenizer, LlamaTokenizerFast  # noqa: E402

IGNORE = -100
IMAGE = -200
WORDS = ("the a cat dog red blue circle square what color is shape how many objects are there in image picture "
         "left right top bottom answer question yes no zero one two three four five small large green yellow "
         "assistant user system chat curious helpful detailed polite language vision visual content tasks").split()
UNICODE = ["é", "ü", "ñ", "ß", "中文", "日本語", "한국어", "Привет", "Ελληνικά", "😀", "🚀", "—", "…", "“", "”",
           "\u00a0", "\u200b", "ｆｕｌｌ", "Ω", "∑", "👍🏽", "ﬁ", "\u0301", "𝔘"]
SPECIAL = ["<s>", "</s>", "<unk>", "<image>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\u2581", "\u2581\u2581"]
DIGITS = ["0", "7", "42", "2048", "3.14", "1,000", "99999"]
PUNCT = [".", ",", "?", "!", ":", ";", "'", "\"", "(", ")", "[INST]", "[/INST]", "<<SYS>>", "USER:", "ASSISTANT:", "#"]


def corpus(rng):
    lines = []
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            parts.append(rng.choice(WORDS) if r < 0.75 else rng.choice(DIGITS) if r < 0.85 else
                         rng.choice(PUNCT) if r < 0.95 else rng.choice(UNICODE[:8]))
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


def strings(rng, n):
    fixed = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  a  b  ", "</s>", " </s> ", "<s><s>", "<s> hi", "hi</s>USER",
             "<image>", "<image>\nWhat is it?", "USER: <image>\nwhat color? ASSISTANT: red</s>", "\u2581", "\u2581a",
             "<unk>", "<<SYS>>\n", "12345678", "x" * 300, "😀" * 5, "日本語のテキスト", "</s></s>", "<s>"]
    out = list(fixed)
    pools = [WORDS, UNICODE, SPECIAL, SPACES, DIGITS, PUNCT]
    weights = [0.45, 0.15, 0.06, 0.16, 0.1, 0.08]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(0, 12)):
            pool = rng.choices(pools, weights)[0]
            parts.append(rng.choice(pool))
            if rng.random() < 0.5:
                parts.append(" ")
        out.append("".join(parts))
    return out[:n]


def tokenizer_image_token(prompt, tok):
    chunks = [tok(c).input_ids for c in prompt.split("<image>")]
    ids, offset = [], 0
    if chunks and chunks[0] and chunks[0][0] == tok.bos_token_id:
        offset = 1
        ids.append(chunks[0][0])
    seps = [ele for sub in zip(chunks, [[IMAGE] * (offset + 1)] * len(chunks)) for ele in sub][:-1]
    for x in seps:
        ids.extend(x[offset:])
    return ids


VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
          "detailed, and polite answers to the user's questions.")
LLAMA2 = ("You are a helpful language and vision assistant. You are able to understand the visual content that the "
          "user provides, and assist the user with a variety of tasks using natural language.")


def multimodal(turns):
    out = []
    for role, value in turns:
        if "<image>" in value:
            value = value.replace("<image>", "").strip()
            value = ("<image>\n" + value).strip()
        out.append((role, value))
    return out


def prompt_v1(turns, system):
    ret = system + " "
    seps = [" ", "</s>"]
    for i, (role, m) in enumerate(turns):
        role = "USER" if role == "human" else "ASSISTANT"
        ret += role + ": " + m + seps[i % 2] if m else role + ":"
    return ret


def prompt_llama2(turns, system):
    ret = ""
    for i, (role, m) in enumerate(turns):
        if m:
            if i == 0:
                m = (f"<<SYS>>\n{system}\n<</SYS>>\n\n" if system else system) + m
            ret += "<s>" + f"[INST] {m} [/INST]" if i % 2 == 0 else " " + m + " " + "</s>"
    return ret.lstrip("<s>")


def preprocess(template, turns, tok, system):
    """LLaVA's preprocess_v1 / preprocess_llama_2 / preprocess_plain for one sample (has_image=True: every
    prompt goes through tokenizer_image_token, as LLaVA does for a batch holding an image)."""
    turns = multimodal(turns)
    if template == "plain":
        conv = "<image>" + turns[1][1] + "\n"
        ids = tokenizer_image_token(conv, tok)
        labels = list(ids)
        n = len(tokenizer_image_token("<image>", tok))
        labels[:n] = [IGNORE] * min(n, len(labels))
        return ids, labels
    conv = prompt_v1(turns, system) if template == "v1" else prompt_llama2(turns, system)
    ids = tokenizer_image_token(conv, tok)
    target = list(ids)
    total = sum(1 for t in ids if t != tok.pad_token_id)
    sep = " ASSISTANT: " if template == "v1" else "[/INST] "
    rounds = conv.split("</s>")
    cur = 1
    target[:cur] = [IGNORE] * cur
    for i, rou in enumerate(rounds):
        if rou == "":
            break
        parts = rou.split(sep)
        if len(parts) != 2:
            break
        parts[0] += sep
        round_len = len(tokenizer_image_token(rou, tok))
        instruction_len = len(tokenizer_image_token(parts[0], tok)) - 2
        if template == "v1" and i != 0 and not tok.legacy:  # IS_TOKENIZER_GREATER_THAN_0_14
            round_len -= 1
            instruction_len -= 1
        end = min(cur + instruction_len, len(target))
        if end > cur:
            target[cur:end] = [IGNORE] * (end - cur)
        cur += round_len
    target[cur:] = [IGNORE] * max(0, len(target) - cur)
    if cur != total:
        target = [IGNORE] * len(target)
    return ids, target


def conversations(rng, n):
    out = []
    qs = ["What color is the circle?", "How many objects are there?", "Describe the image.", "Is it red? Answer yes or no.",
          "what shape is at the top left", "Count the squares — all of them.", "日本語で答えてください。", "  spaced   out  "]
    ans = ["red", "Three.", "A small blue square on the left.", "yes", "There are 2 circles and 1 square.", "はい",
           "😀 done", "  leading space"]
    for k in range(n):
        rounds = rng.randint(1, 3)
        turns = []
        for r in range(rounds):
            q = rng.choice(qs)
            if r == 0 and k % 4 != 3:
                q = rng.choice(["<image>\n" + q, q + "\n<image>", "<image>" + q])
            turns += [("human", q), ("gpt", rng.choice(ans))]
        out.append(turns)
    return out


def make(out, n):
    rng = random.Random(1234)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(corpus(rng))
    subprocess.run(["spm_train", f"--input={out}/corpus.txt", f"--model_prefix={out}/spm", "--vocab_size=600",
                    "--model_type=bpe", "--byte_fallback=true", "--split_digits=true", "--character_coverage=0.99",
                    "--allow_whitespace_only_pieces=true", "--remove_extra_whitespaces=false",
                    "--normalization_rule_name=identity", "--add_dummy_prefix=true", "--unk_id=0", "--bos_id=1",
                    "--eos_id=2", "--pad_id=-1", "--minloglevel=2"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    cases = {"strings": strings(rng, n), "variants": {}, "templates": []}
    slow = {}
    for legacy in (True, False):
        name = "slow_legacy" if legacy else "slow"
        tok = LlamaTokenizer(vocab_file=f"{out}/spm.model", legacy=legacy, add_prefix_space=None if legacy else True)
        tok.add_tokens([AddedToken("<image>", special=True, normalized=False)], special_tokens=True)
        tok.save_pretrained(f"{out}/{name}")
        tok = LlamaTokenizer.from_pretrained(f"{out}/{name}")
        fast_dir = f"{out}/{'fast_legacy' if legacy else 'fast'}"
        LlamaTokenizerFast.from_pretrained(f"{out}/{name}", from_slow=True).save_pretrained(fast_dir)
        fast = Tokenizer.from_file(f"{fast_dir}/tokenizer.json")  # the file itself is the oracle
        tok.pad_token = tok.unk_token  # LLaVA: tokenizer.pad_token = tokenizer.unk_token
        slow[name] = tok
        cases["variants"][name] = {"ids": [tok(s).input_ids for s in cases["strings"]]}
        fast_ids = [fast.encode(s).ids for s in cases["strings"]]
        cases["variants"]["fast_legacy" if legacy else "fast"] = {
            "ids": fast_ids, "decoded": [fast.decode(i, skip_special_tokens=True) for i in fast_ids]}
        cases["image_token"] = tok.convert_tokens_to_ids("<image>")
    for k, turns in enumerate(conversations(rng, 300)):
        template = ["v1", "llama_2", "plain"][k % 3]
        if template == "plain":
            turns = [("human", "<image>\n" + turns[0][1].replace("<image>", "")), turns[1]]
        system = VICUNA if template == "v1" else LLAMA2 if template == "llama_2" else ""
        entry = {"template": template, "turns": [[r, v] for r, v in turns], "system": system, "expected": {}}
        for name, tok in slow.items():
            ids, labels = preprocess(template, turns, tok, system)
            entry["expected"][name] = {"ids": ids, "labels": labels}
        cases["templates"].append(entry)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    print(f"check_tokenizer: wrote {len(cases['strings'])} strings x {len(cases['variants'])} tokenizers and "
          f"{len(cases['templates'])} conversations to {out}/cases.json")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "make":
        return make(argv[2], int(argv[3]) if len(argv) > 3 else 10000)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
