#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml: bash requirements/update.sh (needs the dev extra's uv).
#
# One resolution, two builds of torch, for the one interpreter the project runs on (Python 3.11,
# Linux x86_64, glibc >= 2.28): the README's venv, CI and every cluster node install from these.
#   cpu.txt   torch's CPU build (download.pytorch.org; torch-cpu.txt installs it first) + everything
#             else + the dev tools: the README's venv, CI and the cluster's head.
#   cuda.txt  torch's default (CUDA) build from PyPI with its NVIDIA libraries + the same pins of
#             everything else: the cluster's GPU workers.
# Every line has its hashes (pip --require-hashes, uv pip sync); tests/test_lock.py checks that the
# two agree, that they match pyproject.toml, and that the nodes' Python resolves them.
# TORCH_WHEELS: where torch's CPU wheel is found while locking (a folder of wheels works too).
set -euo pipefail
cd "$(dirname "$0")/.."
torch=2.13.0
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header --quiet
        --index-strategy unsafe-best-match --no-annotate)
cpu_links=https://download.pytorch.org/whl/torch/
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "torch==$torch+cpu" > "$tmp/cpu.in"
# The lock's pins are uv's preferences: a new dependency is added without moving the others
# (UPGRADE=1 resolves everything afresh).
[ -n "${UPGRADE:-}" ] || { grep -v '^#' requirements/cpu.txt > "$tmp/cpu.txt"; grep -v '^#' requirements/cuda.txt > "$tmp/cuda.txt"; }
uv pip compile pyproject.toml "$tmp/cpu.in" --extra dev "${common[@]}" --find-links "${TORCH_WHEELS:-$cpu_links}" \
  -o "$tmp/cpu.txt"
# The same pins for everything torch's CUDA build does not bring in.
grep -E '^[A-Za-z0-9]' "$tmp/cpu.txt" | sed 's/ \\$//' | grep -v '^torch==' > "$tmp/pins.txt"
echo "torch==$torch" > "$tmp/cuda.in"
uv pip compile pyproject.toml "$tmp/cuda.in" -c "$tmp/pins.txt" "${common[@]}" -o "$tmp/cuda.txt"

# CUDA=cu126 (or cu128, ...): also requirements/cuda-$CUDA.txt, the same pins with torch's build for
# that CUDA from PyTorch's own index, for NVIDIA drivers older than the default build's CUDA needs
# (docs/cluster.md, "Older NVIDIA drivers").
if [ -n "${CUDA:-}" ]; then
  echo "torch==$torch+$CUDA" > "$tmp/cuda-other.in"
  uv pip compile pyproject.toml "$tmp/cuda-other.in" -c "$tmp/pins.txt" "${common[@]}" \
    --extra-index-url "https://download.pytorch.org/whl/$CUDA" -o "$tmp/cuda-other.txt"
fi

header() {
  echo "# Locked by requirements/update.sh from pyproject.toml for Python 3.11 on Linux x86_64; do not edit."
  echo "# $1"
}
# torch's CPU build alone, from the one place that has it, installed first with --no-deps: pip
# reads a --find-links page for every project it looks up, so cpu.txt itself names none (on a
# machine that cannot reach it, each of ~200 projects would wait out pip's retries).
{ header "torch's CPU build, first: pip install --no-deps --require-hashes -r requirements/torch-cpu.txt"
  echo "--find-links $cpu_links"
  sed -n '/^torch==/,/^[A-Za-z0-9]/p' "$tmp/cpu.txt" | sed '$d'; } > requirements/torch-cpu.txt
{ header "CPU torch + dev tools, after torch-cpu.txt: pip install --require-hashes -r requirements/cpu.txt (README, CI, the head)"
  cat "$tmp/cpu.txt"; } > requirements/cpu.txt
{ header "CUDA torch (PyPI's default build): uv pip sync --require-hashes requirements/cuda.txt (the GPU workers)"
  cat "$tmp/cuda.txt"; } > requirements/cuda.txt
if [ -n "${CUDA:-}" ]; then
  { header "torch built for $CUDA (older NVIDIA drivers): pip install --require-hashes -r requirements/cuda-$CUDA.txt"
    echo "--extra-index-url https://download.pytorch.org/whl/$CUDA"
    cat "$tmp/cuda-other.txt"; } > "requirements/cuda-$CUDA.txt"
fi
# uv alone (the dev extra's pin, with its hashes): what a cluster node bootstraps its Python with.
{ header "uv, to install the nodes' Python (cluster.yaml): pip install --require-hashes -r requirements/uv.txt"
  sed -n '/^uv==/,/^[A-Za-z0-9]/p' "$tmp/cpu.txt" | sed '$d'; } > requirements/uv.txt
# pip itself, first in a new venv: Python 3.11's bundled pip (23.2) resolves an extra of a locked
# package (weasel's smart-open[http]) to that project's newest release instead of the pin, and
# --require-hashes then refuses the whole install.
echo "pip==${PIP:-26.3}" > "$tmp/pip.in"
{ header "pip, first in a new venv: pip install --require-hashes -r requirements/pip.txt"
  uv pip compile "$tmp/pip.in" "${common[@]}"; } > requirements/pip.txt
echo "requirements/cpu.txt: $(grep -c '^[A-Za-z0-9]' requirements/cpu.txt) packages;" \
     "requirements/cuda.txt: $(grep -c '^[A-Za-z0-9]' requirements/cuda.txt) packages"
