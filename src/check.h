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
#include <utility>

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
  /// Text that ends the message, after everything streamed into it (e.g. what to do about it).
  ErrorBuilder& set_suffix(std::string suffix) {
    suffix_ = std::move(suffix);
    return *this;
  }
  StatusCode code() const { return code_; }
  std::string message() const { return message_.str() + suffix_; }

 private:
  StatusCode code_;
  Message message_;
  std::string suffix_;
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

/// The error of a CUDA runtime call `expr` that returned `status` (a cudaError_t: this header stays
/// free of CUDA headers), as TESSERA_CUDA_CHECK raises it: "<expr> failed: cudaErrorX (what the
/// runtime says)". When the status means that the process cannot use a GPU at all (no driver, a
/// driver older than the CUDA runtime, no device), the message starts with "no CUDA driver:" or
/// "no CUDA device:" and ends with what to do, so that a user on a machine without a GPU reads
/// that first rather than a CUDA error name. Defined in src/cuda_utils.cpp.
ErrorBuilder cuda_error(int status, const char* expr);

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

// Throws kCudaError for a CUDA runtime call that did not return cudaSuccess, with cuda_error's
// message; what is streamed after the macro (the context) goes in before cuda_error's advice on a
// machine without a GPU. The including file must include <cuda_runtime_api.h> itself. The runtime's
// last-error slot is cleared so that a later cudaGetLastError() after an unrelated launch does not
// report this (non-sticky) failure a second time.
#define TESSERA_CUDA_CHECK(expr)                                                               \
  for (const cudaError_t tessera_cuda_status_ = (expr); tessera_cuda_status_ != cudaSuccess;) \
  ::tessera::detail::ErrorThrower() &                                                          \
      ((void)cudaGetLastError(), ::tessera::detail::cuda_error(tessera_cuda_status_, #expr))
