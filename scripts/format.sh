#!/usr/bin/env bash
# Formats every C++ and CUDA source of the tree with .clang-format, using Debian's clang-format-14 (installed by
# scripts/setup.sh: one version, so that every machine formats alike). --check changes nothing: it lists the files
# that differ and fails; the test command runs it. Files git does not track yet count too (unless .gitignore'd), so
# that a new source is formatted before its first commit.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${HR_CLANG_FORMAT:-clang-format-14}
command -v "$tool" >/dev/null || { echo "format: $tool not found (scripts/setup.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ "${1:-}" == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$tool" --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'format: %d file(s) differ from .clang-format (scripts/format.sh fixes them):\n' "${#bad[@]}" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
[[ $# -eq 0 ]] || { echo "usage: scripts/format.sh [--check]" >&2; exit 2; }
"$tool" --style=file -i "${files[@]}"
echo "format: ${#files[@]} files formatted"
