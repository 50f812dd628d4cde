#!/usr/bin/env python3
"""Image processors, the oracle side: the pixel values transformers' CLIPImageProcessor and SiglipImageProcessor
give for images of odd sizes, which headroom's loader must reproduce.

    check_image_processor.py make OUT
        Writes OUT/images/*.png (RGB, odd sizes, some wider and some taller than high, shrunk and enlarged: a
        smooth gradient with noise and hard edges, as photos have both) and OUT/expected.safetensors with, per
        image, "<name>.siglip_resize" (SiglipImageProcessor on the image itself: a resize of the whole image to
        SIZE x SIZE, as data.image_aspect_ratio: resize), "<name>.siglip_pad" and "<name>.clip_pad" (LLaVA's
        expand2square with int(mean x 255), then SiglipImageProcessor / CLIPImageProcessor, as
        data.image_aspect_ratio: pad) and "<name>.clip_square" (CLIPImageProcessor on the image itself: the
        shortest edge to SIZE and a centre crop, as data.image_aspect_ratio: square), each (3, SIZE, SIZE) f32. OUT/siglip/preprocessor_config.json is what
        SiglipImageProcessor.save_pretrained writes (headroom must read it), OUT/cases.json names the images and
        the size. AnyRes: "<name>.next" (LlavaNextImageProcessor: CLIP's steps, LLaVA-NeXT's five pinpoints
        scaled to SIZE) and "<name>.onevision" (LlavaOnevisionImageProcessor: SigLIP's steps, anyres_max_9's
        36 pinpoints scaled to SIZE), each (1 + tiles, 3, SIZE, SIZE), with "<name>.next_best" and
        "<name>.onevision_best" (the chosen [height, width], i64); the pinpoints are in cases.json. At least one
        image is padded by an odd number of pixels.
        transformers 4.45.2 (the newest Debian's torch 1.13 allows) predates two fixes that LLaVA-NeXT's own
        code and current transformers have: the padding's odd pixel goes below / to the right (PR #37819,
        4.52; 4.45 left the padded image one pixel short), and unpad_image rounds to 7 decimals before
        truncating (PR #34522, 4.47). Where the installed version lacks them _transformers_fixes.py patches them in as
        upstream wrote them, so that the oracle is today's transformers.
        Token mixes: for image sizes from 1 x 1000 to 4000 x 3000 (cases.json "mix_sizes", [height, width]),
        random projected features of every crop "mix.<i>.next_in" (1 + tiles, 24 x 24, 3) and
        "mix.<i>.onevision_in" (1 + tiles, 27 x 27, 3) with "mix.newline" (3), and what
        LlavaNextForConditionalGeneration.pack_image_features (LLaVA-NeXT's pinpoints at 336 px) and
        LlavaOnevisionForConditionalGeneration.pack_image_features (anyres_max_9 at 384 px) make of them:
        "mix.<i>.next_out", "mix.<i>.onevision_out" (tokens, 3).

    check_image_processor.py load DIR
        AutoImageProcessor opens DIR's preprocessor_config.json (one headroom wrote for a SigLIP run) and it is a
        SiglipImageProcessor with SigLIP's size, mean and std.

The C++ side (test_image_oracle) compares. Exit 0 on success; 2 when a package is missing.
"""
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("transformers", "PIL", "numpy", "safetensors")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (AutoImageProcessor, CLIPImageProcessor, LlavaNextImageProcessor,  # noqa: E402
                          LlavaOnevisionImageProcessor, SiglipImageProcessor)
from transformers.image_processing_utils import select_best_resolution  # noqa: E402

from _transformers_fixes import upstream_fixes  # noqa: E402

PROG = "check_image_processor"


SIZE = 24
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# (width, height): wider, taller, square, much smaller and larger than SIZE, a thin strip
SHAPES = [(37, 23), (23, 41), (50, 50), (13, 9), (97, 61), (300, 17), (24, 24), (25, 200)]
# ... and more, to 52: the 1 x 8 and 8 x 1 extremes, sizes below the tile, and drawn sizes and aspect ratios. Not
# 60 x 2: resized into its pinpoint it is 3 rows high, and transformers (4.45 to 5.x) then takes the (3, 72, 3)
# array for channels-first and cuts it wrongly (LLaVA-NeXT's own code, on PIL images, and headroom do not).
SHAPES += [(1, 8), (8, 1), (1, 1), (5, 3), (3, 5), (17, 11), (23, 23), (2, 60), (61, 4), (25, 24)]
_draw = random.Random(5)
while len(SHAPES) < 52:
    _w, _h = _draw.randint(1, 130), _draw.randint(1, 130)
    if (_w, _h) not in SHAPES and max(_w, _h) <= 30 * min(_w, _h):
        SHAPES.append((_w, _h))
NEXT_PINPOINTS = [[SIZE, 2 * SIZE], [2 * SIZE, SIZE], [2 * SIZE, 2 * SIZE], [3 * SIZE, SIZE], [SIZE, 3 * SIZE]]
ONEVISION_PINPOINTS = [[i * SIZE, j * SIZE] for i in range(1, 7) for j in range(1, 7)]


def odd_padding(w, h, pinpoints):
    th, tw = select_best_resolution((h, w), pinpoints)
    sw, sh = tw / w, th / h
    nh, nw = (min(math.ceil(h * sw), th), tw) if sw < sh else (th, min(math.ceil(w * sh), tw))
    return (th - nh) % 2 == 1 or (tw - nw) % 2 == 1


def fail(msg):
    print(f"{PROG}: FAIL: {msg}")
    sys.exit(1)


def picture(rng, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 128 + 100 * np.sin((x + y) / 3)], axis=-1)
    img += np.array([[[rng.gauss(0, 20) for _ in range(3)] for _ in range(w)] for _ in range(h)])
    img[(x.astype(int) // 5 + y.astype(int) // 7) % 4 == 0] = [250, 10, 30]  # hard edges
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def expand2square(img, background):  # LLaVA's llava/mm_utils.py
    w, h = img.size
    if w == h:
        return img
    side = max(w, h)
    out = Image.new(img.mode, (side, side), background)
    out.paste(img, ((side - w) // 2, 0) if w < h else (0, (side - h) // 2))
    return out


def pixels(processor, img):
    # channels_last said outright: transformers guesses the layout of a 1- or 3-pixel-wide image wrong otherwise
    out = processor.preprocess(img, return_tensors="pt", input_data_format="channels_last")
    return out["pixel_values"][0].to(torch.float32).contiguous()


def make(out):
    upstream_fixes()
    rng = random.Random(11)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    siglip = SiglipImageProcessor(size={"height": SIZE, "width": SIZE})  # its own mean/std (0.5) and bicubic
    clip = CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE},
                              image_mean=CLIP_MEAN, image_std=CLIP_STD)
    siglip.save_pretrained(os.path.join(out, "siglip"))
    nxt = LlavaNextImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE},
                                  image_mean=CLIP_MEAN, image_std=CLIP_STD, image_grid_pinpoints=NEXT_PINPOINTS)
    # OneVision's checkpoints carry SigLIP's 0.5 / 0.5 (the class defaults to CLIP's).
    ov = LlavaOnevisionImageProcessor(size={"height": SIZE, "width": SIZE}, image_grid_pinpoints=ONEVISION_PINPOINTS,
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3)
    tensors, names, odd, inconsistent = {}, [], 0, {}
    for w, h in SHAPES:
        name = f"img_{w}x{h}"
        img = picture(rng, w, h)
        img.save(os.path.join(out, "images", name + ".png"))
        names.append(name)
        tensors[name + ".siglip_resize"] = pixels(siglip, img)
        tensors[name + ".siglip_pad"] = pixels(siglip, expand2square(img, tuple(int(x * 255) for x in siglip.image_mean)))
        tensors[name + ".clip_pad"] = pixels(clip, expand2square(img, tuple(int(x * 255) for x in CLIP_MEAN)))
        tensors[name + ".clip_square"] = pixels(clip, img)
        for key, proc, pins in (("next", nxt, NEXT_PINPOINTS), ("onevision", ov, ONEVISION_PINPOINTS)):
            best = select_best_resolution((h, w), pins)
            cut = pixels(proc, img)
            if cut.shape[0] != 1 + (best[0] // SIZE) * (best[1] // SIZE):
                # transformers' own processor disagrees with its select_best_resolution: it took the 1-pixel-high
                # array for channels-first (LlavaOnevisionImageProcessor on 8 x 1 in 4.45). Named, not compared.
                inconsistent.setdefault(key, []).append(name)
                continue
            tensors[f"{name}.{key}"] = cut
            tensors[f"{name}.{key}_best"] = torch.tensor(best, dtype=torch.int64)
            odd += odd_padding(w, h, pins)
    if not odd:
        fail("no image is padded by an odd number of pixels: SHAPES no longer covers that case")
    mixes(out, tensors)
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"size": SIZE, "images": names, "inconsistent": inconsistent, "next_pinpoints": NEXT_PINPOINTS,
                   "onevision_pinpoints": ONEVISION_PINPOINTS, "mix_sizes": MIX_SIZES, "next_336": NEXT_336,
                   "onevision_384": ONEVISION_384}, f)
    print(f"{PROG}: wrote {len(names)} images and {len(tensors)} tensors to {out} ({odd} AnyRes cuts padded oddly)")


MIX_SIZES = [[1000, 1], [1, 1000], [336, 336], [10, 10], [480, 640], [640, 480], [3000, 4000], [4000, 3000],
             [1080, 1920], [1920, 1080], [333, 1000], [1000, 333], [700, 701], [2000, 500], [500, 2000], [384, 384],
             [1152, 1152], [300, 2200], [2200, 300], [1536, 768], [97, 61], [768, 1535], [1111, 2333]]
NEXT_336 = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
ONEVISION_384 = [[i * 384, j * 384] for i in range(1, 7) for j in range(1, 7)]


def mixes(out, tensors):
    from types import SimpleNamespace as NS
    from transformers.models.llava_next.modeling_llava_next import (LlavaNextForConditionalGeneration,
                                                                    get_anyres_image_grid_shape)
    from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionForConditionalGeneration
    gen = torch.Generator().manual_seed(5)
    newline = torch.randn(3, generator=gen)
    tensors["mix.newline"] = newline
    for key, cls, tower, patch, pins in (("next", LlavaNextForConditionalGeneration, 336, 14, NEXT_336),
                                         ("onevision", LlavaOnevisionForConditionalGeneration, 384, 14, ONEVISION_384)):
        fake = NS(config=NS(vision_config=NS(image_size=tower, patch_size=patch), image_grid_pinpoints=pins))
        grid = tower // patch
        for i, (h, w) in enumerate(MIX_SIZES):
            rows, cols = get_anyres_image_grid_shape((h, w), pins, tower)
            feats = torch.randn(1 + rows * cols, grid * grid, 3, generator=gen)
            sizes = torch.tensor([[h, w]])
            if key == "next":
                packed, _ = cls.pack_image_features(fake, [feats], sizes, "default", image_newline=newline)
            else:
                packed, _ = cls.pack_image_features(fake, [feats], sizes, image_newline=newline,
                                                    vision_aspect_ratio="anyres_max_9")
            tensors[f"mix.{i}.{key}_in"] = feats.contiguous()
            tensors[f"mix.{i}.{key}_out"] = packed.contiguous()


def load(d):
    p = AutoImageProcessor.from_pretrained(d)
    if type(p).__name__ != "SiglipImageProcessor":
        fail(f"{d}/preprocessor_config.json opens as {type(p).__name__}, not SiglipImageProcessor")
    if list(p.image_mean) != [0.5] * 3 or list(p.image_std) != [0.5] * 3 or p.resample != 3:
        fail(f"{d}: mean {p.image_mean}, std {p.image_std}, resample {p.resample}; SigLIP's are 0.5, 0.5, 3")
    print(f"{PROG}: OK: AutoImageProcessor opens {d} as SiglipImageProcessor, size {p.size}")


def main(argv):
    if len(argv) == 2 and argv[0] == "make":
        make(argv[1])
    elif len(argv) == 2 and argv[0] == "load":
        load(argv[1])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
