#include "reference/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace tessera_ref {
namespace {

struct Layout {
  int exponent_bits, mantissa_bits, bias;
  bool has_infinity;  // e5m2: exponent all ones is inf (mantissa 0) / NaN; e4m3: only S.1111.111 is NaN
};

Layout layout_of(Fp8Format f) { return f == Fp8Format::kE4M3 ? Layout{4, 3, 7, false} : Layout{5, 2, 15, true}; }

double decode_bits(uint8_t code, const Layout& l) {
  const int sign = code >> 7;
  const int exponent = (code >> l.mantissa_bits) & ((1 << l.exponent_bits) - 1);
  const int mantissa = code & ((1 << l.mantissa_bits) - 1);
  const int all_ones = (1 << l.exponent_bits) - 1;
  double value;
  if (l.has_infinity && exponent == all_ones) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!l.has_infinity && exponent == all_ones && mantissa == (1 << l.mantissa_bits) - 1) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {  // subnormal: 0.m x 2^(1 - bias)
    value = std::ldexp(static_cast<double>(mantissa), 1 - l.bias - l.mantissa_bits);
  } else {  // normal: 1.m x 2^(e - bias)
    value = std::ldexp(static_cast<double>((1 << l.mantissa_bits) + mantissa), exponent - l.bias - l.mantissa_bits);
  }
  return sign ? -value : value;
}

}  // namespace

double fp8_decode(uint8_t code, Fp8Format format) { return decode_bits(code, layout_of(format)); }

double fp8_max(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0 : 57344.0; }

uint8_t fp8_encode(double x, Fp8Format format) {
  if (std::isnan(x)) return 0x7f;  // a NaN code of both formats
  // The non-negative finite codes ascend in value from 0x00 (0) to the largest finite one.
  static const auto finite_values = [](Fp8Format f) {
    std::vector<double> v;
    for (int code = 0; code < 0x80 && std::isfinite(fp8_decode(static_cast<uint8_t>(code), f)); ++code) {
      v.push_back(fp8_decode(static_cast<uint8_t>(code), f));
    }
    return v;
  };
  static const std::vector<double> e4m3 = finite_values(Fp8Format::kE4M3), e5m2 = finite_values(Fp8Format::kE5M2);
  const std::vector<double>& values = format == Fp8Format::kE4M3 ? e4m3 : e5m2;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= values.back()) return static_cast<uint8_t>(sign | (values.size() - 1));  // saturate
  // values[hi - 1] <= a < values[hi]: the nearer of the two, ties to the even code.
  const size_t hi = static_cast<size_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin());
  const size_t lo = hi - 1;
  const double err_lo = a - values[lo], err_hi = values[hi] - a;
  const size_t code = err_lo < err_hi ? lo : err_hi < err_lo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | code);
}

std::vector<double> fp8_round(const std::vector<double>& x, Fp8Format format) {
  // A code table makes the decode of each result a lookup.
  std::array<double, 256> table;
  for (int c = 0; c < 256; ++c) table[c] = fp8_decode(static_cast<uint8_t>(c), format);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = table[fp8_encode(x[i], format)];
  return out;
}

}  // namespace tessera_ref
