// The kernel headers (kernels/**/*.cuh) compiled into libtessera, so that JIT compilation needs
// no source tree at run time. cmake/TesseraJit.cmake generates the definitions
// (<build>/src/jit/embedded_headers.cpp) from the headers at build time and regenerates them when
// a header changes; each header's text is stored byte for byte under its include name, e.g.
// "kernels/attention/prefill.cuh", and handed to NVRTC as an in-memory header.
#pragma once

#include <cstddef>

namespace tessera {
namespace jit {

struct EmbeddedHeader {
  const char* name;            ///< include name: "kernels/common/platform.cuh"
  const unsigned char* bytes;  ///< the file's bytes, NUL-terminated
  std::size_t size;            ///< bytes of the file, without the terminating NUL

  const char* text() const { return reinterpret_cast<const char*>(bytes); }
};

/// Every embedded header, sorted by name.
extern const EmbeddedHeader kEmbeddedHeaders[];
extern const std::size_t kNumEmbeddedHeaders;

/// The header with include name `name`, or nullptr.
const EmbeddedHeader* find_embedded_header(const char* name);

}  // namespace jit
}  // namespace tessera
