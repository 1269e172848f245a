#!/usr/bin/env python3
"""W12 on the CPU: the Python part of the decode and prefill wrappers' plan() / run(), without a GPU.

NOT a GPU host time (bench/bench_host.py measures that, on a GPU). This runs the wrappers' real
Python code on host tensors, with stand-ins for what needs a GPU:

- the C++ runtime classes (tessera._C.BatchDecodeWrapper, ...): plan() does nothing; run() calls
  tessera._C._run_arguments_probe with the run's arguments when the build has it (the binding's own
  per-call work: argument conversion, the DLPack import of every array, the views, the device guard,
  the GIL release; no launch), else nothing;
- the device checks (tessera._utils.check_cuda) pass host tensors;
- torch's CUDA stream and device queries return 0 (their cost on a GPU host is not in these figures).

- the CUDA-graph wrapper's page-table buffers are host tensors: its plan()'s copies into them go
  through tessera._C._copy_index_arrays when the build has it (the argument conversion and a host
  memcpy, where a GPU would take the pinned staging and the asynchronous copies), else torch's
  host copies.

So a figure here is the Python wrapper code + the binding's conversions on this CPU; the C++
planner, the kernel launches, CUDA's copy and allocation calls and torch's stream query are not in
it (graph-mode plan() least of all: its GPU copies cost more than the host memcpy standing in for
them). Use it to compare two trees (before / after a change) on the same machine.

  PYTHONPATH=build/python python3 bench/host_standin.py [--iters 2000] [--profile plan|run|graph-plan|graph-run|prefill-run|ragged-run]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time

HQ, HKV, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16


def install_stand_ins(torch, tessera):
    """Replaces the GPU-only pieces (see the module doc). Returns a restore function."""
    from tessera import _C
    from tessera import _utils as U

    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name, None), hasattr(obj, name)))
        setattr(obj, name, value)

    probe = getattr(_C, "_run_arguments_probe", None)

    class RuntimeStandIn:
        def __init__(self, workspace, bounds, options):
            pass

        @staticmethod
        def workspace_size(bounds, options, device):
            return 0

        def plan(self, *args, **kwargs):
            pass

        def run(self, *args, **kwargs):
            pass

        def plan_info(self):
            return {}

    class PagedStandIn(RuntimeStandIn):
        if probe is not None:
            def run(self, q, k, v, kv, layout, indices, o, lse, stream, kv_dtype=None):
                probe(q, k, v, kv, layout, indices, o, lse, stream, kv_dtype=kv_dtype)

        def fast_run(self, indices, host_ids, device, dtype, kv_dtype, hq, d, dv, q_rows, k_page, v_page, layout,
                     empty_like, contiguous_format):
            """The C++ PagedFastRun (one binding call: the tensors' import, the checks, the
            allocation, the launch) stood in for by one call of the probe after the allocation."""
            def call(q, cache, out=None):
                if out is None:
                    out = empty_like(q, memory_format=contiguous_format)
                k, v = cache if type(cache) is tuple else (cache, None)
                if probe is not None:
                    probe(q, k, v, None, layout, indices, out, None, 0)
                return out
            return call

    class RaggedStandIn(RuntimeStandIn):
        if probe is not None:
            def run(self, q, k, v, o, lse, stream, kv_dtype=None):
                probe(q, k, v, None, _C.Layout.NHD, None, o, lse, stream, kv_dtype=kv_dtype)

    patch(_C, "BatchDecodeWrapper", type("BatchDecodeWrapper", (PagedStandIn,), {}))
    patch(_C, "BatchPrefillPagedWrapper", type("BatchPrefillPagedWrapper", (PagedStandIn,), {}))
    patch(_C, "BatchPrefillRaggedWrapper", type("BatchPrefillRaggedWrapper", (RaggedStandIn,), {}))
    patch(U, "check_cuda", lambda name, t: None)

    class Stream:
        cuda_stream = 0

    patch(torch.cuda, "current_stream", lambda device=None: Stream())
    patch(torch.cuda, "current_device", lambda: 0)
    patch(torch.cuda, "_lazy_init", lambda: None)
    for name in ("_cuda_getCurrentRawStream",):
        if hasattr(torch._C, name):
            patch(torch._C, name, lambda device_index: 0)
    if hasattr(torch._C, "_cuda_getDevice"):
        patch(torch._C, "_cuda_getDevice", lambda: 0)

    def restore():
        for obj, name, value, had in reversed(saved):
            if had:
                setattr(obj, name, value)
            else:
                delattr(obj, name)

    return restore, probe is not None


def samples_us(fn, iters: int, warmup: int) -> list:
    perf = time.perf_counter_ns
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = perf()
        fn()
        out.append((perf() - t0) / 1e3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,64")
    p.add_argument("--kv-len", type=int, default=4096)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--profile", choices=("plan", "run", "graph-plan", "graph-run", "prefill-run", "ragged-run"),
                   help="print a cProfile of this call (B = the last of --batches) instead of timing")
    args = p.parse_args(argv)
    import torch
    import tessera

    restore, probed = install_stand_ins(torch, tessera)
    print(f"host_standin: CPU stand-in (NOT a GPU host time); binding probe: {'yes' if probed else 'no'}; "
          f"torch {torch.__version__}")
    bf16 = torch.bfloat16
    rows = []
    try:
        for batch in [int(x) for x in args.batches.split(",")]:
            ppr = (args.kv_len + PAGE_SIZE - 1) // PAGE_SIZE
            pages = batch * ppr
            indptr = torch.arange(batch + 1, dtype=torch.int32) * ppr
            last = torch.full((batch,), args.kv_len - (ppr - 1) * PAGE_SIZE, dtype=torch.int32)
            indices = torch.randperm(pages, generator=torch.Generator().manual_seed(1)).to(torch.int32)
            k_cache = torch.empty(pages, PAGE_SIZE, HKV, HEAD_DIM, dtype=bf16)
            v_cache = torch.empty_like(k_cache)
            kv = (k_cache, v_cache)
            q = torch.empty(batch, HQ, HEAD_DIM, dtype=bf16)
            out = torch.empty_like(q)
            plan_args = (indptr, indices, last, HQ, HKV, HEAD_DIM, PAGE_SIZE)
            w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), "NHD")
            gw = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                torch.empty(1 << 20, dtype=torch.uint8), torch.empty(batch + 1, dtype=torch.int32),
                torch.empty(pages, dtype=torch.int32), torch.empty(batch, dtype=torch.int32))
            # Prefill wrappers over the same shapes (one query row per request), for their run().
            pw = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), "NHD")
            qo = torch.arange(batch + 1, dtype=torch.int32)
            pw.plan(qo, indptr, indices, last, HQ, HKV, HEAD_DIM, PAGE_SIZE, q_data_type=bf16)
            rw = tessera.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8), "NHD")
            rw.plan(qo, qo * 64, HQ, HKV, HEAD_DIM, q_data_type=bf16)
            k_r = torch.empty(batch * 64, HKV, HEAD_DIM, dtype=bf16)
            v_r = torch.empty_like(k_r)

            calls = {
                "plan": lambda: w.plan(*plan_args, q_data_type=bf16, kv_data_type=bf16),
                "graph-plan": lambda: gw.plan(*plan_args, q_data_type=bf16, kv_data_type=bf16),
            }
            calls["plan"]()
            calls["graph-plan"]()
            calls.update({
                "run": lambda: w.run(q, kv),
                "run(out=)": lambda: w.run(q, kv, out=out),
                "graph-run": lambda: gw.run(q, kv),
                "prefill-run": lambda: pw.run(q, kv),
                "ragged-run": lambda: rw.run(q, k_r, v_r),
            })
            if args.profile:
                fn = calls[args.profile]
                for _ in range(args.warmup):
                    fn()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.iters):
                    fn()
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                continue
            for name, fn in calls.items():
                s = samples_us(fn, args.iters, args.warmup)
                rows.append((batch, name, statistics.median(s), min(s)))
    finally:
        restore()
    if rows:
        print(f"{'B':>4} {'call':<12} {'median_us':>10} {'min_us':>8}")
        for batch, name, med, mn in rows:
            print(f"{batch:>4} {name:<12} {med:>10.2f} {mn:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
