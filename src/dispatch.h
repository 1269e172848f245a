// The one mapping from tessera::DType to the device element types kernels are instantiated for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "tessera/dtype.h"
#include "tessera/error.h"

/// Runs the statement list with `T` bound to the element type of a floating `dtype` (f16, bf16,
/// f32); any other dtype is an error naming `arg_name`.
#define TESSERA_DISPATCH_FLOAT_DTYPE(dtype, arg_name, T, ...)                                   \
  [&] {                                                                                         \
    switch (dtype) {                                                                            \
      case ::tessera::DType::kF16: { using T = __half; return __VA_ARGS__(); }                  \
      case ::tessera::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }          \
      case ::tessera::DType::kF32: { using T = float; return __VA_ARGS__(); }                   \
      default:                                                                                  \
        throw ::tessera::Error(::tessera::StatusCode::kUnsupported,                             \
                               std::string(arg_name) + ".dtype = " + ::tessera::dtype_name(dtype) + \
                                   ", expected one of {f16, bf16, f32}");                       \
    }                                                                                           \
  }()

/// The same for the 16-bit types attention operands use (f16, bf16).
#define TESSERA_DISPATCH_HALF_DTYPE(dtype, arg_name, T, ...)                                    \
  [&] {                                                                                         \
    switch (dtype) {                                                                            \
      case ::tessera::DType::kF16: { using T = __half; return __VA_ARGS__(); }                  \
      case ::tessera::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }          \
      default:                                                                                  \
        throw ::tessera::Error(::tessera::StatusCode::kUnsupported,                             \
                               std::string(arg_name) + ".dtype = " + ::tessera::dtype_name(dtype) + \
                                   ", expected one of {f16, bf16}");                            \
    }                                                                                           \
  }()
