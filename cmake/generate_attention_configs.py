#!/usr/bin/env python3
"""Generates the attention kernels' host dispatch and instantiation files from the table
src/config/attention_configs.txt (its header says what each column means).

Usage: generate_attention_configs.py TABLE OUT_DIR
Writes, under OUT_DIR (files whose content is unchanged are not rewritten, so nothing rebuilds):
  src/config/attention_configs.h      traits of every configuration, the head-dim and query-tile
                                      switches, the KV tile of each (head dim, query tile)
  include/tessera/head_dims.h         kSupportedHeadDims (public)
  src/config/<family>_d<D>_<dtype>.cu one instantiation file per (kernel family, head dim, dtype)
  src/config/<family>_d<D>_<dtype>_<kv>.cu  ... and per fp8 KV storage
and prints the .cu paths, one per line, for CMake. A malformed table is an error naming the line.
"""

import os
import sys
from collections import OrderedDict

DTYPES = OrderedDict([("f16", "__half"), ("bf16", "__nv_bfloat16")])
# KV storage of the prefill tiles: "same" (K/V in the operands' dtype) or an fp8 type that the
# tile dequantizes (KVStorage in src/config/config_types.h).
KV_STORAGES = OrderedDict([("same", ("kSame", None)), ("e4m3", ("kE4M3", "__nv_fp8_e4m3")),
                           ("e5m2", ("kE5M2", "__nv_fp8_e5m2"))])
FORMATS = OrderedDict([("ragged", "kRagged"), ("paged", "kPaged"), ("bsr", "kBlockSparse")])
# q_tile name -> query rows it implies (checked against the tile_q column)
# The query rows each QTile may have. k128Wgmma is the sm90a tile for long queries: 128 rows, or
# 192 (three compute warpgroups) where a head dim's registers allow it.
Q_TILES = OrderedDict([("k16", (16,)), ("k16Wide", (16,)), ("k64", (64,)), ("k128", (128,)),
                       ("k128Wgmma", (128, 192))])
ARCH_MMA = {"sm80": "kSync", "sm90a": "kWgmma"}
DECODE_COLUMNS = ["family", "head_dim", "row_groups", "rows_per_group", "stages", "formats", "dtypes", "kv"]
PREFILL_COLUMNS = ["family", "arch", "head_dim", "q_tile", "tile_q", "tile_kv", "warps_q", "warps_kv", "stages",
                   "min_ctas", "formats", "dtypes", "kv"]
INT_COLUMNS = {"head_dim", "row_groups", "rows_per_group", "stages", "tile_q", "tile_kv", "warps_q", "warps_kv",
               "min_ctas"}


class TableError(Exception):
    pass


def parse_list(value, allowed, what, where):
    items = value.split(",")
    for item in items:
        if item not in allowed:
            raise TableError(f"{where}: {what} '{item}' is not one of {', '.join(allowed)}")
    if len(set(items)) != len(items):
        raise TableError(f"{where}: {what} '{value}' lists an entry twice")
    return [i for i in allowed if i in items]  # table order, for stable output


def parse(path):
    decode, prefill = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].split()
            if not text:
                continue
            where = f"{path}:{number}"
            family = text[0]
            columns = {"decode": DECODE_COLUMNS, "prefill": PREFILL_COLUMNS}.get(family)
            if columns is None:
                raise TableError(f"{where}: family '{family}' is not decode or prefill")
            if len(text) != len(columns):
                raise TableError(f"{where}: {len(text)} columns, expected {len(columns)} ({' '.join(columns)})")
            row = dict(zip(columns, text))
            for key in INT_COLUMNS & row.keys():
                try:
                    row[key] = int(row[key])
                except ValueError:
                    raise TableError(f"{where}: {key} = '{row[key]}' is not an integer") from None
                if row[key] <= 0:
                    raise TableError(f"{where}: {key} = {row[key]}, expected > 0")
            if row["head_dim"] % 16 != 0:
                raise TableError(f"{where}: head_dim = {row['head_dim']}, expected a multiple of 16")
            row["formats"] = parse_list(row["formats"], list(FORMATS), "format", where)
            row["dtypes"] = parse_list(row["dtypes"], list(DTYPES), "dtype", where)
            row["where"] = where
            row["kv"] = parse_list(row["kv"], list(KV_STORAGES), "kv storage", where)
            if "same" not in row["kv"]:
                raise TableError(f"{where}: kv '{','.join(row['kv'])}' must include 'same'")
            if family == "prefill":
                if row["arch"] not in ARCH_MMA:
                    raise TableError(f"{where}: arch '{row['arch']}' is not one of {', '.join(ARCH_MMA)}")
                if row["q_tile"] not in Q_TILES:
                    raise TableError(f"{where}: q_tile '{row['q_tile']}' is not one of {', '.join(Q_TILES)}")
                if row["tile_q"] not in Q_TILES[row["q_tile"]]:
                    raise TableError(f"{where}: tile_q = {row['tile_q']} for {row['q_tile']}, expected "
                                     f"{' or '.join(str(n) for n in Q_TILES[row['q_tile']])}")
                if (row["q_tile"] == "k128Wgmma") != (row["arch"] == "sm90a"):
                    raise TableError(f"{where}: k128Wgmma is the sm90a tile, and the only one")
                prefill.append(row)
            else:
                decode.append(row)
    seen = set()
    for row in decode + prefill:
        key = (row["family"], row["head_dim"], row.get("q_tile"))
        if key in seen:
            raise TableError(f"{row['where']}: a second {row['family']} row for head_dim {row['head_dim']}"
                             + (f", {row['q_tile']}" if "q_tile" in row else ""))
        seen.add(key)
    if not decode or not prefill:
        raise TableError(f"{path}: expected decode and prefill rows")
    for d in sorted({r["head_dim"] for r in prefill}):
        tiles = {r["q_tile"] for r in prefill if r["head_dim"] == d}
        # choose_q_tile falls back to k16 and k64; the runtime's decode plans use k16.
        for needed in ("k16", "k64"):
            if needed not in tiles:
                raise TableError(f"{path}: prefill head_dim {d} has no {needed} row (every head dim needs k16 and k64)")
    return decode, prefill


def format_mask(formats):
    return " | ".join(f"format_bit(kernels::KVFormatKind::{FORMATS[f]})" for f in formats)


def kv_mask(kvs):
    return " | ".join(f"kv_storage_bit(KVStorage::{KV_STORAGES[k][0]})" for k in kvs)


def head_dims(rows):
    return sorted({r["head_dim"] for r in rows})


def supported_dims(decode, prefill):
    return sorted(set(head_dims(decode)) & set(head_dims(prefill)))


def header(decode, prefill, table_name):
    out = []
    w = out.append
    w(f"// Generated from {table_name} by cmake/generate_attention_configs.py: edit the table, not this file.")
    w("#pragma once")
    w("")
    w('#include "kernels/attention/decode.cuh"')
    w('#include "kernels/attention/prefill/traits.cuh"')
    w('#include "src/config/config_types.h"')
    w("")
    w("namespace tessera {")
    w("namespace detail {")
    w("")
    w("/// Head dims with a decode (CUDA-core) configuration, and with prefill configurations.")
    w(f"inline constexpr int kDecodeHeadDims[] = {{{', '.join(map(str, head_dims(decode)))}}};")
    w(f"inline constexpr int kPrefillHeadDims[] = {{{', '.join(map(str, head_dims(prefill)))}}};")
    w(f'inline constexpr const char* kDecodeHeadDimsText = "{", ".join(map(str, head_dims(decode)))}";')
    w(f'inline constexpr const char* kPrefillHeadDimsText = "{", ".join(map(str, head_dims(prefill)))}";')
    w("/// kSupportedHeadDims (tessera/head_dims.h: those with both) for messages.")
    w(f'inline constexpr const char* kSupportedHeadDimsText = "{", ".join(map(str, supported_dims(decode, prefill)))}";')
    w("")
    for r in decode:
        for dt in r["dtypes"]:
            t = DTYPES[dt]
            w(f"template <> struct DecodeConfig<{t}, {r['head_dim']}> {{  // {r['where'].rsplit('/', 1)[-1]}")
            w("  template <typename KVT>")
            w(f"  using TraitsFor = kernels::DecodeTraits<{t}, {r['head_dim']}, {r['row_groups']}, {r['rows_per_group']}, "
              f"{r['stages']}, KVT>;")
            w(f"  using Traits = TraitsFor<{t}>;")
            w(f"  static constexpr uint32_t kFormats = {format_mask(r['formats'])};")
            w(f"  static constexpr uint32_t kKVStorages = {kv_mask(r['kv'])};")
            w("};")
    w("")
    for r in prefill:
        for dt in r["dtypes"]:
            t = DTYPES[dt]
            w(f"template <> struct PrefillConfig<{t}, {r['head_dim']}, QTile::{r['q_tile']}> {{  "
              f"// {r['where'].rsplit('/', 1)[-1]}")
            w("  template <typename KVT>")
            w(f"  using TraitsFor = kernels::PrefillTraits<{t}, {r['head_dim']}, {r['tile_q']}, {r['tile_kv']}, "
              f"{r['warps_q']}, {r['warps_kv']}, {r['stages']}, {r['min_ctas']}, kernels::MmaKind::{ARCH_MMA[r['arch']]}, KVT>;")
            w(f"  using Traits = TraitsFor<{t}>;")
            w(f"  static constexpr uint32_t kFormats = {format_mask(r['formats'])};")
            w(f"  static constexpr uint32_t kKVStorages = {kv_mask(r['kv'])};")
            w("};")
    w("")
    w("/// The KV tile rows of the prefill configuration (head_dim, q_tile) of any dtype; 0 when the table")
    w("/// has none (the heuristics ask this to see which tiles exist).")
    w("constexpr int prefill_kv_tile_rows(int head_dim, QTile q_tile) {")
    w("  switch (head_dim) {")
    for d in head_dims(prefill):
        w(f"    case {d}:")
        w("      switch (q_tile) {")
        for r in prefill:
            if r["head_dim"] == d:
                w(f"        case QTile::{r['q_tile']}: return {r['tile_kv']};")
        w("        default: return 0;")
        w("      }")
    w("    default: return 0;")
    w("  }")
    w("}")
    w("")
    w("/// The query tile rows (packed rows) of the prefill configuration (head_dim, q_tile); 0 when the")
    w("/// table has none. The runtime cuts requests into tiles of this many rows.")
    w("constexpr int prefill_q_tile_rows(int head_dim, QTile q_tile) {")
    w("  switch (head_dim) {")
    for d in head_dims(prefill):
        w(f"    case {d}:")
        w("      switch (q_tile) {")
        for r in prefill:
            if r["head_dim"] == d:
                w(f"        case QTile::{r['q_tile']}: return {r['tile_q']};")
        w("        default: return 0;")
        w("      }")
    w("    default: return 0;")
    w("  }")
    w("}")
    w("")
    w("/// The KV storages (kv_storage_bit) the prefill configuration (head_dim, q_tile) is built for; 0")
    w("/// when the table has none.")
    w("constexpr uint32_t prefill_kv_storages(int head_dim, QTile q_tile) {")
    w("  switch (head_dim) {")
    for d in head_dims(prefill):
        w(f"    case {d}:")
        w("      switch (q_tile) {")
        for r in prefill:
            if r["head_dim"] == d:
                w(f"        case QTile::{r['q_tile']}: return {kv_mask(r['kv'])};")
        w("        default: return 0;")
        w("      }")
    w("    default: return 0;")
    w("  }")
    w("}")
    w("")
    w("/// Whether any prefill configuration of head_dim takes KV stored as `kv` (then the head dim's")
    w("/// launchers are instantiated for it).")
    w("constexpr bool has_prefill_kv_storage(int head_dim, KVStorage kv) {")
    w("  return (" + " | ".join(f"prefill_kv_storages(head_dim, QTile::{q})" for q in Q_TILES) + ") & kv_storage_bit(kv);")
    w("}")
    w("")
    w("/// Whether the decode (CUDA-core) configuration of head_dim takes KV stored as `kv`.")
    w("constexpr bool has_decode_kv_storage(int head_dim, KVStorage kv) {")
    w("  switch (head_dim) {")
    for r in decode:
        w(f"    case {r['head_dim']}: return (({kv_mask(r['kv'])}) & kv_storage_bit(kv)) != 0;")
    w("    default: return false;")
    w("  }")
    w("}")
    w("")
    w("/// The most query tile rows of any prefill configuration (the runtime's partial-state slots).")
    w(f"inline constexpr int kMaxPrefillQTileRows = {max(r['tile_q'] for r in prefill)};")
    w("")
    w("/// Whether the table has the prefill configuration (head_dim, q_tile) for KV stored as `kv`.")
    w("constexpr bool has_prefill_config(int head_dim, QTile q_tile, KVStorage kv = KVStorage::kSame) {")
    w("  return (prefill_kv_storages(head_dim, q_tile) & kv_storage_bit(kv)) != 0;")
    w("}")
    w("")
    w("/// Calls f(std::integral_constant<int, D>{}) for the decode head dim D == head_dim.")
    w("template <typename F>")
    w("void with_decode_head_dim(int head_dim, F&& f) {")
    w("  switch (head_dim) {")
    for d in head_dims(decode):
        w(f"    case {d}: return f(std::integral_constant<int, {d}>{{}});")
    w("  }")
    w('  fail_unsupported_head_dim("decode (CUDA cores)", head_dim, kDecodeHeadDimsText);')
    w("}")
    w("")
    w("/// Calls f(std::integral_constant<int, D>{}) for the prefill head dim D == head_dim.")
    w("template <typename F>")
    w("void with_prefill_head_dim(int head_dim, F&& f) {")
    w("  switch (head_dim) {")
    for d in head_dims(prefill):
        w(f"    case {d}: return f(std::integral_constant<int, {d}>{{}});")
    w("  }")
    w('  fail_unsupported_head_dim("prefill", head_dim, kPrefillHeadDimsText);')
    w("}")
    w("")
    w("/// Calls f(ConfigTag<PrefillConfig<T, HEAD_DIM, q_tile>>{}) for the query tiles of (T, HEAD_DIM).")
    w("template <typename T, int HEAD_DIM>")
    w("struct PrefillTiles;")
    for d in head_dims(prefill):
        for dt, t in DTYPES.items():
            rows = [r for r in prefill if r["head_dim"] == d and dt in r["dtypes"]]
            if not rows:
                continue
            w("template <>")
            w(f"struct PrefillTiles<{t}, {d}> {{")
            w("  template <typename F>")
            w("  static void with_q_tile(QTile q_tile, F&& f) {")
            w("    switch (q_tile) {")
            for r in rows:
                w(f"      case QTile::{r['q_tile']}: return f(ConfigTag<PrefillConfig<{t}, {d}, QTile::{r['q_tile']}>>{{}});")
            w("      default: break;")
            w("    }")
            w(f"    fail_no_prefill_config({d}, q_tile);")
            w("  }")
            w("};")
    w("")
    w("}  // namespace detail")
    w("}  // namespace tessera")
    return "\n".join(out) + "\n"


def public_header(decode, prefill, table_name):
    dims = supported_dims(decode, prefill)
    return "\n".join([
        f"// Generated from {table_name} by cmake/generate_attention_configs.py: edit the table, not this file.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace tessera {",
        "",
        "/// Head dims (elements per head of q, k, v and o) the attention kernels are built for: every",
        "/// entry point and KV format takes each of them.",
        f"inline constexpr int64_t kSupportedHeadDims[] = {{{', '.join(map(str, dims))}}};",
        "",
        "}  // namespace tessera",
        "",
    ])


def instantiation(family, d, dtype, table_name, kv="same"):
    t = DTYPES[dtype]
    kvt = KV_STORAGES[kv][1] or t
    what = f"{dtype}" if kv == "same" else f"{dtype} queries over {kv} KV"
    lines = [f"// Generated from {table_name} by cmake/generate_attention_configs.py: the {family} kernels of",
             f"// head_dim {d}, {what} (one translation unit each: parallel builds).",
             f'#include "src/{family}_launch.cuh"', "", "namespace tessera {", "namespace detail {", ""]
    if family == "prefill":
        params = f"kernels::AttentionParams<{t}, {kvt}>"
        lines += [
            f"template void launch_prefill_head_dim<{t}, {kvt}, {d}>(const {params}&, const ResolvedVariant&,",
            "    kernels::KVFormatKind, QTile, int64_t, cudaStream_t);",
            f"template void launch_persistent_head_dim<{t}, {kvt}, {d}>(const {params}&, const ResolvedVariant&,",
            "    kernels::KVFormatKind, QTile, const PersistentLaunch&, cudaStream_t);",
            f"template int persistent_ctas_per_sm<{t}, {kvt}, {d}>(kernels::KVFormatKind, QTile);",
        ]
    else:
        lines += [
            f"template void launch_decode_head_dim<{t}, {kvt}, {d}>(const kernels::AttentionParams<{t}, {kvt}>&,",
            "                                                kernels::KVFormatKind, cudaStream_t);",
        ]
    lines += ["", "}  // namespace detail", "}  // namespace tessera", ""]
    return "\n".join(lines)


def write_if_changed(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    table, out_dir = argv[1], argv[2]
    table_name = "src/config/attention_configs.txt"
    try:
        decode, prefill = parse(table)
    except TableError as e:
        sys.stderr.write(f"attention configuration table: {e}\n")
        return 1
    write_if_changed(os.path.join(out_dir, "src/config/attention_configs.h"), header(decode, prefill, table_name))
    write_if_changed(os.path.join(out_dir, "include/tessera/head_dims.h"), public_header(decode, prefill, table_name))
    sources = []
    for family, rows in (("decode", decode), ("prefill", prefill)):
        for d in head_dims(rows):
            dtypes = [dt for dt in DTYPES if any(dt in r["dtypes"] for r in rows if r["head_dim"] == d)]
            for dt in dtypes:
                kvs = [k for k in KV_STORAGES
                       if any(k in r["kv"] for r in rows if r["head_dim"] == d and dt in r["dtypes"])]
                for kv in kvs:
                    suffix = "" if kv == "same" else f"_{kv}"
                    path = os.path.join(out_dir, f"src/config/{family}_d{d}_{dt}{suffix}.cu")
                    write_if_changed(path, instantiation(family, d, dt, table_name, kv))
                    sources.append(path)
    print("\n".join(sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
