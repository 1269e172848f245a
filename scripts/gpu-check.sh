#!/usr/bin/env bash
# The GPU check, for a machine with an H100 (or another sm_90 GPU) and CUDA 13: builds for sm_90a,
# runs every test (GPU tests must run, not skip), runs compute-sanitizer memcheck over a
# representative subset of the GPU tests, runs the quick benchmark suite, and prints a short
# summary table last. Logs and JSON go to $OUT (default /tmp/tessera-gpu-check).
#
# On the `device` machine (no package manager): run scripts/stage-gpu-deps.sh here first and carry
# .deps; with a prebuilt build folder, pass it as BUILD_DIR and carry it too.
#   Options (environment): BUILD_DIR (default build-sm90a), TESTS=0 to skip CTest, SANITIZE=0 to
#   skip compute-sanitizer, PYTEST=0 to skip the Python tests, BENCH_SUITES (default quick; empty
#   skips the benchmarks), BENCH_ITERS (default 30), TESSERA_GIT_COMMIT (the commit the tree is
#   at, recorded in the benchmark JSON, for copies of the tree without .git), PACK_LOGS=1 to pack
#   the step logs into $OUT/logs.tgz (for machines that return few files). The steps can be
#   split over several device calls on one warm machine (the build folder and the JIT cache stay).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tessera-gpu-check}
BUILD_DIR=${BUILD_DIR:-build-sm90a}
TESTS=${TESTS:-1}
SANITIZE=${SANITIZE:-1}
PYTEST=${PYTEST:-1}
PACK_LOGS=${PACK_LOGS:-0}
BENCH_SUITES=${BENCH_SUITES-quick}
BENCH_ITERS=${BENCH_ITERS:-30}
mkdir -p "$OUT"
summary=()
status=0
print_summary() { for row in "${summary[@]}"; do printf '%-28s %s\n' "${row%%|*}" "${row#*|}"; done; }
note() { summary+=("$1|$2"); case "$2" in ok*) ;; *) status=1 ;; esac; }

echo "== GPU" | tee "$OUT/gpu-check.log"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$OUT/gpu-check.log"

cmake_args=(-DTESSERA_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release)
[ -d .deps/googletest ] && [ ! -f /usr/include/gtest/gtest.h ] && cmake_args+=(-DTESSERA_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
[ -d .deps/include/dlpack ] && cmake_args+=(-DTESSERA_DLPACK_INCLUDE_DIR="$PWD/.deps/include")
# The Python extension when nanobind is importable (the GPU machine has it, with PyTorch).
python3 -c "import nanobind, torch" 2>/dev/null && cmake_args+=(-DTESSERA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
echo "== build ($BUILD_DIR, sm_90a)" | tee -a "$OUT/gpu-check.log"
start=$(date +%s)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${gen[@]}" "${cmake_args[@]}" >>"$OUT/build.log" 2>&1
fi
if cmake --build "$BUILD_DIR" -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
  note "build sm_90a" "ok ($(( $(date +%s) - start )) s)"
else
  tail -40 "$OUT/build.log"; note "build sm_90a" "FAILED (see build.log)"
  print_summary; exit 1
fi

if [ "$TESTS" = 1 ]; then
echo "== tests" | tee -a "$OUT/gpu-check.log"
ctest --test-dir "$BUILD_DIR" --output-on-failure >"$OUT/ctest.log" 2>&1
ctest_rc=$?
tail -25 "$OUT/ctest.log"
line=$(grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1)
skipped=$(grep -c "TESSERA-GPU-SKIP\|\*\*\*Skipped" "$OUT/ctest.log")
if [ $ctest_rc -eq 0 ] && [ "$skipped" -eq 0 ]; then note "ctest (all)" "ok: $line"; else note "ctest (all)" "FAILED: $line, $skipped skipped"; fi
gtest_counts=0
for t in "$BUILD_DIR"/tests/gpu/gpu_*_tests; do
  gtest_counts=$(( gtest_counts + $("$t" --gtest_list_tests | grep -c '^  ') ))
done
note "GPU test cases" "ok: $gtest_counts cases in $(ls "$BUILD_DIR"/tests/gpu/gpu_*_tests | wc -l) executables"
# On sm_90 the 128-row head_dim-128 tile is the wgmma configuration; the prefill suites run again
# on the mma.sync one (what sm_80 devices run) with TESSERA_PREFILL_WGMMA=0.
sync_ok=1
for exe in gpu_attention_tests gpu_variant_tests gpu_runtime_tests gpu_block_mask_tests; do
  TESSERA_PREFILL_WGMMA=0 "$BUILD_DIR/tests/gpu/$exe" >"$OUT/sync128-$exe.log" 2>&1 || { sync_ok=0; tail -20 "$OUT/sync128-$exe.log"; }
done
if [ $sync_ok = 1 ]; then note "mma.sync 128-row tile" "ok: 4 suites with TESSERA_PREFILL_WGMMA=0"; else note "mma.sync 128-row tile" "FAILED"; fi
# The wgmma tiles copy whole ragged/dense KV tiles with TMA; the cp.async gather they replace (the
# other formats' path) runs the same suites with TESSERA_PREFILL_TMA=0.
cpasync_ok=1
for exe in gpu_attention_tests gpu_variant_tests gpu_runtime_tests; do
  TESSERA_PREFILL_TMA=0 "$BUILD_DIR/tests/gpu/$exe" >"$OUT/cpasync-$exe.log" 2>&1 || { cpasync_ok=0; tail -20 "$OUT/cpasync-$exe.log"; }
done
if [ $cpasync_ok = 1 ]; then note "cp.async ragged KV tiles" "ok: 3 suites with TESSERA_PREFILL_TMA=0"; else note "cp.async ragged KV tiles" "FAILED"; fi
fi

if [ "$SANITIZE" = 1 ]; then
  echo "== compute-sanitizer memcheck" | tee -a "$OUT/gpu-check.log"
  san_ok=1
  for spec in "gpu_common_tests:*" \
              "gpu_merge_tests:*Pair*/*7_5_128*:*Ragged*:*Errors*:MergeStatesTest*/*8_128" \
              "gpu_page_tests:*_p3_*:*_p16_*:*Errors*" \
              "gpu_attention_tests:*_sanitize*:*Errors*" \
              "gpu_runtime_tests:*_sanitize*:*Errors*" \
              "gpu_runtime_guarantee_tests:*" \
              "gpu_variant_tests:*_sanitize*:*Errors*" \
              "gpu_block_mask_tests:*_sanitize*:*Errors*" \
              "gpu_mla_tests:*_sanitize*:*BadArguments*" \
              "gpu_rope_tests:*_sanitize*:*Errors*"; do
    exe=${spec%%:*}; filter=${spec#*:}
    if ! compute-sanitizer --tool memcheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/$exe" --gtest_filter="$filter" \
         >"$OUT/sanitize-$exe.log" 2>&1; then
      san_ok=0; tail -20 "$OUT/sanitize-$exe.log"
    fi
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize-$exe.log" | tail -3
  done
  [ $san_ok = 1 ] && note "compute-sanitizer memcheck" "ok: 0 errors" || note "compute-sanitizer memcheck" "FAILED"
  # Shared-memory races in the attention kernels' pipelines (small cases: racecheck is slow).
  if compute-sanitizer --tool racecheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_attention_tests" \
       --gtest_filter='*_sanitize*' >"$OUT/racecheck.log" 2>&1 &&
     compute-sanitizer --tool racecheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_runtime_tests" \
       --gtest_filter='*odd_sanitize*:*b16x64_sanitize*' >>"$OUT/racecheck.log" 2>&1 &&
     compute-sanitizer --tool racecheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_variant_tests" \
       --gtest_filter='*_sanitize*' >>"$OUT/racecheck.log" 2>&1 &&
     compute-sanitizer --tool racecheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_block_mask_tests" \
       --gtest_filter='*_sanitize*' >>"$OUT/racecheck.log" 2>&1 &&
     compute-sanitizer --tool racecheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_mla_tests" \
       --gtest_filter='*_sanitize*' >>"$OUT/racecheck.log" 2>&1; then
    note "compute-sanitizer racecheck" "ok: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
  else
    tail -20 "$OUT/racecheck.log"; note "compute-sanitizer racecheck" "FAILED"
  fi
  # Barrier use of the kernels whose warpgroups hand off through barriers (MLA).
  if compute-sanitizer --tool synccheck --error-exitcode 99 "$BUILD_DIR/tests/gpu/gpu_mla_tests" \
       --gtest_filter='*_sanitize*' >"$OUT/synccheck.log" 2>&1; then
    note "compute-sanitizer synccheck" "ok: $(grep -E 'ERROR SUMMARY' "$OUT/synccheck.log" | tail -1)"
  else
    tail -20 "$OUT/synccheck.log"; note "compute-sanitizer synccheck" "FAILED"
  fi
fi

if [ "$PYTEST" = 1 ] && [ -d "$BUILD_DIR/python/tessera" ]; then
  echo "== pytest tests/python" | tee -a "$OUT/gpu-check.log"
  if PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q tests/python -p no:cacheprovider >"$OUT/pytest.log" 2>&1; then
    note "pytest (Python, GPU)" "ok: $(tail -1 "$OUT/pytest.log")"
  else
    tail -30 "$OUT/pytest.log"; note "pytest (Python, GPU)" "FAILED: $(tail -1 "$OUT/pytest.log")"
  fi
fi

rm -f "$OUT/bench.jsonl"
if [ -z "$BENCH_SUITES" ]; then
  :
elif echo "== benchmarks ($BENCH_SUITES)" | tee -a "$OUT/gpu-check.log" &&
   "$BUILD_DIR/bench/tessera-bench" --suite "$BENCH_SUITES" --iters "$BENCH_ITERS" --json "$OUT/bench.jsonl" \
     >"$OUT/bench.txt" 2>&1; then
  cat "$OUT/bench.txt"; note "tessera-bench $BENCH_SUITES" "ok"
else
  cat "$OUT/bench.txt"; note "tessera-bench $BENCH_SUITES" "FAILED"
fi

echo
echo "== summary"
print_summary
if [ -f "$OUT/bench.jsonl" ]; then
  python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'workload':<34} {'impl':<11} {'median us':>10} {'value':>10} {'unit':<8} {'of ceiling':>10}")
for r in rows:
    frac = r.get('fraction_of_ceiling')
    print(f"{r['workload']:<34} {r['impl']:<11} {r['median_us']:>10.1f} {r['value']:>10.1f} {r['metric']:<8} "
          f"{(f'{100*frac:.1f}%' if frac is not None else '-'):>10}")
PY
fi
if [ "$PACK_LOGS" = 1 ]; then
  (cd "$OUT" && logs=$(ls *.log *.txt 2>/dev/null | grep -v '^gpu-check.log$') &&
     [ -n "$logs" ] && tar czf logs.tgz $logs && rm -f $logs)
fi
exit $status
