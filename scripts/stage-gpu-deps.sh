#!/usr/bin/env bash
# The GPU machine has no package manager: copy the GoogleTest sources and the DLPack header into
# .deps/ (git-ignored) so a `device` call can carry them (carry: [".deps"]) and
# scripts/gpu-check.sh can build there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
rm -rf .deps && mkdir -p .deps/include
cp -r /usr/src/googletest .deps/googletest
cp -r /usr/include/dlpack .deps/include/dlpack
du -sh .deps
