#include "src/jit/module_loader.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "src/check.h"

namespace tessera {
namespace jit {
namespace {

/// The few driver entry points the loader uses, resolved once through the runtime.
struct Driver {
  decltype(&cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&cuModuleLoadData) module_load_data = nullptr;
  decltype(&cuModuleGetFunction) module_get_function = nullptr;
  decltype(&cuGetErrorName) get_error_name = nullptr;
  decltype(&cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&cuLaunchKernel) launch_kernel = nullptr;
  decltype(&cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&cuTensorMapEncodeTiled) tensor_map_encode_tiled = nullptr;
};

template <typename F>
void resolve(const char* symbol, F* fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &ptr, CUDA_VERSION, cudaEnableDefault, &status))
      << " while looking up the driver function " << symbol;
  TESSERA_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr, StatusCode::kCudaError)
      << "the CUDA driver has no " << symbol << " (query result " << static_cast<int>(status) << ")";
  *fn = reinterpret_cast<F>(ptr);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    resolve("cuCtxGetCurrent", &r.ctx_get_current);
    resolve("cuModuleLoadData", &r.module_load_data);
    resolve("cuModuleGetFunction", &r.module_get_function);
    resolve("cuGetErrorName", &r.get_error_name);
    resolve("cuFuncSetAttribute", &r.func_set_attribute);
    resolve("cuLaunchKernel", &r.launch_kernel);
    resolve("cuLaunchKernelEx", &r.launch_kernel_ex);
    resolve("cuTensorMapEncodeTiled", &r.tensor_map_encode_tiled);
    return r;
  }();
  return d;
}

const char* result_name(CUresult result) {
  const char* name = nullptr;
  if (driver().get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  return name;
}

void check_cu(CUresult result, const char* call, const CachedKernel& kernel) {
  if (result == CUDA_SUCCESS) return;
  TESSERA_FAIL(StatusCode::kCudaError) << call << " failed for JIT kernel '" << kernel.name << "' (sm_"
                                       << kernel.arch << ", " << kernel.key << "): " << result_name(result) << " ("
                                       << static_cast<int>(result) << ")";
}

std::mutex g_mutex;
std::map<std::pair<CUcontext, std::string>, CUmodule> g_modules;  // (context, key) -> module

}  // namespace

CUmodule load_module(const CachedKernel& kernel) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  if (d.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    // No current context yet: make the runtime create (and bind) its primary context.
    TESSERA_CUDA_CHECK(cudaFree(nullptr)) << " while initialising the CUDA context for the JIT";
    check_cu(d.ctx_get_current(&ctx), "cuCtxGetCurrent", kernel);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_modules.find({ctx, kernel.key});
  if (it != g_modules.end()) return it->second;
  CUmodule module = nullptr;
  check_cu(d.module_load_data(&module, kernel.cubin.data()), "cuModuleLoadData", kernel);
  g_modules.emplace(std::make_pair(ctx, kernel.key), module);
  return module;
}

CUfunction get_function(const CachedKernel& kernel, const std::string& name_expression) {
  const std::string& lowered = kernel.lowered_name(name_expression);
  CUmodule module = load_module(kernel);
  CUfunction fn = nullptr;
  check_cu(driver().module_get_function(&fn, module, lowered.c_str()), "cuModuleGetFunction", kernel);
  return fn;
}

void set_max_dynamic_shared_memory(CUfunction fn, int bytes, const std::string& what) {
  const CUresult r = driver().func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
  TESSERA_CHECK(r == CUDA_SUCCESS, StatusCode::kCudaError)
      << "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = " << bytes << ") failed for " << what << ": "
      << result_name(r);
}

void launch(CUfunction fn, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, int smem_bytes,
            CUstream stream, void** args, const std::string& what, bool programmatic_dependent) {
  CUresult r;
  if (programmatic_dependent) {
    CUlaunchConfig config = {};
    config.gridDimX = grid_x;
    config.gridDimY = grid_y;
    config.gridDimZ = grid_z;
    config.blockDimX = block_x;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = static_cast<unsigned>(smem_bytes);
    config.hStream = stream;
    CUlaunchAttribute attribute = {};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    r = driver().launch_kernel_ex(&config, fn, args, nullptr);
  } else {
    r = driver().launch_kernel(fn, grid_x, grid_y, grid_z, block_x, 1, 1, static_cast<unsigned>(smem_bytes), stream,
                               args, nullptr);
  }
  TESSERA_CHECK(r == CUDA_SUCCESS, StatusCode::kCudaError)
      << (programmatic_dependent ? "cuLaunchKernelEx" : "cuLaunchKernel") << " failed for " << what << " (grid "
      << grid_x << " x " << grid_y << " x " << grid_z << ", " << block_x << " threads, " << smem_bytes
      << " B shared memory): " << result_name(r);
}

void encode_tiled_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, unsigned rank, const void* base,
                             const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                             CUtensorMapSwizzle swizzle, const std::string& what) {
  std::vector<cuuint32_t> element_strides(rank, 1u);
  const CUresult r = driver().tensor_map_encode_tiled(
      map, dtype, rank, const_cast<void*>(base), dims, strides, box, element_strides.data(),
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CHECK(r == CUDA_SUCCESS, StatusCode::kInternal)
      << "cuTensorMapEncodeTiled failed for " << what << ": " << result_name(r)
      << " (the caller checks the documented requirements first)";
}

}  // namespace jit
}  // namespace tessera
