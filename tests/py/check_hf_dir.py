#!/usr/bin/env python3
"""Hugging Face model directories in and out of headroom, checked with transformers' own LLaVA.

    check_hf_dir.py make OUT [llama|qwen2|qwen2_tied|mistral] [clip|siglip]
        A tiny random LlavaForConditionalGeneration (a vision tower: CLIP's with quick_gelu by default, or
        SigLIP's with tanh GELU, no class token, a biased patch embedding over 10-px images in 4-px patches, so
        that 2 pixel rows and columns stay unread, and every patch as a feature; mlp2x_gelu projector; a decoder
        with grouped-query heads: LLaMA's by default, or Qwen2's with q/k/v biases and rope_theta 1e6, or
        Mistral's with a sliding window of 6 tokens, shorter than the sequences), saved with save_pretrained to OUT/hf (config.json,
        generation_config.json, model.safetensors), a batch OUT/batch.safetensors (input_ids with the image
        placeholders expanded, labels with -100 on the prompts, pixel_values), OUT/model.yaml (a headroom config
        whose model.name_or_path is OUT/hf) and transformers' loss, logits and gradients on that batch in
        OUT/ref.safetensors.
    check_hf_dir.py compare REF OURS
        headroom's `debug grads --logits` output OURS against REF: the loss and the logits within 1e-4, every
        parameter gradient within 1e-4 of the largest (a parameter transformers never uses, with no gradient,
        must have zeros in OURS).
    check_hf_dir.py generate DIR IMAGE GENERATED
        transformers opens DIR and its preprocessor_config.json; on IMAGE (squared as LLaVA's `pad` does) and
        GENERATED's prompt_ids (`headroom generate --json`'s last line), its greedy generate gives GENERATED's
        tokens exactly.
    check_hf_dir.py load DIR BATCH OURS [MADE]
        transformers opens DIR (a headroom checkpoint) with LlavaForConditionalGeneration.from_pretrained, and its
        loss and logits on BATCH must equal headroom's (OURS, from `debug grads --logits` on DIR) within 1e-4;
        with MADE (the directory `make` wrote), its text config's attention window (use_sliding_window,
        sliding_window, max_window_layers, as transformers reads them) must be MADE's.

The forward is float32 and eager attention (torch 1.13 has no SDPA); no attention_mask is passed, so every
position counts, as in headroom's loss (mean cross-entropy over the labels that are not -100, shifted by one).
Exit 0 when everything agrees; 1 on a difference; 2 on a usage or input error.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("torch", "transformers", "safetensors")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (AutoConfig, CLIPVisionConfig, LlamaConfig, LlavaConfig,  # noqa: E402
                          LlavaForConditionalGeneration, MistralConfig, Qwen2Config, SiglipVisionConfig)

transformers.logging.set_verbosity_error()

PROG = "check_hf_dir"
TOL = 1e-4
VOCAB, IMAGE_TOKEN, IMAGE_SIZE, PATCH = 300, 299, 8, 4
T = (IMAGE_SIZE // PATCH) ** 2  # image tokens per image (patch features: CLS dropped)


def fail(msg, code=1):
    print(f"{PROG}: {msg}")
    sys.exit(code)


def eager(model):
    for c in (model.config, model.config.vision_config, model.config.text_config):
        c._attn_implementation = "eager"
    return model


def forward(model, batch, grads=False):
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grads):
        out = model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"], labels=batch["labels"])
    if grads:
        out.loss.backward()
    return out


def text_config(decoder):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if decoder == "llama":
        return LlamaConfig(rope_theta=10000.0, **common)
    if decoder in ("qwen2", "qwen2_tied"):  # qwen2_tied: Qwen2-0.5B's lm_head, embed_tokens' table
        common["tie_word_embeddings"] = decoder == "qwen2_tied"
        if decoder == "qwen2":  # a window in the second layer, longer than every sequence here: causal attention
            return Qwen2Config(rope_theta=1000000.0, use_sliding_window=True, sliding_window=4096, max_window_layers=1,
                               **common)
        return Qwen2Config(rope_theta=1000000.0, use_sliding_window=False, **common)
    if decoder == "mistral":  # a window of 6 in 16-token sequences: every labelled position attends to 6 keys
        return MistralConfig(rope_theta=1000000.0, sliding_window=6, **common)
    fail(f"unknown decoder '{decoder}' (llama, qwen2, qwen2_tied, mistral)", 2)


def vision_config(tower):
    common = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, patch_size=PATCH)
    if tower == "clip":
        return CLIPVisionConfig(image_size=IMAGE_SIZE, hidden_act="quick_gelu", layer_norm_eps=1e-5, **common)
    if tower == "siglip":  # 10 px: the same 2 x 2 patches as CLIP's 8 px (T features with "full"), 2 px unread
        return SiglipVisionConfig(image_size=IMAGE_SIZE + 2, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                  vision_use_head=False, **common)
    fail(f"unknown tower '{tower}' (clip, siglip)", 2)


def make(out, decoder="llama", tower="clip"):
    torch.manual_seed(0)
    vision = vision_config(tower)
    text = text_config(decoder)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                      projector_hidden_act="gelu",
                      vision_feature_select_strategy="default" if tower == "clip" else "full",
                      vision_feature_layer=-2, image_seq_length=T, tie_word_embeddings=text.tie_word_embeddings)
    model = eager(LlavaForConditionalGeneration(cfg)).float()
    with torch.no_grad():  # larger than the default init, so that the checks compare numbers that matter
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)
    # Two sequences of 16 tokens: <s>, an image's placeholders, text; the loss on the last 5 tokens of each.
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 259, (2, 16), generator=g)
    ids[:, 0] = 1
    ids[:, 1:1 + T] = IMAGE_TOKEN
    labels = ids.clone()
    labels[:, :11] = -100
    size = vision.image_size
    batch = {"input_ids": ids, "labels": labels, "pixel_values": torch.randn(2, 3, size, size, generator=g)}
    save_file(batch, os.path.join(out, "batch.safetensors"))
    o = forward(model, batch, grads=True)
    ref = {"loss": o.loss.detach().reshape(()), "logits": o.logits.detach().contiguous()}
    for name, p in model.named_parameters():
        ref["grad." + name] = (p.grad if p.grad is not None else torch.zeros_like(p)).contiguous()
    save_file(ref, os.path.join(out, "ref.safetensors"))
    with open(os.path.join(out, "model.yaml"), "w") as f:
        f.write(f"model:\n  name_or_path: {os.path.join(os.path.abspath(out), 'hf')}\n")
    print(f"{PROG}: wrote {out}/hf ({tower} tower, {decoder} decoder, transformers {transformers.__version__}), batch, reference "
          f"loss {o.loss.item():.6f}")


def close(name, ours, ref):
    ours, ref = ours.double(), ref.double()
    if ours.shape != ref.shape:
        fail(f"{name}: shape {tuple(ours.shape)} against transformers' {tuple(ref.shape)}")
    scale = max(1.0, ref.abs().max().item())
    err = (ours - ref).abs().max().item() / scale
    if err > TOL:
        fail(f"{name}: max |difference| {err:.3g} (relative to max(1, |ref|)) > {TOL}")
    return err


def compare(ref_path, ours_path):
    ref, ours = load_file(ref_path), load_file(ours_path)
    worst = close("loss", ours["loss"].reshape(()), ref["loss"])
    worst = max(worst, close("logits", ours["logits"], ref["logits"]))
    n = 0
    for key, r in ref.items():
        if not key.startswith("grad."):
            continue
        name = key[len("grad."):]
        if name not in ours:
            if r.abs().max().item() == 0:  # unused by transformers (layers past the selected one) and absent here
                continue
            fail(f"gradient of {name}: transformers has one, headroom's output does not")
        worst = max(worst, close(f"gradient of {name}", ours[name], r))
        n += 1
    print(f"{PROG}: OK: loss {ours['loss'].item():.6f} (transformers {ref['loss'].item():.6f}), logits and {n} "
          f"gradients agree, worst {worst:.2g}")


WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers")


def load(model_dir, batch_path, ours_path, made=None):
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        if not os.path.exists(os.path.join(model_dir, f)):
            fail(f"{model_dir} has no {f}")
    model = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32)).eval()
    batch = load_file(batch_path)
    o = forward(model, batch)
    ours = load_file(ours_path)
    worst = max(close("loss", ours["loss"].reshape(()), o.loss.reshape(())), close("logits", ours["logits"], o.logits))
    gen = json.load(open(os.path.join(model_dir, "generation_config.json")))
    if made is not None:
        want, got = AutoConfig.from_pretrained(made).text_config, model.config.text_config
        for key in WINDOW_KEYS:
            if getattr(want, key, None) != getattr(got, key, None):
                fail(f"{model_dir}: text_config.{key} reads {getattr(got, key, None)}, {made}'s "
                     f"{getattr(want, key, None)}")
    print(f"{PROG}: OK: transformers {transformers.__version__} opened {model_dir} "
          f"(eos {gen.get('eos_token_id')}); loss {o.loss.item():.6f} and logits equal headroom's, worst {worst:.2g}")


def generate(model_dir, image_path, generated_path):
    from PIL import Image
    from transformers import AutoImageProcessor
    model = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32)).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)  # the class preprocessor_config.json names
    want = {"siglip_vision_model": "SiglipImageProcessor"}.get(model.config.vision_config.model_type,
                                                               "CLIPImageProcessor")
    if type(processor).__name__ != want:
        fail(f"{model_dir}/preprocessor_config.json opens as {type(processor).__name__}; the tower's is {want}")
    ours = json.loads(open(generated_path).read().splitlines()[-1])
    img = Image.open(image_path).convert("RGB")
    w, h = img.size
    if w != h:  # LLaVA's expand2square with the mean colour
        square = Image.new("RGB", (max(w, h),) * 2, tuple(int(x * 255) for x in processor.image_mean))
        square.paste(img, ((max(w, h) - w) // 2, (max(w, h) - h) // 2))
        img = square
    pixels = processor.preprocess(img, return_tensors="pt")["pixel_values"]
    ids = torch.tensor([ours["prompt_ids"]])
    eos = model.config.text_config.eos_token_id
    with torch.no_grad():
        out = model.generate(input_ids=ids, pixel_values=pixels, attention_mask=torch.ones_like(ids),
                             max_new_tokens=len(ours["tokens"]), do_sample=False, num_beams=1, eos_token_id=eos,
                             pad_token_id=model.config.text_config.pad_token_id)
    theirs = out[0, ids.shape[1]:].tolist()
    if eos in theirs:
        theirs = theirs[:theirs.index(eos) + 1]
    if theirs != ours["tokens"]:
        fail(f"greedy generation differs: headroom {ours['tokens']}, transformers {theirs}")
    print(f"{PROG}: OK: transformers' generate on {model_dir} gives headroom's {len(theirs)} tokens on its "
          f"{ids.shape[1]}-token prompt (image through {want})")


def main(argv):
    if len(argv) in (2, 3, 4) and argv[0] == "make":
        make(*argv[1:])
    elif len(argv) == 3 and argv[0] == "compare":
        compare(argv[1], argv[2])
    elif len(argv) in (4, 5) and argv[0] == "load":
        load(*argv[1:])
    elif len(argv) == 4 and argv[0] == "generate":
        generate(argv[1], argv[2], argv[3])
    else:
        fail("usage: check_hf_dir.py make OUT [DECODER [TOWER]] | compare REF OURS | generate DIR IMAGE GENERATED | load DIR BATCH OURS [MADE]", 2)


if __name__ == "__main__":
    main(sys.argv[1:])
