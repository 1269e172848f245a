#!/usr/bin/env bash
# Builds Tessera and runs its demo: a paged KV cache built with the append kernel, attention
# states merged on the GPU, each checked against the fp64 reference, and the measured ceilings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
./build/examples/tessera-demo "$@"
