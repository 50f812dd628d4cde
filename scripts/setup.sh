#!/usr/bin/env bash
# Installs every Debian package headroom needs to build, test and run, then the PyPI oracles of tests/py in a
# venv (${HR_PYENV:-<repo>/.pyenv}). Idempotent; a rerun with everything present takes about a second.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libeigen3-dev libyaml-cpp-dev nlohmann-json3-dev libstb-dev zlib1g-dev libsentencepiece-dev
  libpcre2-dev libutf8proc-dev  # byte-level BPE tokenizers: the Split regexes (PCRE2) and NFC (utf8proc)
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev  # the fuzz build (tests/fuzz): libFuzzer, ASan, UBSan, OpenMP for clang
  clang-format-14  # scripts/format.sh: the one formatter version the test command checks the tree with
)
# The reference libraries the outputs are checked against (tests/py, run with Debian's /usr/bin/python3 or the
# venv below): PyTorch's memory_viz reads the allocator snapshots (python3-torch also generates the golden
# files, scripts/make_golden.py; the C++ tests read the committed files), headless Chromium renders the HTML
# report (fonts-dejavu-core so that its text has glyphs; chromium only recommends fonts).
packages+=(python3-torch python3-numpy python3-venv chromium fonts-dejavu-core)
# SentencePiece: spm_train makes the test tokenizers, python3-sentencepiece is the slow LlamaTokenizer's engine.
packages+=(sentencepiece python3-sentencepiece)
# Pillow: CLIPImageProcessor and LLaVA's expand2square, the image side of the LLaVA-port check.
packages+=(python3-pil)
# psutil and PyYAML: accelerate's and peft's imports (they are installed without their dependencies, below).
packages+=(python3-psutil python3-yaml)
# Jinja2: transformers' apply_chat_template, which LLaVA-NeXT's preprocess_qwen tokenizes with (check_tokenizer.py).
packages+=(python3-jinja2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present (${#packages[@]})"

# tensorboard's own EventAccumulator reads the tfevents files (tests/py/check_tfevents.py). It is on PyPI only, so
# it goes in a venv that also sees Debian's torch and numpy (--system-site-packages). Pinned to a release of the
# numpy 1.24 / torch 1.13 era; protobuf pinned so that a later major release cannot break its generated code.
# Debian's interpreter on purpose: a `python3` earlier on PATH (pyenv) would not see Debian's torch.
pyenv="${HR_PYENV:-$root/.pyenv}"
# transformers: LlavaForConditionalGeneration.generate is the oracle of headroom's generation
# (tests/py/check_generate_hf.py); 4.45.2 is the last release whose generate() runs on torch 1.13 (later ones
# import torch.distributed.fsdp / torch.distributed.tensor). Its dependencies are pinned with it.
pypi_pins=(tensorboard==2.16.2 protobuf==4.25.3
  transformers==4.45.2 tokenizers==0.20.3 safetensors==0.8.0 huggingface-hub==0.36.2 hf-xet==1.8.0
  regex==2026.11.15 tqdm==4.70.1 filelock==4.2.12 fsspec==2026.9.0 packaging==26.3)
# peft: the oracle of LoRA's adapter files (tests/py/check_llava_port.py peft). 0.13.2 is the last release that
# imports with torch 1.13; it and accelerate (which it imports) go in without their dependencies, which would
# pull a torch 2 wheel: the ones they use (numpy, psutil, pyyaml, safetensors, huggingface-hub) are here already.
nodeps_pins=(peft==0.13.2 accelerate==1.2.1)
# cuDNN's C++ frontend (header-only; the wheel's include/ holds it): the graph API behind the CUDA back-end's
# fused attention (core/backend/cuda/cudnn_attention.cpp). Only its headers are used, so its Python side's
# dependencies (CUTLASS DSL, TVM FFI) are not installed.
nodeps_pins+=(nvidia-cudnn-frontend==1.32.0)
stamp="$pyenv/.headroom-pins"
if [[ ! -x "$pyenv/bin/python3" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$pyenv"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "${pypi_pins[*]} ${nodeps_pins[*]}" ]]; then
  "$pyenv/bin/python3" -m pip install -q --disable-pip-version-check "${pypi_pins[@]}"
  "$pyenv/bin/python3" -m pip install -q --disable-pip-version-check --no-deps "${nodeps_pins[@]}"
  echo "${pypi_pins[*]} ${nodeps_pins[*]}" >"$stamp"
fi
echo "setup: python oracles present in $pyenv (${pypi_pins[*]} ${nodeps_pins[*]})"
