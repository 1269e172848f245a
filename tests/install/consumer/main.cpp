// Uses the installed headers and library without a GPU: builds a malformed paged cache
// description and checks that validation rejects it with a named argument.
#include <tessera/tessera.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  std::vector<int32_t> indptr = {0, 2};
  std::vector<int32_t> indices = {0, 7};  // page 7 does not exist
  std::vector<int32_t> last = {3};
  tessera::PagedKV kv;
  kv.layout = tessera::Layout::kNHD;
  kv.k = tessera::TensorView(nullptr, tessera::DType::kBF16, {4, 16, 8, 128}, tessera::Device::cpu());
  kv.v = kv.k;
  kv.k.data = kv.v.data = reinterpret_cast<void*>(0x1000);
  kv.indptr = tessera::TensorView(indptr.data(), tessera::DType::kI32, {2}, tessera::Device::cpu());
  kv.indices = tessera::TensorView(indices.data(), tessera::DType::kI32, {2}, tessera::Device::cpu());
  kv.last_page_len = tessera::TensorView(last.data(), tessera::DType::kI32, {1}, tessera::Device::cpu());
  try {
    tessera::validate_paged_kv(kv, "paged_kv");
  } catch (const tessera::Error& e) {
    if (std::strstr(e.what(), "paged_kv.indices[1]") != nullptr) {
      std::printf("tessera consumer: version %s, validation error caught: %s\n", tessera::version_string(), e.what());
      return 0;
    }
    std::printf("unexpected message: %s\n", e.what());
    return 1;
  }
  std::printf("malformed cache accepted\n");
  return 1;
}
