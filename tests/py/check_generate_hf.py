#!/usr/bin/env python3
"""Checks headroom's greedy generation against Hugging Face transformers' LlavaForConditionalGeneration.generate.

    python3 tests/py/check_generate_hf.py CASE_DIR [--verbose]
    python3 tests/py/check_generate_hf.py --self-test [--keep DIR]

CASE_DIR/case.json (written by headroom's C++ test) names the model configuration, an f32 safetensors file of
llava-hf-named weights, a safetensors file with one tensor "pixel_values" (images, channels, size, size; the key
"pixel_values" is absent from case.json when no prompt has an image), the prompts (token ids with the image
placeholders already expanded: tokens_per_image consecutive image_token_id per image, images taken from
pixel_values in prompt order), max_new_tokens, eos_token_id, pad_token_id, and headroom's greedy output per prompt
("generated": the new tokens only, ending at the first eos, eos included, else max_new_tokens of them).

The oracle is transformers' own LLaVA on the CPU in float32, eager attention: a CLIPVisionConfig (quick_gelu MLPs,
as headroom's vision tower; the patch-embedding conv has no bias) and a LlamaConfig (no attention or MLP bias,
rotate-half RoPE, lm_head not tied to embed_tokens), vision_feature_layer = select_layer and
vision_feature_select_strategy "default" (drops the CLS token) for select_feature "patch", "full" for
"cls_patch"; image_seq_length = tokens_per_image, so transformers takes the pre-expanded placeholders as they are
(it scatters the image features into them) instead of its legacy in-model expansion. transformers has no
"linear" projector: for projector "linear" the model's multi_modal_projector is replaced by linear_1 alone.
The weights are loaded with load_state_dict under a key map (llava-hf names, or transformers >= 4.52's
model.language_model.* layout); any key missing or unexpected fails, except the vision post_layernorm and encoder
layers past select_layer, which LLaVA never uses.

All prompts run as ONE batch, left-padded with pad_token_id and an attention_mask (transformers derives the
position ids from the mask, so each prompt's first real token is position 0), do_sample=False, num_beams=1.
Each prompt's new tokens, cut after the first eos, must equal "generated" exactly. On a mismatch the prompt is
also generated alone (unbatched) to tell a batching/padding effect from a model difference, and the logits of
a teacher-forced forward at the first differing step are shown (the top-2 margin and the gap between the two
tokens: a near tie explains a flip from rounding).

--self-test builds tiny random models in Python, writes cases (mlp2x_gelu + patch + GQA with 0, 1 and 2 images
per prompt; linear + cls_patch + MHA + select_layer -1 without post_layernorm; text only), fills "generated"
with transformers' own unbatched greedy output (cross-checked with a plain argmax loop), checks each case with
the batched left-padded path, and checks that a case with one token changed is rejected.
Exit 0 when every prompt matches; 1 on a mismatch (or a weight-name / output-format fault); 2 on a usage or
input error.
"""
import argparse
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("torch", "transformers", "safetensors")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,  # noqa: E402
                          MistralConfig, Qwen2Config, SiglipVisionConfig)

transformers.logging.set_verbosity_error()  # its deprecation notes about logits dtype and processors

PROG = "check_generate_hf"
NEAR_TIE = 1e-3  # a logit gap below this (relative to max(1, |logit|)) can flip with rounding


class CaseError(Exception):
    """The case cannot be read: exit 2."""


class Fault(Exception):
    """The case is readable but wrong (weights, output format): exit 1."""


# ------------------------------------------------------------------------------------------------- the case

def _int(obj, key, where):
    v = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(v, bool) or not isinstance(v, int):
        raise CaseError(f"{where}: '{key}' missing or not an integer: {v!r}")
    return v


def _num(obj, key, where):
    v = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CaseError(f"{where}: '{key}' missing or not a number: {v!r}")
    return float(v)


def tokens_per_image(vision):
    n = (vision["image_size"] // vision["patch"]) ** 2  # whole patches (SigLIP leaves the rest of the pixels)
    if vision.get("tower", "clip_vision_model") == "clip_vision_model":
        n += 1  # the class token
    return n if vision["select_feature"] == "cls_patch" else n - 1


def layers_used(vision):
    s = vision["select_layer"]
    return vision["layers"] + 1 + s if s < 0 else s


def read_case(case_dir):
    path = os.path.join(case_dir, "case.json")
    try:
        with open(path, encoding="utf-8") as f:
            case = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CaseError(f"cannot read {path}: {e}")
    m = case.get("model")
    if not isinstance(m, dict):
        raise CaseError(f"{path}: 'model' missing or not an object")
    v, l = m.get("vision"), m.get("llm")
    if not isinstance(v, dict) or not isinstance(l, dict):
        raise CaseError(f"{path}: model.vision / model.llm missing or not objects")
    for k in ("hidden", "layers", "heads", "intermediate", "image_size", "patch", "channels", "select_layer"):
        _int(v, k, f"{path}: model.vision")
    _num(v, "layer_norm_eps", f"{path}: model.vision")
    if v.get("select_feature") not in ("patch", "cls_patch"):
        raise CaseError(f"{path}: model.vision.select_feature {v.get('select_feature')!r} is not patch or cls_patch")
    clip = v.get("tower", "clip_vision_model") == "clip_vision_model"
    if (clip and v["image_size"] % v["patch"]) or v["hidden"] % v["heads"]:
        raise CaseError(f"{path}: model.vision: image_size must be a multiple of patch (CLIP), hidden of heads")
    if not 0 <= layers_used(v) <= v["layers"]:
        raise CaseError(f"{path}: model.vision.select_layer {v['select_layer']} is outside the {v['layers']} layers")
    for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate"):
        _int(l, k, f"{path}: model.llm")
    for k in ("rms_norm_eps", "rope_theta"):
        _num(l, k, f"{path}: model.llm")
    if l["hidden"] % l["heads"] or l["heads"] % l["kv_heads"]:
        raise CaseError(f"{path}: model.llm: heads must divide hidden and kv_heads divide heads")
    if m.get("projector") not in ("mlp2x_gelu", "linear"):
        raise CaseError(f"{path}: model.projector {m.get('projector')!r} is not mlp2x_gelu or linear")
    image_token = _int(m, "image_token_id", f"{path}: model")
    for k in ("max_new_tokens", "eos_token_id", "pad_token_id"):
        _int(case, k, path)
    if case["max_new_tokens"] < 1:
        raise CaseError(f"{path}: max_new_tokens must be at least 1")
    if not isinstance(case.get("weights"), str):
        raise CaseError(f"{path}: 'weights' missing or not a path")
    prompts = case.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise CaseError(f"{path}: 'prompts' missing or empty")
    gen = case.get("generated")
    if not isinstance(gen, list) or len(gen) != len(prompts):
        raise CaseError(f"{path}: 'generated' must be a list with one entry per prompt ({len(prompts)})")
    T = tokens_per_image(v)
    for i, p in enumerate(prompts):
        ids = p.get("input_ids") if isinstance(p, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in ids):
            raise CaseError(f"{path}: prompts[{i}].input_ids missing, empty or not integers")
        if any(t < 0 or t >= l["vocab"] for t in ids):
            raise CaseError(f"{path}: prompts[{i}].input_ids has an id outside the vocabulary of {l['vocab']}")
        n = _int(p, "images", f"{path}: prompts[{i}]")
        have = sum(t == image_token for t in ids)
        if have != n * T:
            raise CaseError(f"{path}: prompts[{i}] has {have} image tokens ({image_token}); {n} image(s) need "
                            f"{n * T} ({T} per image, select_feature {v['select_feature']})")
        runs = [len(r) for r in re.findall(r"I+", "".join("I" if t == image_token else "." for t in ids))]
        if any(r % T for r in runs):
            raise CaseError(f"{path}: prompts[{i}] has a run of image tokens whose length {runs} is not a "
                            f"multiple of tokens_per_image {T}")
        if not isinstance(gen[i], list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in gen[i]):
            raise CaseError(f"{path}: generated[{i}] is not a list of integers")
    n_images = sum(p["images"] for p in prompts)
    pixels = None
    if case.get("pixel_values") is not None:
        ppath = os.path.join(case_dir, case["pixel_values"])
        try:
            tensors = load_file(ppath)
        except Exception as e:  # safetensors raises its own error types
            raise CaseError(f"cannot read {ppath}: {e}")
        if set(tensors) != {"pixel_values"}:
            raise CaseError(f"{ppath}: expected exactly one tensor 'pixel_values', found {sorted(tensors)}")
        pixels = tensors["pixel_values"]
        want = (n_images, v["channels"], v["image_size"], v["image_size"])
        if tuple(pixels.shape) != want:
            raise CaseError(f"{ppath}: pixel_values has shape {tuple(pixels.shape)}; the prompts need {want}")
        if not pixels.is_floating_point():
            raise CaseError(f"{ppath}: pixel_values is {pixels.dtype}, not floating point")
        pixels = pixels.float()
    elif n_images:
        raise CaseError(f"{path}: the prompts use {n_images} image(s) but there is no 'pixel_values'")
    case["_pixels"] = pixels
    case["_tokens_per_image"] = T
    return case


def output_faults(case):
    """The format of headroom's outputs: eos only at the end; max_new_tokens of them when there is no eos."""
    out, eos, n = [], case["eos_token_id"], case["max_new_tokens"]
    for i, g in enumerate(case["generated"]):
        if eos in g and g.index(eos) != len(g) - 1:
            out.append(f"prompt {i}: generated has tokens after its eos {eos} (at index {g.index(eos)}): {g}")
        elif len(g) > n:
            out.append(f"prompt {i}: generated has {len(g)} tokens, more than max_new_tokens {n}")
        elif eos not in g and len(g) != n:
            out.append(f"prompt {i}: generated has {len(g)} tokens and no eos {eos}: it must then have "
                       f"max_new_tokens {n}")
    return out


# ------------------------------------------------------------------------------------------------- the model

class LinearProjector(torch.nn.Module):
    """LLaVA's mm_projector_type "linear", which transformers' LlavaMultiModalProjector cannot express."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.linear_1 = torch.nn.Linear(d_in, d_out, bias=True)

    def forward(self, x):
        return self.linear_1(x)


def hf_config(case):
    m = case["model"]
    v, l = m["vision"], m["llm"]
    T = tokens_per_image(v)
    longest = max(len(p["input_ids"]) for p in case["prompts"]) + case["max_new_tokens"]
    tower, decoder = v.get("tower", "clip_vision_model"), l.get("decoder", "llama")
    common_v = dict(hidden_size=v["hidden"], intermediate_size=v["intermediate"], num_hidden_layers=v["layers"],
                    num_attention_heads=v["heads"], num_channels=v["channels"], image_size=v["image_size"],
                    patch_size=v["patch"], layer_norm_eps=float(v["layer_norm_eps"]), attention_dropout=0.0)
    if tower == "siglip_vision_model":  # tanh GELU, biased patch conv, no class token, no pooling head
        vision = SiglipVisionConfig(hidden_act="gelu_pytorch_tanh", vision_use_head=False, **common_v)
    else:
        vision = CLIPVisionConfig(hidden_act="quick_gelu", **common_v)
    common_l = dict(
        vocab_size=l["vocab"], hidden_size=l["hidden"], intermediate_size=l["intermediate"],
        num_hidden_layers=l["layers"], num_attention_heads=l["heads"], num_key_value_heads=l["kv_heads"],
        hidden_act="silu", max_position_embeddings=max(2048, longest), rms_norm_eps=float(l["rms_norm_eps"]),
        rope_theta=float(l["rope_theta"]), rope_scaling=None, attention_dropout=0.0, tie_word_embeddings=False,
        pad_token_id=case["pad_token_id"], eos_token_id=case["eos_token_id"], bos_token_id=None)
    if decoder == "qwen2":  # biases on q, k and v
        text = Qwen2Config(use_sliding_window=False, **common_l)
    elif decoder == "mistral":
        text = MistralConfig(sliding_window=None, **common_l)
    else:
        text = LlamaConfig(attention_bias=False, mlp_bias=False, **common_l)
    cfg = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=m["image_token_id"], projector_hidden_act="gelu",
        vision_feature_select_strategy="default" if v["select_feature"] == "patch" else "full",
        vision_feature_layer=v["select_layer"], image_seq_length=T, tie_word_embeddings=False,
        pad_token_id=case["pad_token_id"], eos_token_id=case["eos_token_id"])
    for c in (cfg, cfg.vision_config, cfg.text_config):
        c._attn_implementation = "eager"  # torch 1.13 has no SDPA; eager is the plain softmax(QK^T)V
    return cfg


def _set_module(model, suffix, module):
    for name, _ in list(model.named_modules()):
        if name == suffix or name.endswith("." + suffix):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], module)
            return name
    raise Fault(f"transformers {transformers.__version__}: no module named *{suffix} in LlavaForConditionalGeneration")


def model_key(name, model_keys):
    """The model's state_dict key for a llava-hf weight name, or None."""
    cands = [name]
    for old, new in (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                     ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector.")):
        if name.startswith(old):
            cands.append(new + name[len(old):])
    return next((c for c in cands if c in model_keys), None)


def unused_vision_key(key, vision):
    """Keys that LLaVA never reads: post_layernorm, and encoder layers past select_layer."""
    if ".vision_model.post_layernorm." in key:
        return True
    m = re.search(r"\.vision_model\.encoder\.layers\.(\d+)\.", key)
    return bool(m) and int(m.group(1)) >= layers_used(vision)


def build_model(case, case_dir, notes):
    cfg = hf_config(case)
    m = case["model"]
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the unused parameters that the file may lack get a fixed value
        model = LlavaForConditionalGeneration(cfg)
    if m["projector"] == "linear":
        where = _set_module(model, "multi_modal_projector", LinearProjector(m["vision"]["hidden"], m["llm"]["hidden"]))
        notes.append(f"projector linear: {where} replaced by linear_1 alone")
    model = model.float().eval()
    wpath = os.path.join(case_dir, case["weights"])
    try:
        weights = load_file(wpath)
    except Exception as e:
        raise CaseError(f"cannot read {wpath}: {e}")
    sd = model.state_dict()
    mapped, unexpected, shape_faults, upcast = {}, [], [], []
    for name, t in weights.items():
        key = model_key(name, sd)
        if key is None:
            unexpected.append(name)
            continue
        if tuple(t.shape) != tuple(sd[key].shape):
            shape_faults.append(f"{name}: shape {tuple(t.shape)}, transformers' {key} is {tuple(sd[key].shape)}")
            continue
        if t.dtype != torch.float32:
            if not t.is_floating_point():
                shape_faults.append(f"{name}: dtype {t.dtype} is not floating point")
                continue
            upcast.append(name)
        mapped[key] = t.float()
    missing = [k for k in sd if k not in mapped]
    unused = [k for k in missing if unused_vision_key(k, m["vision"])]
    missing = [k for k in missing if k not in unused]
    faults = [f"weight {n} is not a parameter of transformers' LLaVA (unexpected key)" for n in unexpected]
    faults += [f"weight {k} missing from {case['weights']}" for k in missing]
    faults += [f"weight {s}" for s in shape_faults]
    if faults:
        raise Fault("; ".join(faults[:20]) + (f"; ... {len(faults) - 20} more" if len(faults) > 20 else ""))
    model.load_state_dict(mapped, strict=False)
    for k in unused:  # left as initialised; post_layernorm to identity so that its (unused) output is tame
        if ".post_layernorm." in k:
            with torch.no_grad():
                sd[k].fill_(1.0 if k.endswith("weight") else 0.0)
    if unused:
        notes.append(f"{len(unused)} unused vision weights absent from the file (post_layernorm / layers past "
                     f"select_layer): {', '.join(sorted(unused)[:4])}{' ...' if len(unused) > 4 else ''}")
    if upcast:
        notes.append(f"{len(upcast)} weights upcast to float32 (e.g. {upcast[0]})")
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.data_ptr() == head.data_ptr():
        raise Fault("transformers tied lm_head to embed_tokens despite tie_word_embeddings=False")
    notes.append(f"transformers {transformers.__version__}, torch {torch.__version__}, attention "
                 f"{getattr(model.config, '_attn_implementation', '?')}, {len(mapped)} weights loaded")
    return model


# ------------------------------------------------------------------------------------------------- generation

def cut(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def image_slices(prompts):
    out, at = [], 0
    for p in prompts:
        out.append((at, at + p["images"]))
        at += p["images"]
    return out


@torch.no_grad()
def generate_batched(model, case):
    prompts, pad = case["prompts"], case["pad_token_id"]
    L = max(len(p["input_ids"]) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        n = len(p["input_ids"])
        ids[i, L - n:] = torch.tensor(p["input_ids"], dtype=torch.long)
        mask[i, L - n:] = 1
    pixels = case["_pixels"] if sum(p["images"] for p in prompts) else None
    out = model.generate(input_ids=ids, attention_mask=mask, pixel_values=pixels, do_sample=False, num_beams=1,
                         max_new_tokens=case["max_new_tokens"], eos_token_id=case["eos_token_id"],
                         pad_token_id=pad, use_cache=True)
    return [cut(out[i, L:].tolist(), case["eos_token_id"]) for i in range(len(prompts))]


@torch.no_grad()
def generate_one(model, case, i):
    p = case["prompts"][i]
    a, b = image_slices(case["prompts"])[i]
    ids = torch.tensor([p["input_ids"]], dtype=torch.long)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                         pixel_values=case["_pixels"][a:b] if b > a else None, do_sample=False, num_beams=1,
                         max_new_tokens=case["max_new_tokens"], eos_token_id=case["eos_token_id"],
                         pad_token_id=case["pad_token_id"], use_cache=True)
    return cut(out[0, ids.shape[1]:].tolist(), case["eos_token_id"])


@torch.no_grad()
def image_features(model, case, pixels):
    """(images, tokens_per_image, llm hidden): the vision tower's selected layer through the projector, as
    transformers' LLaVA forward computes them."""
    v = case["model"]["vision"]
    hs = model.vision_tower(pixels, output_hidden_states=True).hidden_states[v["select_layer"]]
    return model.multi_modal_projector(hs[:, 1:] if v["select_feature"] == "patch" else hs)


@torch.no_grad()
def next_logits(model, case, i, prefix):
    """Logits of the next token after prompt i and `prefix` generated tokens: one unbatched forward, no cache.
    The embeddings are built here because a generated token may be image_token_id: as in generate's cached
    decoding, only the prompt's placeholders take image features, a generated one keeps its token embedding."""
    p = case["prompts"][i]
    a, b = image_slices(case["prompts"])[i]
    ids = torch.tensor([p["input_ids"] + list(prefix)], dtype=torch.long)
    emb = model.get_input_embeddings()(ids)
    if b > a:
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[0, :len(p["input_ids"])] = ids[0, :len(p["input_ids"])] == case["model"]["image_token_id"]
        emb[mask] = image_features(model, case, case["_pixels"][a:b]).reshape(-1, emb.shape[-1]).to(emb.dtype)
    out = model.language_model(inputs_embeds=emb, attention_mask=torch.ones_like(ids), use_cache=False)
    logits = getattr(out, "logits", None)
    if logits is None:  # transformers >= 4.52: language_model is the bare decoder
        logits = model.lm_head(out.last_hidden_state)
    return logits[0, -1].float()


def first_diff(a, b):
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def describe_step(model, case, i, prefix, hr_tok, hf_tok):
    logits = next_logits(model, case, i, prefix)
    top = torch.topk(logits, 2)
    (t1, t2), (l1, l2) = top.indices.tolist(), top.values.tolist()
    s = f"step {len(prefix)} logits: top1 {t1} ({l1:.6g}), top2 {t2} ({l2:.6g}), margin {l1 - l2:.3g}"
    if hr_tok is not None and hf_tok is not None and 0 <= hr_tok < logits.numel():
        gap = float(logits[hf_tok] - logits[hr_tok])
        tie = abs(gap) <= NEAR_TIE * max(1.0, abs(float(logits[hf_tok])))
        s += (f"; transformers' token {hf_tok} minus headroom's {hr_tok}: {gap:.3g}"
              + (" (a near tie: rounding can flip it)" if tie else " (not a near tie)"))
    return s


def check(case_dir, verbose=False, out=sys.stdout):
    case = read_case(case_dir)
    notes = []
    model = build_model(case, case_dir, notes)
    for n in notes if verbose else notes[-1:]:
        print(f"{PROG}: {n}", file=out)
    faults = output_faults(case)
    got = generate_batched(model, case)
    bad = []
    for i, (p, want, have) in enumerate(zip(case["prompts"], case["generated"], got)):
        ok = want == have
        print(f"{PROG}: prompt {i} ({len(p['input_ids'])} tokens, {p['images']} image(s)): "
              f"{'OK' if ok else 'DIFF'}\n  headroom     {want}\n  transformers {have}", file=out)
        if not ok:
            bad.append(i)
    for i in bad:
        want, have = case["generated"][i], got[i]
        k = first_diff(want, have)
        alone = generate_one(model, case, i)
        if alone == want:
            verdict = ("headroom matches transformers unbatched: the batched, left-padded transformers run differs "
                       "(a batching/padding effect)")
        elif alone == have:
            verdict = "transformers gives the same batched and unbatched: a model difference"
        else:
            verdict = (f"transformers unbatched differs from both (from headroom at step {first_diff(want, alone)}, "
                       f"from batched at step {first_diff(have, alone)})")
        print(f"{PROG}: prompt {i}: first difference at step {k}; transformers unbatched {alone}: {verdict}",
              file=out)
        if k < case["max_new_tokens"]:
            hr_tok = want[k] if k < len(want) else None
            hf_tok = have[k] if k < len(have) else None
            print(f"{PROG}: prompt {i}: {describe_step(model, case, i, want[:k], hr_tok, hf_tok)}", file=out)
        faults.append(f"prompt {i}: headroom's tokens differ from transformers' at step {k} "
                      f"(headroom {want[k:k + 4]}..., transformers {have[k:k + 4]}...)")
    if faults:
        for line in faults:
            print(f"{PROG}: FAIL: {case_dir}: {line}", file=out)
        return 1
    print(f"{PROG}: OK: {case_dir}: {len(got)} prompt(s), {sum(map(len, got))} generated tokens match "
          f"transformers {transformers.__version__} (one left-padded batch)", file=out)
    return 0


# ------------------------------------------------------------------------------------------------- self-test

def random_weights(m, seed, post_layernorm=True):
    """llava-hf-named f32 weights scaled so that logits are well spread (few near ties)."""
    g = torch.Generator().manual_seed(seed)
    v, l = m["vision"], m["llm"]
    C, P, F = v["hidden"], v["patch"], v["intermediate"]
    N = (v["image_size"] // P) ** 2 + 1
    H, D = l["hidden"], l["hidden"] // l["heads"]
    W = {}

    def rnd(name, *shape, std):
        W[name] = torch.randn(*shape, generator=g) * std

    def norm(name, dim, bias=True):
        W[name + ".weight"] = 1.0 + 0.1 * torch.randn(dim, generator=g)
        if bias:
            W[name + ".bias"] = 0.1 * torch.randn(dim, generator=g)

    def lin(name, i, o, bias):
        rnd(name + ".weight", o, i, std=1.0 / math.sqrt(i))
        if bias:
            rnd(name + ".bias", o, std=0.1)

    vp = "vision_tower.vision_model"
    rnd(f"{vp}.embeddings.class_embedding", C, std=0.5)
    rnd(f"{vp}.embeddings.patch_embedding.weight", C, v["channels"], P, P, std=0.3)
    rnd(f"{vp}.embeddings.position_embedding.weight", N, C, std=0.5)
    norm(f"{vp}.pre_layrnorm", C)
    for i in range(v["layers"]):
        p = f"{vp}.encoder.layers.{i}"
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            lin(f"{p}.self_attn.{n}", C, C, True)
        norm(f"{p}.layer_norm1", C)
        lin(f"{p}.mlp.fc1", C, F, True)
        lin(f"{p}.mlp.fc2", F, C, True)
        norm(f"{p}.layer_norm2", C)
    if post_layernorm:
        norm(f"{vp}.post_layernorm", C)
    lin("multi_modal_projector.linear_1", C, H, True)
    if m["projector"] == "mlp2x_gelu":
        lin("multi_modal_projector.linear_2", H, H, True)
    lp = "language_model.model"
    rnd(f"{lp}.embed_tokens.weight", l["vocab"], H, std=1.0)
    for i in range(l["layers"]):
        p = f"{lp}.layers.{i}"
        lin(f"{p}.self_attn.q_proj", H, H, False)
        lin(f"{p}.self_attn.k_proj", H, l["kv_heads"] * D, False)
        lin(f"{p}.self_attn.v_proj", H, l["kv_heads"] * D, False)
        lin(f"{p}.self_attn.o_proj", H, H, False)
        lin(f"{p}.mlp.gate_proj", H, l["intermediate"], False)
        lin(f"{p}.mlp.up_proj", H, l["intermediate"], False)
        lin(f"{p}.mlp.down_proj", l["intermediate"], H, False)
        norm(f"{p}.input_layernorm", H, bias=False)
        norm(f"{p}.post_attention_layernorm", H, bias=False)
    norm(f"{lp}.norm", H, bias=False)
    rnd("language_model.lm_head.weight", l["vocab"], H, std=2.0 / math.sqrt(H))
    return W


def write_case(d, model_cfg, layout, seed, max_new_tokens=8, post_layernorm=True):
    """layout: per prompt a list of ("t", n) text tokens or ("i", 1) an image. "generated" is filled later."""
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1000)
    img, T = model_cfg["image_token_id"], tokens_per_image(model_cfg["vision"])
    prompts = []
    for sample in layout:
        ids, n = [], 0
        for kind, k in sample:
            if kind == "i":
                ids += [img] * T
                n += 1
            else:
                ids += torch.randint(3, img, (k,), generator=g).tolist()
        prompts.append({"input_ids": ids, "images": n})
    save_file(random_weights(model_cfg, seed, post_layernorm), os.path.join(d, "model.safetensors"))
    case = {"model": model_cfg, "weights": "model.safetensors", "prompts": prompts,
            "max_new_tokens": max_new_tokens, "eos_token_id": 2, "pad_token_id": 0,
            "generated": [[] for _ in prompts]}
    images = sum(p["images"] for p in prompts)
    if images:
        v = model_cfg["vision"]
        px = torch.randn(images, v["channels"], v["image_size"], v["image_size"], generator=g)
        save_file({"pixel_values": px}, os.path.join(d, "pixels.safetensors"))
        case["pixel_values"] = "pixels.safetensors"
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    return case


def fill_generated(d):
    """Picks an eos that one prompt reaches mid-way (so that both stop kinds occur), then fills "generated" with
    transformers' unbatched greedy output, cross-checked with a plain argmax loop (no cache)."""
    case = read_case(d)
    model = build_model(case, d, [])
    img, pad = case["model"]["image_token_id"], case["pad_token_id"]
    plain = []
    for i in range(len(case["prompts"])):
        toks = []
        for _ in range(case["max_new_tokens"]):
            toks.append(int(next_logits(model, case, i, toks).argmax()))
        plain.append(toks)
    eos = next((toks[k] for toks in plain for k in range(2, len(toks) - 1)
                if toks[k] not in toks[:k] and toks[k] not in (pad, img)), case["eos_token_id"])
    case["eos_token_id"] = eos
    gen = [generate_one(model, case, i) for i in range(len(case["prompts"]))]
    for i, (a, b) in enumerate(zip(gen, plain)):
        if a != cut(b, eos):
            raise AssertionError(f"{d}: prompt {i}: transformers' generate {a} differs from its plain argmax "
                                 f"loop {cut(b, eos)}")
    with open(os.path.join(d, "case.json")) as f:
        raw = json.load(f)
    raw["eos_token_id"], raw["generated"] = eos, gen
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(raw, f, indent=1)
    return raw


def self_test(keep):
    root = keep or tempfile.mkdtemp(prefix="check_generate_hf.")
    base = {
        "vision": {"hidden": 16, "layers": 3, "heads": 2, "intermediate": 32, "image_size": 8, "patch": 4,
                   "channels": 3, "layer_norm_eps": 1e-5, "select_layer": -2, "select_feature": "patch"},
        "llm": {"vocab": 64, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0},
        "projector": "mlp2x_gelu", "image_token_id": 63}
    alt = json.loads(json.dumps(base))
    alt["vision"].update(select_layer=-1, select_feature="cls_patch")
    alt["llm"].update(kv_heads=4, rope_theta=500000.0)
    alt["projector"] = "linear"
    mixed = [[("t", 1), ("i", 1), ("t", 3)],
             [("t", 2), ("i", 1), ("t", 1), ("i", 1), ("t", 4)],
             [("t", 6)],
             [("i", 1), ("t", 1)],
             [("t", 9), ("i", 1), ("t", 2)]]
    cases = [("mlp2x_patch_gqa", base, mixed, {}),
             ("linear_cls_mha_no_post_ln", alt, mixed[:4], {"post_layernorm": False, "max_new_tokens": 10}),
             ("text_only", base, [[("t", 3)], [("t", 8)], [("t", 5)]], {})]
    passed = failed = 0
    try:
        for n, (name, cfg, layout, kw) in enumerate(cases):
            d = os.path.join(root, name)
            write_case(d, cfg, layout, seed=7 + n, **kw)
            raw = fill_generated(d)
            stops = sum(raw["eos_token_id"] in g for g in raw["generated"])
            print(f"{PROG}: self-test case {name}: eos {raw['eos_token_id']}, {stops} of {len(layout)} prompts "
                  f"stop at it")
            rc = check(d, verbose=True)
            passed, failed = passed + (rc == 0), failed + (rc != 0)
        # A broken copy: one token of one prompt changed must be rejected, with the diagnosis.
        src = os.path.join(root, cases[0][0])
        d = os.path.join(root, "broken")
        shutil.copytree(src, d, dirs_exist_ok=True)
        with open(os.path.join(d, "case.json")) as f:
            raw = json.load(f)
        g = raw["generated"][1]
        k = min(1, len(g) - 1)
        g[k] = (g[k] + 1) % raw["model"]["llm"]["vocab"]
        if g[k] in (raw["eos_token_id"], raw["model"]["image_token_id"]):
            g[k] = (g[k] + 1) % raw["model"]["llm"]["vocab"]
        if k < len(g) - 1 and raw["eos_token_id"] in g[:-1]:
            raise AssertionError("self-test: the broken copy put an eos mid-way")
        with open(os.path.join(d, "case.json"), "w") as f:
            json.dump(raw, f, indent=1)
        buf = io.StringIO()
        rc = check(d, out=buf)
        text = buf.getvalue()
        ok = rc == 1 and "prompt 1: first difference at step" in text and "a model difference" in text
        print(f"{PROG}: self-test broken copy (prompt 1 step {k} changed): "
              f"{'rejected as expected' if ok else 'NOT rejected as expected'} (exit {rc})")
        print("\n".join("    " + s for s in text.rstrip().splitlines() if "FAIL" in s or "logits" in s
                        or "first difference" in s))
        passed, failed = passed + ok, failed + (not ok)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{PROG}: self-test: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case_dir", nargs="?")
    ap.add_argument("--self-test", action="store_true", help="check tiny random models made here")
    ap.add_argument("--keep", metavar="DIR", help="with --self-test: write the cases under DIR and keep them")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.self_test:
        return self_test(args.keep)
    if not args.case_dir:
        ap.error("CASE_DIR is required (or --self-test)")
    try:
        return check(args.case_dir.rstrip("/"), args.verbose)
    except CaseError as e:
        print(f"{PROG}: FAIL: {e}", file=sys.stderr)
        return 2
    except Fault as e:
        print(f"{PROG}: FAIL: {args.case_dir}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
