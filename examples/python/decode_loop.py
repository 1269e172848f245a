"""A prefill and decode loop over Tessera's FlashInfer-compatible wrappers, driven the way the
FlashInfer attention backends of SGLang and vLLM drive them.

The "model" has 4 layers of GQA attention (32 query heads, 8 KV heads, head dim 128, bfloat16);
each layer keeps its paged KV cache in one tensor ``[num_pages, 2, page_size, num_kv_heads,
head_dim]`` (page 16, NHD), all layers sharing one page table. Queries and the new tokens' keys
and values are random numbers standing in for the projections.

Per forward pass, as those backends do:

* the scheduler grows every request and gives it pages from a free list as it crosses page
  boundaries, then builds the batch's page table: ``kv_indptr`` and ``kv_last_page_len`` on the
  CPU (``plan()`` reads them there), ``kv_indices`` on the GPU;
* ``plan()`` once per pass: BatchPrefillWithPagedKVCacheWrapper (``causal=True``) for the prompts,
  BatchDecodeWithPagedKVCacheWrapper for each decode step;
* per layer: the pass's new K/V rows go into that layer's cache (``tessera.get_seq_lens``,
  ``tessera.get_batch_indices_positions``, ``tessera.append_paged_kv_cache``), then ``run()``
  attends with the plan.

(``examples/serving_loop.cpp`` shows the same loop in C++ with the decode runs in a CUDA Graph;
``tests/python/test_gpu.py`` captures these wrappers in ``torch.cuda.CUDAGraph``.)

At the end it checks, for every layer: the cache against the K/V rows the loop appended; every
decode step's output for every request, and three prefill rows per request, against a PyTorch
fp32 attention computed from those appended rows (not from the cache). Tolerances are those of the
GPU tests for bfloat16: relative error <= 1e-2, base-2 log-sum-exp within 8e-3.

Usage: ``python examples/python/decode_loop.py [--steps N]`` with the package importable
(``pip install .`` or ``PYTHONPATH=build/python``). Exit status 0 when every check passes. Without
a CUDA GPU, or without PyTorch, it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import List, Optional, Sequence

import tessera

try:
    import torch
except ImportError:  # main() says so in one line
    torch = None

LAYERS, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 4, 32, 8, 128, 16
PROMPTS = [1, 15, 16, 17, 130, 515, 1000, 3000]  # single tokens, page boundaries, longer contexts
REL_TOL, LSE_TOL = 1e-2, 8e-3


class PagePool:
    """The scheduler's page allocator: a free list in no particular order, as after a while of serving."""

    def __init__(self, num_pages: int, gen: "torch.Generator") -> None:
        self.free: List[int] = torch.randperm(num_pages, generator=gen).tolist()

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("the page pool is exhausted (size it for the longest run)")
        return self.free.pop()


class Request:
    """One sequence: its KV length and its pages, in order."""

    def __init__(self) -> None:
        self.kv_len = 0
        self.pages: List[int] = []

    def grow(self, tokens: int, pool: PagePool) -> None:
        self.kv_len += tokens
        while len(self.pages) * PAGE_SIZE < self.kv_len:
            self.pages.append(pool.take())


class PageTable:
    """The batch's page table: kv_indptr / kv_last_page_len on the CPU for plan(), copies of all
    three arrays on the GPU for the append kernel and run()."""

    def __init__(self, requests: Sequence[Request], device: "torch.device") -> None:
        indptr, indices, last = [0], [], []
        for r in requests:
            indices += r.pages
            indptr.append(len(indices))
            last.append(r.kv_len - (len(r.pages) - 1) * PAGE_SIZE if r.pages else 0)
        self.indptr = torch.tensor(indptr, dtype=torch.int32)
        self.last_page_len = torch.tensor(last, dtype=torch.int32)
        self.indices_gpu = torch.tensor(indices, dtype=torch.int32).to(device, non_blocking=True)
        self.indptr_gpu = self.indptr.to(device, non_blocking=True)
        self.last_page_len_gpu = self.last_page_len.to(device, non_blocking=True)

    def append(self, new_k: "torch.Tensor", new_v: "torch.Tensor", append_indptr: "torch.Tensor",
               cache: "torch.Tensor") -> None:
        """Writes the pass's new rows (request b's are rows append_indptr[b]:append_indptr[b+1]) to
        the ends of the requests' sequences in `cache`; the table already holds their new lengths."""
        seq_lens = tessera.get_seq_lens(self.indptr_gpu, self.last_page_len_gpu, PAGE_SIZE)
        batch_indices, positions = tessera.get_batch_indices_positions(append_indptr, seq_lens, new_k.shape[0])
        tessera.append_paged_kv_cache(new_k, new_v, batch_indices, positions, cache, self.indices_gpu,
                                      self.indptr_gpu, self.last_page_len_gpu, kv_layout="NHD")


def reference(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", positions: "torch.Tensor"):
    """fp32 attention of query rows q [n, Hq, D] at sequence positions `positions` [n] over keys
    and values k, v [L, Hkv, D] of one sequence: row i sees keys 0 .. positions[i]. Returns o
    [n, Hq, D] and the base-2 log-sum-exp [n, Hq]."""
    group = NUM_QO_HEADS // NUM_KV_HEADS
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("nhd,lhd->hnl", q.float(), kf) / math.sqrt(HEAD_DIM)
    hidden = torch.arange(k.shape[0], device=q.device)[None, :] > positions[:, None]
    logits = logits.masked_fill(hidden[None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    o = torch.einsum("hnl,lhd->nhd", torch.softmax(logits, dim=-1), vf)
    return o, (lse / math.log(2.0)).transpose(0, 1)


class Comparison:
    """Kernel outputs next to the reference's, compared at once."""

    def __init__(self) -> None:
        self.out: List["torch.Tensor"] = []
        self.ref: List["torch.Tensor"] = []
        self.lse_err = 0.0

    def add(self, out, lse, ref_out, ref_lse) -> None:
        self.out.append(out.float().flatten())
        self.ref.append(ref_out.flatten())
        err = (lse - ref_lse).abs().max().item()
        self.lse_err = max(self.lse_err, math.inf if math.isnan(err) else err)  # max() would drop a NaN

    def rel_err(self) -> float:
        out, ref = torch.cat(self.out), torch.cat(self.ref)
        return ((out - ref).norm() / ref.norm()).item()  # NaN (an unwritten output) fails below

    def ok(self) -> bool:
        return self.rel_err() <= REL_TOL and self.lse_err <= LSE_TOL

    def summary(self) -> str:
        return f"rel err {self.rel_err():.1e}, base-2 lse err {self.lse_err:.1e} -> {'OK' if self.ok() else 'WRONG'}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="decode steps (default 16)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: expected >= 1")

    if torch is None:
        print("decode_loop.py: PyTorch is not installed (pip install torch); the example needs it and ran nothing")
        return 0
    if not torch.cuda.is_available():
        print("decode_loop.py: no CUDA GPU (torch.cuda.is_available() is False); the example needs one and ran nothing")
        return 0

    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(2026)
    batch = len(PROMPTS)
    print(f"decode_loop.py: tessera {tessera.__version__} on {torch.cuda.get_device_name(dev)}")
    print(f"model: {LAYERS} layers, Hq {NUM_QO_HEADS}, Hkv {NUM_KV_HEADS}, head dim {HEAD_DIM}, bfloat16; "
          f"{batch} requests, prompts {PROMPTS}; {args.steps} decode steps; page {PAGE_SIZE}, NHD")

    num_pages = sum(math.ceil((p + args.steps) / PAGE_SIZE) for p in PROMPTS)
    pool = PagePool(num_pages, torch.Generator().manual_seed(7))
    caches = [torch.zeros(num_pages, 2, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=dev)
              for _ in range(LAYERS)]
    requests = [Request() for _ in PROMPTS]

    def projections(rows: int):
        """Stand-ins for one layer's q, k, v projections of `rows` new tokens."""
        return [torch.randn(rows, h, HEAD_DIM, generator=gen, device=dev).to(dtype)
                for h in (NUM_QO_HEADS, NUM_KV_HEADS, NUM_KV_HEADS)]

    # One workspace for both wrappers, as SGLang shares its global one: their plans and runs are
    # ordered on one stream, so the decode plan never overwrites what a prefill run still reads.
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    prefill = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    decode = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    # What the checks need: per layer, the K/V rows handed to the append and every pass's q/o/lse.
    appended = [[] for _ in range(LAYERS)]  # per layer, per pass: (k, v, append_indptr on the CPU)
    outputs = [[] for _ in range(LAYERS)]   # per layer, per pass: (q, o, lse)

    # Prefill: one pass over every prompt.
    qo_indptr = torch.tensor([0] + list(torch.tensor(PROMPTS).cumsum(0).tolist()), dtype=torch.int32)
    for r, n in zip(requests, PROMPTS):
        r.grow(n, pool)
    table = PageTable(requests, dev)
    prefill.plan(qo_indptr, table.indptr, table.indices_gpu, table.last_page_len, NUM_QO_HEADS, NUM_KV_HEADS,
                 HEAD_DIM, PAGE_SIZE, causal=True, q_data_type=dtype)
    qo_indptr_gpu = qo_indptr.to(dev)
    for layer in range(LAYERS):
        q, k, v = projections(int(qo_indptr[-1]))
        table.append(k, v, qo_indptr_gpu, caches[layer])
        o, lse = prefill.run(q, caches[layer], return_lse=True)
        appended[layer].append((k, v, qo_indptr))
        outputs[layer].append((q, o, lse))

    # Decode: one token per request and step.
    one_each = torch.arange(batch + 1, dtype=torch.int32)
    one_each_gpu = one_each.to(dev)
    step_ms = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for r in requests:
            r.grow(1, pool)
        table = PageTable(requests, dev)
        decode.plan(table.indptr, table.indices_gpu, table.last_page_len, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM,
                    PAGE_SIZE, q_data_type=dtype)
        for layer in range(LAYERS):
            q, k, v = projections(batch)
            table.append(k, v, one_each_gpu, caches[layer])
            o, lse = decode.run(q, caches[layer], return_lse=True)
            appended[layer].append((k, v, one_each))
            outputs[layer].append((q, o, lse))
        torch.cuda.synchronize()  # the engine samples the step's tokens here
        step_ms.append((time.perf_counter() - start) * 1e3)
    print(f"prefill: {int(qo_indptr[-1])} prompt tokens, one plan, {LAYERS} run()s; decode: one plan and {LAYERS} "
          f"run()s per step, median step {statistics.median(step_ms):.2f} ms (wall clock, random projections "
          "included)")

    # Checks, layer by layer.
    all_ok = True
    for layer in range(LAYERS):
        # Request b's rows in the order they were appended: its prompt, then one per step.
        seq_k = [torch.cat([k[indptr[b]:indptr[b + 1]] for k, _, indptr in appended[layer]]) for b in range(batch)]
        seq_v = [torch.cat([v[indptr[b]:indptr[b + 1]] for _, v, indptr in appended[layer]]) for b in range(batch)]
        cache_ok = True
        for b, r in enumerate(requests):
            pages = torch.tensor(r.pages, device=dev)
            # [pages, K|V, page_size, Hkv, D] -> [K|V, tokens, Hkv, D]
            slots = caches[layer][pages].transpose(0, 1).reshape(2, -1, NUM_KV_HEADS, HEAD_DIM)[:, : r.kv_len]
            cache_ok &= torch.equal(slots[0], seq_k[b]) and torch.equal(slots[1], seq_v[b])
        prefill_cmp, decode_cmp = Comparison(), Comparison()
        q, o, lse = outputs[layer][0]
        for b, n in enumerate(PROMPTS):
            rows = sorted({0, n // 2, n - 1})
            at = [int(qo_indptr[b]) + i for i in rows]
            ref_o, ref_lse = reference(q[at], seq_k[b], seq_v[b], torch.tensor(rows, device=dev))
            prefill_cmp.add(o[at], lse[at], ref_o, ref_lse)
        for step in range(args.steps):
            q, o, lse = outputs[layer][1 + step]
            for b, n in enumerate(PROMPTS):
                position = torch.tensor([n + step], device=dev)  # the step's token sees itself and all before
                ref_o, ref_lse = reference(q[b : b + 1], seq_k[b], seq_v[b], position)
                decode_cmp.add(o[b : b + 1], lse[b : b + 1], ref_o, ref_lse)
        layer_ok = cache_ok and prefill_cmp.ok() and decode_cmp.ok()
        all_ok &= layer_ok
        print(f"layer {layer}: cache vs appended rows {'EXACT' if cache_ok else 'WRONG'}; prefill (3 rows per "
              f"request) {prefill_cmp.summary()}; decode (every step and request) {decode_cmp.summary()}")
    print("decode_loop.py: " + ("all results match the reference" if all_ok else "MISMATCH against the reference"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
