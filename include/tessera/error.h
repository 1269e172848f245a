// Errors. Every public entry point validates its arguments and throws tessera::Error whose
// message names the argument, the offending value and what was expected, e.g.
//   paged_kv.indices[17] = 4096 is out of range [0, 4096)
#pragma once

#include <stdexcept>
#include <string>

#include "tessera/export.h"

namespace tessera {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  ///< malformed input: shape, dtype, stride, index or value
  kUnsupported = 2,      ///< well-formed but not implemented (e.g. a head dim without a kernel)
  kCudaError = 3,        ///< the CUDA runtime or driver reported an error
  kInternal = 4,         ///< a bug in Tessera
};

TESSERA_API const char* status_code_name(StatusCode code);

/// A result code plus message; `ok()` when code == kOk.
struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;
  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

/// The exception every public Tessera function throws on failure.
class TESSERA_API Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }
  Status status() const { return Status{code_, what()}; }

 private:
  StatusCode code_;
};

/// Runs fn(context) and returns what it threw as a Status: a tessera::Error with its code, any other
/// std::exception as kInternal. Defined inside libtessera, so an exception is caught by the C++
/// runtime that threw it. Language bindings call the library through it so that no C++ exception
/// crosses the library boundary: a process can hold two C++ runtimes (e.g. a libtessera built by a
/// compiler that links libstdc++ statically, next to the libstdc++ PyTorch loads), and an
/// exception thrown by one and caught by the other crashes the process.
TESSERA_API Status call_catching(void (*fn)(void* context), void* context) noexcept;

/// Runs `f` and converts a thrown tessera::Error into a Status (for callers that avoid exceptions).
template <typename F>
Status status_of(F&& f) {
  try {
    f();
    return Status::Ok();
  } catch (const Error& e) {
    return e.status();
  }
}

}  // namespace tessera
