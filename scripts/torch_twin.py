#!/usr/bin/env python3
"""The PyTorch twin of `headroom bench`: the same model and batch, timed per optimizer step in PyTorch.

    headroom bench CONFIG --set data.pad_to_max_length=true > hr.json
    python3 scripts/torch_twin.py hr.json [--compile] [--threads N] [--device cuda]

The model is transformers' LlavaForConditionalGeneration built from the bench JSON's `hf_config` (the
architecture headroom's parity tests check against), with random weights. Every step takes
global_batch_size samples of max_seq_len tokens, one image each, in micro-batches of micro_batch_size. Each
sequence labels its last loss_tokens_per_step / global_batch_size positions, as many as headroom's step labelled
(every text position for a bench JSON without that figure); transformers still runs lm_head over every position.
It trains the same parts as headroom's stage, with gradient checkpointing where headroom checkpoints (its last
decoder layer whole where headroom's plan kept that block: `checkpointing.llm_last_block_kept`), AdamW and
gradient clipping at 1. bf16 and fp16 run under torch.autocast over f32 weights, PyTorch's usual mixed precision.
`--compile` wraps the forward and loss in torch.compile (PyTorch 2); `--simdlen 256` has inductor generate AVX2 code on
an AVX-512 CPU (its `cpp.simdlen`; tests/bench/speed_table.sh's SPEED_ISA=avx2). `--device cuda` is the GPU peer: the model
on the GPU with SDPA attention, autocast on CUDA, PyTorch's caching allocator, whose
max_memory_allocated / max_memory_reserved are reported beside headroom's peaks (the bench JSON of a
`device.type: cuda` run). Prints one JSON object, with the step time ratio to headroom's (PyTorch / headroom:
above 1, headroom is faster); its tokens_per_s is headroom's tokens a step (not padding) over this step time, and
positions_per_s every position of the batch.
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch
from transformers import LlavaConfig, LlavaForConditionalGeneration


def parts(model):
    """The vision tower and the language model's modules (its decoder first) in either layout of transformers'
    LlavaForConditionalGeneration: up to 4.x the tower and a LlamaForCausalLM hang off it; from 5.x they sit under
    its `.model` (a LlavaModel), the decoder without its head, and `lm_head` beside `.model`."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "vision_tower") and hasattr(inner, "language_model"):
        return inner.vision_tower, [inner.language_model, model.lm_head]
    return model.vision_tower, [model.language_model]


def checkpoint(module):
    """Gradient checkpointing on a transformers model, non-reentrant under every version (transformers 4.x's
    default was reentrant, 5.x's is not), so the recompute is the same whichever is installed."""
    module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def keep_last_layer(decoder):
    """Leaves the checkpointed decoder's last layer out of checkpointing, as headroom's plan does where keeping that
    block adds no peak. transformers 5.x checkpoints per layer (each layer's `gradient_checkpointing`); 4.x's decoder
    loop calls `_gradient_checkpointing_func(layer.__call__, ...)` for every layer: the last layer's call then runs
    it directly."""
    inner = decoder.model if hasattr(decoder, "model") and hasattr(decoder.model, "layers") else decoder
    last = inner.layers[-1]
    if hasattr(last, "gradient_checkpointing"):
        last.gradient_checkpointing = False
        return
    through = inner._gradient_checkpointing_func

    def checkpointed(fn, *args, **kwargs):
        if getattr(fn, "__self__", None) is last:
            return fn(*args, **kwargs)
        return through(fn, *args, **kwargs)

    inner._gradient_checkpointing_func = checkpointed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json", help="headroom bench's output ('-' for stdin)")
    ap.add_argument("--steps", type=int, help="timed steps (default: the bench's)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default: the bench's, at least 1 with --compile)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward and loss")
    ap.add_argument("--simdlen", type=int, help="with --compile: the vector width in bits of inductor's CPU code "
                    "(default: the CPU's widest; 256 is AVX2)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (default: headroom's threads per rank x ranks)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: where the twin runs")
    a = ap.parse_args()
    b = json.load(sys.stdin if a.bench_json == "-" else open(a.bench_json))
    if "not_expressible" in b["hf_config"]:
        sys.exit(f"torch_twin: the model has no transformers twin: {b['hf_config']['not_expressible']}")
    steps = a.steps or b["steps"]
    warmup = b["warmup_steps"] if a.warmup is None else a.warmup
    if a.compile:
        warmup = max(warmup, 1)
        if a.simdlen:
            import torch._inductor.config as inductor
            inductor.cpp.simdlen = a.simdlen
    elif a.simdlen:
        sys.exit("torch_twin: --simdlen sets inductor's code, so it needs --compile")
    torch.set_num_threads(a.threads or b["threads_per_rank"] * b["world_size"])

    torch.manual_seed(0)
    cfg = LlavaConfig.from_dict(b["hf_config"])
    device = torch.device(a.device)
    gpu = device.type == "cuda"
    if gpu:
        cfg._attn_implementation = "sdpa"
    model = LlavaForConditionalGeneration(cfg).float().train().to(device)
    vision, llm = parts(model)
    for m in (vision, *llm):
        m.requires_grad_(False)
    if b["stage"] == "full":
        vision.requires_grad_(True)
    if b["stage"] != "pretrain":
        for m in llm:
            m.requires_grad_(True)
    if b["checkpointing"]["llm"] != "none":
        checkpoint(llm[0])
        if b["checkpointing"].get("llm_last_block_kept"):
            keep_last_layer(llm[0])
    if b["stage"] == "full" and b["checkpointing"]["vision"] != "none":
        checkpoint(vision)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=b["learning_rate"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    micro, seq = b["micro_batch_size"], b["max_seq_len"]
    accumulation = b["global_batch_size"] // micro
    vocab, image_token = cfg.text_config.vocab_size, cfg.image_token_index
    per_image = b["hf_config"]["image_seq_length"]
    text = seq - 1 - per_image
    labelled = text
    if b.get("loss_tokens_per_step"):
        labelled = min(text, max(1, round(b["loss_tokens_per_step"] / b["global_batch_size"])))
    size = cfg.vision_config.image_size
    g = torch.Generator().manual_seed(1)

    def batch():
        ids = torch.randint(0, image_token, (micro, seq), generator=g)
        ids[:, 1:1 + per_image] = image_token
        labels = torch.full_like(ids, -100)
        labels[:, seq - labelled:] = ids[:, seq - labelled:]
        pixels = torch.randn(micro, 3, size, size, generator=g)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels, "labels": labels}
        return {k: v.to(device) for k, v in inputs.items()}

    batches = [batch() for _ in range(accumulation)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[b["precision"]]

    def loss_of(inputs):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            # No KV cache: training never reads it, and transformers fills one unless told (config.use_cache).
            return model(**inputs, use_cache=False).loss

    forward = torch.compile(loss_of) if a.compile else loss_of

    def step():
        for inputs in batches:
            (forward(inputs) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    headroom = b["step_ms"]["median"] / 1e3
    memory = {}
    if gpu:
        memory = {"gpu": torch.cuda.get_device_name(device),
                  "max_memory_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
                  "max_memory_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20,
                  "headroom_peak_allocated_mib": b.get("peak_allocated_mib"),
                  "headroom_peak_reserved_mib": b.get("peak_reserved_mib")}
        if b.get("peak_reserved_mib"):
            memory["reserved_ratio_headroom_over_torch"] = b["peak_reserved_mib"] / memory["max_memory_reserved_mib"]
    print(json.dumps({
        "torch": torch.__version__,
        "device": str(device),
        "compiled": a.compile,
        "simdlen": a.simdlen,
        "threads": torch.get_num_threads(),
        "precision": b["precision"],
        "steps": steps,
        "step_ms": {"median": 1e3 * t, "mean": 1e3 * statistics.mean(times), "min": 1e3 * min(times),
                    "max": 1e3 * max(times)},
        "tokens_per_s": b.get("tokens_per_step", b["global_batch_size"] * seq) / t,
        "positions_per_s": b["global_batch_size"] * seq / t,
        "labelled_per_sequence": labelled,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "headroom_step_ms": b["step_ms"]["median"],
        "ratio_torch_over_headroom": t / headroom,
        **memory,
    }, indent=2))


if __name__ == "__main__":
    main()
