// SHA-256 (FIPS 180-4), written here so the JIT cache needs no crypto dependency. The kernel cache
// uses it for its keys (docs/design.md §7) and to check cache files for corruption. It is not used for
// anything security-related beyond that: whoever can write the cache directory can run code on
// the GPU anyway.
//
// Checking a cached CUBIN (~300 KB) is most of a warm JIT load's host time, so on x86-64 CPUs with
// the SHA extensions the compression runs on them (several times the portable code's rate); the
// portable engine stays for every other CPU and as the tests' cross-check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {
namespace jit {

/// Which implementation of the compression function a Sha256 object runs.
enum class Sha256Engine {
  kPortable,  ///< plain C++, any CPU
  kX86Sha,    ///< x86-64 SHA extensions (SHA-NI, with SSSE3 and SSE4.1), where the CPU has them
};

/// The engine Sha256() uses: kX86Sha where available, else kPortable.
Sha256Engine default_sha256_engine();
/// Whether this build and this CPU can run `engine`.
bool sha256_engine_available(Sha256Engine engine);

class Sha256 {
 public:
  Sha256();
  /// Throws tessera::Error (kInvalidArgument) when `engine` is not available here.
  explicit Sha256(Sha256Engine engine);
  Sha256& update(const void* data, std::size_t size);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  /// Appends `s` as an unambiguous field: its length as 8 little-endian bytes, then its bytes,
  /// so that ("ab", "c") and ("a", "bc") hash differently.
  Sha256& field(std::string_view s);
  /// The 32-byte digest as 64 lowercase hex digits. The object must not be updated afterwards.
  std::string hex_digest();

 private:
  using CompressFn = void (*)(uint32_t* state, const unsigned char* blocks, std::size_t count);
  CompressFn compress_;
  uint32_t h_[8];
  unsigned char buf_[64];
  std::size_t buf_len_ = 0;
  uint64_t total_ = 0;
  bool finished_ = false;
};

/// SHA-256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace jit
}  // namespace tessera
