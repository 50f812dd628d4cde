#!/usr/bin/env python3
"""A LLaVA port end to end, checked with transformers: a llava-hf directory with a real (SentencePiece) tokenizer
and a CLIP image processor, LLaVA-format conversations and images of odd sizes.

    check_llava_port.py make OUT
        Writes OUT/hf: a tiny random LlavaForConditionalGeneration, its LlavaProcessor (LlamaTokenizer trained with
        spm_train, legacy=False, "<image>" added; CLIPImageProcessor with its own mean and std), all through
        save_pretrained. OUT/data: train.json (LLaVA's format, v1 conversations) and PNG images. OUT/port.yaml:
        the headroom config that trains from OUT/hf on that data (model.name_or_path only: dimensions, tokenizer
        and image normalisation all come from the directory; small train.max_shard_size, so checkpoints are
        sharded). OUT/ref_batch.safetensors: the first 4 samples as LLaVA's pipeline builds them (preprocess_v1,
        tokenizer_image_token, expand2square with int(mean * 255), the CLIP processor), placeholders expanded as
        llava-hf's are; OUT/ref.safetensors: transformers' loss and logits on it; OUT/masked.txt: how many of the
        samples LLaVA's masking throws away whole (headroom's run must warn about exactly as many).
    check_llava_port.py compare OUT BATCH OURS
        headroom's batch (`debug batch`) against the reference: ids and labels equal, pixels within 1e-5 (the
        same bytes after padding and resampling); headroom's loss on its own batch (`debug grads`) equal to transformers' within 1e-4.
    check_llava_port.py load DIR BATCH OURS
        transformers opens DIR (a headroom checkpoint) with LlavaForConditionalGeneration and AutoProcessor; the
        processor tokenizes as the one saved in OUT/hf did and expands "<image>" into the model's placeholders (its
        processor_config.json); the logits on BATCH equal headroom's (OURS) within 1e-4.

    check_llava_port.py generate DIR IMAGE GENERATED
        transformers' LlavaForConditionalGeneration.generate (greedy) from DIR on the prompt headroom built
        (GENERATED: `headroom generate --json`'s prompt_ids, placeholders expanded) and IMAGE (expand2square and
        the checkpoint's own processor) produces headroom's tokens, up to and including </s>.
    check_llava_port.py peft DIR BATCH OURS
        PEFT opens DIR (a checkpoint of a LoRA run: model.safetensors the base with its trained projector,
        adapter/adapter_model.safetensors and adapter/adapter_config.json the adapters) as PeftModel over
        LlavaForConditionalGeneration; the adapters trained (lora_B is not zero) and sit on the language model's
        layers only; on BATCH its loss and the gradients of everything it trains (adapters, projector), its logits
        and merge_and_unload()'s equal headroom's (OURS, `debug grads --logits`) within 1e-4.
    check_llava_port.py merged DIR MERGED BATCH
        transformers opens MERGED (`headroom lora merge DIR --out MERGED`) as LlavaForConditionalGeneration; every
        weight equals PEFT's merge_and_unload() of DIR's adapters over DIR's base within 1e-6, and so do the
        logits on BATCH within 1e-4.
    check_llava_port.py stage1 OUT
        LLaVA's stage-1 start: OUT/clip (a whole CLIPModel, text half included, with its CLIPImageProcessor) and
        OUT/llama (a LlamaForCausalLM with the SentencePiece tokenizer), LLaVA-format captions, and
        OUT/stage1.yaml (model.vision_tower + model.language_model, the plain template, train.stage pretrain).
    check_llava_port.py stage1_check OUT DIR
        transformers opens DIR (headroom's checkpoint after pretraining) as LlavaForConditionalGeneration and
        AutoProcessor (a LlavaProcessor whose tokenizer has "<image>" and "<pad>" after the LLaMA's vocabulary,
        as llava-hf's conversion adds them); its vision tower equals the CLIP's vision half and its language model the LLaMA (both
        frozen in pretraining) with "<image>" at the LLaMA's vocabulary size and the added rows at the mean; its
        projector has trained; on text, its logits over the LLaMA's vocabulary equal LlamaForCausalLM's.

Exit 0 when everything agrees; 1 on a difference; 2 on a usage error or a missing package.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _oracle_env  # noqa: E402

_oracle_env.require("torch", "transformers", "safetensors", "sentencepiece", "PIL")
import check_tokenizer as ct  # noqa: E402  (spm_train settings, LLaVA's preprocess transcribed)
from check_hf_dir import eager  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (AddedToken, AutoProcessor, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig,  # noqa: E402
                          LlamaTokenizer, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor)

transformers.logging.set_verbosity_error()

PROG = "check_llava_port"
TOL = 1e-4
IMAGE_SIZE, PATCH = 16, 4
T = (IMAGE_SIZE // PATCH) ** 2
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
SAMPLES, BATCH = 16, 4


def fail(msg, code=1):
    print(f"{PROG}: FAIL: {msg}")
    sys.exit(code)


def expand2square(img, background):  # LLaVA's llava/mm_utils.py
    w, h = img.size
    if w == h:
        return img
    side = max(w, h)
    out = Image.new(img.mode, (side, side), background)
    out.paste(img, ((side - w) // 2, 0) if w < h else (0, (side - h) // 2))
    return out


def reference_batch(out, entries, tok, processor, image_token):
    ids_list, labels_list, pixels = [], [], []
    for e in entries[:BATCH]:
        turns = [("human" if t["from"] == "human" else "gpt", t["value"]) for t in e["conversations"]]
        ids, labels = ct.preprocess("v1", turns, tok, ct.VICUNA)
        ex_ids, ex_labels = [], []
        for i, l in zip(ids, labels):
            n = T if i == ct.IMAGE else 1
            ex_ids += [image_token if i == ct.IMAGE else i] * n
            ex_labels += [-100 if i == ct.IMAGE else l] * n
        ids_list.append(ex_ids)
        labels_list.append(ex_labels)
        img = Image.open(os.path.join(out, "data", "images", e["image"])).convert("RGB")
        img = expand2square(img, tuple(int(x * 255) for x in processor.image_processor.image_mean))
        pixels.append(processor.image_processor.preprocess(img, return_tensors="pt")["pixel_values"][0])
    seq = max(len(i) for i in ids_list)
    input_ids = torch.full((len(ids_list), seq), tok.pad_token_id, dtype=torch.int64)
    labels = torch.full((len(ids_list), seq), -100, dtype=torch.int64)
    for r, (i, l) in enumerate(zip(ids_list, labels_list)):
        input_ids[r, :len(i)] = torch.tensor(i)
        labels[r, :len(l)] = torch.tensor(l)
    return {"input_ids": input_ids, "labels": labels, "pixel_values": torch.stack(pixels)}


def make(out):
    rng = random.Random(7)
    os.makedirs(os.path.join(out, "data", "images"), exist_ok=True)
    tok = spm_tokenizer(out)
    tok.add_tokens([AddedToken("<image>", special=True, normalized=False)], special_tokens=True)
    image_token = tok.convert_tokens_to_ids("<image>")
    tok.pad_token = tok.unk_token
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                         image_mean=MEAN, image_std=STD)
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok)
    hf = os.path.join(out, "hf")
    processor.save_pretrained(hf)
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                              image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="quick_gelu", layer_norm_eps=1e-5)
    text = LlamaConfig(vocab_size=image_token + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token,
                      projector_hidden_act="gelu", vision_feature_select_strategy="default", vision_feature_layer=-2,
                      image_seq_length=T, tie_word_embeddings=False)
    model = eager(LlavaForConditionalGeneration(cfg)).float().eval()
    model.save_pretrained(hf, safe_serialization=True)
    # Conversations and images of odd sizes (expand2square pads them).
    qs = ["What color is the circle?", "How many objects are there?", "Is it red? Answer yes or no.",
          "what shape is at the top left", "Describe the image."]
    ans = ["red", "Three.", "yes", "A small blue square on the left.", "There are 2 circles and 1 square."]
    entries = []
    for k in range(SAMPLES):
        w, h = rng.randint(6, 40), rng.randint(6, 40)
        img = Image.new("RGB", (w, h), tuple(rng.randint(0, 255) for _ in range(3)))
        img.putdata([tuple(rng.randint(0, 255) for _ in range(3)) for _ in range(w * h)])
        img.save(os.path.join(out, "data", "images", f"{k:03d}.png"))
        conv = [{"from": "human", "value": "<image>\n" + rng.choice(qs)}, {"from": "gpt", "value": rng.choice(ans)}]
        if k % 3 == 0:
            conv += [{"from": "human", "value": rng.choice(qs)}, {"from": "gpt", "value": rng.choice(ans)}]
        entries.append({"id": f"{k:03d}", "image": f"{k:03d}.png", "conversations": conv})
    with open(os.path.join(out, "data", "train.json"), "w") as f:
        json.dump(entries, f, indent=1)
    saved_tok = LlamaTokenizer.from_pretrained(hf)
    saved_tok.pad_token = saved_tok.unk_token
    masked = 0  # samples LLaVA's masking throws away whole (its "tokenization mismatch")
    for e in entries:
        turns = [("human" if t["from"] == "human" else "gpt", t["value"]) for t in e["conversations"]]
        masked += all(l == -100 for l in ct.preprocess("v1", turns, saved_tok, ct.VICUNA)[1])
    with open(os.path.join(out, "masked.txt"), "w") as f:
        f.write(f"{masked}\n")
    batch = reference_batch(out, entries, saved_tok, processor, image_token)
    batch["input_ids"][batch["input_ids"] == -1] = 0
    save_file(batch, os.path.join(out, "ref_batch.safetensors"))
    with torch.no_grad():
        o = model(**batch)
    save_file({"loss": o.loss.reshape(()), "logits": o.logits.contiguous()}, os.path.join(out, "ref.safetensors"))
    root = os.path.abspath(out)
    with open(os.path.join(out, "port.yaml"), "w") as f:
        f.write(f"""run: {{output_dir: {root}/run}}
model: {{name_or_path: {root}/hf}}
data:
  train_json: {root}/data/train.json
  eval_json: {root}/data/train.json
  image_folder: {root}/data/images
  template: v1
  max_seq_len: 512
  num_workers: 1
train: {{micro_batch_size: 4, max_steps: 20, learning_rate: 0.002, warmup_ratio: 0, save_steps: 20,
        max_shard_size: 40KB, eval_samples: 4, max_new_tokens: 4}}
log: {{progress_bar: false, logging_steps: 5}}
""")
    print(f"{PROG}: wrote {hf} (transformers {transformers.__version__}; vocab {image_token + 1}, <image> "
          f"{image_token}), {SAMPLES} samples, reference loss {o.loss.item():.6f}")


def close(name, ours, ref, tol=TOL):
    ours, ref = ours.double(), ref.double()
    if ours.shape != ref.shape:
        fail(f"{name}: shape {tuple(ours.shape)} against the reference's {tuple(ref.shape)}")
    err = (ours - ref).abs().max().item() / max(1.0, ref.abs().max().item())
    if err > tol:
        fail(f"{name}: max |difference| {err:.3g} > {tol}")
    return err


def compare(out, batch_path, ours_path):
    ref_b, ours_b = load_file(os.path.join(out, "ref_batch.safetensors")), load_file(batch_path)
    for key in ("input_ids", "labels"):
        if not torch.equal(ours_b[key], ref_b[key]):
            r, o = ref_b[key], ours_b[key]
            detail = f"shape {tuple(o.shape)} vs {tuple(r.shape)}"
            if o.shape == r.shape:
                row = int((o != r).any(1).nonzero()[0])
                detail = f"row {row}: headroom {o[row].tolist()}\n  LLaVA    {r[row].tolist()}"
            fail(f"{key} differ from LLaVA's pipeline: {detail}")
    # The same bytes after padding and PIL's fixed-point bicubic; only float rounding of the normalisation may differ.
    pix = (ours_b["pixel_values"] - ref_b["pixel_values"]).abs().max().item()
    if pix > 1e-5:
        fail(f"pixel_values differ by {pix:.4g} (one 8-bit level is {1.0 / (255 * max(STD)):.4g})")
    ref, ours = load_file(os.path.join(out, "ref.safetensors")), load_file(ours_path)
    err = close("loss", ours["loss"].reshape(()), ref["loss"])
    print(f"{PROG}: OK: input_ids and labels equal LLaVA's ({tuple(ref_b['input_ids'].shape)}), pixels within "
          f"{pix:.2g}; loss {ours['loss'].item():.6f} vs transformers {ref['loss'].item():.6f} (|diff| {err:.2g})")


def load(model_dir, batch_path, ours_path):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    for f in ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.model",
              "tokenizer_config.json"):
        if not os.path.exists(os.path.join(model_dir, f)):
            fail(f"{model_dir} has no {f}")
    model = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32)).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    source = LlamaTokenizer.from_pretrained(os.path.join(os.path.dirname(os.path.dirname(model_dir)), "hf"))
    text = "USER: <image>\nWhat color is the circle? ASSISTANT: red</s>"
    if processor.tokenizer(text).input_ids != source(text).input_ids:
        fail("the checkpoint's tokenizer does not tokenize as the one the run started from")
    if list(processor.image_processor.image_mean) != MEAN:
        fail(f"the checkpoint's image processor has mean {processor.image_processor.image_mean}, not {MEAN}")
    # processor_config.json: the processor expands "<image>" into the image's placeholders, as many as the model takes
    from PIL import Image
    placeholders = processor(text="<image>\nDescribe it.", images=Image.new("RGB", (20, 13), (90, 30, 200)),
                             return_tensors="pt").input_ids[0].tolist().count(model.config.image_token_index)
    vision = model.config.vision_config
    if placeholders != (vision.image_size // vision.patch_size) ** 2:
        fail(f"AutoProcessor expands <image> into {placeholders} placeholders, not the model's "
             f"{(vision.image_size // vision.patch_size) ** 2}")
    batch = load_file(batch_path)
    with torch.no_grad():
        o = model(**batch)
    ours = load_file(ours_path)
    worst = max(close("loss", ours["loss"].reshape(()), o.loss.reshape(())), close("logits", ours["logits"], o.logits))
    shards = len(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else 1
    print(f"{PROG}: OK: transformers opened {model_dir} ({shards} safetensors shard(s)) and its processor; loss "
          f"{o.loss.item():.6f} and logits equal headroom's, worst {worst:.2g}")


def generate(model_dir, image_path, generated_path):
    model = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32)).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    ours = json.loads(open(generated_path).read().splitlines()[-1])
    img = Image.open(image_path).convert("RGB")
    img = expand2square(img, tuple(int(x * 255) for x in processor.image_processor.image_mean))
    pixels = processor.image_processor.preprocess(img, return_tensors="pt")["pixel_values"]
    ids = torch.tensor([ours["prompt_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, pixel_values=pixels, attention_mask=torch.ones_like(ids),
                             max_new_tokens=len(ours["tokens"]), do_sample=False, num_beams=1,
                             eos_token_id=model.config.text_config.eos_token_id,
                             pad_token_id=model.config.text_config.pad_token_id)
    theirs = out[0, ids.shape[1]:].tolist()
    eos = model.config.text_config.eos_token_id
    if eos in theirs:
        theirs = theirs[:theirs.index(eos) + 1]
    if theirs != ours["tokens"]:
        fail(f"greedy generation differs: headroom {ours['tokens']}, transformers {theirs}")
    text = processor.tokenizer.decode(theirs, skip_special_tokens=True)
    if text.strip() != ours["answer"].strip():
        fail(f"the answer's text differs: headroom {ours['answer']!r}, transformers {text!r}")
    print(f"{PROG}: OK: transformers' generate gives headroom's {len(theirs)} tokens ({text!r}) on its "
          f"{ids.shape[1]}-token prompt")


def peft_check(model_dir, batch_path, ours_path):
    _oracle_env.require("peft")
    from peft import PeftModel
    base = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32))
    adapter = os.path.join(model_dir, "adapter")
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    if os.path.realpath(config["base_model_name_or_path"]) != os.path.realpath(model_dir):
        fail(f"adapter_config.json names {config['base_model_name_or_path']} as its base, not {model_dir}")
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True).eval()
    for p in model.base_model.model.multi_modal_projector.parameters():  # trains beside the adapters, as in LLaVA
        p.requires_grad_(True)
    lora_b = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    if not lora_b:
        fail(f"PEFT found no LoRA adapters in {model_dir}")
    outside = [n for n in lora_b if ".language_model.model.layers." not in n]
    if outside:
        fail(f"adapters outside the language model's layers: {outside[:3]}")
    if all(float(p.abs().max()) == 0 for p in lora_b.values()):
        fail("every lora_B is zero: the adapters did not train")
    batch = load_file(batch_path)
    ours = load_file(ours_path)
    # The loss and every adapter's gradient (and the projector's, which trains beside them), dropout off as in
    # headroom's `debug grads`.
    model.train()
    for module in model.modules():
        if hasattr(module, "lora_dropout"):
            for key in list(module.lora_dropout.keys()):
                module.lora_dropout[key] = torch.nn.Identity()
    o = model(**batch)
    o.loss.backward()
    worst = close("loss", ours["loss"].reshape(()), o.loss.detach().reshape(()))
    grads = 0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        ours_name = name.replace("base_model.model.", "", 1).replace(".default.", ".")
        if ours_name not in ours:
            fail(f"PEFT trains {name}, which headroom's gradients do not have ({ours_name})")
        worst = max(worst, close(f"d {ours_name}", ours[ours_name], p.grad))
        grads += 1
    if grads < 2 * len(lora_b):
        fail(f"only {grads} gradients compared for {len(lora_b)} adapted layers")
    model.eval()
    with torch.no_grad():
        o = model(**batch)
        worst = max(worst, close("logits", ours["logits"], o.logits))
        merged = model.merge_and_unload()
        m = merged(**batch)
        worst = max(worst, close("merged logits", ours["logits"], m.logits))
    print(f"{PROG}: OK: PEFT opened {model_dir} ({len(lora_b)} adapted layers); its loss, {grads} gradients, logits "
          f"and merge_and_unload()'s logits equal headroom's, worst {worst:.2g}")


def merged_check(model_dir, merged_dir, batch_path):
    _oracle_env.require("peft")
    from peft import PeftModel
    base = eager(LlavaForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.float32))
    peft_merged = PeftModel.from_pretrained(base, os.path.join(model_dir, "adapter")).merge_and_unload().eval()
    ours = eager(LlavaForConditionalGeneration.from_pretrained(merged_dir, torch_dtype=torch.float32)).eval()
    theirs = peft_merged.state_dict()
    worst, n = 0.0, 0
    for name, t in ours.state_dict().items():
        if name not in theirs:
            fail(f"{merged_dir} has {name}, which PEFT's merged model does not")
        worst = max(worst, close(f"merged {name}", t, theirs[name], tol=1e-6))
        n += 1
    if n != len(theirs):
        fail(f"{merged_dir} has {n} tensors, PEFT's merged model {len(theirs)}")
    batch = load_file(batch_path)
    with torch.no_grad():
        worst_logits = close("merged logits", ours(**batch).logits, peft_merged(**batch).logits)
    print(f"{PROG}: OK: headroom's merged {merged_dir}: {n} weights equal PEFT's merge_and_unload() (worst "
          f"{worst:.2g}), logits too ({worst_logits:.2g})")


def spm_tokenizer(out, legacy=False):
    rng = random.Random(7)
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(ct.corpus(rng))
    ct.subprocess.run(["spm_train", f"--input={out}/corpus.txt", f"--model_prefix={out}/spm", "--vocab_size=600",
                       "--model_type=bpe", "--byte_fallback=true", "--split_digits=true", "--character_coverage=0.99",
                       "--allow_whitespace_only_pieces=true", "--remove_extra_whitespaces=false",
                       "--normalization_rule_name=identity", "--add_dummy_prefix=true", "--unk_id=0", "--bos_id=1",
                       "--eos_id=2", "--pad_id=-1", "--minloglevel=2"], check=True, stdout=ct.subprocess.DEVNULL,
                      stderr=ct.subprocess.DEVNULL)
    return LlamaTokenizer(vocab_file=f"{out}/spm.model", legacy=legacy, add_prefix_space=None if legacy else True)


def stage1(out):
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, LlamaForCausalLM
    rng = random.Random(11)
    os.makedirs(os.path.join(out, "data", "images"), exist_ok=True)
    tok = spm_tokenizer(out)
    torch.manual_seed(3)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                              image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="quick_gelu", layer_norm_eps=1e-5)
    clip = CLIPModel(CLIPConfig(text_config=CLIPTextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                           num_attention_heads=2, vocab_size=50).to_dict(),
                                vision_config=vision.to_dict(), projection_dim=8)).float()
    clip.save_pretrained(os.path.join(out, "clip"), safe_serialization=True)
    CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                       image_mean=MEAN, image_std=STD).save_pretrained(os.path.join(out, "clip"))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                         bos_token_id=1, eos_token_id=2)).float()
    llama.save_pretrained(os.path.join(out, "llama"), safe_serialization=True)
    tok.save_pretrained(os.path.join(out, "llama"))
    entries = []
    for k in range(SAMPLES):
        w, h = rng.randint(6, 40), rng.randint(6, 40)
        img = Image.new("RGB", (w, h))
        img.putdata([tuple(rng.randint(0, 255) for _ in range(3)) for _ in range(w * h)])
        img.save(os.path.join(out, "data", "images", f"{k:03d}.png"))
        caption = rng.choice(["a red circle on the left", "two blue squares", "a small green shape", "three circles"])
        entries.append({"id": f"{k:03d}", "image": f"{k:03d}.png",
                        "conversations": [{"from": "human", "value": "<image>\nDescribe it."},
                                          {"from": "gpt", "value": caption}]})
    with open(os.path.join(out, "data", "train.json"), "w") as f:
        json.dump(entries, f, indent=1)
    root = os.path.abspath(out)
    with open(os.path.join(out, "stage1.yaml"), "w") as f:
        f.write(f"""run: {{output_dir: {root}/run1}}
model: {{vision_tower: {root}/clip, language_model: {root}/llama}}
data:
  train_json: {root}/data/train.json
  image_folder: {root}/data/images
  template: plain
  num_workers: 1
train: {{stage: pretrain, micro_batch_size: 4, max_steps: 6, learning_rate: 0.01, warmup_ratio: 0, save_steps: 6}}
log: {{progress_bar: false, logging_steps: 2}}
""")
    print(f"{PROG}: wrote {out}/clip (CLIPModel), {out}/llama (LlamaForCausalLM, vocab {len(tok)}), stage1.yaml")


def stage1_check(out, ckpt):
    from safetensors import safe_open
    from transformers import LlamaForCausalLM
    model = eager(LlavaForConditionalGeneration.from_pretrained(ckpt, torch_dtype=torch.float32)).eval()
    llama = LlamaForCausalLM.from_pretrained(os.path.join(out, "llama"), torch_dtype=torch.float32).eval()
    V = llama.config.vocab_size
    processor = AutoProcessor.from_pretrained(ckpt)
    if type(processor).__name__ != "LlavaProcessor":
        fail(f"AutoProcessor of {ckpt} is a {type(processor).__name__}, not a LlavaProcessor")
    ids = processor.tokenizer("<image>\nDescribe it.").input_ids
    if V not in ids or processor.tokenizer.convert_tokens_to_ids("<pad>") != V + 1:
        fail(f"the checkpoint's tokenizer does not know <image> as {V} and <pad> as {V + 1}: {ids}")
    if list(processor.image_processor.image_mean) != MEAN:
        fail(f"the checkpoint's image processor has mean {processor.image_processor.image_mean}, not {MEAN}")
    if model.config.image_token_index != V:
        fail(f"image_token_index {model.config.image_token_index}, expected the LLaMA's vocabulary size {V}")
    if model.config.text_config.vocab_size != (V + 2 + 63) // 64 * 64:
        fail(f"vocab_size {model.config.text_config.vocab_size}, expected {(V + 2 + 63) // 64 * 64}")
    clip = {}
    with safe_open(os.path.join(out, "clip", "model.safetensors"), "pt") as f:
        for k in f.keys():
            clip[k] = f.get_tensor(k)
    checked = 0
    for name, p in model.vision_tower.named_parameters():
        if name not in clip:
            fail(f"vision_tower.{name} is not in the CLIP directory")
        if not torch.equal(p, clip[name]):
            fail(f"vision_tower.{name} differs from the CLIP's (frozen in pretraining)")
        checked += 1
    for name, p in llama.named_parameters():
        q = model.language_model.get_parameter(name)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            if not torch.equal(q[:V], p) or not torch.allclose(q[V:], p.mean(0, keepdim=True).expand(q.shape[0] - V, -1),
                                                              atol=1e-6):
                fail(f"language_model.{name}: rows differ from the LLaMA's, or the added rows are not their mean")
        elif not torch.equal(q, p):
            fail(f"language_model.{name} differs from the LLaMA's (frozen in pretraining)")
        checked += 1
    ids = torch.tensor([[1, 5, 77, 300, 12, 9, 451, 2]])
    with torch.no_grad():
        a = model(input_ids=ids).logits[..., :V]
        b = llama(input_ids=ids).logits
    err = (a - b).abs().max().item()
    if err > TOL:
        fail(f"text-only logits differ from LlamaForCausalLM's by {err:.3g}")
    print(f"{PROG}: OK: {ckpt} opens as LlavaForConditionalGeneration and LlavaProcessor (<image> {V}, vocab "
          f"{model.config.text_config.vocab_size}); {checked} tower and LLaMA tensors equal their sources; text logits "
          f"equal LlamaForCausalLM's within {err:.2g}")


def main(argv):
    if len(argv) == 2 and argv[0] == "make":
        make(argv[1])
    elif len(argv) == 4 and argv[0] == "compare":
        compare(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "load":
        load(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "merged":
        merged_check(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "peft":
        peft_check(argv[1], argv[2], argv[3])
    elif len(argv) == 4 and argv[0] == "generate":
        generate(argv[1], argv[2], argv[3])
    elif len(argv) == 2 and argv[0] == "stage1":
        stage1(argv[1])
    elif len(argv) == 3 and argv[0] == "stage1_check":
        stage1_check(argv[1], argv[2])
    else:
        fail("usage: check_llava_port.py make OUT | compare OUT BATCH OURS | load DIR BATCH OURS | "
             "generate DIR IMAGE GENERATED | stage1 OUT | stage1_check OUT DIR", 2)


if __name__ == "__main__":
    main(sys.argv[1:])
