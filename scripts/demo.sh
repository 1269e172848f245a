#!/usr/bin/env bash
# Builds Tessera and runs its serving-loop example (examples/serving_loop.cpp): a model-shaped loop
# of prefill and decode steps over a paged KV cache (append, plan once per step, run per layer in a
# CUDA Graph), its results checked against the fp64 reference and its speed set against the copy
# and GEMM ceilings measured in the same run. Without a GPU it says so in one line.
# Arguments go to the example (--steps N).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
./build/examples/tessera-serving-loop "$@"
