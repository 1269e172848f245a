// Private helpers for raising tessera::Error from src/ with messages that name the argument, the
// offending value and what was expected (docs/design.md §4). Host code only: this header pulls in no
// CUDA header, so any translation unit of src/ may include it.
//
//   TESSERA_CHECK(page_size >= 1, StatusCode::kInvalidArgument)
//       << name << ".page_size = " << page_size << ", expected >= 1";
//   TESSERA_CHECK_ARG(q.ndim == 3) << "q.ndim = " << q.ndim << ", expected 3";
//   TESSERA_FAIL(StatusCode::kUnsupported) << "head_dim = " << d << " is not supported";
//   TESSERA_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost)) << " while reading " << name;
//   throw_error(StatusCode::kInternal, str_cat("work item ", i, " has no CTA"));
//
// The streamed operands are only evaluated when the check fails. DType, Device and Layout values
// print as their names ("bf16", "cuda:0", "NHD").
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/formats.h"
#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// An ostringstream that prints Tessera's enums by name instead of as numbers.
class Message {
 public:
  template <typename T>
  Message& operator<<(const T& value) {
    out_ << value;
    return *this;
  }
  Message& operator<<(DType t) {
    out_ << dtype_name(t);
    return *this;
  }
  Message& operator<<(const Device& d) {
    out_ << to_string(d);
    return *this;
  }
  Message& operator<<(Layout l) {
    out_ << layout_name(l);
    return *this;
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

/// Collects a status code and a message; ErrorThrower turns it into a thrown tessera::Error.
class ErrorBuilder {
 public:
  explicit ErrorBuilder(StatusCode code) : code_(code) {}
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    message_ << value;
    return *this;
  }
  StatusCode code() const { return code_; }
  std::string message() const { return message_.str(); }

 private:
  StatusCode code_;
  Message message_;
};

/// `ErrorThrower() & builder << ...`: operator& binds looser than <<, so the whole message is
/// built before the throw, and the throw happens outside any destructor.
struct ErrorThrower {
  [[noreturn]] void operator&(const ErrorBuilder& builder) const {
    throw Error(builder.code(), builder.message());
  }
};

/// Concatenates the arguments' printed forms (enums by name, as Message does).
template <typename... Args>
std::string str_cat(const Args&... args) {
  Message m;
  (void)(m << ... << args);
  return m.str();
}

[[noreturn]] inline void throw_error(StatusCode code, const std::string& message) {
  throw Error(code, message);
}

/// "[4, 16, 8, 128]"
inline std::string join_dims(const int64_t* values, int count) {
  std::string s = "[";
  for (int i = 0; i < count; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(values[i]);
  }
  return s + "]";
}

}  // namespace detail

using detail::str_cat;
using detail::throw_error;

}  // namespace tessera

// An expression, not an if-statement, so it nests under an unbraced if/else without dangling-else
// surprises.
#define TESSERA_CHECK(cond, code) \
  (cond) ? (void)0 : ::tessera::detail::ErrorThrower() & ::tessera::detail::ErrorBuilder(code)

#define TESSERA_CHECK_ARG(cond) TESSERA_CHECK(cond, ::tessera::StatusCode::kInvalidArgument)

#define TESSERA_FAIL(code) ::tessera::detail::ErrorThrower() & ::tessera::detail::ErrorBuilder(code)

// Throws kCudaError for a CUDA runtime call that did not return cudaSuccess. The including file
// must include <cuda_runtime_api.h> itself (this header stays free of CUDA headers). The runtime's
// last-error slot is cleared so that a later cudaGetLastError() after an unrelated launch does not
// report this (non-sticky) failure a second time.
#define TESSERA_CUDA_CHECK(expr)                                                                \
  for (const cudaError_t tessera_cuda_status_ = (expr); tessera_cuda_status_ != cudaSuccess;)  \
  ::tessera::detail::ErrorThrower() &                                                           \
      ((void)cudaGetLastError(), ::tessera::detail::ErrorBuilder(::tessera::StatusCode::kCudaError)) \
          << #expr << " failed: " << cudaGetErrorName(tessera_cuda_status_) << " ("             \
          << cudaGetErrorString(tessera_cuda_status_) << ")"
