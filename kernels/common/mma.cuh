// Tensor-core instruction wrappers for sm_80+: ldmatrix and mma.sync m16n8k16 with fp32
// accumulation. Fragment layouts follow the PTX ISA ("Matrix Fragments for mma.m16n8k16"):
// with g = lane / 4 and t = lane % 4,
//   A (16x16, row-major)  a0: (g, 2t..2t+1)   a1: (g+8, 2t..)   a2: (g, 2t+8..)   a3: (g+8, 2t+8..)
//   B (16x8, column-major) b0: (k 2t..2t+1, n g)   b1: (k 2t+8.., n g)
//   C (16x8, f32)          c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Shared-memory address of a generic pointer, as the PTX instructions take it.
TESSERA_DEVICE uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

/// 16 bytes of shared memory at shared-window address `addr` (16-byte aligned), as two 64-bit words.
TESSERA_DEVICE ulonglong2 ld_shared_u64x2(uint32_t addr) {
  ulonglong2 v;
  asm volatile("ld.shared.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "r"(addr));
  return v;
}

/// Stores a 32-bit word to the shared-window address `addr`.
TESSERA_DEVICE void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}

/// Four 8x8 b16 matrices; lane i supplies the address of row i % 8 of matrix i / 8.
TESSERA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The same, each matrix transposed on the way (for B operands stored k-major, e.g. V).
TESSERA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// D = A * B + D for one m16n8k16 tile, inputs f16 or bf16, fp32 accumulation.
template <typename T>
TESSERA_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// One specialisation per input type; TYPE is the C++ type, PTX_TYPE its name in the instruction.
#define TESSERA_MMA_M16N8K16(TYPE, PTX_TYPE)                                                              \
  template <>                                                                                             \
  TESSERA_DEVICE void mma_m16n8k16<TYPE>(float(&d)[4], const uint32_t(&a)[4], uint32_t b0, uint32_t b1) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE                          \
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                 \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                         \
  }
TESSERA_MMA_M16N8K16(__nv_bfloat16, "bf16")
TESSERA_MMA_M16N8K16(__half, "f16")
#undef TESSERA_MMA_M16N8K16

/// The two n8 tiles of one ldmatrix_x4 B load (b0, b1 of the first tile, then of the second):
/// d0 += A * B0, d1 += A * B1.
template <typename T>
TESSERA_DEVICE void mma_m16n8k16_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  mma_m16n8k16<T>(d0, a, b[0], b[1]);
  mma_m16n8k16<T>(d1, a, b[2], b[3]);
}

/// Zeroes an accumulator array of MMA fragments, [tiles][n8 tiles][fragment].
template <int M, int N, int F>
TESSERA_DEVICE void zero_fragments(float (&acc)[M][N][F]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int i = 0; i < F; ++i) acc[m][n][i] = 0.f;
}

/// Two floats rounded to a packed pair of T (low half = x), the register form of an A operand.
template <typename T>
TESSERA_DEVICE uint32_t pack_pair(float x, float y);

template <>
TESSERA_DEVICE uint32_t pack_pair<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
TESSERA_DEVICE uint32_t pack_pair<__half>(float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace kernels
}  // namespace tessera
