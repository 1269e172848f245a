// Division by a divisor that is fixed for a launch (page size, column-block width) as one
// 32 x 32 -> 64-bit multiply and a shift, instead of the ~20-instruction integer division the
// GPU otherwise runs: the loaders divide every KV row's position by it (measured: the block-sparse
// producer with a runtime block width lost 5% of W3 causal throughput to those divisions,
// bench/results/LOG.md, session 27).
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// n / d for 0 <= n < 2^31 and 1 <= d < 2^31, exactly. With l = ceil(log2 d), s = 31 + l and
/// m = ceil(2^s / d) (< 2^32 because 2^l < 2d): n * m / 2^s = n / d + n * e / 2^s with
/// 0 <= e < 1, and n * e / 2^s < 2^(31 - s) = 2^-l <= 1 / d, too little to cross the next
/// multiple of 1 / d, so the floor is n / d's.
struct FastDivisor {
  uint32_t multiplier;
  uint32_t shift;
  int32_t divisor;

  /// Built on the host (d outside [1, 2^31) gives the divisor 1; callers validate first).
  static TESSERA_HOST_DEVICE FastDivisor make(int64_t d) {
    FastDivisor f;
    f.divisor = (d >= 1 && d < (int64_t{1} << 31)) ? static_cast<int32_t>(d) : 1;
    uint32_t l = 0;
    while ((int64_t{1} << l) < f.divisor) ++l;
    f.shift = 31 + l;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << f.shift) + static_cast<uint64_t>(f.divisor) - 1) /
                                         static_cast<uint64_t>(f.divisor));
    return f;
  }
  /// n / divisor for 0 <= n < 2^31.
  TESSERA_HOST_DEVICE int32_t div(int32_t n) const {
    return static_cast<int32_t>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * multiplier) >> shift);
  }
  /// n % divisor for 0 <= n < 2^31, given q = div(n).
  TESSERA_HOST_DEVICE int32_t mod(int32_t n, int32_t q) const { return n - q * divisor; }
};

}  // namespace kernels
}  // namespace tessera
