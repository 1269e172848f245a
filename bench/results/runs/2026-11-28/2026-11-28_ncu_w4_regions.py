#!/usr/bin/env python3
"""Sampled warp states of the persistent D128 wgmma prefill kernel by code region (session 51,
bench/results/LOG.md): the SASS of one build (461c42e, the bf16 ragged PlannedScheduler kernel) cut
at offsets read off its disassembly: the first KV tile of a work item (its own instantiation: Q
wait, Q K^T, softmax), the lagged tiles (Q K^T of t + 1 with P V of t, softmax), the last P V, the
epilogue (O staged, bulk stores) and the producer warpgroup (after its setmaxnreg). The offsets
hold for this build only.

Usage: python3 2026-11-28_ncu_w4_regions.py CELL_sass.csv [...]  (ncu --page source --csv
--print-source sass, from the tarball 2026-11-28_h200_461c42e_ncu_w4_runtime_sass.tar.xz)
"""
import collections
import csv
import sys

REGIONS = [(0x0, 0x4000, "first tile (Q wait, Q K^T 0, softmax 0)"), (0x4000, 0x7000, "lagged tiles"),
           (0x7000, 0x7C00, "last P V"), (0x7C00, 0xB400, "epilogue"), (0xB400, 1 << 30, "producer warpgroup")]

for path in sys.argv[1:]:
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    names = rows[head]
    data = [r for r in rows[head + 1:] if len(r) == len(names)]
    col = {n: i for i, n in enumerate(names)}
    stalls = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    base = int(data[0][col["Address"]], 16)
    samples = col["Warp Stall Sampling (All Samples)"]
    total = sum(float(r[samples] or 0) for r in data)
    print(f"# {path}: {len(data)} instructions, {total:.0f} samples")
    for lo, hi, name in REGIONS:
        part = [r for r in data if lo <= int(r[col["Address"]], 16) - base < hi]
        s = sum(float(r[samples] or 0) for r in part)
        reasons = collections.Counter()
        for r in part:
            for n in stalls:
                reasons[n] += float(r[col[n]] or 0)
        top = ", ".join(f"{k[6:]} {v / s * 100:.0f}%" for k, v in reasons.most_common(5))
        print(f"{name:42s} {s / total * 100:5.1f}% of samples; {top}")
        for r in sorted(part, key=lambda r: -float(r[samples] or 0))[:4]:
            off = int(r[col["Address"]], 16) - base
            print(f"    {off:5x} {float(r[samples]) / total * 100:5.2f}%  {r[col['Source']].strip()[:64]}")
    print()
