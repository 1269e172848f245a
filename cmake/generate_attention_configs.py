#!/usr/bin/env python3
"""Generates the attention kernels' host dispatch and instantiation files from the table
src/config/attention_configs.txt (its header says what each column means).

Usage: generate_attention_configs.py TABLE OUT_DIR
Writes, under OUT_DIR (files whose content is unchanged are not rewritten, so nothing rebuilds):
  src/config/attention_configs.h      traits of every configuration, the head-dim and query-tile
                                      switches, the KV tile of each (head dim, query tile)
  include/tessera/head_dims.h         kSupportedHeadDims (public)
  src/config/<family>_d<D>_<dtype>.cu one instantiation file per (kernel family, head dim, dtype)
                                      (split head dims: d<D>x<DV>)
  src/config/<family>_d<D>_<dtype>_<kv>.cu  ... and per fp8 KV storage (families decode, prefill;
                                      pod: the POD kernel's pairs, equal head dims, 16-bit K/V)
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
INT_COLUMNS = {"row_groups", "rows_per_group", "stages", "tile_q", "tile_kv", "warps_q", "warps_kv",
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
            row["formats"] = parse_list(row["formats"], list(FORMATS), "format", where)
            row["dtypes"] = parse_list(row["dtypes"], list(DTYPES), "dtype", where)
            row["where"] = where
            row["kv"] = parse_list(row["kv"], list(KV_STORAGES), "kv storage", where)
            if "same" not in row["kv"]:
                raise TableError(f"{where}: kv '{','.join(row['kv'])}' must include 'same'")
            parse_head_dims(row, family, where)
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
        key = (row["family"], dims_key(row), row.get("q_tile"))
        if key in seen:
            raise TableError(f"{row['where']}: a second {row['family']} row for head_dim {dims_name(row)}"
                             + (f", {row['q_tile']}" if "q_tile" in row else ""))
        seen.add(key)
    if not decode or not prefill:
        raise TableError(f"{path}: expected decode and prefill rows")
    for d, dv in head_dim_pairs(prefill):
        tiles = {r["q_tile"] for r in prefill if dims_key(r) == (d, dv)}
        # choose_q_tile falls back to k16 and k64; the runtime's decode plans use k16.
        for needed in ("k16", "k64"):
            if needed not in tiles:
                raise TableError(f"{path}: prefill head_dim {pair_name(d, dv)} has no {needed} row "
                                 "(every head dim needs k16 and k64)")
    return decode, prefill


def parse_head_dims(row, family, where):
    """head_dim: D (Q, K, V and O rows of D elements) or, for prefill, DxDV (Q and K rows of D, V and
    O rows of DV < D)."""
    text = row["head_dim"]
    parts = text.split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise TableError(f"{where}: head_dim = '{text}' is not an integer or DxDV") from None
    if len(dims) > 2 or (len(dims) == 2 and family != "prefill"):
        raise TableError(f"{where}: head_dim = '{text}', expected D" + (" or DxDV" if family == "prefill" else ""))
    for d in dims:
        if d <= 0 or d % 16 != 0:
            raise TableError(f"{where}: head_dim = '{text}', expected multiples of 16")
    if len(dims) == 2 and dims[1] >= dims[0]:
        raise TableError(f"{where}: head_dim = '{text}', expected DV < D (V's columns are a prefix of K's)")
    row["head_dim"] = dims[0]
    row["head_dim_vo"] = dims[-1]
    if len(dims) == 2 and row["kv"] != ["same"]:
        raise TableError(f"{where}: split head dims {text} take kv 'same' only")


def dims_key(row):
    return (row["head_dim"], row["head_dim_vo"])


def pair_name(d, dv):
    return f"{d}" if d == dv else f"{d}x{dv}"


def dims_name(row):
    return pair_name(*dims_key(row))


def head_dim_pairs(rows):
    return sorted({dims_key(r) for r in rows})


def format_mask(formats):
    return " | ".join(f"format_bit(kernels::KVFormatKind::{FORMATS[f]})" for f in formats)


def kv_mask(kvs):
    return " | ".join(f"kv_storage_bit(KVStorage::{KV_STORAGES[k][0]})" for k in kvs)


def head_dims(rows):
    """The head dims of the rows whose Q/K and V/O dims agree."""
    return sorted({r["head_dim"] for r in rows if r["head_dim"] == r["head_dim_vo"]})


def split_pairs(rows):
    return [(d, dv) for d, dv in head_dim_pairs(rows) if d != dv]


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
    split_text = ", ".join(f"{d}/{dv}" for d, dv in split_pairs(prefill))
    w("/// Prefill's split head dims (head_dim_qk / head_dim_vo), for messages.")
    w(f'inline constexpr const char* kPrefillSplitHeadDimsText = "{split_text}";')
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
            w(f"template <> struct PrefillConfig<{t}, {r['head_dim']}, QTile::{r['q_tile']}, {r['head_dim_vo']}> {{  "
              f"// {r['where'].rsplit('/', 1)[-1]}")
            w("  template <typename KVT>")
            w(f"  using TraitsFor = kernels::PrefillTraits<{t}, {r['head_dim']}, {r['tile_q']}, {r['tile_kv']}, "
              f"{r['warps_q']}, {r['warps_kv']}, {r['stages']}, {r['min_ctas']}, kernels::MmaKind::{ARCH_MMA[r['arch']]}, KVT, "
              f"{r['head_dim_vo']}>;")
            w(f"  using Traits = TraitsFor<{t}>;")
            w(f"  static constexpr uint32_t kFormats = {format_mask(r['formats'])};")
            w(f"  static constexpr uint32_t kKVStorages = {kv_mask(r['kv'])};")
            w("};")
    w("")
    def per_tile_function(signature, value):
        w(f"constexpr {signature} {{")
        for d, dv in head_dim_pairs(prefill):
            w(f"  if (head_dims.qk == {d} && head_dims.vo == {dv}) {{")
            w("    switch (q_tile) {")
            for r in prefill:
                if dims_key(r) == (d, dv):
                    w(f"      case QTile::{r['q_tile']}: return {value(r)};")
            w("      default: return 0;")
            w("    }")
            w("  }")
        w("  return 0;")
        w("}")
        w("")
    w("/// The KV tile rows of the prefill configuration (head_dims, q_tile) of any dtype; 0 when the table")
    w("/// has none (the heuristics ask this to see which tiles exist).")
    per_tile_function("int prefill_kv_tile_rows(PrefillHeadDims head_dims, QTile q_tile)", lambda r: r["tile_kv"])
    w("/// The query tile rows (packed rows) of the prefill configuration (head_dims, q_tile); 0 when the")
    w("/// table has none. The runtime cuts requests into tiles of this many rows.")
    per_tile_function("int prefill_q_tile_rows(PrefillHeadDims head_dims, QTile q_tile)", lambda r: r["tile_q"])
    w("/// The KV storages (kv_storage_bit) the prefill configuration (head_dims, q_tile) is built for; 0")
    w("/// when the table has none.")
    per_tile_function("uint32_t prefill_kv_storages(PrefillHeadDims head_dims, QTile q_tile)", lambda r: kv_mask(r["kv"]))
    w("/// Whether any prefill configuration of head_dim takes KV stored as `kv` (then the head dim's")
    w("/// launchers are instantiated for it).")
    w("constexpr bool has_prefill_kv_storage(PrefillHeadDims head_dim, KVStorage kv) {")
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
    w("constexpr bool has_prefill_config(PrefillHeadDims head_dim, QTile q_tile, KVStorage kv = KVStorage::kSame) {")
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
    w("/// Calls f(PrefillHeadDimsTag<QK, VO>{}) for the prefill head dims (QK, VO) == head_dims.")
    w("template <typename F>")
    w("void with_prefill_head_dim(PrefillHeadDims head_dims, F&& f) {")
    for d, dv in head_dim_pairs(prefill):
        w(f"  if (head_dims.qk == {d} && head_dims.vo == {dv}) return f(PrefillHeadDimsTag<{d}, {dv}>{{}});")
    w('  fail_unsupported_head_dim("prefill", head_dims, head_dims.split() ? kPrefillSplitHeadDimsText : kPrefillHeadDimsText);')
    w("}")
    w("")
    w("/// Calls f(ConfigTag<PrefillConfig<T, HEAD_DIM, q_tile, HEAD_DIM_VO>>{}) for the query tiles of")
    w("/// (T, HEAD_DIM, HEAD_DIM_VO).")
    w("template <typename T, int HEAD_DIM, int HEAD_DIM_VO = HEAD_DIM>")
    w("struct PrefillTiles;")
    for d, dv in head_dim_pairs(prefill):
        for dt, t in DTYPES.items():
            rows = [r for r in prefill if dims_key(r) == (d, dv) and dt in r["dtypes"]]
            if not rows:
                continue
            w("template <>")
            w(f"struct PrefillTiles<{t}, {d}, {dv}> {{")
            w("  template <typename F>")
            w("  static void with_q_tile(QTile q_tile, F&& f) {")
            w("    switch (q_tile) {")
            for r in rows:
                w(f"      case QTile::{r['q_tile']}: return f(ConfigTag<PrefillConfig<{t}, {d}, QTile::{r['q_tile']}, {dv}>>{{}});")
            w("      default: break;")
            w("    }")
            w(f"    fail_no_prefill_config(PrefillHeadDims({d}, {dv}), q_tile);")
            w("  }")
            w("};")
    w("")
    w("}  // namespace detail")
    w("}  // namespace tessera")
    return "\n".join(out) + "\n"


def public_header(decode, prefill, table_name):
    dims = supported_dims(decode, prefill)
    pairs = split_pairs(prefill)
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
        "/// Pairs (head_dim_qk, head_dim_vo) of different head dims that prefill (one-shot and plan/run;",
        "/// ragged and paged KV, 16-bit) is built for: q and k rows of head_dim_qk elements, v and o rows",
        "/// of head_dim_vo. Decode and block-sparse attention take equal head dims only.",
        f"inline constexpr int64_t kSupportedPrefillSplitHeadDims[][2] = {{{', '.join(f'{{{d}, {dv}}}' for d, dv in pairs)}}};",
        "",
        "}  // namespace tessera",
        "",
    ])


def instantiation(family, d, dtype, table_name, kv="same", dv=None):
    dv = d if dv is None else dv
    t = DTYPES[dtype]
    kvt = KV_STORAGES[kv][1] or t
    what = f"{dtype}" if kv == "same" else f"{dtype} queries over {kv} KV"
    lines = [f"// Generated from {table_name} by cmake/generate_attention_configs.py: the {family} kernels of",
             f"// head_dim {pair_name(d, dv)}, {what} (one translation unit each: parallel builds).",
             f'#include "src/{family}_launch.cuh"', "", "namespace tessera {", "namespace detail {", ""]
    if family == "prefill":
        params = f"kernels::AttentionParams<{t}, {kvt}>"
        lines += [
            f"template void launch_prefill_head_dim<{t}, {kvt}, {d}, {dv}>(const {params}&, const ResolvedVariant&,",
            "    kernels::KVFormatKind, QTile, int64_t, cudaStream_t);",
            f"template void launch_persistent_head_dim<{t}, {kvt}, {d}, {dv}>(const {params}&, const ResolvedVariant&,",
            "    kernels::KVFormatKind, QTile, const PersistentLaunch&, cudaStream_t);",
            f"template int persistent_ctas_per_sm<{t}, {kvt}, {d}, {dv}>(kernels::KVFormatKind, QTile);",
        ]
    elif family == "pod":
        params = f"kernels::AttentionParams<{t}, {kvt}>"
        lines += [
            f"template void launch_pod_head_dim<{t}, {kvt}, {d}, {dv}>(const {params}&, const ResolvedVariant&, PodTiles,",
            "    const PodLaunch&, cudaStream_t);",
            f"template PodOccupancy pod_occupancy<{t}, {kvt}, {d}, {dv}>(PodTiles);",
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
        for d, dv in head_dim_pairs(rows):
            same_dims = [r for r in rows if dims_key(r) == (d, dv)]
            dtypes = [dt for dt in DTYPES if any(dt in r["dtypes"] for r in same_dims)]
            for dt in dtypes:
                kvs = [k for k in KV_STORAGES if any(k in r["kv"] for r in same_dims if dt in r["dtypes"])]
                for kv in kvs:
                    suffix = "" if kv == "same" else f"_{kv}"
                    path = os.path.join(out_dir, f"src/config/{family}_d{pair_name(d, dv)}_{dt}{suffix}.cu")
                    write_if_changed(path, instantiation(family, d, dt, table_name, kv, dv))
                    sources.append(path)
    # The POD kernel (prefill_config.h is_pod_pair): the prefill rows' equal head dims, 16-bit K/V.
    for d, dv in head_dim_pairs(prefill):
        if d != dv:
            continue
        for dt in [dt for dt in DTYPES if any(dt in r["dtypes"] for r in prefill if dims_key(r) == (d, dv))]:
            path = os.path.join(out_dir, f"src/config/pod_d{pair_name(d, dv)}_{dt}.cu")
            write_if_changed(path, instantiation("pod", d, dt, table_name))
            sources.append(path)
    print("\n".join(sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
