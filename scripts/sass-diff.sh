#!/usr/bin/env bash
# Compares the machine code (SASS) of every kernel translation unit between a git revision and the
# working tree, for one architecture: the check that a refactoring of kernels/ changed no
# instruction. Line info is left out, so moved code compares equal.
# Usage: scripts/sass-diff.sh [REV=HEAD] [ARCH=90a] [TU...]   (TUs default to every src/**/*.cu
# and the generated src/config/*_d*_*.cu)
# Prints one line per TU (identical / DIFFERS with a count of differing lines); diffs go to
# $SASS_DIFF_DIR (default /tmp/tessera-sass-diff).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
arch=${2:-90a}
shift $(( $# < 2 ? $# : 2 ))
out=${SASS_DIFF_DIR:-/tmp/tessera-sass-diff}
mkdir -p "$out"
base="$out/base-$(git rev-parse --short "$rev")"
if [ ! -d "$base" ]; then
  mkdir -p "$base"
  git archive "$rev" | tar -x -C "$base"
fi
tus=("$@")
if [ ${#tus[@]} -eq 0 ]; then
  mapfile -t tus < <(git ls-files 'src/*.cu' 'src/**/*.cu')
  # and the working tree's generated instantiation files
  [ -f src/config/attention_configs.txt ] &&
    mapfile -t -O ${#tus[@]} tus < <(python3 cmake/generate_attention_configs.py src/config/attention_configs.txt "$out/gen-list" | sed "s@^$out/gen-list/@@")
fi
# cuobjdump ships with the full toolkit; minimal installs lack it (the triton wheel and PyPI's
# nvidia-cuda-cuobjdump wheel carry one).
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))" 2>/dev/null || true)}
[ -x "$cuobjdump" ] || { echo "sass-diff: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
dlpack=$(dirname "$(dirname "$(find /usr/include /usr/local/include -name dlpack.h -path '*dlpack/*' | head -1)")")
flags=(-std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTESSERA_HAS_SM90A_KERNELS=1 -Xcompiler -fPIC
       "-gencode=arch=compute_${arch},code=sm_${arch}" -cubin)
# A tree with the configuration table gets its generated dispatch and instantiation files in
# $out/gen-<tree> (as CMake generates them); a TU path that is not in the tree is looked up there
# (src/config/prefill_d128_bf16.cu).
generate() {  # tree -> generated dir (empty when the tree has no table)
  local tree=$1 gen="$out/gen-$(basename "$1")"
  if [ -f "$tree/src/config/attention_configs.txt" ]; then
    python3 "$tree/cmake/generate_attention_configs.py" "$tree/src/config/attention_configs.txt" "$gen" >/dev/null
    echo "$gen"
  fi
}
sass() {  # tree tu -> SASS text without the address comments
  local tree=$1 tu=$2 cubin="$out/$(basename "$1")-$arch-$(echo "$2" | tr / _).cubin" gen src
  gen=$(generate "$tree")
  src="$tree/$tu"
  [ -f "$src" ] || { [ -n "$gen" ] && src="$gen/$tu"; }
  [ -f "$src" ] || { echo "(missing)"; return; }
  nvcc "${flags[@]}" -I"$tree" -I"$tree/include" ${gen:+-I"$gen" -I"$gen/include"} -I"$dlpack" -o "$cubin" "$src" 2>/dev/null
  "$cuobjdump" -sass "$cubin" | sed -E 's@/\*[0-9a-f]{4,}\*/@@; s/[[:space:]]+/ /g' | grep -v '^ *$'
}
status=0
for tu in "${tus[@]}"; do
  name=$(echo "$tu" | tr / _)
  base_sass="$out/$(basename "$base")-$arch-$name.sass"  # the revision's SASS is computed once
  [ -s "$base_sass" ] || sass "$base" "$tu" >"$base_sass" &
  sass "$PWD" "$tu" >"$out/$name.new.sass"
  wait
  cp "$base_sass" "$out/$name.base.sass"
  if cmp -s "$out/$name.base.sass" "$out/$name.new.sass"; then
    echo "identical  sm_$arch $tu ($(grep -c . "$out/$name.new.sass") lines)"
  else
    n=$(diff "$out/$name.base.sass" "$out/$name.new.sass" | grep -c '^[<>]' || true)
    echo "DIFFERS    sm_$arch $tu ($n lines; diff $out/$name.base.sass $out/$name.new.sass)"
    status=1
  fi
done
exit $status
