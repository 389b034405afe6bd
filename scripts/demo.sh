#!/usr/bin/env bash
# Installs what is missing, builds wsync into build/, and shows it working on this machine:
# 2 trainer processes push 3 versions of a small model to an engine of 2 tensor-parallel
# processes, and every step is checked (weights by hash, tokens against a 1-process engine).
# Arguments go to wsync-demo: a mixture-of-experts checkpoint, for instance, with
#   scripts/demo.sh --model ../shared/testdata/hf_deepseek_v3_tiny --ep 2
# (whole experts per engine rank; --ep 1, the default, splits every expert by TP).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
cmake -B build -S .
cmake --build build -j "$(nproc)"

exec build/bin/wsync-demo --trainers 2 --tp 2 --steps 3 "$@"
