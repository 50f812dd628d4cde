"""Writes tests/golden/adamw8bit_bnb.safetensors: bitsandbytes' own 8-bit AdamW (AdamW8bit, block-wise, on the
CPU) over three steps of fixed gradients, the oracle of test_optim's AdamW8bit tests. bitsandbytes needs PyTorch
2.x, not Debian's 1.13: run it with a venv of PyTorch from PyPI and bitsandbytes (written with torch 2.11.0 and
bitsandbytes 0.50.2: `python3 -m venv V && V/bin/pip install torch bitsandbytes safetensors`). The test suite reads
the file and never runs this.

Tensors: qmap1 / qmap2 (the signed and unsigned dynamic maps), param0 (the start), grad1..grad3, and after each
step k: param{k}, state1_{k} / state2_{k} (uint8 codes), absmax1_{k} / absmax2_{k}. The size, 4,396, ends in a
partial block of 44 (blocks of 256); block 0 has small gradients, block 1 zero ones, block 2 one outlier."""
import sys

import bitsandbytes as bnb
import torch
from safetensors.torch import save_file

N, LR, BETAS, EPS, WD = 4396, 1e-2, (0.9, 0.95), 1e-6, 0.1
torch.manual_seed(7)
p = torch.nn.Parameter(torch.randn(N) * 0.5)
out = {"param0": p.detach().clone()}
opt = bnb.optim.AdamW8bit([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, min_8bit_size=4096)
for k in (1, 2, 3):
    g = torch.randn(N) * (0.1 if k != 2 else 3.0)  # a large second gradient moves every block's scale
    g[:256] *= 1e-3  # one block of small gradients
    g[256:512] = 0.0  # one block of zero gradients (its moments decay; on step 1 they stay zero)
    g[700] = 40.0 * (1 if k != 3 else -1)  # an outlier that sets its block's scale
    p.grad = g.clone()
    opt.step()
    st = opt.state[p]
    out[f"grad{k}"] = g
    out[f"param{k}"] = p.detach().clone()
    for name in ("state1", "state2", "absmax1", "absmax2"):
        out[f"{name}_{k}"] = st[name].detach().clone()
out["qmap1"], out["qmap2"] = opt.state[p]["qmap1"].clone(), opt.state[p]["qmap2"].clone()
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1] if len(sys.argv) > 1 else
          "tests/golden/adamw8bit_bnb.safetensors",
          metadata={"bitsandbytes": bnb.__version__, "torch": torch.__version__, "lr": str(LR),
                    "betas": str(BETAS), "eps": str(EPS), "weight_decay": str(WD)})
