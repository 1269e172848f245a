#!/usr/bin/env bash
# A/B benchmark of two trees in one lease: the working tree against a base tree (a `git archive`
# of the base revision, staged here with `scripts/ab-bench.sh --stage REV` into .ab-base/ and
# carried to the GPU machine). Builds tessera-bench for sm_90a in both, then runs the same
# benchmark selections alternating base / new for ROUNDS rounds, each run's JSON lines tagged with
# its side and round, and prints a median table per cell last.
#   Environment: ROUNDS (default 3), RUNS (a ;-separated list of tessera-bench argument sets,
#   default: the quick suite, W2 at 4k and 16k, every W4 set), ITERS (default 30), COOLDOWN_MS
#   (default 300), OUT (default /tmp/tessera-ab), BUILD_DIR (default build-sm90a), FIRST (base or
#   new: the side that runs first in each round, default base), PIN (a CPU list for taskset: both
#   sides' processes run on those CPUs, for the host-clock cells; default: unpinned), BASE_ENV
#   (e.g. "TESSERA_PREFILL_TMA=0": no base tree; the base side is the working tree's build run
#   with these environment settings, for switches that keep an older path).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--stage" ]; then
  rev=${2:?usage: scripts/ab-bench.sh --stage REV}
  rm -rf .ab-base && mkdir .ab-base
  git archive "$rev" | tar -x -C .ab-base
  git rev-parse --short "$rev" >.ab-base/.ab-rev
  mkdir -p "$(git rev-parse --git-path info)"
  grep -qxF "/.ab-base/" "$(git rev-parse --git-path info/exclude)" 2>/dev/null || echo "/.ab-base/" >>"$(git rev-parse --git-path info/exclude)"
  rm -rf .ab-base/bench/results  # runs, not code
  du -sh .ab-base
  exit 0
fi
BASE_ENV=${BASE_ENV:-}
[ -n "$BASE_ENV" ] || [ -d .ab-base ] || { echo "ab-bench: no .ab-base (run scripts/ab-bench.sh --stage REV here first)" >&2; exit 2; }
OUT=${OUT:-/tmp/tessera-ab}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-30}
COOLDOWN_MS=${COOLDOWN_MS:-300}
BUILD_DIR=${BUILD_DIR:-build-sm90a}
RUNS=${RUNS:-"--suite quick;--suite prefill --filter s4096;--suite prefill --filter s16384;--suite prefill --filter w4_"}
mkdir -p "$OUT"
# "-dirty" where tracked files differ from HEAD (uncommitted changes, or a copy whose git metadata
# is older than its files: pass TESSERA_GIT_COMMIT there).
new_rev=${TESSERA_GIT_COMMIT:-$(git describe --always --dirty --abbrev=7 --exclude='*' 2>/dev/null || echo new)}
if [ -n "$BASE_ENV" ]; then
  base_rev="$new_rev ($BASE_ENV)"
  echo "== build $new_rev, tessera-bench, sm_90a; base: the same build with $BASE_ENV"
  BUILD_DIR=$BUILD_DIR bash scripts/gpu-build.sh tessera-bench >"$OUT/ab-build-new.log" 2>&1 || {
    tail -30 "$OUT/ab-build-new.log"; exit 1; }
else
  [ -e .ab-base/.deps ] || ln -s "$PWD/.deps" .ab-base/.deps
  base_rev=$(cat .ab-base/.ab-rev 2>/dev/null || echo base)
  echo "== build base ($base_rev) and new ($new_rev), tessera-bench, sm_90a"
  (cd .ab-base && BUILD_DIR=$BUILD_DIR bash scripts/gpu-build.sh tessera-bench) >"$OUT/ab-build-base.log" 2>&1 &
  base_pid=$!
  BUILD_DIR=$BUILD_DIR bash scripts/gpu-build.sh tessera-bench >"$OUT/ab-build-new.log" 2>&1 || {
    tail -30 "$OUT/ab-build-new.log"; exit 1; }
  wait $base_pid || { tail -30 "$OUT/ab-build-base.log"; exit 1; }
fi
# The device tool returns a bounded number of files: a build that succeeded keeps no log.
rm -f "$OUT/ab-build-base.log" "$OUT/ab-build-new.log"
IFS=';' read -r -a run_sets <<<"$RUNS"
for round in $(seq 1 "$ROUNDS"); do
  sides="base new"
  [ "${FIRST:-base}" = new ] && sides="new base"
  for side in $sides; do
    exe=$BUILD_DIR/bench/tessera-bench
    [ $side = base ] && exe=.ab-base/$BUILD_DIR/bench/tessera-bench
    [ $side = base ] && [ -n "$BASE_ENV" ] && exe="env $BASE_ENV $BUILD_DIR/bench/tessera-bench"
    [ -n "${PIN:-}" ] && exe="taskset -c $PIN $exe"
    commit=$new_rev
    [ $side = base ] && commit=$base_rev
    for args in "${run_sets[@]}"; do
      # shellcheck disable=SC2086
      TESSERA_GIT_COMMIT=$commit $exe $args --iters "$ITERS" --cooldown-ms "$COOLDOWN_MS" --json - 2>>"$OUT/ab-stderr.log" |
        grep '^{' | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); r['ab_side'] = '$side'; r['ab_round'] = $round; r['commit'] = '$commit'; print(json.dumps(r))" >>"$OUT/ab.jsonl"
    done
    echo "round $round $side done"
  done
done
[ -s "$OUT/ab-stderr.log" ] || rm -f "$OUT/ab-stderr.log"
python3 - "$OUT/ab.jsonl" <<'PY'
import json, statistics, sys, collections
cells = collections.defaultdict(lambda: {'base': [], 'new': [], 'base_min': [], 'new_min': [], 'metric': ''})
for line in open(sys.argv[1]):
    r = json.loads(line)
    c = cells[(r['workload'], r['impl'])]
    c[r['ab_side']].append(r['value'])
    c[r['ab_side'] + '_min'].append(r['min_us'])
    c['metric'] = r['metric']
# new/base of the median value; for us/ms metrics (W8) lower is better. "min new/base" compares the
# fastest run of each measurement (median over rounds), in the same sense: for rates base_min /
# new_min. Dense prefill cells of a few ms run their first runs at full clock and the rest under
# the 700 W software power cap, whose clock steps land anywhere in the window: their medians move
# by several percent between measurements of one binary, their fastest runs by ~0.3%.
print(f"{'workload':<36} {'impl':<18} {'base (runs)':>26} {'new (runs)':>26} {'new/base':>8} {'min new/base':>12}")
for (w, impl), v in cells.items():
    if not v['base'] or not v['new']:
        continue
    b, n = statistics.median(v['base']), statistics.median(v['new'])
    bm, nm = statistics.median(v['base_min']), statistics.median(v['new_min'])
    min_ratio = nm / bm if v['metric'] in ('us', 'ms') else bm / nm
    fmt = lambda xs: ' '.join(f'{x:.1f}' for x in xs)
    print(f"{w:<36} {impl:<18} {fmt(v['base']):>26} {fmt(v['new']):>26} {n / b:8.3f} {min_ratio:12.3f}")
PY
