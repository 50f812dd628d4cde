#!/usr/bin/env python3
"""LLaVA-NeXT's and LLaVA-OneVision's AnyRes model side, the oracle: transformers' LlavaNextForConditionalGeneration
and LlavaOnevisionForConditionalGeneration on images of mixed sizes and aspect ratios, whose forward, loss and every
gradient headroom must reproduce.

    check_llava_next.py make OUT
        Writes OUT/hf: a tiny random LlavaNextForConditionalGeneration (CLIP tower of 12 px in 3-px patches, so each
        crop is 4 x 4 features; a LLaMA decoder with grouped-query attention; five pinpoints up to 3 x 1 tiles)
        through save_pretrained; and OUT/onevision/ the same files for a tiny LlavaOnevisionForConditionalGeneration
        (a SigLIP tower of 12 px, every patch kept; a Qwen2 decoder; the tile range (1x1),...,(3x3) and anyres_max_1,
        so that the larger images' tile features are pooled). OUT/batch.safetensors: three sequences holding five images (wide, tall, square,
        smaller than a tile, a thin strip), two of them in one sequence, and a text-only sequence, with
        input_ids (each image's placeholders as many as its tokens), labels, pixel_values (every image's crops
        in turn: (crops, 3, 12, 12)) and image_sizes ((images, 2) i64, [height, width]). OUT/ref.safetensors:
        transformers' loss, logits and "grad.<parameter>" for every parameter (zeros where none flows), all f32,
        "tokens" (each image's token count), "pooled" (1 where OneVision pooled the image's tile features) and
        "parameters" (the model's parameter count).

    check_llava_next.py load DIR BATCH OURS TRAIN_JSON IMAGE_FOLDER
        transformers opens DIR (a headroom AnyRes checkpoint) as the class its config.json names
        (LlavaNextForConditionalGeneration or LlavaOnevisionForConditionalGeneration) and its image processor
        (AutoImageProcessor: LlavaNextImageProcessor or LlavaOnevisionImageProcessor); BATCH (`headroom debug batch`, the first samples
        of TRAIN_JSON) holds the pixel values and image_sizes that processor makes of those samples' images
        (within 1e-5), and transformers' logits on BATCH equal headroom's (OURS, `debug grads --logits`) within 1e-4.

    check_llava_next.py generate DIR IMAGE GENERATED
        transformers' generate (greedy) from DIR, on the prompt headroom built (GENERATED: `headroom generate --json`'s
        prompt_ids, placeholders expanded for the image's layout) and IMAGE through DIR's image processor, produces
        headroom's tokens.

The C++ side (test_llava_next_oracle) compares. Exit 0 on success, 1 on a mismatch; 2 when a package is missing.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("transformers", "safetensors")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,  # noqa: E402
                          LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config,
                          SiglipVisionConfig)
from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches  # noqa: E402

from _transformers_fixes import upstream_fixes  # noqa: E402

SIZE = 12
IMAGE_TOKEN = 299  # vocabulary 300: the byte tokenizer's ids fit (the end-to-end run trains on text)
PINPOINTS = [[SIZE, 2 * SIZE], [2 * SIZE, SIZE], [2 * SIZE, 2 * SIZE], [3 * SIZE, SIZE], [SIZE, 3 * SIZE]]
ONEVISION_PINPOINTS = [[SIZE * r, SIZE * c] for r in range(1, 4) for c in range(1, 4)]  # "(1x1),...,(3x3)"
CLASSES = {"llava_next": LlavaNextForConditionalGeneration, "llava_onevision": LlavaOnevisionForConditionalGeneration}
# [height, width]: wide, tall, square, below one tile, a thin strip
IMAGES = [[10, 30], [40, 9], [20, 20], [7, 5], [13, 50]]
# Which images each sequence holds, and the text around them (lengths of text runs before, between and after).
SEQUENCES = [([0, 1], [3, 5, 4]), ([2], [0, 6]), ([], [9]), ([3, 4], [2, 0, 5])]


def model_config(kind):
    if kind == "onevision":  # SigLIP, every patch kept, the last layer (LlavaOnevisionConfig's defaults); Qwen2
        vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                                    image_size=SIZE, patch_size=3, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                    vision_use_head=False)
        text = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
                           max_position_embeddings=512, use_sliding_window=False)
        return LlavaOnevisionConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                                    image_token_index=IMAGE_TOKEN, image_grid_pinpoints=ONEVISION_PINPOINTS,
                                    vision_feature_layer=-1, vision_feature_select_strategy="full",
                                    vision_aspect_ratio="anyres_max_1")
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                              image_size=SIZE, patch_size=3, projection_dim=16, hidden_act="quick_gelu")
    text = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512)
    return LlavaNextConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_index=IMAGE_TOKEN,
                           image_grid_pinpoints=PINPOINTS, vision_feature_layer=-2,
                           vision_feature_select_strategy="default", image_seq_length=16, ignore_index=-100)


def token_counts(model, crops, sizes):
    """Each image's token count, as pack_image_features makes them (the placeholders it needs)."""
    with torch.no_grad():
        feats = [torch.zeros(n, (SIZE // 3) ** 2, model.config.text_config.hidden_size) for n in crops]
        if isinstance(model, LlavaOnevisionForConditionalGeneration):
            _, lens = model.pack_image_features(feats, sizes, image_newline=model.image_newline,
                                                vision_aspect_ratio=model.config.vision_aspect_ratio)
        else:
            _, lens = model.pack_image_features(feats, sizes, "default", image_newline=model.image_newline)
    return lens.tolist()


def unpooled_counts(model, crops, sizes):
    """The token counts without OneVision's pooling (anyres_max_64: never above it here)."""
    if not isinstance(model, LlavaOnevisionForConditionalGeneration):
        return token_counts(model, crops, sizes)
    with torch.no_grad():
        feats = [torch.zeros(n, (SIZE // 3) ** 2, model.config.text_config.hidden_size) for n in crops]
        _, lens = model.pack_image_features(feats, sizes, image_newline=model.image_newline,
                                            vision_aspect_ratio="anyres_max_64")
    return lens.tolist()


def make(out, kind="next"):
    upstream_fixes()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    config = model_config(kind)
    model = CLASSES[config.model_type](config).float()
    with torch.no_grad():  # every weight O(0.1), norm scales around 1 (image_newline included: it is trained)
        for name, p in model.named_parameters():
            centre = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g))
    model.train()
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)
    sizes = torch.tensor(IMAGES, dtype=torch.long)
    crops = [image_size_to_num_patches(s, config.image_grid_pinpoints, SIZE) for s in IMAGES]
    tokens = token_counts(model, crops, sizes)
    pooled = [int(a != b) for a, b in zip(tokens, unpooled_counts(model, crops, sizes))]

    # Sequences: text runs and image placeholders, right-padded; labels on text only, some of it masked.
    order, rows = [], []
    for images, runs in SEQUENCES:
        ids = []
        for k, run in enumerate(runs):
            ids += torch.randint(1, IMAGE_TOKEN, (run,), generator=g).tolist()
            if k < len(images):
                ids += [IMAGE_TOKEN] * tokens[images[k]]
                order.append(images[k])
        rows.append(ids)
    seq = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), seq, dtype=torch.long)
    labels = torch.full((len(rows), seq), -100, dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, :len(r)] = torch.tensor(r)
        for t, tok in enumerate(r):
            if tok != IMAGE_TOKEN and t % 3 != 1:
                labels[b, t] = tok
    pixels = [torch.randn(crops[i], 3, SIZE, SIZE, generator=g) for i in order]
    batch_sizes = sizes[order]
    # transformers takes (images, most crops, 3, SIZE, SIZE) and keeps each image's own crops
    most = max(p.shape[0] for p in pixels)
    stacked = torch.zeros(len(pixels), most, 3, SIZE, SIZE)
    for i, p in enumerate(pixels):
        stacked[i, :p.shape[0]] = p

    out_ = model(input_ids=input_ids, pixel_values=stacked, image_sizes=batch_sizes, labels=labels)
    out_.loss.backward()
    ref = {"loss": out_.loss.detach().reshape(()), "logits": out_.logits.detach(),
           "tokens": torch.tensor([tokens[i] for i in order], dtype=torch.long),
           "pooled": torch.tensor([pooled[i] for i in order], dtype=torch.long),
           "parameters": torch.tensor([sum(p.numel() for p in model.parameters())], dtype=torch.long)}
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "ref.safetensors"))
    save_file({"input_ids": input_ids, "labels": labels, "pixel_values": torch.cat(pixels).contiguous(),
               "image_sizes": batch_sizes.contiguous()}, os.path.join(out, "batch.safetensors"))
    print(f"check_llava_next: {type(model).__name__}: {len(order)} images ({sum(crops[i] for i in order)} crops, "
          f"tokens {[tokens[i] for i in order]}, {sum(pooled[i] for i in order)} pooled) in {len(rows)} sequences of "
          f"{seq}; loss {out_.loss.item():.6f}; wrote {out}")


def crops_of(batch):
    """transformers' (images, most crops, 3, S, S) from headroom's flat crops and image_sizes."""
    config = model_class(batch["dir"]).config_class.from_pretrained(batch["dir"])
    size = config.vision_config.image_size
    counts = [image_size_to_num_patches(s.tolist(), config.image_grid_pinpoints, size) for s in batch["image_sizes"]]
    stacked = torch.zeros(len(counts), max(counts), 3, size, size)
    at = 0
    for i, n in enumerate(counts):
        stacked[i, :n] = batch["pixel_values"][at:at + n]
        at += n
    return stacked, counts


def model_class(d):
    """The class DIR's config.json names by its model_type."""
    return CLASSES[json.load(open(os.path.join(d, "config.json")))["model_type"]]


def load(d, batch_path, ours_path, train_json, image_folder):
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import AutoImageProcessor
    upstream_fixes()
    batch, ours = load_file(batch_path), load_file(ours_path)
    faults = []
    # The loader's pixels: what the checkpoint's own processor makes of the same images.
    processor = AutoImageProcessor.from_pretrained(d)
    cls = model_class(d)
    want = cls.__name__.replace("ForConditionalGeneration", "ImageProcessor")
    if type(processor).__name__ != want:
        faults.append(f"{d}'s image processor is {type(processor).__name__}, not {want}")
    entries = json.load(open(train_json))[:batch["input_ids"].shape[0]]
    images = [Image.open(os.path.join(image_folder, e["image"])).convert("RGB") for e in entries if "image" in e]
    theirs = processor(images=images, return_tensors="pt")
    batch["dir"] = d
    stacked, counts = crops_of(batch)
    if theirs["image_sizes"].tolist() != batch["image_sizes"].tolist():
        faults.append(f"image_sizes {batch['image_sizes'].tolist()} != the processor's {theirs['image_sizes'].tolist()}")
    else:
        for i, n in enumerate(counts):
            diff = (theirs["pixel_values"][i, :n] - stacked[i, :n]).abs().max().item()
            if diff > 1e-5:
                faults.append(f"image {i} ({entries[i]['image']}): pixels differ from the processor's by {diff:.3g}")
    model = cls.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], pixel_values=stacked, image_sizes=batch["image_sizes"])
    diff = (out.logits - ours["logits"]).abs().max().item()
    scale = ours["logits"].abs().max().item()
    if diff > 1e-4 * max(scale, 1.0):
        faults.append(f"logits differ from headroom's by {diff:.3g} (largest |logit| {scale:.3g})")
    if _oracle_env.print_faults("check_llava_next", faults):
        return 1
    print(f"check_llava_next: transformers opened {d} as {cls.__name__}; {len(images)} images' "
          f"pixels ({sum(counts)} crops) and logits equal headroom's (logits within {diff:.2g})")
    return 0


def generate(d, image_path, generated_path):
    from PIL import Image
    from transformers import AutoImageProcessor
    upstream_fixes()
    model = model_class(d).from_pretrained(d, torch_dtype=torch.float32).eval()
    processor = AutoImageProcessor.from_pretrained(d)
    ours = json.loads(open(generated_path).read().splitlines()[-1])
    inputs = processor(images=[Image.open(image_path).convert("RGB")], return_tensors="pt")
    ids = torch.tensor([ours["prompt_ids"]])
    eos = model.config.text_config.eos_token_id
    with torch.no_grad():
        out = model.generate(input_ids=ids, pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"],
                             attention_mask=torch.ones_like(ids), max_new_tokens=len(ours["tokens"]), do_sample=False,
                             num_beams=1, eos_token_id=eos, pad_token_id=model.config.text_config.pad_token_id)
    theirs = out[0, ids.shape[1]:].tolist()
    if eos in theirs:
        theirs = theirs[:theirs.index(eos) + 1]
    if theirs != ours["tokens"]:
        _oracle_env.print_faults("check_llava_next", [f"greedy generation differs: headroom {ours['tokens']}, "
                                                      f"transformers {theirs}"])
        return 1
    print(f"check_llava_next: transformers' generate on {d} gives headroom's {len(theirs)} tokens on its "
          f"{ids.shape[1]}-token prompt ({inputs['image_sizes'].tolist()[0]} image, "
          f"{int((ids == model.config.image_token_index).sum())} image tokens)")
    return 0


def main(argv):
    if len(argv) == 2 and argv[0] == "make":
        os.makedirs(os.path.join(argv[1], "onevision"), exist_ok=True)
        make(argv[1])
        make(os.path.join(argv[1], "onevision"), "onevision")
        return 0
    if len(argv) == 6 and argv[0] == "load":
        return load(*argv[1:])
    if len(argv) == 4 and argv[0] == "generate":
        return generate(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
