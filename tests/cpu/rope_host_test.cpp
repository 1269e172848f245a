// The standalone RoPE functions' argument checks (tessera/rope.h), no GPU: every check runs on the
// host before the device is touched, so the views below point at fake device addresses that are
// never dereferenced. Each error names the argument, its value and what was expected.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "expect_invalid.h"
#include "tessera/rope.h"

namespace {

using tessera_cpu_test::expect_invalid;
using tessera::ApplyLlama31RopeOptions;
using tessera::ApplyRopeOptions;
using tessera::Device;
using tessera::DType;
using tessera::TensorView;

void* fake_address(int64_t slot) { return reinterpret_cast<void*>(uintptr_t{0x100000} * (slot + 1)); }

TensorView fake(DType dtype, std::initializer_list<int64_t> shape, int64_t slot = 0, Device device = Device::cuda(0)) {
  return TensorView(fake_address(slot), dtype, shape, device);
}

/// A well-formed call of each entry point: 6 rows, 4 query heads and 2 key heads of 128 dims,
/// bf16; indptr [0, 2, 6] with offsets, or 6 position ids.
struct Args {
  TensorView q = fake(DType::kBF16, {6, 4, 128}, 0);
  TensorView k = fake(DType::kBF16, {6, 2, 128}, 1);
  TensorView q_rope = fake(DType::kBF16, {6, 4, 128}, 2);
  TensorView k_rope = fake(DType::kBF16, {6, 2, 128}, 3);
  TensorView indptr = fake(DType::kI32, {3}, 4);
  TensorView offsets = fake(DType::kI32, {2}, 5);
  TensorView pos_ids = fake(DType::kI64, {6}, 6);
  ApplyRopeOptions options;
  ApplyLlama31RopeOptions llama31;

  void apply_rope() const { tessera::apply_rope(q, k, q_rope, k_rope, indptr, offsets, options); }
  void apply_rope_pos_ids() const { tessera::apply_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, options); }
  void apply_llama31_rope() const { tessera::apply_llama31_rope(q, k, q_rope, k_rope, indptr, offsets, llama31); }
};

TEST(RopeArguments, QAndK) {
  Args a;
  a.q = fake(DType::kF32, {6, 4, 128});
  expect_invalid([&] { a.apply_rope(); }, "q.dtype = f32, expected one of {f16, bf16}");
  a = Args();
  a.q = fake(DType::kBF16, {6, 512});
  expect_invalid([&] { a.apply_rope(); }, "q.ndim = 2, expected 3 ([nnz, num_q_heads, head_dim])");
  a = Args();
  a.k = fake(DType::kF16, {6, 2, 128});
  expect_invalid([&] { a.apply_rope(); }, "k.dtype = f16, expected bf16 (the dtype of q)");
  a = Args();
  a.k = fake(DType::kBF16, {5, 2, 128});
  expect_invalid([&] { a.apply_rope(); }, "k.shape[0] = 5, expected 6 (nnz: q.shape[0])");
  a = Args();
  a.k = fake(DType::kBF16, {6, 2, 64});
  expect_invalid([&] { a.apply_rope(); }, "k.shape[2] = 64, expected 128 (head_dim: q.shape[2])");
  a = Args();
  a.q = TensorView(fake_address(0), DType::kBF16, {6, 4, 128}, {1024, 256, 2}, Device::cuda(0));
  expect_invalid([&] { a.apply_rope(); }, "q.strides[2] = 2, expected 1");
  a = Args();
  a.q = TensorView(nullptr, DType::kBF16, {6, 4, 128}, Device::cuda(0));
  expect_invalid([&] { a.apply_rope(); }, "q.data = null");
}

TEST(RopeArguments, Outputs) {
  Args a;
  a.q_rope = fake(DType::kBF16, {6, 4, 64}, 2);
  expect_invalid([&] { a.apply_rope(); }, "q_rope.shape[2] = 64, expected 128 (q.shape[2]");
  a = Args();
  a.k_rope = fake(DType::kF16, {6, 2, 128}, 3);
  expect_invalid([&] { a.apply_rope(); }, "k_rope.dtype = f16, expected bf16 (the dtype of k)");
  a = Args();
  a.k_rope = TensorView(a.k.data, DType::kBF16, {6, 2, 128}, {512, 128, 1}, Device::cuda(0));
  expect_invalid([&] { a.apply_rope(); }, "k_rope shares k's data but has strides [512, 128, 1], expected [256, 128, 1]");
}

TEST(RopeArguments, RotaryDimScaleAndTheta) {
  Args a;
  a.options.rotary_dim = 63;
  expect_invalid([&] { a.apply_rope(); }, "rotary_dim = 63, expected an even value in [2, 128] (head_dim: q.shape[2] = 128)");
  a.options.rotary_dim = 130;
  expect_invalid([&] { a.apply_rope_pos_ids(); }, "rotary_dim = 130, expected an even value in [2, 128]");
  a.options.rotary_dim = -2;
  expect_invalid([&] { a.apply_rope(); }, "rotary_dim = -2");
  a = Args();
  a.options.rope_theta = 0;
  expect_invalid([&] { a.apply_rope(); }, "rope_theta = 0, expected a finite value > 0");
  a = Args();
  a.options.rope_scale = -1;
  expect_invalid([&] { a.apply_rope_pos_ids(); }, "rope_scale = -1, expected a finite value > 0");
  a = Args();
  a.llama31.high_freq_factor = 1.0;
  expect_invalid([&] { a.apply_llama31_rope(); }, "high_freq_factor = 1, expected a finite value > low_freq_factor = 1");
  a = Args();
  a.llama31.old_context_len = 0;
  expect_invalid([&] { a.apply_llama31_rope(); }, "old_context_len = 0, expected a finite value > 0");
  a = Args();
  a.llama31.rope_scale = 0;
  expect_invalid([&] { a.apply_llama31_rope(); }, "rope_scale = 0, expected a finite value > 0");
  a = Args();
  a.llama31.rotary_dim = 7;
  expect_invalid([&] { a.apply_llama31_rope(); }, "rotary_dim = 7");
}

TEST(RopeArguments, Positions) {
  Args a;
  a.indptr = fake(DType::kI64, {3}, 4);
  expect_invalid([&] { a.apply_rope(); }, "indptr.dtype = i64, expected i32");
  a = Args();
  a.offsets = fake(DType::kI32, {3}, 5);
  expect_invalid([&] { a.apply_rope(); }, "offsets.shape[0] = 3, expected 2 (batch_size = indptr.shape[0] - 1)");
  a = Args();
  a.indptr = fake(DType::kI32, {0}, 4);
  expect_invalid([&] { a.apply_rope(); }, "indptr.shape[0] = 0, expected in [1, 2^31)");
  a = Args();
  a.pos_ids = fake(DType::kI64, {5}, 6);
  expect_invalid([&] { a.apply_rope_pos_ids(); }, "pos_ids.shape[0] = 5, expected 6 (nnz: the rows to rotate)");
  a.pos_ids = fake(DType::kF32, {6}, 6);
  expect_invalid([&] { a.apply_rope_pos_ids(); }, "pos_ids.dtype = f32, expected one of {i32, i64}");
  a.pos_ids = TensorView(fake_address(6), DType::kI32, {6}, {2}, Device::cuda(0));
  expect_invalid([&] { a.apply_rope_pos_ids(); }, "pos_ids.strides[0] = 2, expected 1");
}

TEST(RopeArguments, CosSinCache) {
  const TensorView query = fake(DType::kF16, {6, 4 * 64}, 0), key = fake(DType::kF16, {6, 64}, 1);
  const TensorView query_out = fake(DType::kF16, {6, 4 * 64}, 2), key_out = fake(DType::kF16, {6, 64}, 3);
  const TensorView positions = fake(DType::kI64, {6}, 4), cache = fake(DType::kF32, {4096, 64}, 5);
  using tessera::apply_rope_with_cos_sin_cache;
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 48, cache, true, query_out, key_out); },
                 "query.shape[1] = 256 is not a multiple of head_size = 48");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, fake(DType::kF16, {6, 100}, 1), 64, cache, true,
                                                     query_out, key_out); },
                 "key.shape[1] = 100 is not a multiple of head_size = 64");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 0, cache, true, query_out, key_out); },
                 "head_size = 0, expected >= 2");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 64, fake(DType::kBF16, {4096, 64}, 5), true,
                                                     query_out, key_out); },
                 "cos_sin_cache.dtype = bf16, expected f32");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 64, fake(DType::kF32, {4096, 96}, 5), true,
                                                     query_out, key_out); },
                 "cos_sin_cache.shape[1] = 96, expected an even rotary_dim in [2, 64] (head_size)");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 64, fake(DType::kF32, {4096, 33}, 5), true,
                                                     query_out, key_out); },
                 "cos_sin_cache.shape[1] = 33");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(fake(DType::kI32, {7}, 4), query, key, 64, cache, true, query_out,
                                                     key_out); },
                 "positions.shape[0] = 7, expected 6");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, key, 64, cache, true, query_out,
                                                     fake(DType::kF16, {6, 128}, 3)); },
                 "key_out.shape[1] = 128, expected 64 (key.shape[1]");
  expect_invalid([&] { apply_rope_with_cos_sin_cache(positions, query, fake(DType::kBF16, {6, 64}, 1), 64, cache, true,
                                                     query_out, key_out); },
                 "key.dtype = bf16, expected f16 (the dtype of query)");
}

TEST(RopeArguments, DevicesAreCheckedAfterEverythingElse) {
  // Host tensors that are otherwise well formed: the device is the error, and it comes last (a
  // malformed argument on the host is named first).
  Args a;
  a.q = fake(DType::kBF16, {6, 4, 128}, 0, Device::cpu());
  expect_invalid([&] { a.apply_rope(); }, "q.device = cpu, expected a CUDA device");
  a.options.rotary_dim = 3;
  expect_invalid([&] { a.apply_rope(); }, "rotary_dim = 3");
  a = Args();
  a.offsets = fake(DType::kI32, {2}, 5, Device::cuda(1));
  expect_invalid([&] { a.apply_rope(); }, "offsets.device = cuda:1, expected cuda:0 (the device of q)");
  a = Args();
  a.k_rope = fake(DType::kBF16, {6, 2, 128}, 3, Device::cpu());
  expect_invalid([&] { a.apply_rope(); }, "k_rope.device = cpu, expected cuda:0 (the device of q)");
}

TEST(RopeArguments, NoRowsIsANoOpWithoutTheDevice) {
  // Nothing to rotate: checked, then nothing queued (no device is needed).
  Args a;
  a.q = fake(DType::kBF16, {0, 4, 128}, 0);
  a.k = fake(DType::kBF16, {0, 2, 128}, 1);
  a.q_rope = fake(DType::kBF16, {0, 4, 128}, 2);
  a.k_rope = fake(DType::kBF16, {0, 2, 128}, 3);
  a.pos_ids = fake(DType::kI32, {0}, 6);
  a.apply_rope_pos_ids();
  tessera::apply_rope_pos_ids_inplace(a.q, a.k, a.pos_ids);
}

}  // namespace
