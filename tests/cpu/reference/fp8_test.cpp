// The fp8 reference codec (tests/reference/fp8.h) against encodings worked out by hand, so that a
// wrong reference cannot agree with a wrong kernel; and decode(encode(x)) over every code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "reference/fp8.h"

namespace {

using tessera_ref::Fp8Format;
using tessera_ref::fp8_decode;

uint8_t encode(float x, Fp8Format f) { return tessera_ref::fp8_encode(x, f); }

// The reference against encodings worked out by hand, so that a wrong reference cannot agree with a
// wrong kernel.
TEST(Fp8Reference, KnownEncodings) {
  const float inf = std::numeric_limits<float>::infinity();
  const Fp8Format e4m3 = Fp8Format::kE4M3, e5m2 = Fp8Format::kE5M2;
  EXPECT_EQ(encode(1.0f, e4m3), 0x38);     // 0.0111.000
  EXPECT_EQ(encode(-1.0f, e4m3), 0xB8);
  EXPECT_EQ(encode(1.0625f, e4m3), 0x38);  // halfway 1 .. 1.125: to even (1)
  EXPECT_EQ(encode(1.1875f, e4m3), 0x3A);  // halfway 1.125 .. 1.25: to even (1.25)
  EXPECT_EQ(encode(448.0f, e4m3), 0x7E);   // the largest finite
  EXPECT_EQ(encode(464.0f, e4m3), 0x7E);   // halfway to 480 (would be S.1111.111): 448
  EXPECT_EQ(encode(1e6f, e4m3), 0x7E);     // saturated
  EXPECT_EQ(encode(-inf, e4m3), 0xFE);
  EXPECT_EQ(encode(0.015625f, e4m3), 0x08);  // 2^-6, the smallest normal
  EXPECT_EQ(encode(0.013671875f, e4m3), 0x07);  // 7 * 2^-9, the largest subnormal
  EXPECT_EQ(encode(0.001953125f, e4m3), 0x01);  // 2^-9, the smallest subnormal
  EXPECT_EQ(encode(0.0009765625f, e4m3), 0x00);  // 2^-10: halfway to 0, to even
  EXPECT_EQ(encode(-0.0009f, e4m3), 0x80);  // below half the smallest subnormal: -0
  EXPECT_EQ(encode(0.0029296875f, e4m3), 0x02);  // 1.5 * 2^-9: halfway, to even (2)
  EXPECT_EQ(encode(0.0152f, e4m3), 0x08);  // rounds up out of the subnormals
  EXPECT_TRUE(std::isnan(fp8_decode(encode(std::nanf(""), e4m3), e4m3)));

  EXPECT_EQ(encode(1.0f, e5m2), 0x3C);     // 0.01111.00
  EXPECT_EQ(encode(-3.5f, e5m2), 0xC3);    // 1.10000.11
  EXPECT_EQ(encode(57344.0f, e5m2), 0x7B);  // the largest finite
  EXPECT_EQ(encode(61440.0f, e5m2), 0x7B);  // halfway to 65536 (infinity): saturated
  EXPECT_EQ(encode(inf, e5m2), 0x7B);
  EXPECT_EQ(encode(7.0f, e5m2), 0x47);      // 0.10001.11, exact
  EXPECT_EQ(encode(7.5f, e5m2), 0x48);      // halfway 7 .. 8: to even (8)
  EXPECT_EQ(encode(5.5f, e5m2), 0x46);      // halfway 5 .. 6: to even (6)
  EXPECT_EQ(encode(1.52587890625e-05f, e5m2), 0x01);  // 2^-16, the smallest subnormal
  EXPECT_EQ(encode(6.103515625e-05f, e5m2), 0x04);    // 2^-14, the smallest normal
  EXPECT_TRUE(std::isnan(fp8_decode(encode(std::nanf(""), e5m2), e5m2)));
}

TEST(Fp8Reference, EveryFiniteCodeRoundTrips) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    int finite = 0;
    for (int code = 0; code < 256; ++code) {
      const double v = fp8_decode(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      ++finite;
      // -0 and +0 both encode to their own sign's zero.
      EXPECT_EQ(tessera_ref::fp8_encode(v, f), code) << "code " << code;
    }
    EXPECT_EQ(finite, f == Fp8Format::kE4M3 ? 254 : 248);  // e4m3: 2 NaNs; e5m2: 2 infinities, 6 NaNs
  }
}

}  // namespace
