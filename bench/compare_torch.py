#!/usr/bin/env python3
"""PyTorch SDPA on the W1, W2 and W4 cells of bench/README.md, for comparison with tessera-bench.

Runs torch.nn.functional.scaled_dot_product_attention with one backend forced at a time
(torch.nn.attention.sdpa_kernel: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION) on
contiguous [B, H, S, D] bf16 tensors of random normal values, on the same GPU as tessera-bench,
and writes the same JSON lines (same workload names, impl "torch-sdpa-<backend>") plus a table.

  W1  decode: q [B, 32, 1, 128], contiguous K/V [B, 8, L, 128], enable_gqa=True (if a backend
      rejects it, the KV heads are repeat_interleave'd outside the timed region; the params say
      which). GB/s = K and V bytes of the 8 KV heads (B * L * 8 * 128 * 2 B * 2) / time.
  W2  dense prefill [16, H, S, D], causal and not. TFLOP/s = 4 * D * visible pairs * H / time.
  W4  variable-length causal prefill as a padded batch [16, 32 (8 KV), max_len, 128]; FLOPs are
      counted over the real visible pairs only (the padding is wasted work, as in bench/README.md).
      Reported under the w4_ragged_* names (a padded batch has no paged variant).

Timing: CUDA events per run, warm-up, median of --iters runs (>= 20), an L2 flush (a write of
max(2 x L2, 64 MiB)) before every run outside the timed region. The copy (1 GiB device copy, GB/s
= bytes read + written) and bf16 8192^3 matmul ceilings are measured first in the same process.

No dependency beyond PyTorch; without a CUDA device it prints "no CUDA device" and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass, field

MIN_ITERS = 20
COPY_CEILING = "copy_d2d"
GEMM_CEILING = "gemm_bf16"
GBPS = "GB/s"
TFLOPS = "TFLOP/s"

BACKENDS = {  # short name -> torch.nn.attention.SDPBackend member
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}

# ---------------------------------------------------------------------------------------------
# The cells (names and suites identical to bench/bench_attention.cpp).

W1_BATCHES = (1, 16, 64, 128)
W1_LENGTHS = (1024, 4096, 16384, 32768)
W2_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
W2_SHAPES = {"a": (16, 128), "b": (32, 64), "c": (8, 256), "d": (32, 96)}  # tag -> (H, D), as tessera-bench
W4_SETS = {
    "constant": [1024] * 16,
    "uniform": [906, 942, 553, 777, 1009, 926, 822, 1000, 878, 735, 654, 800, 655, 609, 768, 662],
    "skewed": [709, 357, 302, 376, 506, 1744, 541, 412, 298, 285, 502, 311, 815, 330, 449, 8439],
}
HQ, HKV, HEAD_DIM = 32, 8, 128

# Measured SDPA anchors of bench/README.md, to check that this script reproduces them.
W1_ANCHORS = {  # backend -> B -> GB/s per W1_LENGTHS
    "cudnn": {1: (49, 309, 1178, 1292), 16: (1279, 1993, 2765, 2824),
              64: (2262, 2824, 3021, 3061), 128: (2243, 2930, 3025, 3050)},
    "flash": {64: (1789, 2503, 2685, 2423)},
}
W2A_ANCHORS = {  # (backend, causal) -> TFLOP/s per W2_LENGTHS, D=128
    ("cudnn", True): (208, 337, 368, 577, 592, 598),
    ("cudnn", False): (324, 482, 604, 657, 617, 625),
    ("flash", True): (119, 215, 280, 326, 325, 338),
    ("flash", False): (220, 297, 330, 351, 351, 350),
}
W4_ANCHORS = {"cudnn": {"constant": 438, "uniform": 253, "skewed": 39},
              "flash": {"constant": 247, "uniform": 134, "skewed": 23}}


@dataclass
class Cell:
    name: str
    suites: list[str]
    kind: str  # "w1", "w2", "w4"
    cfg: dict = field(default_factory=dict)


def all_cells() -> list[Cell]:
    cells = []
    for b in W1_BATCHES:
        for li, length in enumerate(W1_LENGTHS):
            quick = b in (16, 64) and length in (4096, 16384)
            cells.append(Cell(f"w1_decode_b{b}_l{length}", ["decode"] + (["quick"] if quick else []),
                              "w1", {"B": b, "L": length, "li": li}))
    for tag, (heads, dim) in W2_SHAPES.items():
        for causal in (True, False):
            for si, s in enumerate(W2_LENGTHS):
                quick = tag == "a" and s in (4096, 16384)
                name = f"w2{tag}_{'causal' if causal else 'noncausal'}_s{s}"
                cells.append(Cell(name, ["prefill"] + (["quick"] if quick else []), "w2",
                                  {"tag": tag, "H": heads, "D": dim, "S": s, "si": si, "causal": causal}))
    for set_name, lens in W4_SETS.items():
        quick = set_name == "constant"
        cells.append(Cell(f"w4_ragged_{set_name}", ["prefill"] + (["quick"] if quick else []), "w4",
                          {"set": set_name, "lens": lens}))
    return cells


def visible_pairs(qo: int, kv: int, causal: bool) -> float:
    """Query/key pairs a request sees; query i sits at position kv - qo + i."""
    return qo * (kv - qo) + qo * (qo + 1) / 2 if causal else float(qo) * kv


# ---------------------------------------------------------------------------------------------
# Output.

@dataclass
class Result:
    workload: str
    suite: str
    impl: str
    params: dict
    samples_us: list[float]
    metric: str
    value: float
    ceiling_name: str
    ceiling_value: float


def clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    return x


ROW = "{:<22} {:<20} {:<46} {:>11} {:>10} {:<7} {:>8}  {}"


class Sink:
    def __init__(self, info: dict, json_path: str | None):
        self.info = info
        self.file = open(json_path, "a") if json_path not in (None, "", "-") else None
        self.to_stdout = json_path == "-"
        self.lines: list[str] = []
        print(ROW.format("workload", "impl", "params", "median_us", "value", "unit", "fraction", "ceiling"))

    def add(self, r: Result) -> None:
        median = statistics.median(r.samples_us)
        fraction = r.value / r.ceiling_value if r.ceiling_value else float("nan")
        params_text = " ".join(f"{k}={v}" for k, v in r.params.items())
        print(ROW.format(r.workload, r.impl, params_text, f"{median:.2f}", f"{r.value:.1f}", r.metric,
                         f"{fraction:.3f}", r.ceiling_name), flush=True)
        obj = {"workload": r.workload, "suite": r.suite, "impl": r.impl, "params": r.params,
               "median_us": median, "min_us": min(r.samples_us), "max_us": max(r.samples_us),
               "iters": len(r.samples_us), "metric": r.metric, "value": r.value,
               "ceiling_name": r.ceiling_name, "ceiling_value": r.ceiling_value,
               "fraction_of_ceiling": fraction, **self.info}
        line = json.dumps(clean(obj), allow_nan=False)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if self.to_stdout:
            self.lines.append(line)

    def finish(self) -> None:
        for line in self.lines:
            print(line)
        if self.file:
            self.file.close()


def git_commit() -> str:
    if os.environ.get("TESSERA_GIT_COMMIT"):
        return os.environ["TESSERA_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


# ---------------------------------------------------------------------------------------------
# Measurement.

class Bench:
    def __init__(self, torch, iters: int, warmup: int, sink: Sink):
        self.torch = torch
        self.iters = iters
        self.warmup = warmup
        self.sink = sink
        self.dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(self.dev)
        l2 = getattr(props, "L2_cache_size", 0) or 50 << 20
        self.flush_buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=self.dev)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(20261122)
        self.ceilings: dict[str, float] = {}

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, device=self.dev, dtype=self.torch.bfloat16)

    def measure(self, fn) -> list[float]:
        torch = self.torch
        for _ in range(self.warmup):
            self.flush_buf.zero_()
            fn()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.iters)]
        for start, stop in events:
            self.flush_buf.zero_()  # outside the event pair
            start.record()
            fn()
            stop.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(stop) * 1e3 for start, stop in events]

    def report(self, workload, suite, impl, params, samples, metric, amount) -> None:
        median_s = statistics.median(samples) * 1e-6
        if metric == GBPS:
            value, ceiling = amount / median_s / 1e9, COPY_CEILING
        else:
            value, ceiling = amount / median_s / 1e12, GEMM_CEILING
        self.sink.add(Result(workload, suite, impl, params, samples, metric, value, ceiling,
                             self.ceilings.get(ceiling, float("nan"))))

    def run_ceilings(self) -> None:
        torch = self.torch
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device=self.dev).random_(0, 256, generator=self.gen)
        dst = torch.empty_like(src)
        samples = self.measure(lambda: dst.copy_(src))
        self.ceilings[COPY_CEILING] = 2.0 * n / (statistics.median(samples) * 1e-6) / 1e9
        self.report(COPY_CEILING, "ceilings", "torch-copy", {"bytes": n}, samples, GBPS, 2.0 * n)
        del src, dst
        m = 8192
        a, b = self.randn(m, m), self.randn(m, m)
        c = torch.empty_like(a)
        samples = self.measure(lambda: torch.matmul(a, b, out=c))
        flops = 2.0 * m * m * m
        self.ceilings[GEMM_CEILING] = flops / (statistics.median(samples) * 1e-6) / 1e12
        self.report(GEMM_CEILING, "ceilings", "torch-matmul",
                    {"M": m, "N": m, "K": m, "dtype": "bf16", "accum": "f32"}, samples, TFLOPS, flops)
        del a, b, c
        torch.cuda.empty_cache()

    def fits(self, name: str, nbytes: float) -> bool:
        free, total = self.torch.cuda.mem_get_info()
        if nbytes + (512 << 20) <= free:
            return True
        print(f"compare_torch: {name} skipped: needs {nbytes / 2**30:.1f} GiB, "
              f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB", file=sys.stderr)
        return False

    def try_backend(self, fn) -> str | None:
        """Runs fn once; None when it works, else why not (the error and the backend's warnings)."""
        torch = self.torch
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
                torch.cuda.synchronize()
            return None
        except Exception as e:  # noqa: BLE001 - any refusal means "skip this backend"
            reasons = [str(e).splitlines()[0] if str(e) else type(e).__name__]
            reasons += [str(w.message).splitlines()[0] for w in caught or []]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            return "; ".join(reasons)

    def sdpa_runs(self, cell: Cell, backends, q, k, v, causal: bool, params: dict, metric: str,
                  amount: float, anchor_of) -> None:
        """Times every backend on (q, k, v); GQA via enable_gqa, else repeat_interleave."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa = torch.nn.functional.scaled_dot_product_attention
        group = q.shape[1] // k.shape[1]
        for backend in backends:
            member = getattr(SDPBackend, BACKENDS[backend])
            with sdpa_kernel([member]), torch.inference_mode():
                fn = (lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True)) if group > 1 else \
                     (lambda: sdpa(q, k, v, is_causal=causal))
                gqa = "enable_gqa" if group > 1 else "none"
                why = self.try_backend(fn)
                if why and group > 1 and self.fits(cell.name + " (repeat_interleave)", 2 * k.numel() * group * 2):
                    k_rep = k.repeat_interleave(group, dim=1)
                    v_rep = v.repeat_interleave(group, dim=1)
                    fn = lambda: sdpa(q, k_rep, v_rep, is_causal=causal)  # noqa: E731
                    gqa = f"repeat_interleave (reads {group}x the counted KV bytes)"
                    why_rep = self.try_backend(fn)
                    if why_rep is None:
                        print(f"compare_torch: {cell.name} torch-sdpa-{backend}: enable_gqa refused ({why}); "
                              "timed with repeat_interleave'd KV heads instead", file=sys.stderr)
                    why = why_rep and f"enable_gqa: {why} | repeat_interleave: {why_rep}"
                if why:
                    print(f"compare_torch: {cell.name} torch-sdpa-{backend} skipped: {why}", file=sys.stderr)
                    k_rep = v_rep = None
                    continue
                samples = self.measure(fn)
                k_rep = v_rep = None
            p = dict(params)
            if group > 1:
                p["gqa"] = gqa
            anchor = anchor_of(backend)
            if anchor:
                p["anchor_benchmarks_md"] = anchor
            self.report(cell.name, cell.suites[0], f"torch-sdpa-{backend}", p, samples, metric, amount)

    # The workloads.
    def run_w1(self, cell: Cell, backends) -> None:
        b, length, li = cell.cfg["B"], cell.cfg["L"], cell.cfg["li"]
        kv_bytes = 2.0 * b * length * HKV * HEAD_DIM * 2
        if not self.fits(cell.name, kv_bytes):
            return
        q = self.randn(b, HQ, 1, HEAD_DIM)
        k = self.randn(b, HKV, length, HEAD_DIM)
        v = self.randn(b, HKV, length, HEAD_DIM)
        params = {"B": b, "L": length, "Hq": HQ, "Hkv": HKV, "D": HEAD_DIM, "kv": "contiguous BHSD",
                  "dtype": "bf16", "bytes": "K+V read (Hkv heads)"}
        self.sdpa_runs(cell, backends, q, k, v, False, params, GBPS, kv_bytes,
                       lambda be: W1_ANCHORS.get(be, {}).get(b, (None,) * 4)[li])

    def run_w2(self, cell: Cell, backends) -> None:
        c = cell.cfg
        batch, heads, dim, s, causal = 16, c["H"], c["D"], c["S"], c["causal"]
        if not self.fits(cell.name, 4.0 * batch * heads * s * dim * 2):
            return
        q, k, v = (self.randn(batch, heads, s, dim) for _ in range(3))
        flops = batch * 4.0 * dim * heads * visible_pairs(s, s, causal)
        params = {"B": batch, "S": s, "H": heads, "D": dim, "mask": "causal" if causal else "none",
                  "kv": "contiguous BHSD", "dtype": "bf16", "flops": "4*D*visible_pairs*H"}
        anchors = W2A_ANCHORS if c["tag"] == "a" else {}
        self.sdpa_runs(cell, backends, q, k, v, causal, params, TFLOPS, flops,
                       lambda be: anchors.get((be, causal), (None,) * 6)[c["si"]])

    def run_w4(self, cell: Cell, backends) -> None:
        lens = cell.cfg["lens"]
        batch, max_len = len(lens), max(lens)
        if not self.fits(cell.name, 2.0 * batch * max_len * HEAD_DIM * 2 * (HQ + HKV)):
            return
        q = self.randn(batch, HQ, max_len, HEAD_DIM)
        k = self.randn(batch, HKV, max_len, HEAD_DIM)
        v = self.randn(batch, HKV, max_len, HEAD_DIM)
        flops = sum(4.0 * HEAD_DIM * HQ * visible_pairs(n, n, True) for n in lens)
        params = {"B": batch, "lengths": cell.cfg["set"], "total": sum(lens), "padded_to": max_len,
                  "Hq": HQ, "Hkv": HKV, "D": HEAD_DIM, "mask": "causal", "kv": "padded batch",
                  "dtype": "bf16", "flops": "4*D*real_visible_pairs*Hq"}
        self.sdpa_runs(cell, backends, q, k, v, True, params, TFLOPS, flops,
                       lambda be: W4_ANCHORS.get(be, {}).get(cell.cfg["set"]))


# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch SDPA backends on the W1/W2/W4 cells of bench/README.md (JSON lines like tessera-bench).")
    p.add_argument("--suite", action="append", default=None,
                   help="suite(s): decode, prefill, quick, all; repeatable or a comma list (default: quick)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="append one JSON line per result to PATH ('-': print them after the table)")
    p.add_argument("--iters", type=int, default=30, help=f"timed runs per cell, >= {MIN_ITERS} (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up runs (default 5)")
    p.add_argument("--filter", default="", help="only cells whose name contains TEXT (ceilings still run)")
    p.add_argument("--backends", default="flash,cudnn,efficient",
                   help="comma list of SDPA backends to force: flash, cudnn, efficient (default: all three)")
    p.add_argument("--list", action="store_true", help="list the cells and exit (no GPU needed)")
    args = p.parse_args(argv)
    if args.iters < MIN_ITERS:
        p.error(f"--iters must be at least {MIN_ITERS} (docs/design.md §9)")
    args.suites = [s for item in (args.suite or ["quick"]) for s in item.split(",") if s]
    unknown = set(args.suites) - {"decode", "prefill", "quick", "all"}
    if unknown:
        p.error(f"unknown suite(s): {', '.join(sorted(unknown))} (decode, prefill, quick, all)")
    args.backends = [b for b in args.backends.split(",") if b]
    bad = set(args.backends) - set(BACKENDS)
    if bad:
        p.error(f"unknown backend(s): {', '.join(sorted(bad))}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cells = [c for c in all_cells()
             if ("all" in args.suites or set(c.suites) & set(args.suites)) and args.filter in c.name]
    if args.list:
        for c in cells:
            print(f"{c.name:<24} {','.join(c.suites)}")
        return 0
    try:
        import torch
    except ImportError:
        print("compare_torch: PyTorch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("compare_torch: no CUDA device; nothing to measure")
        return 0

    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sm_count": props.multi_processor_count,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": git_commit()}
    print(f"compare_torch: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, {props.name} ({props.multi_processor_count} SMs)")
    sink = Sink(info, args.json)
    bench = Bench(torch, args.iters, args.warmup, sink)
    runners = {"w1": bench.run_w1, "w2": bench.run_w2, "w4": bench.run_w4}
    try:
        with torch.inference_mode():
            bench.run_ceilings()
            for cell in cells:
                try:
                    runners[cell.kind](cell, args.backends)
                except torch.cuda.OutOfMemoryError as e:
                    print(f"compare_torch: {cell.name} skipped: out of memory ({str(e).splitlines()[0]})",
                          file=sys.stderr)
                torch.cuda.empty_cache()
    finally:
        sink.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
