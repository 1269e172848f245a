#!/usr/bin/env python3
"""W3 through Python mods: tessera.flex_attention against Tessera's built-in variants and
torch's FlexAttention, in one process (the harness of bench/compare_torch.py: CUDA events, L2
flush before each run, median of --iters >= 20, copy and GEMM ceilings measured first).

Cells (bench/README.md W3: B=16, H=16, D=128, bf16, causal base), for each S of --lengths:
  causal     mask_mod q >= kv                     | built-in: causal
  softcap30  score_mod 30 tanh(score / 30), causal | built-in: logits_soft_cap=30
  alibi      score_mod score + slope[h] (kv - q)   | built-in: pos_encoding_mode="ALIBI"
             (slopes a captured device tensor), causal
  window1024 mask_mod q >= kv & q - kv <= 1024     | built-in: window_left=1024
impls: tessera-flex (tessera.flex_attention with create_block_mask's mask, 128 x 128 blocks),
tessera-builtin (BatchPrefillWithRaggedKVCacheWrapper over the same tensors in NHD, planned once),
torch-flex (torch.compile(flex_attention), with --torch-flex). TFLOP/s = 4 D H B x visible pairs.

First-call latency: with an empty TESSERA_CACHE_DIR (set by this script to a fresh directory
unless --keep-cache), the wall time of the first flex_attention call of each mod (trace + NVRTC
compile + load + run, synchronised), and create_block_mask's first call; for torch, the first
call of the compiled flex_attention (Dynamo + Inductor + Triton). Reported as impl "*-first-call"
with the seconds in `value` (metric "s").
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as CT  # noqa: E402  (the shared harness)

B, H, D = 16, 16, 128
CAP = 30.0
WINDOW = 1024


def visible_pairs(s: int, window: int) -> float:
    """Pairs per head and request: causal, or causal within `window` keys before p."""
    if window < 0 or window + 1 >= s:
        return s * (s + 1) / 2
    return window * (window + 1) / 2 + (s - window) * (window + 1.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="16384", help="comma list of S (default 16384)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--torch-flex", action="store_true", help="also time torch.compile(flex_attention)")
    p.add_argument("--keep-cache", action="store_true", help="use the current TESSERA_CACHE_DIR")
    p.add_argument("--cells", default="causal,softcap30,alibi,window1024")
    args = p.parse_args(argv)
    if args.iters < CT.MIN_ITERS:
        p.error(f"--iters must be at least {CT.MIN_ITERS}")
    if not args.keep_cache:
        os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-flex-bench-")
    import torch

    if not torch.cuda.is_available():
        print("bench_flex: no CUDA device; nothing to measure")
        return 0
    import tessera
    from torch.nn.attention import flex_attention as torch_flex

    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sm_count": props.multi_processor_count,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": CT.git_commit()}
    print(f"bench_flex: torch {torch.__version__}, tessera {tessera.__version__}, {props.name}")
    sink = CT.Sink(info, args.json)
    bench = CT.Bench(torch, args.iters, args.warmup, sink)
    dev = bench.dev
    slopes = torch.tensor(tessera._C.alibi_slopes(H), device=dev)

    def causal(b, h, q, kv):
        return q >= kv

    def window(b, h, q, kv):
        return (q >= kv) & (q - kv <= WINDOW)

    def softcap(score, b, h, q, kv):
        return CAP * torch.tanh(score / CAP)

    def alibi(score, b, h, q, kv):
        return score + slopes[h] * (kv - q)

    cells = {  # name -> (score_mod, mask_mod, built-in plan kwargs, window for the FLOPs)
        "causal": (None, causal, {}, -1),
        "softcap30": (softcap, causal, {"logits_soft_cap": CAP}, -1),
        "alibi": (alibi, causal, {"pos_encoding_mode": "ALIBI"}, -1),
        "window1024": (None, window, {"window_left": WINDOW}, WINDOW),
    }
    wanted = [c for c in args.cells.split(",") if c]
    unknown = set(wanted) - set(cells)
    if unknown:
        p.error(f"unknown cells {sorted(unknown)}")
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def first_call(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    def report_latency(workload, impl, params, seconds):
        sink.add(CT.Result(workload, "flex", impl, params, [seconds * 1e6], "s", seconds, "", float("nan")))

    try:
        with torch.inference_mode():
            bench.run_ceilings()
            for s in (int(x) for x in args.lengths.split(",") if x):
                q, k, v = (bench.randn(B, H, s, D) for _ in range(3))
                q_nhd, k_nhd, v_nhd = (t.transpose(1, 2).reshape(B * s, H, D).contiguous() for t in (q, k, v))
                indptr = torch.arange(0, (B + 1) * s, s, dtype=torch.int32)
                for name in wanted:
                    score_mod, mask_mod, builtin, win = cells[name]
                    workload = f"w3_{name}_s{s}"
                    flops = 4.0 * D * H * B * visible_pairs(s, win)
                    params = {"B": B, "H": H, "D": D, "S": s, "dtype": "bf16"}
                    secs, bm = first_call(lambda: tessera.create_block_mask(mask_mod, None, None, s, s, device=dev))
                    report_latency(workload, "tessera-create_block_mask-first-call", params, secs)
                    run = lambda: tessera.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)  # noqa: E731
                    secs, _ = first_call(run)
                    report_latency(workload, "tessera-flex-first-call", params, secs)
                    bench.report(workload, "flex", "tessera-flex", params, bench.measure(run), CT.TFLOPS, flops)
                    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
                    w.plan(indptr, indptr, H, H, D, causal=True, q_data_type=torch.bfloat16, **builtin)
                    run_builtin = lambda: w.run(q_nhd, k_nhd, v_nhd)  # noqa: E731
                    bench.report(workload, "flex", "tessera-builtin", params, bench.measure(run_builtin),
                                 CT.TFLOPS, flops)
                    if args.torch_flex:
                        compiled = torch.compile(torch_flex.flex_attention)
                        secs, tbm = first_call(
                            lambda: torch_flex.create_block_mask(mask_mod, None, None, s, s, device=dev))
                        report_latency(workload, "torch-create_block_mask-first-call", params, secs)
                        trun = lambda: compiled(q, k, v, score_mod=score_mod, block_mask=tbm)  # noqa: E731
                        secs, _ = first_call(trun)
                        report_latency(workload, "torch-flex-first-call", params, secs)
                        bench.report(workload, "flex", "torch-flex", params, bench.measure(trun), CT.TFLOPS, flops)
                    torch.cuda.empty_cache()
    finally:
        sink.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
