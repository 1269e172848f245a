#!/usr/bin/env python3
"""Where a kernel's sampled warp states fall, by side of a two-sided kernel (the POD kernel's
prefill and decode CTAs run different code in one launch).

Input: `ncu --import REP --page source --csv --print-source sass > sass.csv` of a report taken with
source counters (`--set full`). The SASS is split at the gap between the instructions that only
one side runs (default: HGMMA, the wgmma prefill tile; HMMA.16816, the mma.sync decode tile); for
each side it prints the summed counters (samples, stall reasons, instructions executed), then the
second side's hottest instructions and its samples per window of 64 instructions.

Usage: python3 scripts/ncu-sass-regions.py sass.csv [--markers HGMMA HMMA.16816] [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys


def number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--markers", nargs=2, default=["HGMMA", "HMMA.16816"], metavar=("FIRST", "SECOND"))
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()

    rows = list(csv.reader(open(args.csv, newline="")))
    head = next((i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r]), None)
    if head is None:
        sys.exit(f"{args.csv}: no 'Source' column (expected ncu --page source --csv --print-source sass)")
    names = [c.strip() for c in rows[head]]
    data = [r for r in rows[head + 1:] if len(r) == len(names)]
    col = {n: i for i, n in enumerate(names)}
    src = col["Source"]
    counters = [n for n in names if n not in ("Source", "Address")
                and sum(number(r[col[n]]) is not None for r in data[:200]) > 100]
    at = {m: [i for i, r in enumerate(data) if m in r[src]] for m in args.markers}
    first, second = (at[m] for m in args.markers)
    if not first or not second:
        sys.exit(f"a marker is missing: {args.markers[0]} x{len(first)}, {args.markers[1]} x{len(second)}")
    if first[-1] < second[0]:
        cut = (first[-1] + second[0]) // 2
        in_second = lambda i: i > cut  # noqa: E731
    elif second[-1] < first[0]:
        cut = (second[-1] + first[0]) // 2
        in_second = lambda i: i < cut  # noqa: E731
    else:
        sys.exit("the markers' instructions interleave: no single cut separates the sides")
    print(f"{len(data)} instructions; {args.markers[0]} at {first[0]}..{first[-1]}, "
          f"{args.markers[1]} at {second[0]}..{second[-1]}; cut at {cut}")

    sums = {side: collections.Counter() for side in args.markers}
    for i, r in enumerate(data):
        side = args.markers[1] if in_second(i) else args.markers[0]
        for n in counters:
            v = number(r[col[n]])
            if v:
                sums[side][n] += v
    samples = next((n for n in counters if n.startswith("Warp Stall Sampling (All")), None)
    for side in args.markers:
        total = sums[side][samples] if samples else 0
        print(f"== side of {side}")
        for n in counters:
            if sums[side][n]:
                share = f"  {100 * sums[side][n] / total:5.1f}%" if total and n.startswith("stall_") and "Not Issued" not in n else ""
                print(f"   {n:<66} {sums[side][n]:16.0f}{share}")
    if not samples:
        return 0
    mine = [i for i in range(len(data)) if in_second(i)]
    total = sum(number(data[i][col[samples]]) or 0 for i in mine)
    print(f"== side of {args.markers[1]}: hottest instructions ({samples}, total {total:.0f})")
    stall_cols = [n for n in counters if n.startswith("stall_") and "Not Issued" not in n]
    for i in sorted(mine, key=lambda i: -(number(data[i][col[samples]]) or 0))[: args.top]:
        s = number(data[i][col[samples]]) or 0
        why = " ".join(f"{n[6:]}={data[i][col[n]]}" for n in stall_cols if (number(data[i][col[n]]) or 0) >= 0.1 * s)
        print(f"{i:6d} {s:8.0f}  {data[i][src].strip()[:64]:<64} {why}")
    executed = next((n for n in counters if n.startswith("Instructions Executed")), None)
    print("== windows of 64 instructions: samples, instructions executed, commonest opcodes")
    for w0 in range(mine[0], mine[-1] + 1, 64):
        window = range(w0, min(w0 + 64, mine[-1] + 1))
        s = sum(number(data[i][col[samples]]) or 0 for i in window)
        e = sum(number(data[i][col[executed]]) or 0 for i in window) if executed else 0
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", data[i][src].strip()).split(" ")[0].split(".")[0]
                                  for i in window)
        if s >= 0.005 * total:
            print(f"{w0:6d} {s:8.0f} {e:12.0f}  " + " ".join(f"{op}:{n}" for op, n in ops.most_common(6)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
