// fp8 (OCP 8-bit floating point) encode/decode written from the formats' definitions, for the
// tests' reference side: e4m3 (the finite-only "fn" flavour: bias 7, no infinities, S.1111.111 is
// NaN, largest finite 448) and e5m2 (bias 15, IEEE-style infinities and NaNs, largest finite
// 57344). Shares no code with the library (which converts with CUDA's intrinsics).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera_ref {

enum class Fp8Format { kE4M3, kE5M2 };

/// The value of an fp8 code (NaN codes: quiet NaN; e5m2 infinity codes: +-inf).
double fp8_decode(uint8_t code, Fp8Format format);

/// The code of x rounded to nearest (ties to the even code) with saturation: |x| beyond the largest
/// finite value (infinities included) becomes that value with x's sign; NaN becomes a NaN code.
uint8_t fp8_encode(double x, Fp8Format format);

/// fp8_decode(fp8_encode(x)) for each element.
std::vector<double> fp8_round(const std::vector<double>& x, Fp8Format format);

/// The largest finite value: 448 (e4m3) or 57344 (e5m2).
double fp8_max(Fp8Format format);

}  // namespace tessera_ref
