// build_block_mask (tessera/variant.h): validation, the generated builder unit, its compile through
// the kernel cache and the three launches of kernels/attention/block_mask.cuh (which documents
// what a block holds and when it counts as full).
#include "src/variant/block_mask.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/attention/block_mask_params.cuh"
#include "src/check.h"
#include "src/jit/arch.h"
#include "src/jit/kernel_cache.h"
#include "src/jit/module_loader.h"
#include "src/variant/jit_variant.h"
#include "src/variant/variant_config.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

namespace {

using kernels::BlockMaskTraits;

constexpr int64_t kInt32Limit = INT32_MAX;
// Grid-stride kernels: more CTAs than this only add launch overhead.
constexpr int64_t kMaxGridCtas = 65535;

/// The loaded kernels of one builder unit.
struct BlockMaskKernels {
  CUfunction classify = nullptr;
  CUfunction indptr = nullptr;
  CUfunction compact = nullptr;
};

struct BlockMaskKernelMap {
  std::mutex mutex;
  std::map<std::string, BlockMaskKernels> kernels;  // (device, unit text) -> loaded kernels
};

BlockMaskKernelMap& kernel_map() {
  static BlockMaskKernelMap* m = new BlockMaskKernelMap;  // never destroyed: builds may run during exit
  return *m;
}

BlockMaskKernels load_kernels(const MaskMod& mask, const std::vector<VariantParam>& params, int device) {
  const BlockMaskSource src = block_mask_source(mask, params);
  const std::string key = std::to_string(device) + "\n" + src.source.text;
  BlockMaskKernelMap& map = kernel_map();
  {
    std::lock_guard<std::mutex> lock(map.mutex);
    auto it = map.kernels.find(key);
    if (it != map.kernels.end()) return it->second;
  }
  jit::CompileRequest req;
  req.name = "block mask '" + mask.function + "'";
  req.source = src.source;
  req.arch = jit::current_device_arch();
  req.name_expressions = src.name_expressions;
  const auto compiled = jit::default_kernel_cache().get_or_compile(req);
  BlockMaskKernels k;
  k.classify = jit::get_function(*compiled, src.name_expressions[0]);
  k.indptr = jit::get_function(*compiled, src.name_expressions[1]);
  k.compact = jit::get_function(*compiled, src.name_expressions[2]);
  std::lock_guard<std::mutex> lock(map.mutex);
  map.kernels.emplace(key, k);
  return k;
}

/// A 1-D, contiguous device array of `dtype` (the builder's outputs).
void check_output_array(const TensorView& t, const char* name, DType dtype) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {dtype});
  check_on_cuda(t, name);
  check_contiguous(t, name);
  TESSERA_CHECK_ARG(t.data != nullptr || t.shape[0] == 0) << name << ".data is null, expected device memory";
}

/// Temporary device memory ordered on `stream`, freed on the stream when it goes out of scope
/// (also when a later launch throws).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    TESSERA_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream))
        << " (build_block_mask scratch of " << bytes << " bytes)";
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace

int block_mask_lanes_per_block(int64_t block_rows, int64_t block_cols) {
  const int64_t pairs = block_rows * block_cols;
  int lanes = 1;
  while (lanes < 32 && lanes < pairs) lanes *= 2;
  return lanes;
}

BlockMaskSource block_mask_source(const MaskMod& mask, const std::vector<VariantParam>& params) {
  const std::string prologue = "#include \"kernels/attention/block_mask.cuh\"\n" + user_params_prologue(params);
  // The mask_mod as the kernels' MaskFn; its Params live in BlockMaskArgs::mask_params.
  const std::string epilogue =
      "}  // namespace tessera_user\n"
      "struct TesseraBlockMaskFn {\n"
      "  static __device__ __forceinline__ bool visible(const tessera::kernels::uint64_t* param_slots, int b, int h,\n"
      "                                                 int q_idx, int kv_idx) {\n"
      "    return tessera_user::" + mask.function +
      "(*reinterpret_cast<const tessera_user::Params*>(param_slots), b, h, q_idx, kv_idx);\n"
      "  }\n"
      "};\n";
  BlockMaskSource out;
  out.source = jit::generate_source(prologue, mask.source, epilogue);
  out.name_expressions = {
      "&tessera::kernels::block_mask_classify_kernel<TesseraBlockMaskFn, " +
          std::to_string(BlockMaskTraits::kClassifyThreads) + ">",
      "&tessera::kernels::block_mask_indptr_kernel<" + std::to_string(BlockMaskTraits::kScanThreads) + ">",
      "&tessera::kernels::block_mask_compact_kernel<" + std::to_string(BlockMaskTraits::kCompactThreads) + ">",
  };
  return out;
}

}  // namespace detail

void build_block_mask(const MaskMod& mask, const std::vector<VariantParam>& params, int64_t q_len, int64_t kv_len,
                      int64_t block_rows, int64_t block_cols, int32_t batch, int32_t head, const TensorView& indptr,
                      const TensorView& indices, const TensorView& block_flags, StreamHandle stream) {
  using detail::is_identifier;
  // ---- arguments (all before any CUDA call, so errors need no GPU) ----
  TESSERA_CHECK_ARG(is_identifier(mask.function))
      << "mask.function = '" << mask.function << "', expected a C identifier (the mask_mod's name)";
  TESSERA_CHECK_ARG(!mask.source.empty())
      << "mask.source is empty, expected CUDA source that defines bool " << mask.function
      << "(const Params& params, int b, int h, int q_idx, int kv_idx)";
  TESSERA_CHECK_ARG(q_len >= 1 && q_len <= detail::kInt32Limit)
      << "q_len = " << q_len << ", expected in [1, 2^31)";
  TESSERA_CHECK_ARG(kv_len >= 1 && kv_len <= detail::kInt32Limit)
      << "kv_len = " << kv_len << ", expected in [1, 2^31)";
  TESSERA_CHECK_ARG(block_rows >= 1 && block_rows <= detail::kInt32Limit)
      << "block_rows = " << block_rows << ", expected in [1, 2^31)";
  TESSERA_CHECK_ARG(block_cols >= 1 && block_cols <= detail::kInt32Limit)
      << "block_cols = " << block_cols << ", expected in [1, 2^31)";
  const int64_t num_row_blocks = (q_len + block_rows - 1) / block_rows;
  const int64_t num_col_blocks = (kv_len + block_cols - 1) / block_cols;
  const int64_t num_blocks = num_row_blocks * num_col_blocks;  // < 2^62: no overflow
  TESSERA_CHECK_ARG(num_blocks <= detail::kInt32Limit)
      << "ceil(q_len / block_rows) * ceil(kv_len / block_cols) = " << num_row_blocks << " * " << num_col_blocks
      << " = " << num_blocks << " blocks (q_len = " << q_len << ", kv_len = " << kv_len
      << ", block_rows = " << block_rows << ", block_cols = " << block_cols
      << "), expected < 2^31 (indptr and indices are int32)";

  detail::check_output_array(indptr, "indptr", DType::kI32);
  TESSERA_CHECK_ARG(indptr.shape[0] == num_row_blocks + 1)
      << "indptr.shape[0] = " << indptr.shape[0] << ", expected " << num_row_blocks + 1
      << " (ceil(q_len / block_rows) + 1 with q_len = " << q_len << ", block_rows = " << block_rows << ")";
  detail::check_output_array(indices, "indices", DType::kI32);
  check_same_device(indptr, "indptr", indices, "indices");
  TESSERA_CHECK_ARG(indices.shape[0] >= num_blocks)
      << "indices.shape[0] = " << indices.shape[0] << ", expected >= " << num_blocks
      << " (ceil(q_len / block_rows) * ceil(kv_len / block_cols): every block may be listed)";
  detail::check_output_array(block_flags, "block_flags", DType::kU8);
  check_same_device(indptr, "indptr", block_flags, "block_flags");
  TESSERA_CHECK_ARG(block_flags.shape[0] == indices.shape[0])
      << "block_flags.shape[0] = " << block_flags.shape[0] << ", expected " << indices.shape[0]
      << " (the length of indices)";

  kernels::BlockMaskArgs args{};
  detail::fill_param_slots(params, "build_block_mask", "params.", indptr, "indptr", args.mask_params);

  // ---- device ----
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device)) << " (build_block_mask)";
  TESSERA_CHECK_ARG(indptr.device.id == device)
      << "indptr.device = " << indptr.device << ", but the current CUDA device is " << device
      << ", expected the outputs on the current device";
  const detail::BlockMaskKernels fn = detail::load_kernels(mask, params, device);

  args.q_len = static_cast<int32_t>(q_len);
  args.kv_len = static_cast<int32_t>(kv_len);
  args.q_pos_offset = static_cast<int32_t>(kv_len - q_len);
  args.block_rows = static_cast<int32_t>(block_rows);
  args.block_cols = static_cast<int32_t>(block_cols);
  args.num_row_blocks = static_cast<int32_t>(num_row_blocks);
  args.num_col_blocks = static_cast<int32_t>(num_col_blocks);
  args.batch = batch;
  args.head = head;
  args.lanes_per_block = detail::block_mask_lanes_per_block(block_rows, block_cols);
  args.indptr = indptr.data_as<int32_t>();
  args.indices = indices.data_as<int32_t>();
  args.block_flags = block_flags.data_as<uint8_t>();

  // Scratch: row_counts [num_row_blocks] i32, then block_class [num_row_blocks * num_col_blocks] u8.
  const size_t counts_bytes = (static_cast<size_t>(num_row_blocks) * sizeof(int32_t) + 15) / 16 * 16;
  detail::StreamScratch scratch(counts_bytes + static_cast<size_t>(num_blocks), stream);
  args.row_counts = reinterpret_cast<int32_t*>(scratch.get());
  args.block_class = reinterpret_cast<uint8_t*>(scratch.get() + counts_bytes);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(args.row_counts, 0, static_cast<size_t>(num_row_blocks) * sizeof(int32_t),
                                     stream))
      << " (build_block_mask)";

  void* kernel_args[] = {&args};
  const CUstream cu_stream = stream;  // the runtime's and the driver's stream types are one type
  const std::string what = "build_block_mask '" + mask.function + "'";
  constexpr int64_t kWarpsPerCta = kernels::BlockMaskTraits::kClassifyThreads / 32;
  const int64_t blocks_per_cta = kWarpsPerCta * (32 / args.lanes_per_block);
  const int64_t classify_ctas = std::min((num_blocks + blocks_per_cta - 1) / blocks_per_cta, detail::kMaxGridCtas);
  jit::launch(fn.classify, static_cast<unsigned>(classify_ctas), 1, 1, kernels::BlockMaskTraits::kClassifyThreads, 0,
              cu_stream, kernel_args, what + " classify");
  jit::launch(fn.indptr, 1, 1, 1, kernels::BlockMaskTraits::kScanThreads, 0, cu_stream, kernel_args, what + " indptr");
  jit::launch(fn.compact, static_cast<unsigned>(std::min(num_row_blocks, detail::kMaxGridCtas)), 1, 1,
              kernels::BlockMaskTraits::kCompactThreads, 0, cu_stream, kernel_args, what + " compact");
}

}  // namespace tessera
