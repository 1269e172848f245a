#!/usr/bin/env bash
# Compiles one instantiation of the prefill kernel template with NVRTC (as the JIT does) and with
# nvcc (as the ahead-of-time build does) from the same source, for sm_90a, and prints both kernels'
# SASS instruction counts and their largest per-opcode differences: the JIT kernels measured 2-4%
# slower than nvcc's on the same code (bench/results/LOG.md, session 39). CPU only.
# Usage: scripts/nvrtc-vs-nvcc.sh [TRAITS] [FORMAT] [VARIANT_FEATURES] [--ptx]
#   TRAITS   default the D128 bf16 wgmma tile
#   FORMAT   kRagged | kPaged | kBlockSparse (default kBlockSparse)
#   VARIANT_FEATURES  BuiltinVariant's feature bits (default 0u)
#   --ptx    also write both PTX files (their .loc lines attribute instructions to source lines)
# Outputs (cubins, SASS, PTX with --ptx) under $NVRTC_VS_NVCC_DIR (default /tmp/tessera-nvrtc-vs-nvcc).
set -euo pipefail
cd "$(dirname "$0")/.."
traits=${1:-"tessera::kernels::PrefillTraits<__nv_bfloat16, 128, 128, 128, 8, 1, 2, 1, tessera::kernels::MmaKind::kWgmma, __nv_bfloat16, 128>"}
format=${2:-kBlockSparse}
features=${3:-0u}
out=${NVRTC_VS_NVCC_DIR:-/tmp/tessera-nvrtc-vs-nvcc}
mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))" 2>/dev/null || true)}
[ -x "$cuobjdump" ] || { echo "nvrtc-vs-nvcc: no cuobjdump (set CUOBJDUMP=)" >&2; exit 2; }
params="tessera::kernels::AttentionParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>"
name="&tessera::kernels::attention_prefill_kernel<$traits, tessera::kernels::KVFormatKind::$format, TesseraJitVariant, tessera::kernels::OneShotScheduler, $params>"
# The JIT's source for a built-in variant (src/variant/jit_variant.cpp: variant_source).
printf '#include "kernels/attention/prefill.cuh"\nstruct TesseraJitVariant : tessera::kernels::BuiltinVariant<%s> {};\n' \
  "$features" > "$out/generated.cu"
{ cat "$out/generated.cu"; echo "void* tessera_take_address() { return (void*)($name); }"; } > "$out/aot.cu"
g++ -O1 -std=c++17 -o "$out/nvrtc_compile" scripts/nvrtc_compile.cpp -I"$cuda/include" -L"$cuda/lib64" -lnvrtc
LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$out/nvrtc_compile" "$out/generated.cu" "$name" "$out/nvrtc.cubin" "$PWD" "$cuda/include"
nvcc -arch=sm_90a -cubin -std=c++17 --expt-relaxed-constexpr -lineinfo -I"$PWD" -o "$out/nvcc.cubin" "$out/aot.cu"
if [ "${4:-}" = "--ptx" ]; then
  LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$out/nvrtc_compile" "$out/generated.cu" "$name" "$out/nvrtc.ptx" "$PWD" "$cuda/include" --gpu-architecture=compute_90a
  nvcc -arch=sm_90a -ptx -std=c++17 --expt-relaxed-constexpr -lineinfo -I"$PWD" -o "$out/nvcc.ptx" "$out/aot.cu"
fi
for side in nvrtc nvcc; do
  "$cuobjdump" -sass "$out/$side.cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/' |
    sed -E 's/^\s+\/\*[0-9a-f]{4}\*\/\s+//; s/^@!?U?P[T0-9]+\s+//' > "$out/$side.sass"
  awk '{split($1, a, "."); print a[1]}' "$out/$side.sass" | sort | uniq -c > "$out/$side.ops"
done
echo "SASS instructions: nvrtc $(wc -l < "$out/nvrtc.sass"), nvcc $(wc -l < "$out/nvcc.sass")"
echo "largest per-opcode differences (nvrtc - nvcc):"
join -1 2 -2 2 -a1 -a2 -e0 -o 0,1.1,2.1 <(sort -k2 "$out/nvrtc.ops") <(sort -k2 "$out/nvcc.ops") |
  awk '{d = $2 - $3; if (d != 0) printf "%+6d %-12s nvrtc %5d nvcc %5d\n", d, $1, $2, $3}' | sort -rn -k1 | head -12
