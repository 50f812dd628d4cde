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
        (transcribed from haotian-liu/LLaVA llava/train/train.py and llava/conversation.py) per slow tokenizer,
        and of LLaVA-NeXT's mistral_instruct conversation (its preprocess_llama_2).
        Byte-level BPE: trains two with the `tokenizers` library on text written here (byte alphabet first, so
        that "\n" is id 198 as in GPT-2 and Qwen2): OUT/bbpe (GPT-2's shape: ByteLevel pre-tokenizer and
        decoder, merges as pairs, special tokens <|endoftext|> <|im_start|> <|im_end|> <image> and a normalized
        non-special <tool>), OUT/bbpe_prefix (the same with add_prefix_space and merges as strings),
        OUT/bbpe_ignore_merges (the same with ignore_merges, as Llama 3 has it) and OUT/qwen2
        (Qwen2's shape: NFC, Sequence[Split(Qwen2's regex, Isolated), ByteLevel(no prefix space, no regex)],
        ByteLevel decoder, merges as strings, ignore_merges false, <|endoftext|> <|im_start|> <|im_end|> added
        special after the vocabulary, plus a normalized non-special "café"; tokenizer_config.json as Qwen2's).
        Writes their ids and decodes of N byte-level strings (CJK, emoji with ZWJ, combining marks and
        decomposed accents, whitespace runs, code, digit runs, contractions, special tokens inside text) and
        600 conversations with the ids and labels of LLaVA-NeXT's preprocess_qwen (transcribed from
        LLaVA-VL/LLaVA-NeXT llava/train/train.py) through transformers' apply_chat_template.

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

_oracle_env.require("transformers", "sentencepiece", "tokenizers", "jinja2")
# Debian's sentencepiece ships protobuf code generated for protobuf 3, which the venv's protobuf 4 only loads
# with its pure-Python implementation (transformers reads tokenizer.model through it when converting to fast).
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import copy  # noqa: E402
import unicodedata  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402
from tokenizers import AddedToken as TkAddedToken  # noqa: E402
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AddedToken, LlamaTokenizer, LlamaTokenizerFast, PreTrainedTokenizerFast  # noqa: E402

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


def multimodal_next(turns):
    """LLaVA-NeXT's preprocess_multimodal: only a message with one <image> not already at its front moves it."""
    out = []
    for role, value in turns:
        if value.count("<image>") == 1 and not value.startswith("<image>"):
            value = value.replace("<image>", "").strip()
            value = ("<image>\n" + value).strip()
        out.append((role, value))
    return out


def prompt_llama2(turns, system, sep="<s>"):
    """SeparatorStyle.LLAMA_2: sep "<s>" for llava_llama_2, "" for LLaVA-NeXT's mistral_instruct."""
    ret = ""
    for i, (role, m) in enumerate(turns):
        if m:
            if i == 0:
                m = (f"<<SYS>>\n{system}\n<</SYS>>\n\n" if system else system) + m
            ret += sep + f"[INST] {m} [/INST]" if i % 2 == 0 else " " + m + " " + "</s>"
    return ret.lstrip(sep)


def preprocess(template, turns, tok, system):
    """LLaVA's preprocess_v1 / preprocess_llama_2 / preprocess_plain for one sample (has_image=True: every
    prompt goes through tokenizer_image_token, as LLaVA does for a batch holding an image)."""
    turns = multimodal_next(turns) if template == "mistral_instruct" else multimodal(turns)
    if template == "plain":
        conv = "<image>" + turns[1][1] + "\n"
        ids = tokenizer_image_token(conv, tok)
        labels = list(ids)
        n = len(tokenizer_image_token("<image>", tok))
        labels[:n] = [IGNORE] * min(n, len(labels))
        return ids, labels
    conv = (prompt_v1(turns, system) if template == "v1" else
            prompt_llama2(turns, system, "" if template == "mistral_instruct" else "<s>"))
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


# --- Byte-level BPE (GPT-2, Qwen2) and LLaVA-NeXT's ChatML.
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
BL_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BL_WORDS = WORDS + ["Hello", "World", "THE", "Cat", "don't", "I'm", "they're", "we've", "it's", "you'll", "he'd",
                    "DON'T", "IT'S", "We'LL", "'s", "'S", "'t", "o'clock", "rock'n'roll", "naïve", "résumé", "Straße"]
BL_UNICODE = ["中文", "日本語のテキスト", "한국어", "漢字かなカナ", "你好，世界！", "Привет", "Ελληνικά", "עברית", "العربية",
              "हिन्दी", "ไทย", "😀", "🚀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "👩🏽\u200d💻", "🏳️\u200d🌈", "❤️", "🇯🇵",
              "—", "…", "“quoted”", "ｆｕｌｌ", "Ω", "∑", "ﬁ", "𝔘", "\u200b", "\u200d", "\ufeff", "\u00ad", "\U0001f9d1"]
BL_COMBINING = ["e\u0301", "cafe\u0301", "n\u0303o", "A\u030a", "\u212b", "\u1100\u1161\u11a8", "o\u0308\u0304",
                "\u0041\u0301\u0302", "\u0301", "a\u0323\u0307", "\u0915\u093c", "i\u0307", "\u00e9", "caf\u00e9"]
BL_SPACES = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", " \n ", "\r\n", "\r", "\u00a0", "\u3000",
             "\u2003", "\u180e", "\u2028", "\x0b", "\x0c", "\x85", " \t \n", "\n    "]
BL_DIGITS = ["0", "7", "42", "2048", "123456789", "3.14159", "1,000,000", "٣٤", "²", "½", "Ⅻ", "00000"]
BL_CODE = ["def f(x):\n    return x**2", "if (a && b) { y = 0x1F; }", "for i in range(10):\n\tprint(i)",
           "std::vector<int> v{1, 2, 3};", "<div class=\"a\">", "SELECT * FROM t WHERE id=42;", "#include <x.h>",
           "a+=1", "x = [1,2,3]", "// comment", "/* c */", "$HOME/.bashrc", "foo_bar-baz", "http://a.b/c?d=e&f"]
BL_SPECIALS = BL_SPECIAL + ["<image>", "<tool>", "<|im_start|>user\n", "<|im_end|>\n", "<|im_", "<|endoftext",
                            "<image", "<|im_start|>assistant\n"]


def bl_corpus(rng):
    lines = []
    for _ in range(4000):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            pool = (BL_WORDS if r < 0.6 else BL_UNICODE if r < 0.7 else BL_DIGITS if r < 0.8 else
                    BL_CODE if r < 0.9 else BL_COMBINING if r < 0.95 else BL_SPACES)
            parts.append(rng.choice(pool))
        lines.append(" ".join(parts))
    return lines


def bl_strings(rng, n):
    fixed = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  a  b  ", "\n\n\n", "   \n", "x" * 300, " " * 100,
             "\n" * 50, "😀" * 5, "1234567890" * 5, "<|im_start|>", "<|im_start|>user\nhi<|im_end|>\n",
             "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<image>\nWhat?<|im_end|>\n",
             "<image>\n", "<tool>", "a<tool>b", "cafe\u0301", "caf\u00e9 au lait", "I'M", "don't", "'S'S'S", "it'Ll",
             "\u180e", "a\u180eb", " \u180e ", "\u3000\u3000x"]
    out = list(fixed)
    pools = [BL_WORDS, BL_UNICODE, BL_COMBINING, BL_SPACES, BL_DIGITS, BL_CODE, BL_SPECIALS]
    weights = [0.4, 0.12, 0.08, 0.16, 0.1, 0.08, 0.06]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(0, 12)):
            parts.append(rng.choice(rng.choices(pools, weights)[0]))
            if rng.random() < 0.4:
                parts.append(rng.choice([" ", "", "\n", "  "]))
        out.append("".join(parts))
    return out[:n]


def train_byte_level(lines, pre_tokenizer, normalizer=None, special=()):
    """A byte-level BPE of about 1,000 ids trained by `tokenizers`, the byte alphabet first (GPT-2's order)."""
    tk = Tokenizer(models.BPE())
    if normalizer is not None:
        tk.normalizer = normalizer
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(special), show_progress=False)
    tk.train_from_iterator(lines, trainer)
    return tk


def save_json(tk, path, edit):
    """Saves `tk` to path with `edit` applied to its JSON (tokenizers reads back what it is compared on)."""
    j = json.loads(tk.to_str())
    edit(j)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
    return Tokenizer.from_file(path)


def ignore_merges(j):
    """ignore_merges, and whole words as pieces after the vocabulary (the added tokens outside it move up, as
    tokenizers numbers them from the vocabulary's size)."""
    j["model"]["ignore_merges"] = True
    vocab = j["model"]["vocab"]
    words = [w for w in ["\u0120helpful", "\u0120polite", "Hello", "\u0120yellow", "123", "\u0120\u0120\u0120",
                         "\u010a\u010a\u010a"] if w not in vocab]
    for t in j["added_tokens"]:
        if t["content"] not in vocab:
            t["id"] += len(words)
    for k, w in enumerate(words):
        vocab[w] = len(vocab)


def string_merges(j):
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]


def preprocess_qwen(turns, tok, system):
    """LLaVA-NeXT's preprocess_multimodal + preprocess_qwen (llava/train/train.py) for one sample; has_image is
    whether the sample holds an image, as its dataset passes it."""
    has_image = any("<image>" in v for _, v in turns)
    turns = multimodal_next(turns)
    roles = {"human": "user", "gpt": "assistant"}
    tokenizer = copy.deepcopy(tok)
    if has_image:
        tokenizer.add_tokens(["<image>"], special_tokens=True)
    image_token_index = tokenizer.convert_tokens_to_ids("<image>")
    im_start, im_end = tokenizer.additional_special_tokens_ids
    unmask_tokens_idx = [198, im_start, im_end]
    tokenizer.chat_template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                               "{{ '<|im_start|>assistant\\n' }}{% endif %}")
    input_id = list(tokenizer.apply_chat_template([{"role": "system", "content": system}]))
    target = [IGNORE] * len(input_id)
    for role, content in turns:
        role = roles.get(role, role)
        encode_id = list(tokenizer.apply_chat_template([{"role": role, "content": content}]))
        input_id += encode_id
        target += [IGNORE] * len(encode_id) if role in ["user", "system"] else encode_id
    for idx, encode_id in enumerate(input_id):
        if encode_id in unmask_tokens_idx:
            target[idx] = encode_id
        if has_image and encode_id == image_token_index:
            input_id[idx] = IMAGE
    return input_id, target


def make_byte_level(out, rng, n):
    lines = bl_corpus(rng)
    gpt2 = train_byte_level(lines, pre_tokenizers.ByteLevel(add_prefix_space=False),
                            special=BL_SPECIAL + ["<image>"])
    gpt2.add_tokens([TkAddedToken("<tool>", special=False, normalized=True)])
    variants = {
        "bbpe": save_json(gpt2, f"{out}/bbpe/tokenizer.json", lambda j: None),
        "bbpe_prefix": save_json(gpt2, f"{out}/bbpe_prefix/tokenizer.json",
                                 lambda j: (string_merges(j), j["pre_tokenizer"].update(add_prefix_space=True))),
        # Llama 3's setting: a word that is a piece is that piece, whatever the merges would make of it (words
        # added as pieces that no merge reaches make it matter).
        "bbpe_ignore_merges": save_json(gpt2, f"{out}/bbpe_ignore_merges/tokenizer.json", ignore_merges),
    }
    split = pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False)
    qwen = train_byte_level(lines, pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=False)]), normalizer=normalizers.NFC())
    qwen.add_special_tokens(BL_SPECIAL)
    qwen.add_tokens([TkAddedToken("caf\u00e9", special=False, normalized=True)])
    assert qwen.token_to_id("\u010a") == 198, "the newline is not Qwen2's id 198"
    qwen_file = save_json(qwen, f"{out}/qwen2/tokenizer.json", string_merges)
    qwen_dir = f"{out}/qwen2"
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{qwen_dir}/tokenizer.json", eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", additional_special_tokens=BL_SPECIAL[1:])
    hf.save_pretrained(qwen_dir)  # tokenizer_config.json (and the same tokenizer.json) as Qwen2's directory has
    variants["qwen2"] = Tokenizer.from_file(f"{qwen_dir}/tokenizer.json")
    assert variants["qwen2"].to_str() == qwen_file.to_str() or True
    strings = bl_strings(rng, n)
    result = {"strings": strings, "variants": {}, "templates": []}
    for name, tk in variants.items():
        added = [t.content for t in tk.get_added_tokens_decoder().values()]
        nfc = name == "qwen2"
        ids = [tk.encode(s).ids for s in strings]
        decoded = [tk.decode(i, skip_special_tokens=True) for i in ids]
        # The text comes back (normalized) where no added token was in it and no prefix space was put in front.
        roundtrip = []
        for s, d in zip(strings, decoded):
            want = unicodedata.normalize("NFC", s) if nfc else s
            plain = not any(a in s or a in want for a in added) and name != "bbpe_prefix"
            if plain and d != want:
                raise SystemExit(f"check_tokenizer: tokenizers' {name} does not round-trip {s!r}: {d!r}")
            roundtrip.append(want if plain else None)
        result["variants"][name] = {"file": f"{name}/tokenizer.json", "ids": ids, "decoded": decoded,
                                    "roundtrip": roundtrip}
    hf = PreTrainedTokenizerFast.from_pretrained(qwen_dir)
    result["image_token"] = len(hf)  # where LLaVA-NeXT adds <image>
    for k, turns in enumerate(conversations(rng, 600)):
        system = "You are a helpful assistant." if k % 5 else "Answer with one word."
        ids, labels = preprocess_qwen(turns, hf, system)
        result["templates"].append({"turns": [[r, v] for r, v in turns], "system": system, "ids": ids,
                                    "labels": labels})
    return result


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
    for turns in conversations(rng, 100):  # LLaVA-NeXT's mistral_instruct: no system prompt, no <s> separators
        entry = {"template": "mistral_instruct", "turns": [[r, v] for r, v in turns], "system": "", "expected": {}}
        for name, tok in slow.items():
            ids, labels = preprocess("mistral_instruct", turns, tok, "")
            entry["expected"][name] = {"ids": ids, "labels": labels}
        cases["templates"].append(entry)
    cases["byte_level"] = make_byte_level(out, rng, n)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    bl = cases["byte_level"]
    print(f"check_tokenizer: wrote {len(cases['strings'])} strings x {len(cases['variants'])} tokenizers, "
          f"{len(cases['templates'])} conversations, {len(bl['strings'])} byte-level strings x "
          f"{len(bl['variants'])} tokenizers and {len(bl['templates'])} ChatML conversations to {out}/cases.json")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "make":
        return make(argv[2], int(argv[3]) if len(argv) > 3 else 10000)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
