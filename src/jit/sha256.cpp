#include "src/jit/sha256.h"

#include <cstring>

#include "src/check.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TESSERA_SHA256_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define TESSERA_SHA256_X86 0
#endif

namespace tessera {
namespace jit {
namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress_portable(uint32_t* state, const unsigned char* p, std::size_t count) {
  for (; count > 0; --count, p += 64) {
    uint32_t w[64];  // the message schedule
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) |
             uint32_t{p[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

#if TESSERA_SHA256_X86
bool cpu_has_x86_sha() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = (c & (1u << 9)) != 0, sse41 = (c & (1u << 19)) != 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = (b & (1u << 29)) != 0;
  return ssse3 && sse41 && sha;
}

// The SHA extensions keep the eight working variables in two registers, ABEF and CDGH (A and C in
// the top lane), and the message schedule as four registers of four words (the first word in the
// bottom lane). sha256rnds2 runs two rounds and returns the new ABEF; the old ABEF becomes CDGH, so
// the two state registers trade roles after every call.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_x86_sha(uint32_t* state, const unsigned char* p,
                                                                  std::size_t count) {
  // Reverses the bytes of each 32-bit word: message words are big-endian.
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  const __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));      // [A B C D]
  const __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));  // [E F G H]
  const __m128i badc = _mm_shuffle_epi32(dcba, 0xB1);                                 // [B A D C]
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);                                 // [H G F E]
  __m128i abef = _mm_alignr_epi8(badc, efgh, 8);                                      // [F E B A]
  __m128i cdgh = _mm_blend_epi16(efgh, badc, 0xF0);                                   // [H G D C]
  for (; count > 0; --count, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];  // W[4j .. 4j+3] for the 4-round group j, in w[j % 4]
#pragma GCC unroll 16  // constant indices keep w[] in registers
    for (int j = 0; j < 16; ++j) {
      __m128i& wj = w[j & 3];
      if (j < 4) {
        wj = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j)), kByteSwap);
      } else {
        // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16]: msg1 adds s0 to W[t-16], the
        // alignr supplies W[t-7], msg2 adds s1 (chained through the two new words).
        const __m128i prev1 = w[(j + 3) & 3], prev2 = w[(j + 2) & 3], prev3 = w[(j + 1) & 3];
        const __m128i t = _mm_add_epi32(_mm_sha256msg1_epu32(wj, prev3), _mm_alignr_epi8(prev1, prev2, 4));
        wj = _mm_sha256msg2_epu32(t, prev1);
      }
      __m128i wk = _mm_add_epi32(wj, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * j)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);  // rounds 4j, 4j+1: cdgh now holds ABEF
      wk = _mm_shuffle_epi32(wk, 0x0E);              // the upper two words
      abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);  // rounds 4j+2, 4j+3: back in place
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  // [A B E F]
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);  // [G H C D]
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(feba, dchg, 0xF0));  // [A B C D]
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(dchg, feba, 8));  // [E F G H]
}
#endif

using CompressFn = void (*)(uint32_t* state, const unsigned char* blocks, std::size_t count);

CompressFn compress_for(Sha256Engine engine) {
#if TESSERA_SHA256_X86
  if (engine == Sha256Engine::kX86Sha) return compress_x86_sha;
#endif
  return compress_portable;
}

const char* engine_name(Sha256Engine engine) {
  return engine == Sha256Engine::kX86Sha ? "x86 SHA extensions" : "portable";
}

}  // namespace

bool sha256_engine_available(Sha256Engine engine) {
  if (engine == Sha256Engine::kPortable) return true;
#if TESSERA_SHA256_X86
  static const bool has_sha = cpu_has_x86_sha();
  return engine == Sha256Engine::kX86Sha && has_sha;
#else
  return false;
#endif
}

Sha256Engine default_sha256_engine() {
  static const Sha256Engine engine =
      sha256_engine_available(Sha256Engine::kX86Sha) ? Sha256Engine::kX86Sha : Sha256Engine::kPortable;
  return engine;
}

Sha256::Sha256() : Sha256(default_sha256_engine()) {}

Sha256::Sha256(Sha256Engine engine)
    : compress_(compress_for(engine)),
      h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {
  TESSERA_CHECK_ARG(sha256_engine_available(engine))
      << "Sha256 engine '" << engine_name(engine) << "' is not available in this build or on this CPU";
}

Sha256& Sha256::update(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buf_len_ > 0) {
    const std::size_t take = size < 64 - buf_len_ ? size : 64 - buf_len_;
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    size -= take;
    if (buf_len_ < 64) return *this;
    compress_(h_, buf_, 1);
    buf_len_ = 0;
  }
  if (size >= 64) {
    compress_(h_, p, size / 64);
    p += size / 64 * 64;
    size %= 64;
  }
  std::memcpy(buf_, p, size);
  buf_len_ = size;
  return *this;
}

Sha256& Sha256::field(std::string_view s) {
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(s.size()) >> (8 * i));
  update(len, sizeof(len));
  return update(s);
}

std::string Sha256::hex_digest() {
  if (!finished_) {
    const uint64_t bits = total_ * 8;
    const unsigned char pad = 0x80;
    update(&pad, 1);
    const unsigned char zero = 0;
    while (buf_len_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, sizeof(len));
    finished_ = true;
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint32_t v : h_) {
    for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kHex[(v >> shift) & 0xf]);
  }
  return out;
}

std::string sha256_hex(std::string_view data) { return Sha256().update(data).hex_digest(); }

}  // namespace jit
}  // namespace tessera
