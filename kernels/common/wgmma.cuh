// Warpgroup tensor-core instructions of sm_90a (wgmma): shared-memory matrix descriptors, the
// m64nNk16 MMAs (N = 16, 64, 96, 128, 256) and the fp8 m64nNk32 ones (N = 64, 128, 256) with fp32
// accumulation, and the fences around them. A warpgroup is 4 consecutive warps (128 threads); all
// of them execute every instruction here together.
//
// Accumulator layout of m64nNk16 (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts"
// of wgmma): warp w of the warpgroup owns rows 16w .. 16w+15, and d[4n .. 4n+3] of a thread holds
// the n-th 8-column block exactly as mma.sync m16n8's C fragment (rows g and g+8, columns 2t, 2t+1
// with g = lane / 4, t = lane % 4). A from registers (k16) is laid out as mma.sync m16n8k16's A.
// So a wgmma S tile converts into P's A operand as the m16n8k16 tiles do (mma.cuh).
//
// Shared-memory operands are swizzled (SwizzledOperandTile, smem_layout.cuh): an "atom" is 8 rows
// of 128, 64 or 32 bytes (64, 32 or 16 16-bit elements), aligned to its size, with 16-byte chunk c
// of row r stored at c XOR (address bits 7.. of the row). The hardware applies the XOR to address
// bits, so a K-major descriptor may start 32, 64 or 96 bytes into an atom's rows (the k16 steps).
#pragma once

#include <cuda_fp8.h>

#include "kernels/common/platform.cuh"

// The instructions exist on sm_90a only; other targets compile the callers (one source for every
// architecture) but must never run them.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_WGMMA_AVAILABLE 1
#else
#define TESSERA_WGMMA_AVAILABLE 0
#endif

namespace tessera {
namespace kernels {

/// A wgmma shared-memory descriptor of a SwizzledOperandTile with kAtomChunks-chunk rows (128-,
/// 64- or 32-byte swizzle). Byte quantities are multiples of 16. For a K-major operand (rows of
/// the M or N dimension, K contiguous): `stride_bytes` is the distance between 8-row atoms and
/// `leading_bytes` is unused (a k16 step stays inside one atom row). For an MN-major operand (K
/// rows, M or N contiguous): `leading_bytes` is the distance between column blocks along M or N
/// and `stride_bytes` the distance between 8-row atoms along K.
template <int kAtomChunks>
TESSERA_DEVICE uint64_t smem_desc_swizzled(uint32_t smem_address, uint32_t leading_bytes, uint32_t stride_bytes) {
  static_assert(kAtomChunks == 8 || kAtomChunks == 4 || kAtomChunks == 2, "a swizzled layout");
  constexpr uint64_t kLayout = kAtomChunks == 8 ? 1 : kAtomChunks == 4 ? 2 : 3;  // bits 62-63: 128, 64, 32 B
  return static_cast<uint64_t>((smem_address & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (kLayout << 62);
}

/// The descriptor of k16 step `kd` of a K-major operand of layout Tile (a SwizzledOperandTile):
/// rows row0 .. row0 + 63 (A, M = 64) or all Tile::kRows (B) of a tile at `tile` (shared-window
/// address, aligned to the tile's atom). Step kd lies in column block kd / kStepsPerBlock, 32
/// bytes per step into its rows.
template <typename Tile>
TESSERA_HOST_DEVICE constexpr uint32_t wgmma_k_major_offset(int row0, int kd) {
  return (kd / Tile::kStepsPerBlock) * Tile::kBlockBytes + row0 * Tile::kRowBytes + (kd % Tile::kStepsPerBlock) * 32;
}
template <typename Tile>
TESSERA_DEVICE uint64_t wgmma_k_major_desc(uint32_t tile, int row0, int kd) {
  return smem_desc_swizzled<Tile::kAtomChunks>(tile + wgmma_k_major_offset<Tile>(row0, kd), 16, Tile::kAtomBytes);
}

/// `desc` with its start address moved by `bytes` (a multiple of 16). The 14-bit address field
/// is the low word's bottom and a shared-window address stays below 2^18, so the sum never
/// carries out of it: an unrolled loop forms one descriptor and adds constants instead of
/// encoding every step's (about five uniform instructions a descriptor).
TESSERA_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

/// The descriptor of k16 step `kk` (K rows 16kk .. 16kk + 15) of an MN-major operand of layout
/// Tile: Tile::kRows K rows, the M or N columns in its column blocks.
template <typename Tile>
TESSERA_DEVICE uint64_t wgmma_mn_major_desc(uint32_t tile, int kk) {
  return smem_desc_swizzled<Tile::kAtomChunks>(tile + kk * 2 * Tile::kAtomBytes, Tile::kBlockBytes,
                                               Tile::kAtomBytes);
}

/// Four 8x8 b16 matrices stored from registers (sm_90, stmatrix): register m of lane (g, t) =
/// lane / 4, lane % 4 is row g, b16 columns 2t and 2t + 1 of matrix m; lane i supplies the address
/// of row i % 8 of matrix i / 8 (rows anywhere, 16 bytes each).
TESSERA_DEVICE void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#else
  __trap();
#endif
}

/// Orders this thread's earlier register writes (accumulators, A fragments) before the wgmma
/// instructions that follow read them.
TESSERA_DEVICE void wgmma_fence() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

/// Closes the group of wgmma issued since the last commit.
TESSERA_DEVICE void wgmma_commit() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

/// Waits until at most N committed groups are in flight; their accumulators are then readable.
template <int N>
TESSERA_DEVICE void wgmma_wait() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to the
/// async proxy that wgmma reads through. Each writer fences before the barrier that publishes.
TESSERA_DEVICE void fence_proxy_async_shared() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/// Warpgroup register reallocation (setmaxnreg): the calling warpgroup's per-thread register
/// limit moves to kRegs (a multiple of 8, 24-256), returning registers to the SM's pool or taking
/// them from it, so a producer warpgroup can hand its share to the consumers.
template <int kRegs>
TESSERA_DEVICE void warpgroup_registers_decrease() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
TESSERA_DEVICE void warpgroup_registers_increase() {
#if TESSERA_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

/// Ties the accumulators to this point of the program: the compiler may not move their reads or
/// writes across it, so none lands between a wgmma and the wait that completes it.
template <int N>
TESSERA_DEVICE void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// The same for A fragments in registers (a register-A wgmma reads them until its wait), N words.
template <int N>
TESSERA_DEVICE void wgmma_fence_operands(uint32_t (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

/// wgmma_wait<N> that ptxas keeps after the computation of `value`: the value is first stored to
/// `slot` (a shared-memory word of this thread's own, never read). ptxas schedules register-only
/// instructions freely across a wgmma wait and put a softmax that was meant to overlap an MMA in
/// flight after its wait; a store it cannot move past the wait carries that dependency.
template <int N>
TESSERA_DEVICE void wgmma_wait_after(float value, uint32_t slot) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(slot), "f"(value) : "memory");
  wgmma_wait<N>();
}

/// d (64 x N, fp32) = A * B^T + (accumulate ? d : 0) for one warpgroup: A (64 x 16) and B
/// (N x 16) both K-major in shared memory (descriptors from smem_desc_swizzled). N is 64, 96, 128 or 256;
/// a thread holds N / 2 accumulators.
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);

/// d (64 x N, fp32) = A * B + (accumulate ? d : 0) for one warpgroup: A (64 x 16) K-major and B
/// (16 x N) MN-major, both in shared memory (a P published by another warpgroup times V).
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_b(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b_mn_major,
                                          bool accumulate);

/// d (64 x N, fp32) = A * B + (accumulate ? d : 0) for one warpgroup: A (64 x 16) MN-major (M
/// contiguous) and B (N x 16) K-major, both in shared memory (V^T times a P^T: the MLA tile for
/// few query rows, whose N is the rows).
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_a(float (&d)[N / 2], uint64_t desc_a_mn_major, uint64_t desc_b,
                                          bool accumulate);

/// d (64 x N, fp32) = A * B + (accumulate ? d : 0) for one warpgroup: A (64 x 16) in registers
/// (four packed pairs, the m16n8k16 A fragment of the thread's warp), B (16 x N) MN-major in
/// shared memory (N contiguous elements per K row, in the layout's column blocks).
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b_mn_major,
                                      bool accumulate);

/// The fp8 forms (T __nv_fp8_e4m3 or __nv_fp8_e5m2; FP8 attention): one k32 step, 32 bytes of
/// each row as the 16-bit k16 step is, so descriptors address it the same way. fp8 wgmma reads
/// both operands K-major only (PTX has no transpose for 8-bit types). A in registers is four words
/// of four elements: rows g and g + 8 of the warp's 16, columns 4t .. 4t + 3 (words 0, 1) and
/// 16 + 4t .. 16 + 4t + 3 (words 2, 3), element 0 in the low byte: byte for byte the 16-bit k16
/// A fragment.
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk32_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk32_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate);

#if TESSERA_WGMMA_AVAILABLE
// A thread's accumulators of an m64n16 (8), m64n64 (32), m64n96 (48), m64n128 (64) and m64n256
// (128) tile, as asm operands %0 ..
#define TESSERA_WGMMA_D8_REGS "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define TESSERA_WGMMA_D8_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define TESSERA_WGMMA_D32_REGS                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TESSERA_WGMMA_D48_REGS                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define TESSERA_WGMMA_D64_REGS                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define TESSERA_WGMMA_D32_OPERANDS                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                     \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),               \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),             \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TESSERA_WGMMA_D48_OPERANDS                                                                                    \
  TESSERA_WGMMA_D32_OPERANDS, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),         \
      "+f"(d[46]), "+f"(d[47])
#define TESSERA_WGMMA_D64_OPERANDS                                                                                    \
  TESSERA_WGMMA_D32_OPERANDS, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),         \
      "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),         \
      "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),         \
      "+f"(d[62]), "+f"(d[63])

#define TESSERA_WGMMA_D128_REGS \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define TESSERA_WGMMA_D128_OPERANDS \
  TESSERA_WGMMA_D64_OPERANDS, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// The two operand forms of m64nNk16 for one 16-bit input type (PTX name PTX_TYPE). Accumulate is
// the scale-d predicate; scale-a/b are 1; SS takes both operands K-major (no transpose); RS takes
// B MN-major (transpose-b = 1). The operand numbers after the accumulators are spelled out:
// SS_TAIL names desc_a, desc_b and the accumulate flag; RS_TAIL the four A words, desc_b and the
// flag; ACC the flag's number. SS_MN_B is SS with B MN-major (transpose-b = 1).
#define TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, N, REGS, OPERANDS, SS_ACC, SS_TAIL, RS_ACC, RS_TAIL)                    \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk16_ss<TYPE, N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b,                  \
                                                 bool accumulate) {                                                   \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " SS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " " REGS SS_TAIL           \
                 ", acc, 1, 1, 0, 0;\n}\n"                                                                             \
                 : OPERANDS                                                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<uint32_t>(accumulate)));                                 \
  }                                                                                                                   \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_b<TYPE, N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b_mn_major,    \
                                                      bool accumulate) {                                              \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " SS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " " REGS SS_TAIL           \
                 ", acc, 1, 1, 0, 1;\n}\n"                                                                             \
                 : OPERANDS                                                                                           \
                 : "l"(desc_a), "l"(desc_b_mn_major), "r"(static_cast<uint32_t>(accumulate)));                        \
  }                                                                                                                   \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_a<TYPE, N>(float(&d)[N / 2], uint64_t desc_a_mn_major, uint64_t desc_b,    \
                                                      bool accumulate) {                                              \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " SS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " " REGS SS_TAIL           \
                 ", acc, 1, 1, 1, 0;\n}\n"                                                                             \
                 : OPERANDS                                                                                           \
                 : "l"(desc_a_mn_major), "l"(desc_b), "r"(static_cast<uint32_t>(accumulate)));                        \
  }                                                                                                                   \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk16_rs<TYPE, N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc_b_mn_major,   \
                                                 bool accumulate) {                                                   \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " RS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " " REGS RS_TAIL           \
                 ", acc, 1, 1, 1;\n}\n"                                                                                \
                 : OPERANDS                                                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b_mn_major),                                  \
                   "r"(static_cast<uint32_t>(accumulate)));                                                           \
  }
#define TESSERA_WGMMA_N16(TYPE, PTX_TYPE)                                                                             \
  TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, 16, TESSERA_WGMMA_D8_REGS, TESSERA_WGMMA_D8_OPERANDS, "%10", ", %8, %9",      \
                        "%13", ", {%8, %9, %10, %11}, %12")
#define TESSERA_WGMMA_N64(TYPE, PTX_TYPE)                                                                             \
  TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, 64, TESSERA_WGMMA_D32_REGS, TESSERA_WGMMA_D32_OPERANDS, "%34", ", %32, %33",  \
                        "%37", ", {%32, %33, %34, %35}, %36")
#define TESSERA_WGMMA_N96(TYPE, PTX_TYPE)                                                                             \
  TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, 96, TESSERA_WGMMA_D48_REGS, TESSERA_WGMMA_D48_OPERANDS, "%50", ", %48, %49",  \
                        "%53", ", {%48, %49, %50, %51}, %52")
#define TESSERA_WGMMA_N128(TYPE, PTX_TYPE)                                                                            \
  TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, 128, TESSERA_WGMMA_D64_REGS, TESSERA_WGMMA_D64_OPERANDS, "%66", ", %64, %65", \
                        "%69", ", {%64, %65, %66, %67}, %68")
#define TESSERA_WGMMA_N256(TYPE, PTX_TYPE)                                                                            \
  TESSERA_WGMMA_M64NK16(TYPE, PTX_TYPE, 256, TESSERA_WGMMA_D128_REGS, TESSERA_WGMMA_D128_OPERANDS, "%130",           \
                        ", %128, %129", "%133", ", {%128, %129, %130, %131}, %132")
TESSERA_WGMMA_N16(__nv_bfloat16, "bf16")
TESSERA_WGMMA_N16(__half, "f16")
TESSERA_WGMMA_N64(__nv_bfloat16, "bf16")
TESSERA_WGMMA_N64(__half, "f16")
TESSERA_WGMMA_N96(__nv_bfloat16, "bf16")
TESSERA_WGMMA_N96(__half, "f16")
TESSERA_WGMMA_N128(__nv_bfloat16, "bf16")
TESSERA_WGMMA_N128(__half, "f16")
TESSERA_WGMMA_N256(__nv_bfloat16, "bf16")
TESSERA_WGMMA_N256(__half, "f16")
// The fp8 forms: the same operand numbering, no transpose immediates.
#define TESSERA_WGMMA_M64NK32(TYPE, PTX_TYPE, N, REGS, OPERANDS, SS_ACC, SS_TAIL, RS_ACC, RS_TAIL)                    \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk32_ss<TYPE, N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b,                  \
                                                 bool accumulate) {                                                   \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " SS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." PTX_TYPE "." PTX_TYPE " " REGS SS_TAIL           \
                 ", acc, 1, 1;\n}\n"                                                                                   \
                 : OPERANDS                                                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<uint32_t>(accumulate)));                                 \
  }                                                                                                                   \
  template <>                                                                                                         \
  TESSERA_DEVICE void wgmma_m64nNk32_rs<TYPE, N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc_b,            \
                                                 bool accumulate) {                                                   \
    asm volatile("{\n .reg .pred acc;\n setp.ne.b32 acc, " RS_ACC ", 0;\n"                                            \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." PTX_TYPE "." PTX_TYPE " " REGS RS_TAIL           \
                 ", acc, 1, 1;\n}\n"                                                                                   \
                 : OPERANDS                                                                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<uint32_t>(accumulate)));  \
  }
#define TESSERA_WGMMA_FP8(TYPE, PTX_TYPE)                                                                             \
  TESSERA_WGMMA_M64NK32(TYPE, PTX_TYPE, 64, TESSERA_WGMMA_D32_REGS, TESSERA_WGMMA_D32_OPERANDS, "%34", ", %32, %33",  \
                        "%37", ", {%32, %33, %34, %35}, %36")                                                         \
  TESSERA_WGMMA_M64NK32(TYPE, PTX_TYPE, 128, TESSERA_WGMMA_D64_REGS, TESSERA_WGMMA_D64_OPERANDS, "%66", ", %64, %65", \
                        "%69", ", {%64, %65, %66, %67}, %68")                                                         \
  TESSERA_WGMMA_M64NK32(TYPE, PTX_TYPE, 256, TESSERA_WGMMA_D128_REGS, TESSERA_WGMMA_D128_OPERANDS, "%130",           \
                        ", %128, %129", "%133", ", {%128, %129, %130, %131}, %132")
TESSERA_WGMMA_FP8(__nv_fp8_e4m3, "e4m3")
TESSERA_WGMMA_FP8(__nv_fp8_e5m2, "e5m2")
#undef TESSERA_WGMMA_FP8
#undef TESSERA_WGMMA_M64NK32
#undef TESSERA_WGMMA_N256
#undef TESSERA_WGMMA_N128
#undef TESSERA_WGMMA_N96
#undef TESSERA_WGMMA_N64
#undef TESSERA_WGMMA_N16
#undef TESSERA_WGMMA_M64NK16
#undef TESSERA_WGMMA_D128_OPERANDS
#undef TESSERA_WGMMA_D64_OPERANDS
#undef TESSERA_WGMMA_D48_OPERANDS
#undef TESSERA_WGMMA_D32_OPERANDS
#undef TESSERA_WGMMA_D8_OPERANDS
#undef TESSERA_WGMMA_D128_REGS
#undef TESSERA_WGMMA_D64_REGS
#undef TESSERA_WGMMA_D48_REGS
#undef TESSERA_WGMMA_D32_REGS
#undef TESSERA_WGMMA_D8_REGS
#else
// Other targets compile the callers but never run them.
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss(float (&)[N / 2], uint64_t, uint64_t, bool) {
  __trap();
}
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_b(float (&)[N / 2], uint64_t, uint64_t, bool) {
  __trap();
}
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_ss_mn_a(float (&)[N / 2], uint64_t, uint64_t, bool) {
  __trap();
}
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk16_rs(float (&)[N / 2], const uint32_t (&)[4], uint64_t, bool) {
  __trap();
}
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk32_ss(float (&)[N / 2], uint64_t, uint64_t, bool) {
  __trap();
}
template <typename T, int N>
TESSERA_DEVICE void wgmma_m64nNk32_rs(float (&)[N / 2], const uint32_t (&)[4], uint64_t, bool) {
  __trap();
}
#endif

/// One MMA k step of d (64 x N) = A B^T (+ d) with A and B K-major in shared memory: k16 for
/// 16-bit T, k32 for fp8 (both 32 bytes of each row).
template <typename T, int N>
TESSERA_DEVICE void wgmma_k_step_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  if constexpr (sizeof(T) == 1) {
    wgmma_m64nNk32_ss<T, N>(d, desc_a, desc_b, accumulate);
  } else {
    wgmma_m64nNk16_ss<T, N>(d, desc_a, desc_b, accumulate);
  }
}

}  // namespace kernels
}  // namespace tessera
