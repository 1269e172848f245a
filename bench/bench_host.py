#!/usr/bin/env python3
"""W12: the host cost of one call from Python (bench/README.md, "W12").

A serving step calls the decode wrapper's plan() once and run() once per layer; without CUDA
Graphs the host time of those calls is the step time at small batches. This script measures it
from Python, where the cost is (argument checks, tensor exports, allocation, the launch):

  cells  W1's decode shapes: Hq 32, Hkv 8, D 128, page size 16, bf16, NHD, one query per request,
         every request of KV length L (default 4096), the page table a random permutation of the
         pages; B in --batches (default 1 and 64).
  impls  tessera             BatchDecodeWithPagedKVCacheWrapper (plan(), run(), run(out=...))
         tessera-cuda-graph  CUDAGraphBatchDecodeWithPagedKVCacheWrapper, called eagerly (its
                             plan() also fills the preallocated page-table buffers), and the host
                             cost of replaying a captured run() (workload w12_graph_replay_*)
         torch-sdpa          anchor: torch.nn.functional.scaled_dot_product_attention on the same
                             request shapes (q [B, 32, 1, 128], contiguous K/V [B, 8, L, 128],
                             enable_gqa=True), in the same process
         torch               anchor: an in-place add on a [B, 32, 128] bf16 tensor (w12_inplace_add)
  metric host time of one call in microseconds: time.perf_counter_ns() around the call, the GPU
         queue drained (torch.cuda.synchronize()) before each sample, outside the timed region;
         median of --iters (default 300) samples after --warmup calls. plan() is given its page
         table as FlashInfer's engines keep it: indptr and last_page_len on the host (int32 CPU
         tensors), indices on the GPU (--index-device cuda puts all three on the GPU: plan() then
         pays for their copies to the host, as FlashInfer's does).

Targets (issue 26): run() <= 15 us and plan() <= 30 us, graph-mode wrapper included.

Output: a table, and with --json PATH (or - for stdout) one JSON line per result in the format of
tessera-bench --json (bench/README.md, "Output"): workload, suite "w12", impl, params, median_us,
min_us, max_us, p90_us, iters, metric "us", value (= median_us), no ceiling, gpu, sm_count, date,
commit. Host times depend on the CPU: params name it (host_cpu) and the torch version.

Before timing, the wrapper's output is checked against SDPA over the same K/V (the pages are the
request's contiguous K/V scattered into the cache), so a misconfigured cell fails loudly.

Needs a CUDA GPU, PyTorch and tessera importable (PYTHONPATH=<build>/python); without a usable GPU
it says why on stderr and exits 1: there is no host cost of a GPU call to measure without one.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HQ, HKV, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
RUN_TARGET_US, PLAN_TARGET_US = 15.0, 30.0
SUITE = "w12"


# ---------------------------------------------------------------------------------------------
# Timing.

def host_samples_us(fn, iters: int, warmup: int, drain) -> list[float]:
    """Host time of fn() in microseconds, `iters` samples after `warmup` calls; drain() (the GPU
    queue) runs before every call, outside the timed region."""
    perf = time.perf_counter_ns
    for _ in range(warmup):
        drain()
        fn()
    drain()
    gc.collect()
    samples = []
    for _ in range(iters):
        drain()
        t0 = perf()
        fn()
        t1 = perf()
        samples.append((t1 - t0) / 1e3)
    drain()
    return samples


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


# ---------------------------------------------------------------------------------------------
# Output.

ROW = "{:<28} {:<28} {:>10} {:>10} {:>10} {:>10}  {}"


def host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


class Sink:
    def __init__(self, info: dict, json_path: str | None, samples: bool):
        self.info = info
        self.file = open(json_path, "a") if json_path not in (None, "", "-") else None
        self.to_stdout = json_path == "-"
        self.samples = samples
        self.lines: list[str] = []
        self.medians: dict[tuple[str, str], float] = {}
        print(ROW.format("workload", "impl", "median_us", "p90_us", "min_us", "target", "params"))

    def add(self, workload: str, impl: str, params: dict, samples_us: list[float], target_us=None) -> None:
        median = statistics.median(samples_us)
        p90 = percentile(samples_us, 0.9)
        self.medians[(workload, impl)] = median
        shown = {k: v for k, v in params.items() if k in ("B", "L", "op")}
        print(ROW.format(workload, impl, f"{median:.2f}", f"{p90:.2f}", f"{min(samples_us):.2f}",
                         "" if target_us is None else f"<= {target_us:g}",
                         " ".join(f"{k}={v}" for k, v in shown.items())), flush=True)
        full = dict(params)
        if target_us is not None:
            full["target_us"] = target_us
        obj = {"workload": workload, "suite": SUITE, "impl": impl, "params": full,
               "median_us": median, "min_us": min(samples_us), "max_us": max(samples_us), "p90_us": p90,
               "iters": len(samples_us), "metric": "us", "value": median,
               "ceiling_name": None, "ceiling_value": None, "fraction_of_ceiling": None, **self.info}
        if self.samples:
            obj["samples_us"] = samples_us
        line = json.dumps(obj, allow_nan=False)
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


# ---------------------------------------------------------------------------------------------
# The cells.

class DecodeCell:
    """W1's decode inputs for one B and L: a paged cache holding each request's contiguous K/V in
    randomly permuted pages, the page table (host indptr / last_page_len, device indices), the
    queries, and SDPA's contiguous view of the same K/V."""

    def __init__(self, torch, dev, batch: int, kv_len: int, index_device: str, seed: int = 20261126):
        self.torch, self.dev, self.batch, self.kv_len = torch, dev, batch, kv_len
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed + batch)
        pages_per_req = (kv_len + PAGE_SIZE - 1) // PAGE_SIZE
        num_pages = batch * pages_per_req
        self.num_pages = num_pages
        bf16 = torch.bfloat16
        # SDPA's contiguous K/V [B, Hkv, L, D] and the queries [B, Hq, 1, D].
        self.k_sdpa = torch.randn(batch, HKV, kv_len, HEAD_DIM, generator=gen, device=dev, dtype=bf16)
        self.v_sdpa = torch.randn(batch, HKV, kv_len, HEAD_DIM, generator=gen, device=dev, dtype=bf16)
        self.q_sdpa = torch.randn(batch, HQ, 1, HEAD_DIM, generator=gen, device=dev, dtype=bf16)
        self.q = self.q_sdpa.reshape(batch, HQ, HEAD_DIM).contiguous()  # [B, Hq, D] for the wrappers
        # Page p of request b holds tokens [16 p, 16 p + 16); the page ids are a permutation.
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed + 7 * batch)).to(torch.int32)
        self.k_cache = torch.zeros(num_pages, PAGE_SIZE, HKV, HEAD_DIM, device=dev, dtype=bf16)
        self.v_cache = torch.zeros_like(self.k_cache)
        padded = pages_per_req * PAGE_SIZE
        for src, cache in ((self.k_sdpa, self.k_cache), (self.v_sdpa, self.v_cache)):
            rows = torch.zeros(batch, padded, HKV, HEAD_DIM, device=dev, dtype=bf16)
            rows[:, :kv_len] = src.transpose(1, 2)
            cache[perm.to(dev).long()] = rows.reshape(num_pages, PAGE_SIZE, HKV, HEAD_DIM)
        self.indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages_per_req)
        self.last_page_len = torch.full((batch,), kv_len - (pages_per_req - 1) * PAGE_SIZE, dtype=torch.int32)
        self.indices = perm.to(dev)
        if index_device == "cuda":
            self.indptr = self.indptr.to(dev)
            self.last_page_len = self.last_page_len.to(dev)
        self.out = torch.empty_like(self.q)

    def plan_args(self):
        return (self.indptr, self.indices, self.last_page_len, HQ, HKV, HEAD_DIM, PAGE_SIZE)

    def sdpa(self, F):
        return F.scaled_dot_product_attention(self.q_sdpa, self.k_sdpa, self.v_sdpa, enable_gqa=True)


def check_against_sdpa(torch, F, cell: DecodeCell, out, what: str) -> None:
    """out against SDPA over the same K/V, relative to SDPA's largest output (attention over 4096
    random keys averages the values down to ~0.02, so an absolute bound would pass anything)."""
    ref = cell.sdpa(F).reshape(cell.batch, HQ, HEAD_DIM).float()
    rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    if not rel <= 2e-2:
        raise SystemExit(f"bench_host: {what} B={cell.batch} L={cell.kv_len}: max |out - sdpa| / max |sdpa| = "
                         f"{rel:.3g} (> 2e-2): the cell is misconfigured or the kernel is wrong; nothing timed")
    print(f"  check {what} B={cell.batch}: max |out - sdpa| / max |sdpa| = {rel:.2e}")


def run_cells(torch, tessera, args, sink: Sink, base_params: dict) -> None:
    F = torch.nn.functional
    dev = torch.device("cuda", torch.cuda.current_device())
    sync = torch.cuda.synchronize
    iters, warmup = args.iters, args.warmup
    ws_bytes = args.workspace_mib << 20

    # Anchor: an in-place add (the cheapest launch from Python), in the same process.
    x = torch.zeros(64, HQ, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    sink.add("w12_inplace_add", "torch", {**base_params, "op": "add_", "shape": [64, HQ, HEAD_DIM]},
             host_samples_us(lambda: x.add_(1.0), iters, warmup, sync))

    for batch in args.batches:
        cell = DecodeCell(torch, dev, batch, args.kv_len, args.index_device)
        params = {**base_params, "B": batch, "L": args.kv_len, "Hq": HQ, "Hkv": HKV, "D": HEAD_DIM,
                  "page_size": PAGE_SIZE, "dtype": "bf16", "layout": "NHD", "index_arrays": args.index_device}
        tag = f"b{batch}_l{args.kv_len}"

        # torch SDPA on the same request shapes.
        sink.add(f"w12_run_{tag}", "torch-sdpa", {**params, "op": "sdpa", "enable_gqa": True},
                 host_samples_us(lambda: cell.sdpa(F), iters, warmup, sync))

        # The plain wrapper.
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(ws_bytes, dtype=torch.uint8, device=dev), "NHD")
        plan_args = cell.plan_args()

        def plan_plain():
            w.plan(*plan_args, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

        plan_plain()
        kv = (cell.k_cache, cell.v_cache)
        check_against_sdpa(torch, F, cell, w.run(cell.q, kv), "tessera run()")
        sink.add(f"w12_plan_{tag}", "tessera", {**params, "op": "plan"},
                 host_samples_us(plan_plain, iters, warmup, sync), PLAN_TARGET_US)
        sink.add(f"w12_run_{tag}", "tessera", {**params, "op": "run"},
                 host_samples_us(lambda: w.run(cell.q, kv), iters, warmup, sync), RUN_TARGET_US)
        sink.add(f"w12_run_out_{tag}", "tessera", {**params, "op": "run(out=)"},
                 host_samples_us(lambda: w.run(cell.q, kv, out=cell.out), iters, warmup, sync), RUN_TARGET_US)
        w = None  # its workspace freed before the next wrapper's

        # The CUDA-graph wrapper, called eagerly, then a captured run() replayed.
        bufs = (torch.empty(batch + 1, dtype=torch.int32, device=dev),
                torch.empty(cell.num_pages, dtype=torch.int32, device=dev),
                torch.empty(batch, dtype=torch.int32, device=dev))
        gw = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            torch.empty(ws_bytes, dtype=torch.uint8, device=dev), *bufs, kv_layout="NHD")

        def plan_graph():
            gw.plan(*plan_args, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

        plan_graph()
        check_against_sdpa(torch, F, cell, gw.run(cell.q, kv), "tessera-cuda-graph run()")
        sink.add(f"w12_plan_{tag}", "tessera-cuda-graph", {**params, "op": "plan"},
                 host_samples_us(plan_graph, iters, warmup, sync), PLAN_TARGET_US)
        sink.add(f"w12_run_{tag}", "tessera-cuda-graph", {**params, "op": "run"},
                 host_samples_us(lambda: gw.run(cell.q, kv), iters, warmup, sync), RUN_TARGET_US)
        sink.add(f"w12_run_out_{tag}", "tessera-cuda-graph", {**params, "op": "run(out=)"},
                 host_samples_us(lambda: gw.run(cell.q, kv, out=cell.out), iters, warmup, sync), RUN_TARGET_US)
        if args.replay:
            try:
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    gw.run(cell.q, kv, out=cell.out)  # warm-up on a side stream, as torch.cuda.graph asks
                torch.cuda.current_stream().wait_stream(side)
                sync()
                with torch.cuda.graph(graph):
                    gw.run(cell.q, kv, out=cell.out)
                cell.out.zero_()  # the replay must write it
                sync()
                graph.replay()
                check_against_sdpa(torch, F, cell, cell.out, "graph replay")
                sink.add(f"w12_graph_replay_{tag}", "tessera-cuda-graph", {**params, "op": "CUDAGraph.replay"},
                         host_samples_us(graph.replay, iters, warmup, sync))
                graph = None
            except Exception as e:  # reported, the other cells still run
                print(f"bench_host: graph replay B={batch} failed: {type(e).__name__}: {e}", file=sys.stderr)
        gw = cell = None
        torch.cuda.empty_cache()


def summary(sink: Sink, args) -> None:
    print("\nW12 summary (median us; targets run <= 15, plan <= 30):")
    print(f"{'B':>4} {'op':<10} {'tessera':>10} {'graph':>10} {'torch-sdpa':>11}")
    for batch in args.batches:
        tag = f"b{batch}_l{args.kv_len}"
        for op in ("plan", "run", "run_out"):
            row = [sink.medians.get((f"w12_{op}_{tag}", impl)) for impl in ("tessera", "tessera-cuda-graph",
                                                                             "torch-sdpa")]
            cells = [f"{v:10.2f}" if v is not None else f"{'-':>10}" for v in row]
            print(f"{batch:>4} {op:<10} {cells[0]} {cells[1]} {cells[2]:>11}")
    add = sink.medians.get(("w12_inplace_add", "torch"))
    if add is not None:
        print(f"in-place add (torch): {add:.2f} us")


def parse_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=parse_list, default=[1, 64], help="comma list of B (default 1,64)")
    p.add_argument("--kv-len", type=int, default=4096, help="KV length of every request (default 4096)")
    p.add_argument("--iters", type=int, default=300, help="timed calls per cell (default 300)")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls first (default 50)")
    p.add_argument("--index-device", choices=("cpu", "cuda"), default="cpu",
                   help="where plan()'s indptr / last_page_len live (default cpu, as engines keep them)")
    p.add_argument("--workspace-mib", type=int, default=128, help="float_workspace_buffer size (default 128)")
    p.add_argument("--no-replay", dest="replay", action="store_false", help="skip the CUDA-graph replay cell")
    p.add_argument("--json", default=None, metavar="PATH", help="append JSON lines to PATH (- for stdout)")
    p.add_argument("--samples", action="store_true", help="each JSON line also carries samples_us")
    args = p.parse_args(argv)
    if args.iters < 20:
        p.error("--iters must be at least 20")

    try:
        import torch
    except ImportError:
        print("bench_host: PyTorch is not importable (pip install torch); W12 times calls on torch tensors",
              file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench_host: no CUDA device (torch.cuda.is_available() is False); W12 measures the host time of "
              "GPU calls and needs a GPU: nothing measured", file=sys.stderr)
        return 1
    try:
        import tessera
    except ImportError as e:
        print(f"bench_host: cannot import tessera ({e}); set PYTHONPATH=<build>/python", file=sys.stderr)
        return 1
    reason = tessera._C.cuda_unavailable_reason()
    if reason:
        print(f"bench_host: tessera sees no usable GPU: {reason}", file=sys.stderr)
        return 1
    if not hasattr(tessera._C, "_run_arguments_probe"):
        print("bench_host: warning: this tessera._C predates 0e9f510 (torch tensors still go through "
              "Tensor.__dlpack__): rebuild the module to measure the current tree", file=sys.stderr)

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    info = {"gpu": props.name, "sm_count": props.multi_processor_count,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": git_commit()}
    base_params = {"host_cpu": host_cpu(), "torch": torch.__version__, "python": platform.python_version()}
    print(f"bench_host (W12): torch {torch.__version__}, tessera {tessera.__version__} from "
          f"{os.path.dirname(tessera.__file__)}, {props.name}, host CPU {base_params['host_cpu']}")
    sink = Sink(info, args.json, args.samples)
    run_cells(torch, tessera, args, sink, base_params)
    summary(sink, args)
    sink.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
