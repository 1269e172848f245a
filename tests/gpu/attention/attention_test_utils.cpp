#include "gpu/attention/attention_test_utils.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <stdexcept>
#include <utility>

namespace tessera_test {
namespace attn {

std::vector<std::vector<uint8_t>> tree_masks(const std::vector<int64_t>& qo_len, const std::vector<int64_t>& kv_len,
                                             std::mt19937_64& rng) {
  std::vector<std::vector<uint8_t>> masks(qo_len.size());
  for (size_t b = 0; b < qo_len.size(); ++b) {
    const int64_t qo = qo_len[b], kv = kv_len[b], prefix = kv - qo;
    masks[b].assign(static_cast<size_t>(qo * kv), 0);
    std::vector<int64_t> parent(qo, -1);
    for (int64_t i = 1; i < qo; ++i) {
      parent[i] = std::uniform_int_distribution<int64_t>(std::max<int64_t>(0, i - 4), i - 1)(rng);
    }
    for (int64_t i = 0; i < qo; ++i) {
      for (int64_t j = 0; j < kv; ++j) masks[b][i * kv + j] = j < prefix;
      for (int64_t a = i; a >= 0; a = parent[a]) {
        if (prefix + a >= 0 && prefix + a < kv) masks[b][i * kv + prefix + a] = 1;
      }
    }
  }
  return masks;
}

PackedMasks pack_masks(const std::vector<std::vector<uint8_t>>& masks, std::mt19937_64& rng) {
  PackedMasks p;
  p.byte_indptr = {0};
  for (const std::vector<uint8_t>& m : masks) {
    const size_t n = m.size(), start = p.bytes.size(), nbytes = (n + 7) / 8;
    p.bytes.resize(start + nbytes, 0);
    for (size_t e = 0; e < nbytes * 8; ++e) {
      const bool bit = e < n ? m[e] != 0 : (rng() & 1) != 0;
      if (bit) p.bytes[start + e / 8] |= static_cast<uint8_t>(1u << (e % 8));
    }
    p.byte_indptr.push_back(static_cast<int32_t>(p.bytes.size()));
  }
  return p;
}


using tessera::DecodeKernel;
using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::TensorView;

double lse_tolerance(DType dtype) { return dtype == DType::kBF16 ? 8e-3 : 1e-3; }

tessera_ref::Layout ref_layout(Layout layout) {
  return layout == Layout::kNHD ? tessera_ref::Layout::NHD : tessera_ref::Layout::HND;
}

std::vector<double> nhd_to_hnd(const std::vector<double>& x, int64_t len, int64_t heads, int64_t dim) {
  std::vector<double> out(x.size());
  for (int64_t n = 0; n < len; ++n)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(x.begin() + (n * heads + h) * dim, dim, out.begin() + (h * len + n) * dim);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Device tensors.

namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) { return padded_strides(shape, 0, 0); }

/// Elements a buffer needs for a view of `shape` with `strides`.
int64_t span_elements(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (product(shape) == 0) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}

/// Calls f(logical_index, buffer_offset) for every element, row-major.
void for_each_element(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      const std::function<void(int64_t, int64_t)>& f) {
  const int64_t total = product(shape);
  if (total == 0) return;
  const int n = static_cast<int>(shape.size());
  std::vector<int64_t> idx(n, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (int d = n - 1; d >= 0; --d) {
      ++idx[d];
      off += strides[d];
      if (idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

std::vector<int64_t> padded_strides(const std::vector<int64_t>& shape, int64_t inner_pad, int64_t outer_pad) {
  const size_t n = shape.size();
  std::vector<int64_t> strides(n, 1);
  if (n >= 2) {
    strides[n - 2] = shape[n - 1] + inner_pad;
    for (size_t d = n - 2; d-- > 0;) strides[d] = strides[d + 1] * shape[d + 1];
    strides[0] += outer_pad;
  }
  return strides;
}

TensorView make_view(void* data, DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
  }
  t.device = Device::cuda(0);
  return t;
}

DeviceTensor upload_tensor(DType dtype, const std::vector<double>& values, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides_in, double pad_fill) {
  if (static_cast<int64_t>(values.size()) != product(shape)) throw std::runtime_error("upload_tensor: size mismatch");
  const std::vector<int64_t> strides = strides_in.empty() ? contiguous_strides(shape) : strides_in;
  DeviceTensor t;
  if (strides == contiguous_strides(shape)) {
    t.buf = upload_as(dtype, values);
  } else {
    std::vector<double> image(span_elements(shape, strides), pad_fill);
    for_each_element(shape, strides, [&](int64_t i, int64_t off) { image[off] = values[i]; });
    t.buf = upload_as(dtype, image);
  }
  t.view = make_view(t.buf.get(), dtype, shape, strides);
  return t;
}

DeviceTensor make_output(DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides_in) {
  const std::vector<int64_t> strides = strides_in.empty() ? contiguous_strides(shape) : strides_in;
  DeviceTensor t;
  const int64_t span = span_elements(shape, strides);
  t.image.assign(span, kPadSentinel);
  t.covered.assign(span, 0);
  for_each_element(shape, strides, [&](int64_t, int64_t off) {
    t.image[off] = kNaN;
    t.covered[off] = 1;
  });
  if (strides == contiguous_strides(shape)) {
    t.buf = DeviceBuffer(span * tessera::dtype_size(dtype));
    t.buf.poison();
  } else {
    t.buf = upload_as(dtype, t.image);
  }
  t.view = make_view(t.buf.get(), dtype, shape, strides);
  return t;
}

std::vector<double> read_tensor(const DeviceTensor& t) {
  std::vector<int64_t> shape(t.view.shape, t.view.shape + t.view.ndim);
  std::vector<int64_t> strides(t.view.strides, t.view.strides + t.view.ndim);
  const auto all = download_as(t.view.dtype, t.buf.get(), span_elements(shape, strides));
  std::vector<double> out(product(shape));
  for_each_element(shape, strides, [&](int64_t i, int64_t off) { out[i] = all[off]; });
  return out;
}

size_t padding_changes(const DeviceTensor& t) {
  if (t.image.empty()) return 0;
  const auto all = download_as(t.view.dtype, t.buf.get(), t.image.size());
  size_t changed = 0;
  for (size_t i = 0; i < all.size(); ++i) changed += !t.covered[i] && all[i] != kPadSentinel;
  return changed;
}

std::vector<unsigned char> read_bytes(const DeviceTensor& t) {
  std::vector<unsigned char> bytes(t.buf.bytes());
  t.buf.download(bytes.data(), bytes.size());
  return bytes;
}

TensorView i32_view(const DeviceBuffer& buf, int64_t n) {
  return TensorView(buf.get(), DType::kI32, {n}, Device::cuda(0));
}

// ---------------------------------------------------------------------------------------------
// Paged caches and ragged packing.

DevicePaged upload_paged(DType dtype, const tessera_ref::PagedCache& cache, Layout layout, bool combined,
                         int64_t page_pad, int64_t slot_pad) {
  DevicePaged d;
  const int64_t P = cache.num_pages, ps = cache.page_size, H = cache.num_kv_heads, D = cache.head_dim,
                Dv = cache.value_dim();
  const bool nhd = layout == Layout::kNHD;
  const int64_t a = nhd ? ps : H, b = nhd ? H : ps;
  d.indptr = upload_i32(cache.indptr);
  d.indices = upload_i32(cache.indices);
  d.last_page_len = upload_i32(cache.last_page_len);
  const TensorView indptr = i32_view(d.indptr, static_cast<int64_t>(cache.indptr.size()));
  const TensorView indices = i32_view(d.indices, static_cast<int64_t>(cache.indices.size()));
  const TensorView last = i32_view(d.last_page_len, static_cast<int64_t>(cache.last_page_len.size()));
  if (!combined) {
    const std::vector<int64_t> shape = {P, a, b, D}, v_shape = {P, a, b, Dv};
    d.k = upload_tensor(dtype, cache.k_pages, shape, padded_strides(shape, slot_pad, page_pad));
    d.v = upload_tensor(dtype, cache.v_pages, v_shape, padded_strides(v_shape, slot_pad, page_pad));
    d.view.k = d.k.view;
    d.view.v = d.v.view;
    d.view.layout = layout;
    d.view.indptr = indptr;
    d.view.indices = indices;
    d.view.last_page_len = last;
  } else {
    if (Dv != D) throw std::invalid_argument("upload_paged: a combined K/V tensor needs equal head dims");
    const int64_t page_elems = a * b * D;
    std::vector<double> both(2 * P * page_elems);
    for (int64_t p = 0; p < P; ++p) {
      std::copy_n(cache.k_pages.begin() + p * page_elems, page_elems, both.begin() + (2 * p) * page_elems);
      std::copy_n(cache.v_pages.begin() + p * page_elems, page_elems, both.begin() + (2 * p + 1) * page_elems);
    }
    const std::vector<int64_t> shape = {P, 2, a, b, D};
    d.kv = upload_tensor(dtype, both, shape, padded_strides(shape, slot_pad, page_pad));
    d.view = tessera::PagedKV::from_combined(d.kv.view, layout, indptr, indices, last);
  }
  return d;
}

Packed pack_rows(const std::vector<std::vector<double>>& parts, int64_t row_elems) {
  Packed p;
  p.indptr.push_back(0);
  for (const auto& part : parts) {
    p.values.insert(p.values.end(), part.begin(), part.end());
    p.indptr.push_back(p.indptr.back() + static_cast<int32_t>(static_cast<int64_t>(part.size()) / row_elems));
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

void expect_matches_oracle(DType dtype, const std::vector<double>& o, const std::vector<double>* lse,
                           const tessera_ref::State& ref, const std::string& what, double rel_tolerance_o,
                           double lse_tolerance_override) {
  ASSERT_EQ(o.size(), ref.o.size()) << what;
  const double rel = tessera_ref::rel_error(o, ref.o);
  const double max_abs = tessera_ref::max_abs_error(o, ref.o);
  EXPECT_LE(rel, rel_tolerance_o > 0 ? rel_tolerance_o : rel_tolerance(dtype)) << what << ": o relative error ||o - ref|| / ||ref|| (max abs error "
                                       << max_abs << ")";
  // (row, head) pairs that see no key: o exactly 0, lse -inf.
  const int64_t D = ref.head_dim;
  size_t empty = 0, bad_o = 0, bad_lse = 0;
  for (size_t r = 0; r < ref.lse.size(); ++r) {
    if (!(std::isinf(ref.lse[r]) && ref.lse[r] < 0)) continue;
    ++empty;
    for (int64_t d = 0; d < D; ++d) {
      if (o[r * D + d] != 0.0) {
        ++bad_o;
        break;
      }
    }
    if (lse != nullptr && !((*lse)[r] == -kInf)) ++bad_lse;
  }
  EXPECT_EQ(bad_o, 0u) << what << ": of " << empty << " (row, head) pairs that see no key, these have o != 0";
  if (lse != nullptr) {
    ASSERT_EQ(lse->size(), ref.lse.size()) << what;
    const double lse_err = tessera_ref::max_abs_error(*lse, tessera_ref::lse_natural_to_log2(ref.lse));
    EXPECT_LE(lse_err, lse_tolerance_override > 0 ? lse_tolerance_override : lse_tolerance(dtype))
        << what << ": base-2 lse max abs error";
    EXPECT_EQ(bad_lse, 0u) << what << ": of " << empty
                           << " (row, head) pairs that see no key, these have lse != -inf";
  }
}

// ---------------------------------------------------------------------------------------------
// Case lists.

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Deals the values of an axis in rounds, each round a fresh permutation (the same on every
/// platform), so every value appears equally often and in varied combination with other axes.
class Deck {
 public:
  Deck(std::vector<int64_t> values, uint64_t seed) : values_(std::move(values)), state_(seed) {}

  int64_t next() {
    return next_if([](int64_t) { return true; });
  }
  /// The next value of the round that satisfies `pred` (moved forward); if none of the round's
  /// remaining values does, any value that does (the round is left as is).
  template <typename P>
  int64_t next_if(P pred) {
    if (pos_ == order_.size()) refill();
    for (size_t i = pos_; i < order_.size(); ++i) {
      if (pred(order_[i])) {
        std::swap(order_[pos_], order_[i]);
        return order_[pos_++];
      }
    }
    const size_t start = static_cast<size_t>(splitmix64(state_) % values_.size());
    for (size_t i = 0; i < values_.size(); ++i) {
      const int64_t v = values_[(start + i) % values_.size()];
      if (pred(v)) return v;
    }
    throw std::logic_error("Deck: no value satisfies the constraint");
  }

 private:
  void refill() {
    order_ = values_;
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[splitmix64(state_) % i]);
    pos_ = 0;
  }

  std::vector<int64_t> values_;
  std::vector<int64_t> order_;
  size_t pos_ = 0;
  uint64_t state_;
};

constexpr double kMaxKvElements = 3.2e7;  // host memory: K of one case, in doubles (256 MB)

/// Shrinks a case (KV heads, batch, head_dim, in that order) until it fits the budgets.
void fit(AttentionCase& c, double budget) {
  while (oracle_cost(c) > budget || kv_elements(c) > kMaxKvElements) {
    if (c.num_kv_heads > 1) --c.num_kv_heads;
    else if (c.batch > 7) c.batch = 7;
    else if (c.head_dim > 128) c.head_dim = 128;
    else if (c.batch > 1) c.batch = 1;
    else if (c.head_dim > 64) c.head_dim = 64;
    else break;
  }
}

void fit(BlockSparseCase& c, double budget) {
  while (oracle_cost(c) > budget) {
    if (c.num_kv_heads > 1) --c.num_kv_heads;
    else if (c.head_dim > 128) c.head_dim = 128;
    else if (c.head_dim > 64) c.head_dim = 64;
    else break;
  }
}

template <typename Case, typename NameFn>
void make_names_unique(std::vector<Case>& cases, NameFn name) {
  std::set<std::string> seen;
  for (auto& c : cases) {
    for (int k = 2; seen.count(name(c)); ++k) c.tag = "_v" + std::to_string(k);
    seen.insert(name(c));
  }
}

DType dtype_of(int64_t i) { return i ? DType::kBF16 : DType::kF16; }

double visible_pairs(double qo, double kv, bool causal) {
  if (!causal) return qo * kv;
  return qo * (kv - qo) + qo * (qo + 1) / 2;  // qo <= kv
}

}  // namespace

std::string case_name(const AttentionCase& c) {
  std::string s;
  switch (c.entry) {
    case Entry::kSingle: s = std::string("single_") + tessera::layout_name(c.layout); break;
    case Entry::kRagged: s = "ragged"; break;
    case Entry::kPaged: s = std::string("paged_") + tessera::layout_name(c.layout); break;
  }
  if (c.decode) {
    switch (c.kernel) {
      case DecodeKernel::kCudaCores: s += "_cudacores"; break;
      case DecodeKernel::kTensorCores: s += "_tensorcores"; break;
      case DecodeKernel::kAuto: s += "_auto"; break;
    }
  }
  s += std::string("_") + tessera::dtype_name(c.dtype);
  if (c.fp8_q) s += "_fp8q";
  if (c.fp8 != Fp8KV::kNone) {
    s += std::string("_kv") + tessera::dtype_name(c.kv_dtype());
    s += c.kv_scales == KVScaleMode::kHost ? "_hostscale" : c.kv_scales == KVScaleMode::kDevice ? "_devscale" : "_headscale";
  }
  if (c.entry != Entry::kSingle) s += "_b" + std::to_string(c.batch);
  if (!c.decode) s += "_qo" + std::to_string(c.qo_len);
  s += "_kv" + std::to_string(c.kv_len);
  if (c.entry == Entry::kPaged) s += "_p" + std::to_string(c.page_size);
  s += "_g" + std::to_string(c.group) + "_hkv" + std::to_string(c.num_kv_heads) + "_d" + std::to_string(c.head_dim);
  if (c.value_dim() != c.head_dim) s += "x" + std::to_string(c.value_dim());
  if (c.causal) s += "_causal";
  if (c.entry == Entry::kPaged && c.combined_kv) s += "_combined";
  if (c.entry == Entry::kPaged && c.nan_unused) s += "_nanpad";
  if (c.strided) s += "_strided";
  if (!c.with_lse) s += "_nolse";
  if (c.sm_scale >= 0) s += "_scaled";
  if (c.loose_max_qo) s += "_loosemax";
  s += variant_suffix(c.variant);
  s += c.tag;
  if (c.sanitize) s += "_sanitize";
  return s;
}

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << case_name(c); }

double oracle_cost(const AttentionCase& c) {
  const double heads = static_cast<double>(c.num_qo_heads() * c.head_dim);
  const double qo = static_cast<double>(c.qo_len), kv = static_cast<double>(c.kv_len);
  // Request 0 at the maximum; the others' lengths are uniform in [0, max] (see request_lengths).
  const double first = visible_pairs(qo, kv, c.causal);
  const double rest = c.decode ? kv / 2 : (c.causal ? 0.6 : 1.0) * ((qo + 1) / 2) * (kv / 2);
  return heads * (first + static_cast<double>(c.batch - 1) * rest);
}

double kv_elements(const AttentionCase& c) {
  return static_cast<double>(c.num_kv_heads * c.head_dim) * static_cast<double>(c.kv_len) *
         (1.0 + static_cast<double>(c.batch - 1) / 2);
}

std::vector<AttentionCase> decode_cases() {
  std::vector<AttentionCase> cases;
  Deck dtype({0, 1}, 11), dim({64, 96, 128, 256}, 12), kv({0, 1, 15, 512, 2049, 16384}, 13), batch({1, 7, 64}, 14),
      page({1, 3, 16, 64}, 15), layout({0, 1}, 16), hkv({1, 2, 3}, 17), strided({1, 0, 0, 0, 0}, 18),
      nolse({1, 0, 0, 0, 0, 0, 0}, 19), causal({1, 0, 0, 0}, 20), scaled({1, 0, 0, 0, 0, 0}, 21),
      combined({0, 1}, 22), nan_unused({1, 0}, 23);
  for (int e = 0; e < 4; ++e) {
    for (DecodeKernel kernel : {DecodeKernel::kCudaCores, DecodeKernel::kTensorCores, DecodeKernel::kAuto}) {
      for (int64_t group : {1, 4, 5, 7, 8}) {
        AttentionCase c;
        c.decode = true;
        c.entry = e < 2 ? Entry::kSingle : e == 2 ? Entry::kRagged : Entry::kPaged;
        c.kernel = kernel;
        c.group = group;
        c.dtype = dtype_of(dtype.next());
        c.layout = e == 1 ? Layout::kHND : e == 3 && layout.next() ? Layout::kHND : Layout::kNHD;
        c.qo_len = 1;
        c.kv_len = kv.next();
        // Batch 64 with up to 2049 keys per request; 16384 keys with batch <= 7.
        c.batch = c.entry == Entry::kSingle ? 1 : batch.next_if([&](int64_t b) { return b < 64 || c.kv_len <= 2049; });
        if (c.entry == Entry::kPaged) {
          c.page_size = page.next();
          c.combined_kv = combined.next();
          c.nan_unused = nan_unused.next();
        }
        c.num_kv_heads = hkv.next();
        c.head_dim = dim.next();
        c.strided = strided.next();
        c.with_lse = !nolse.next();
        c.causal = causal.next() && c.kv_len > 0;
        if (scaled.next()) c.sm_scale = 0.3;
        fit(c, 4e8);
        cases.push_back(c);
      }
    }
  }
  // MQA and the largest GQA groups at a long context, both kernel families.
  for (DecodeKernel kernel : {DecodeKernel::kCudaCores, DecodeKernel::kTensorCores}) {
    AttentionCase c;
    c.decode = true;
    c.entry = Entry::kPaged;
    c.kernel = kernel;
    c.dtype = kernel == DecodeKernel::kCudaCores ? DType::kBF16 : DType::kF16;
    c.layout = kernel == DecodeKernel::kCudaCores ? Layout::kHND : Layout::kNHD;
    c.batch = 7;
    c.kv_len = 16384;
    c.page_size = 16;
    c.num_kv_heads = 1;
    c.group = 8;
    c.head_dim = 128;
    c.nan_unused = true;
    cases.push_back(c);
  }
  // The compute-sanitizer subset: small, one per entry point and kernel family, with the odd
  // shapes (page size 3, NaN page tails, combined K/V, group 5 and 7, empty requests, strides).
  auto small = [](Entry entry, DecodeKernel kernel, Layout layout, DType dtype, int64_t batch, int64_t kv_len,
                  int64_t page_size, int64_t hkv, int64_t group, int64_t dim) {
    AttentionCase c;
    c.decode = true;
    c.entry = entry;
    c.kernel = kernel;
    c.layout = layout;
    c.dtype = dtype;
    c.batch = batch;
    c.kv_len = kv_len;
    c.page_size = page_size;
    c.num_kv_heads = hkv;
    c.group = group;
    c.head_dim = dim;
    c.sanitize = true;
    return c;
  };
  AttentionCase s1 = small(Entry::kPaged, DecodeKernel::kCudaCores, Layout::kNHD, DType::kF16, 7, 37, 3, 2, 5, 128);
  s1.nan_unused = true;
  AttentionCase s2 = small(Entry::kPaged, DecodeKernel::kTensorCores, Layout::kHND, DType::kBF16, 7, 37, 3, 1, 7, 64);
  s2.nan_unused = true;
  s2.combined_kv = true;
  s2.strided = true;
  AttentionCase s3 = small(Entry::kRagged, DecodeKernel::kTensorCores, Layout::kNHD, DType::kF16, 5, 20, 0, 2, 4, 256);
  AttentionCase s4 = small(Entry::kSingle, DecodeKernel::kCudaCores, Layout::kHND, DType::kBF16, 1, 15, 0, 1, 1, 128);
  s4.strided = true;
  // 64 x 3 = 192 CTAs of 16-row tiles: more than the SMs of an H100 / H200 (132), so the one-shot
  // grid keeps the 4-warp 16-row tile; the small batches above take the wide one (8 warps, KV128).
  AttentionCase s5 = small(Entry::kPaged, DecodeKernel::kTensorCores, Layout::kNHD, DType::kBF16, 64, 37, 3, 3, 4, 128);
  // head_dim 96: padded rows in both families (a 16-thread row group with 4 idle threads; 16-chunk
  // shared-memory rows with 4 unused chunks).
  AttentionCase s6 = small(Entry::kPaged, DecodeKernel::kCudaCores, Layout::kHND, DType::kF16, 7, 37, 3, 2, 5, 96);
  s6.nan_unused = true;
  AttentionCase s7 = small(Entry::kRagged, DecodeKernel::kTensorCores, Layout::kNHD, DType::kBF16, 5, 20, 0, 2, 4, 96);
  s7.strided = true;
  cases.insert(cases.end(), {s1, s2, s3, s4, s5, s6, s7});
  make_names_unique(cases, case_name);
  return cases;
}

std::vector<AttentionCase> prefill_cases() {
  std::vector<AttentionCase> cases;
  Deck dtype({0, 1}, 31), dim({64, 96, 128, 256}, 32), kv({0, 1, 15, 512, 2049, 16384}, 33), batch({1, 7, 64}, 34),
      page({1, 3, 16, 64}, 35), layout({0, 1}, 36), hkv({1, 2, 4}, 37), group({1, 4, 5, 7, 8}, 38),
      strided({1, 0, 0, 0, 0}, 39), nolse({1, 0, 0, 0, 0, 0, 0}, 40), scaled({1, 0, 0, 0, 0, 0}, 41),
      nan_unused({1, 0}, 42), loose({1, 0, 0}, 43);
  for (int e = 0; e < 5; ++e) {
    for (bool causal : {false, true}) {
      for (int64_t qo : {1, 3, 17, 128, 577}) {
        AttentionCase c;
        c.entry = e < 2 ? Entry::kSingle : e == 2 ? Entry::kRagged : Entry::kPaged;
        c.causal = causal;
        c.qo_len = qo;
        c.dtype = dtype_of(dtype.next());
        c.layout = e == 1 ? Layout::kHND : e >= 3 && layout.next() ? Layout::kHND : Layout::kNHD;
        // Causal needs qo <= kv (queries are the last positions); the fp64 cost keeps qo 577 at
        // kv <= 2049 and kv 16384 at qo <= 128, batch 64 at qo <= 128 and kv <= 2049.
        c.kv_len = kv.next_if([&](int64_t k) {
          return (!causal || k >= qo) && (qo < 577 || k <= 2049) && (k < 16384 || qo <= 128);
        });
        c.batch = c.entry == Entry::kSingle
                      ? 1
                      : batch.next_if([&](int64_t b) { return b < 64 || (qo <= 128 && c.kv_len <= 2049); });
        if (c.entry == Entry::kPaged) {
          c.page_size = page.next();
          c.combined_kv = e == 4;
          c.nan_unused = nan_unused.next();
        }
        c.group = group.next();
        c.num_kv_heads = hkv.next();
        c.head_dim = dim.next();
        c.strided = strided.next();
        c.with_lse = !nolse.next();
        if (scaled.next()) c.sm_scale = 0.3;
        c.loose_max_qo = c.entry != Entry::kSingle && loose.next();
        fit(c, 8e8);
        cases.push_back(c);
      }
    }
  }
  // GQA 7 and MQA with long queries over a long prefix, batch 64 with many short requests.
  {
    AttentionCase c;
    c.entry = Entry::kPaged;
    c.dtype = DType::kBF16;
    c.layout = Layout::kHND;
    c.batch = 7;
    c.qo_len = 128;
    c.kv_len = 2049;
    c.page_size = 16;
    c.num_kv_heads = 1;
    c.group = 7;
    c.head_dim = 128;
    c.causal = true;
    c.nan_unused = true;
    cases.push_back(c);
    c.entry = Entry::kRagged;
    c.dtype = DType::kF16;
    c.layout = Layout::kNHD;
    c.batch = 64;
    c.qo_len = 17;
    c.kv_len = 512;
    c.num_kv_heads = 2;
    c.group = 5;
    c.head_dim = 256;
    c.causal = false;
    cases.push_back(c);
  }
  // Pages that hold whole KV tiles (128 slots and more; 64 at head dim 256): the wgmma tiles copy
  // those tiles with TMA and a request's last partial tile with cp.async, whose NaN page tails
  // must stay out.
  for (int i = 0; i < 6; ++i) {
    AttentionCase c;
    c.entry = Entry::kPaged;
    c.dtype = i % 2 ? DType::kBF16 : DType::kF16;
    c.layout = i % 3 == 1 ? Layout::kHND : Layout::kNHD;
    c.batch = 3;
    c.qo_len = i < 3 ? 577 : 130;
    c.kv_len = i < 3 ? 2049 : 700;
    c.head_dim = std::vector<int64_t>{128, 64, 96, 256, 128, 256}[i];
    c.page_size = c.head_dim == 256 ? 64 * (1 + i % 2) : 128 * (1 + i % 2);
    c.num_kv_heads = 2;
    c.group = i % 2 ? 4 : 1;
    c.causal = i % 2 == 0;
    c.nan_unused = true;
    fit(c, 8e8);
    cases.push_back(c);
  }
  // Pages smaller than a KV tile that fill it evenly (16, 32, 64 slots; 16, 32 at head dim 256):
  // the wgmma tiles copy each whole tile as one TMA box a page, from pages in random order, and a
  // request's last partial tile with cp.async, whose NaN page tails must stay out.
  for (int i = 0; i < 8; ++i) {
    AttentionCase c;
    c.entry = Entry::kPaged;
    c.dtype = i % 2 ? DType::kF16 : DType::kBF16;
    c.layout = i % 3 == 0 ? Layout::kHND : Layout::kNHD;
    c.batch = i < 4 ? 3 : 7;
    c.qo_len = i % 4 == 3 ? 17 : 577;
    c.kv_len = i < 4 ? 2049 : 700;
    c.head_dim = std::vector<int64_t>{128, 64, 96, 256, 128, 256, 64, 128}[i];
    c.page_size = std::vector<int64_t>{16, 32, 64, 16, 32, 32, 16, 64}[i];
    c.num_kv_heads = i % 2 ? 1 : 2;
    c.group = std::vector<int64_t>{1, 4, 8, 5, 2, 1, 7, 3}[i];
    c.causal = i % 2 == 0;
    c.combined_kv = i == 4;
    c.nan_unused = true;
    fit(c, 8e8);
    cases.push_back(c);
  }
  // The compute-sanitizer subset.
  auto small = [](Entry entry, Layout layout, DType dtype, int64_t batch, int64_t qo, int64_t kv, int64_t page_size,
                  int64_t hkv, int64_t group, int64_t dim, bool causal) {
    AttentionCase c;
    c.entry = entry;
    c.layout = layout;
    c.dtype = dtype;
    c.batch = batch;
    c.qo_len = qo;
    c.kv_len = kv;
    c.page_size = page_size;
    c.num_kv_heads = hkv;
    c.group = group;
    c.head_dim = dim;
    c.causal = causal;
    c.sanitize = true;
    return c;
  };
  AttentionCase s1 = small(Entry::kPaged, Layout::kNHD, DType::kBF16, 7, 17, 40, 3, 1, 5, 128, true);
  s1.nan_unused = true;
  s1.combined_kv = true;
  AttentionCase s2 = small(Entry::kPaged, Layout::kHND, DType::kF16, 5, 20, 15, 16, 2, 7, 64, false);
  s2.nan_unused = true;
  s2.strided = true;
  AttentionCase s3 = small(Entry::kRagged, Layout::kNHD, DType::kF16, 7, 33, 20, 0, 1, 4, 256, false);
  s3.loose_max_qo = true;
  AttentionCase s4 = small(Entry::kSingle, Layout::kHND, DType::kBF16, 1, 17, 65, 0, 2, 1, 128, true);
  s4.strided = true;
  // Long rows at head_dim 128: the 128-row tile (wgmma on sm_90; s1 too, 85 packed rows).
  AttentionCase s5 = small(Entry::kRagged, Layout::kNHD, DType::kF16, 3, 130, 300, 0, 2, 1, 128, false);
  // head_dim 96 (padded shared-memory rows): the 128-row tile and a paged 64-row one.
  AttentionCase s6 = small(Entry::kRagged, Layout::kNHD, DType::kBF16, 3, 130, 300, 0, 2, 1, 96, true);
  AttentionCase s7 = small(Entry::kPaged, Layout::kHND, DType::kF16, 5, 20, 45, 3, 2, 3, 96, false);
  s7.nan_unused = true;
  // head_dim 256: s3 (132 packed rows) runs the 128-row tile (8 warps x 16 rows); a paged causal
  // one too, and a 64-row one (40 packed rows).
  AttentionCase s8 = small(Entry::kPaged, Layout::kHND, DType::kBF16, 3, 130, 300, 16, 2, 1, 256, true);
  AttentionCase s9 = small(Entry::kRagged, Layout::kNHD, DType::kBF16, 3, 40, 100, 0, 2, 1, 256, true);
  // Pages of 128 slots under the 128-row tile: whole tiles by TMA, the last partial one by cp.async.
  AttentionCase s10 = small(Entry::kPaged, Layout::kNHD, DType::kBF16, 3, 130, 300, 128, 2, 1, 128, true);
  s10.nan_unused = true;
  // Pages of 16 slots under the 128-row tile: whole tiles as one TMA box a page.
  AttentionCase s11 = small(Entry::kPaged, Layout::kNHD, DType::kF16, 3, 130, 300, 16, 2, 4, 128, false);
  s11.nan_unused = true;
  cases.insert(cases.end(), {s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11});
  make_names_unique(cases, case_name);
  return cases;
}

std::vector<AttentionCase> split_head_dim_prefill_cases() {
  std::vector<AttentionCase> cases;
  Deck dtype({0, 1}, 51), kv({0, 1, 15, 512, 2049, 16384}, 52), batch({1, 7, 64}, 53), page({1, 16, 64}, 54),
      layout({0, 1}, 55), hkv({1, 2, 3}, 56), group({1, 2, 4, 8}, 57), strided({1, 0, 0, 0}, 58),
      nolse({1, 0, 0, 0, 0}, 59), nan_unused({1, 0}, 60), loose({1, 0, 0}, 61);
  // Every entry point and page size, causal or not, over query lengths that pick each query tile:
  // 1 (16-row tile with GQA groups <= 16), 17 and 64 (64-row), 577 (128-row: wgmma on sm_90).
  for (int e = 0; e < 4; ++e) {
    for (bool causal : {false, true}) {
      for (int64_t qo : {1, 17, 64, 577}) {
        AttentionCase c;
        c.entry = e < 2 ? Entry::kSingle : e == 2 ? Entry::kRagged : Entry::kPaged;
        c.causal = causal;
        c.qo_len = qo;
        c.dtype = dtype_of(dtype.next());
        c.layout = e == 1 ? Layout::kHND : e == 3 && layout.next() ? Layout::kHND : Layout::kNHD;
        c.kv_len = kv.next_if([&](int64_t k) {
          return (!causal || k >= qo) && (qo < 577 || k <= 2049) && (k < 16384 || qo <= 64);
        });
        c.batch = c.entry == Entry::kSingle
                      ? 1
                      : batch.next_if([&](int64_t b) { return b < 64 || (qo <= 64 && c.kv_len <= 2049); });
        if (c.entry == Entry::kPaged) {
          c.page_size = page.next();
          c.nan_unused = nan_unused.next();
        }
        c.group = group.next();
        c.num_kv_heads = hkv.next();
        c.head_dim = 192;
        c.head_dim_vo = 128;
        c.strided = strided.next();
        c.with_lse = !nolse.next();
        c.loose_max_qo = c.entry != Entry::kSingle && loose.next();
        while ((oracle_cost(c) > 8e8 || kv_elements(c) > kMaxKvElements) && (c.num_kv_heads > 1 || c.batch > 7)) {
          if (c.num_kv_heads > 1) --c.num_kv_heads;
          else c.batch = 7;
        }
        cases.push_back(c);
      }
    }
  }
  // The compute-sanitizer subset: each query tile once, paged with page size 1 and NaN tails.
  AttentionCase s1;
  s1.entry = Entry::kPaged;
  s1.dtype = DType::kBF16;
  s1.batch = 5;
  s1.qo_len = 130;
  s1.kv_len = 300;
  s1.page_size = 1;
  s1.nan_unused = true;
  s1.num_kv_heads = 2;
  s1.head_dim = 192;
  s1.head_dim_vo = 128;
  s1.causal = true;
  s1.sanitize = true;
  AttentionCase s2 = s1;
  s2.entry = Entry::kRagged;
  s2.dtype = DType::kF16;
  s2.qo_len = 20;
  s2.group = 3;
  s2.causal = false;
  AttentionCase s3 = s2;
  s3.entry = Entry::kSingle;
  s3.batch = 1;
  s3.layout = Layout::kHND;
  s3.qo_len = 3;
  s3.group = 4;
  s3.strided = true;
  cases.insert(cases.end(), {s1, s2, s3});
  make_names_unique(cases, case_name);
  return cases;
}

Lengths request_lengths(const AttentionCase& c, std::mt19937_64& rng) {
  Lengths len;
  len.qo.resize(c.batch);
  len.kv.resize(c.batch);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return hi <= lo ? lo : std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  // Decode with the causal mask keeps every request non-empty (a single query at position
  // kv_len - 1 sees every key; kv_len 0 would put it before the sequence).
  const int64_t min_kv = c.decode && c.causal ? std::min<int64_t>(1, c.kv_len) : 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t kv, qo;
    if (b == 0) {
      kv = c.kv_len;
      qo = c.qo_len;
    } else if (b == 1) {
      kv = min_kv;  // a request without keys: o = 0, lse = -inf
      qo = uniform(1, c.qo_len);
    } else if (b == 2) {
      kv = uniform(min_kv, c.kv_len);
      qo = 0;  // prefill: a request without queries
    } else if (b == 3) {
      kv = std::min<int64_t>(1, c.kv_len);
      qo = uniform(1, c.qo_len);
    } else {
      kv = uniform(min_kv, c.kv_len);
      qo = uniform(1, c.qo_len);
    }
    if (c.decode) qo = 1;
    if (c.causal && !c.decode) qo = std::min(qo, kv);
    len.qo[b] = qo;
    len.kv[b] = kv;
  }
  return len;
}

// ---------------------------------------------------------------------------------------------
// Variants: the kernel's tessera::VariantOptions and the oracle's view of the same variant.

std::string variant_suffix(const VariantDesc& v) {
  std::string s;
  auto num = [](double x) {
    std::string t = std::to_string(x);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    for (char& ch : t) ch = ch == '.' ? 'p' : ch == '-' ? 'm' : ch;
    return t;
  };
  if (v.window_left >= 0) s += "_win" + std::to_string(v.window_left);
  if (v.sinks > 0) s += "_sinks" + std::to_string(v.sinks);
  if (v.soft_cap > 0) s += "_cap" + num(v.soft_cap);
  if (v.alibi) s += "_alibi";
  if (v.mask == MaskKind::kRandom) s += "_mask";
  if (v.mask == MaskKind::kTree) s += "_tree";
  if (v.rope != tessera::PosEncoding::kNone) {
    s += v.rope == tessera::PosEncoding::kRopeLlama ? "_rope" : "_rope31";
    if (v.rope_theta != 1e4) s += "t" + num(v.rope_theta);
    if (v.rope_scale != 1.0) s += "s" + num(v.rope_scale);
    if (v.rope_offsets) s += "off";
  }
  if (v.sigmoid) s += "_sigmoid" + num(v.sigmoid_bias);
  if (v.user == UserVariant::kDocumentMask) s += "_udoc";
  if (v.user == UserVariant::kTransforms) s += "_uqkvo";
  return s;
}

namespace {

// User variant (a): a document mask over a device tensor of document ids plus a score transform
// (temperature, a per-head linear position bias and a constant bias), all through params.
constexpr const char* kDocumentMaskSource = R"(// document mask + score transform (variant tests)
float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head) {
  return logits * params.temperature + params.slope * (float)(qo_head + 1) * (float)(kv_idx - qo_idx) +
         params.bias;
}
bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head) {
  if (qo_idx < 0) return false;  // a query before the sequence (qo_len > kv_len) has no document
  const int32_t* doc = params.docs + (int64_t)batch * params.doc_stride;
  return doc[qo_idx] == doc[kv_idx];
}
)";
constexpr float kDocTemperature = 0.75f, kDocSlope = 1.f / 512.f, kDocBias = 1.25f;

// User variant (b): query, key, value and output transforms.
constexpr const char* kTransformsSource = R"(// q/k/v/o transforms (variant tests)
float2 query_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head, int dim) {
  const float s = params.q_scale * (1.f + 0.25f * (float)(qo_head & 1));
  return make_float2(value.x * s, value.y * s);
}
float2 key_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                     int kv_head, int dim) {
  const float s = (kv_idx & 1) ? 1.f : 0.75f;
  return make_float2(s * (value.x + params.k_mix * value.y), s * (value.y - params.k_mix * value.x));
}
float2 value_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head, int dim) {
  const float* bias = params.v_bias + (int64_t)kv_head * params.head_dim;
  return make_float2(value.x + bias[dim], value.y + bias[dim + params.head_dim / 2]);
}
float output_transform(const Params& params, float value, int batch, int qo_idx, int qo_head, int dim) {
  return value * (2.f + (float)(qo_idx & 1));
}
)";
constexpr float kQScale = 0.75f, kKMix = 0.375f;

/// Everything a variant case needs beyond the plain inputs: device buffers and views for the
/// kernel, and the reference side (oracle options, transformed operands, output post-processing).
struct VariantSetup {
  bool active = false;
  tessera::VariantOptions options;  // user is set by the caller (points into `spec`)
  tessera::VariantSpec spec;
  bool has_user = false;
  DeviceBuffer alibi, mask, mask_indptr, q_offset, k_offset, docs, v_bias;

  tessera_ref::Options ref;  // variant fields of the oracle options (sm_scale, causal set by the runner)
  double ref_scale_factor = 1.0;  // the oracle's sm_scale is the kernel's times this
  std::vector<std::vector<double>> q_ref, k_ref, v_ref;  // per request; empty: the inputs as they are
  double lse_shift = 0.0;             // natural-log shift of every finite reference LSE
  bool output_parity_factor = false;  // o *= 2 + (query position & 1)
};

TensorView device_view_1d(const DeviceBuffer& buf, DType dtype, int64_t n) {
  return TensorView(buf.get(), dtype, {n}, Device::cuda(0));
}

template <typename T>
DeviceBuffer upload_pod(const std::vector<T>& values) {
  DeviceBuffer buf(std::max<size_t>(1, values.size()) * sizeof(T));
  buf.upload(values.data(), values.size() * sizeof(T));
  return buf;
}

/// Query position of row i of a request with (qo, kv) lengths.
int64_t query_position(int64_t qo, int64_t kv, int64_t i) { return kv - qo + i; }

void prepare_variant(VariantSetup& vs, const AttentionCase& c, const Lengths& len,
                     const std::vector<std::vector<double>>& q_parts, const std::vector<std::vector<double>>& k_parts,
                     const std::vector<std::vector<double>>& v_parts, std::mt19937_64& rng) {
  const VariantDesc& d = c.variant;
  const int64_t B = c.batch, Hq = c.num_qo_heads(), Hkv = c.num_kv_heads, D = c.head_dim;
  if (d.user == UserVariant::kDocumentMask && (d.soft_cap > 0 || d.sigmoid || d.alibi)) {
    throw std::logic_error("the document-mask user variant has no oracle form with soft-cap, sigmoid or ALiBi");
  }
  vs.active = true;
  tessera::VariantOptions& o = vs.options;
  tessera_ref::Options& r = vs.ref;

  o.window_left = d.window_left;
  r.window_left = d.window_left;
  o.num_sink_tokens = d.sinks;
  r.num_sink_tokens = d.sinks;
  o.logits_soft_cap = d.soft_cap;
  r.logits_soft_cap = d.soft_cap;
  if (d.alibi) {
    const std::vector<float> slopes = tessera::alibi_slopes(Hq);
    const std::vector<double> want = tessera_ref::alibi_slopes(Hq);
    EXPECT_EQ(slopes.size(), want.size()) << "tessera::alibi_slopes(" << Hq << ")";
    for (size_t h = 0; h < std::min(slopes.size(), want.size()); ++h) {
      EXPECT_NEAR(slopes[h], want[h], 1e-7 * want[h]) << "tessera::alibi_slopes(" << Hq << ")[" << h << "]";
    }
    vs.alibi = upload_pod(slopes);
    o.alibi_slopes = device_view_1d(vs.alibi, DType::kF32, Hq);
    r.alibi_slopes.assign(slopes.begin(), slopes.end());  // the f32 values the kernel reads
  }
  o.sigmoid = d.sigmoid;
  o.sigmoid_bias = d.sigmoid_bias;
  r.use_softmax = !d.sigmoid;
  r.sigmoid_bias = d.sigmoid_bias;

  // Reference masks (byte per element), the custom mask and the user's document mask ANDed.
  const bool doc = d.user == UserVariant::kDocumentMask;
  std::vector<std::vector<uint8_t>> masks;  // per request, [qo_b, kv_b]
  if (d.mask != MaskKind::kNone || doc) {
    masks.resize(B);
    for (int64_t b = 0; b < B; ++b) masks[b].assign(len.qo[b] * len.kv[b], 1);
  }
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  if (d.mask == MaskKind::kRandom) {
    int64_t row = 0;  // packed query row, across requests
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < len.qo[b]; ++i, ++row) {
        for (int64_t j = 0; j < len.kv[b]; ++j) {
          masks[b][i * len.kv[b] + j] = row % 5 != 4 && u01(rng) < 0.7;
        }
      }
    }
  } else if (d.mask == MaskKind::kTree) {
    masks = tree_masks(len.qo, len.kv, rng);
  }
  if (d.mask != MaskKind::kNone) {
    const PackedMasks packed = pack_masks(masks, rng);
    const std::vector<uint8_t>& bytes = packed.bytes;
    vs.mask = upload_pod(bytes);
    vs.mask_indptr = upload_i32(packed.byte_indptr);
    o.custom_mask = device_view_1d(vs.mask, DType::kU8, std::max<int64_t>(1, static_cast<int64_t>(bytes.size())));
    o.custom_mask_indptr = i32_view(vs.mask_indptr, B + 1);
  }

  // Document ids for the user mask: segments of random length, ids cycling through 4 values so
  // that equal ids also occur in separate segments.
  if (doc) {
    const int64_t stride = std::max<int64_t>(1, *std::max_element(len.kv.begin(), len.kv.end()));
    std::vector<int32_t> ids(B * stride, -7);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t kv = len.kv[b];
      int32_t seg = 0;
      for (int64_t j = 0; j < kv; ++seg) {
        const int64_t n = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, kv / 6))(rng);
        for (int64_t t = 0; t < n && j < kv; ++t, ++j) ids[b * stride + j] = seg % 4;
      }
      const int64_t qo = len.qo[b];
      for (int64_t i = 0; i < qo; ++i) {
        const int64_t p = query_position(qo, kv, i);
        for (int64_t j = 0; j < kv; ++j) {
          const bool same = p >= 0 && ids[b * stride + p] == ids[b * stride + j];
          masks[b][i * kv + j] = masks[b][i * kv + j] && same;
        }
      }
    }
    vs.docs = upload_pod(ids);
    vs.spec.name = "test_document_mask";
    vs.spec.source = kDocumentMaskSource;
    vs.spec.params = {
        tessera::VariantParam::device_tensor("docs", device_view_1d(vs.docs, DType::kI32, B * stride)),
        tessera::VariantParam::scalar_i32("doc_stride", static_cast<int32_t>(stride)),
        tessera::VariantParam::scalar_f32("temperature", kDocTemperature),
        tessera::VariantParam::scalar_f32("slope", kDocSlope),
        tessera::VariantParam::scalar_f32("bias", kDocBias),
    };
    vs.has_user = true;
    vs.ref_scale_factor = kDocTemperature;
    r.alibi_slopes.resize(Hq);
    for (int64_t h = 0; h < Hq; ++h) r.alibi_slopes[h] = static_cast<double>(kDocSlope) * static_cast<double>(h + 1);
    vs.lse_shift = kDocBias;
  }
  if (!masks.empty()) {
    r.custom_mask_indptr = {0};
    for (int64_t b = 0; b < B; ++b) {
      r.custom_mask.insert(r.custom_mask.end(), masks[b].begin(), masks[b].end());
      r.custom_mask_indptr.push_back(static_cast<int64_t>(r.custom_mask.size()));
    }
  }

  // RoPE and user q/k/v transforms: the reference gets the transformed operands, rounded to the
  // dtype as the kernel's shared-memory tiles hold them (the oracle's own RoPE would skip that
  // rounding, which alone can exceed the LSE tolerance for rows with few keys).
  std::vector<int64_t> q_off(B, 0), k_off(B, 0);
  if (d.rope != tessera::PosEncoding::kNone) {
    o.rope.mode = d.rope;
    o.rope.theta = d.rope_theta;
    o.rope.scale = d.rope_scale;
    if (d.rope_offsets) {
      std::vector<int32_t> qo32(B), ko32(B);
      for (int64_t b = 0; b < B; ++b) {
        qo32[b] = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, 1000)(rng));
        ko32[b] = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, 1000)(rng));
        q_off[b] = qo32[b];
        k_off[b] = ko32[b];
      }
      vs.q_offset = upload_i32(qo32);
      vs.k_offset = upload_i32(ko32);
      o.rope.q_offset = i32_view(vs.q_offset, B);
      o.rope.k_offset = i32_view(vs.k_offset, B);
    }
  }
  const bool transforms = d.user == UserVariant::kTransforms;
  std::vector<float> v_bias;
  if (transforms) {
    v_bias.resize(Hkv * D);
    for (float& x : v_bias) x = static_cast<float>(0.1 * std::normal_distribution<double>(0.0, 1.0)(rng));
    vs.v_bias = upload_pod(v_bias);
    vs.spec.name = "test_qkvo_transforms";
    vs.spec.source = kTransformsSource;
    vs.spec.params = {
        tessera::VariantParam::scalar_f32("q_scale", kQScale),
        tessera::VariantParam::scalar_f32("k_mix", kKMix),
        tessera::VariantParam::device_tensor("v_bias", device_view_1d(vs.v_bias, DType::kF32, Hkv * D)),
        tessera::VariantParam::scalar_i32("head_dim", static_cast<int32_t>(D)),
    };
    vs.has_user = true;
    vs.output_parity_factor = true;
  }
  if (d.rope != tessera::PosEncoding::kNone || transforms) {
    const tessera_ref::RopeMode mode = d.rope == tessera::PosEncoding::kRopeLlama     ? tessera_ref::RopeMode::Llama
                                       : d.rope == tessera::PosEncoding::kRopeLlama31 ? tessera_ref::RopeMode::Llama31
                                                                                      : tessera_ref::RopeMode::None;
    tessera_ref::RopeParams rp;
    rp.theta = d.rope_theta;
    rp.scale = d.rope_scale;
    const int64_t half = D / 2;
    vs.q_ref.resize(B);
    vs.k_ref.resize(B);
    vs.v_ref.resize(B);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t qo = len.qo[b], kv = len.kv[b];
      std::vector<int64_t> qpos(qo), kpos(kv);
      for (int64_t i = 0; i < qo; ++i) qpos[i] = query_position(qo, kv, i) + q_off[b];
      for (int64_t j = 0; j < kv; ++j) kpos[j] = j + k_off[b];
      std::vector<double> qx = tessera_ref::apply_rope(q_parts[b], qo, Hq, D, qpos, mode, rp);
      std::vector<double> kx = tessera_ref::apply_rope(k_parts[b], kv, Hkv, D, kpos, mode, rp);
      std::vector<double> vx = v_parts[b];
      if (transforms) {
        for (int64_t i = 0; i < qo; ++i)
          for (int64_t h = 0; h < Hq; ++h) {
            const double s = static_cast<double>(kQScale) * (1.0 + 0.25 * static_cast<double>(h & 1));
            for (int64_t e = 0; e < D; ++e) qx[(i * Hq + h) * D + e] *= s;
          }
        for (int64_t j = 0; j < kv; ++j)
          for (int64_t h = 0; h < Hkv; ++h) {
            const double s = (j & 1) ? 1.0 : 0.75;
            double* kr = &kx[(j * Hkv + h) * D];
            double* vr = &vx[(j * Hkv + h) * D];
            for (int64_t e = 0; e < half; ++e) {
              const double a = kr[e], bb = kr[e + half];
              kr[e] = s * (a + kKMix * bb);
              kr[e + half] = s * (bb - kKMix * a);
              vr[e] += v_bias[h * D + e];
              vr[e + half] += v_bias[h * D + e + half];
            }
          }
      }
      vs.q_ref[b] = round_to(c.dtype, qx);
      vs.k_ref[b] = round_to(c.dtype, kx);
      vs.v_ref[b] = transforms ? round_to(c.dtype, vx) : vx;
    }
  }
}

/// The dequantization scales of an fp8 case: per KV head (equal across heads unless per-head),
/// each the product of a host factor and, with device scales, a device value.
struct Fp8Scales {
  KVScaleMode mode = KVScaleMode::kHost;
  bool fp8_q = false;  // FP8 attention: q's scale too
  double k_host = 1, v_host = 1, q_host = 1;
  std::vector<double> k_device, v_device, q_device;  // [1] or [Hkv]
  std::vector<double> k, v, q;                        // [Hkv] what each head's codes are multiplied by

  /// The options' KVScales, uploading the device factors into the buffers (kept by the caller).
  tessera::KVScales options(DeviceBuffer& dk, DeviceBuffer& dv, DeviceBuffer& dq) const {
    tessera::KVScales s;
    s.k = k_host;
    s.v = v_host;
    if (fp8_q) s.q = q_host;
    if (mode != KVScaleMode::kHost) {
      dk = upload_as(DType::kF32, k_device);
      dv = upload_as(DType::kF32, v_device);
      const int64_t n = static_cast<int64_t>(k_device.size());
      s.k_device = make_view(dk.get(), DType::kF32, {n}, {1});
      s.v_device = make_view(dv.get(), DType::kF32, {n}, {1});
      if (fp8_q) {
        dq = upload_as(DType::kF32, q_device);
        s.q_device = make_view(dq.get(), DType::kF32, {n}, {1});
      }
    }
    return s;
  }
};

Fp8Scales draw_fp8_scales(const AttentionCase& c, std::mt19937_64& rng) {
  // Around 1/16: the codes are N(0, 16^2), so K and V come out near N(0, 1). Host and device
  // factors of at most 2 significant bits (1 or 3 times a power of two), so a scale has at most
  // 4 and code x scale at most 8: exact in bf16 and f16, as the inputs of the 16-bit cases are,
  // so the oracle sees exactly the values the kernel's tiles hold. (Arbitrary scales add the
  // 16-bit rounding of each dequantized element, as storing K/V in 16 bits does.)
  std::uniform_int_distribution<int> pick(0, 3);
  const double host_factors[] = {2.0 / 32, 3.0 / 32, 1.0 / 32, 3.0 / 64};
  const double device_factors[] = {0.5, 0.75, 1.0, 1.5};
  Fp8Scales s;
  s.mode = c.kv_scales;
  const int64_t n = c.kv_scales == KVScaleMode::kPerHead ? c.num_kv_heads : 1;
  s.k_host = host_factors[pick(rng)];
  s.v_host = host_factors[pick(rng)];
  for (int64_t h = 0; h < n && c.kv_scales != KVScaleMode::kHost; ++h) {
    s.k_device.push_back(device_factors[pick(rng)]);
    s.v_device.push_back(device_factors[pick(rng)]);
  }
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    const size_t i = s.k_device.size() > 1 ? static_cast<size_t>(h) : 0;
    s.k.push_back(s.k_host * (s.k_device.empty() ? 1.0 : s.k_device[i]));
    s.v.push_back(s.v_host * (s.v_device.empty() ? 1.0 : s.v_device[i]));
  }
  // FP8 attention's q scales are drawn after K's and V's, so fp8 KV cases draw what they did.
  s.fp8_q = c.fp8_q;
  if (c.fp8_q) {
    s.q_host = host_factors[pick(rng)];
    for (int64_t h = 0; h < n && c.kv_scales != KVScaleMode::kHost; ++h) s.q_device.push_back(device_factors[pick(rng)]);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      s.q.push_back(s.q_host * (s.q_device.empty() ? 1.0 : s.q_device[s.q_device.size() > 1 ? static_cast<size_t>(h) : 0]));
    }
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The decode / prefill runner.

void run_attention_case(const AttentionCase& c, uint64_t seed, AttentionCase::Fp8Errors* fp8_errors) {
  std::mt19937_64 rng(seed);
  const Lengths len = request_lengths(c, rng);
  const int64_t B = c.batch, Hq = c.num_qo_heads(), Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.value_dim();
  const std::string what = case_name(c) + " (seed " + std::to_string(seed) + ")";
  if (Dv != D && (c.fp8 != Fp8KV::kNone || c.variant.any() || c.decode || c.combined_kv)) {
    throw std::invalid_argument(what + ": head_dim_vo != head_dim is a prefill case without fp8, variant or combined K/V");
  }
  if (c.fp8_q && (c.fp8 == Fp8KV::kNone || c.decode || c.variant.any())) {
    throw std::invalid_argument(what + ": FP8 attention is a prefill case with fp8 K/V and no variant");
  }

  // Inputs, rounded to the dtype before anything else sees them.
  std::vector<std::vector<double>> q_parts(B), k_parts(B), v_parts(B);
  for (int64_t b = 0; b < B; ++b) {
    q_parts[b] = round_to(c.dtype, random_normal(len.qo[b] * Hq * D, rng, c.q_stddev));
    k_parts[b] = round_to(c.dtype, random_normal(len.kv[b] * Hkv * D, rng));
    v_parts[b] = round_to(c.dtype, random_normal(len.kv[b] * Hkv * Dv, rng));
  }
  // fp8 K/V: the uploaded codes (k_store, v_store) and, in k_parts / v_parts, what they stand for
  // (code x the head's scale), which the oracle sees. 16-bit K/V: the same values.
  const DType kv_dtype = c.kv_dtype();
  std::vector<std::vector<double>> k_store = k_parts, v_store = v_parts;
  Fp8Scales fp8_scales;
  // FP8 attention: the unquantized inputs (the 16-bit draws above, at the dequantized values'
  // scale) for the error the tests report, and the stored q codes.
  std::vector<std::vector<double>> q_unquantized, k_unquantized, v_unquantized, q_store;
  if (c.fp8 != Fp8KV::kNone) {
    fp8_scales = draw_fp8_scales(c, rng);
    if (c.fp8_q) {
      q_unquantized = q_parts;
      k_unquantized = k_parts;
      v_unquantized = v_parts;
    }
    for (int64_t b = 0; b < B; ++b) {
      if (c.fp8_q) {
        // Codes of the unquantized values over their head's scale, so both stand for one tensor.
        q_store.push_back(q_parts[b]);
        k_store[b] = k_parts[b];
        v_store[b] = v_parts[b];
        for (size_t i = 0; i < q_store[b].size(); ++i) {
          q_store[b][i] /= fp8_scales.q[static_cast<int64_t>(i / D) % Hq / c.group];
        }
        for (size_t i = 0; i < k_store[b].size(); ++i) {
          const int64_t h = static_cast<int64_t>(i / D) % Hkv;
          k_store[b][i] /= fp8_scales.k[h];
          v_store[b][i] /= fp8_scales.v[h];
        }
        q_store[b] = round_to(kv_dtype, q_store[b]);
        k_store[b] = round_to(kv_dtype, k_store[b]);
        v_store[b] = round_to(kv_dtype, v_store[b]);
        q_parts[b] = q_store[b];
        for (size_t i = 0; i < q_parts[b].size(); ++i) {
          q_parts[b][i] *= fp8_scales.q[static_cast<int64_t>(i / D) % Hq / c.group];
        }
      } else {
        k_store[b] = round_to(kv_dtype, random_normal(len.kv[b] * Hkv * D, rng, 16.0));
        v_store[b] = round_to(kv_dtype, random_normal(len.kv[b] * Hkv * D, rng, 16.0));
      }
      k_parts[b] = k_store[b];
      v_parts[b] = v_store[b];
      for (size_t i = 0; i < k_parts[b].size(); ++i) {
        const int64_t h = static_cast<int64_t>(i / D) % Hkv;
        k_parts[b][i] *= fp8_scales.k[h];
        v_parts[b][i] *= fp8_scales.v[h];
      }
    }
  }
  // The variant's own data (masks, offsets, parameters) comes after the inputs, so cases without
  // a variant draw exactly what they always drew.
  VariantSetup vs;
  if (c.variant.any()) prepare_variant(vs, c, len, q_parts, k_parts, v_parts, rng);
  const Packed q = pack_rows(q_parts, Hq * D);  // the oracle's (dequantized for FP8 attention)
  const Packed q_up = c.fp8_q ? pack_rows(q_store, Hq * D) : Packed{};  // FP8 attention: uploaded codes
  const Packed k = pack_rows(k_store, Hkv * D);  // uploaded
  const Packed v = pack_rows(v_store, Hkv * Dv);
  q_parts.clear();
  const int64_t total_q = q.indptr.back(), total_kv = k.indptr.back();
  int64_t max_qo = *std::max_element(len.qo.begin(), len.qo.end());
  if (c.loose_max_qo) max_qo += 13;

  // q, o, lse. Strided: q rows padded by 64 elements, o heads (hence rows) by 8.
  const bool one_query = c.decode && c.entry == Entry::kSingle;
  const std::vector<int64_t> q_shape = one_query ? std::vector<int64_t>{Hq, D} : std::vector<int64_t>{total_q, Hq, D};
  DeviceTensor dq = upload_tensor(c.q_dtype(), c.fp8_q ? q_up.values : q.values, q_shape,
                                  c.strided ? padded_strides(q_shape, 0, 64) : std::vector<int64_t>{});
  std::vector<int64_t> o_shape = q_shape;
  o_shape.back() = Dv;
  DeviceTensor dout = make_output(c.dtype, o_shape, c.strided ? padded_strides(o_shape, 8, 0) : std::vector<int64_t>{});
  DeviceTensor dlse;
  TensorView lse_view;  // undefined: no lse
  if (c.with_lse) {
    dlse = make_output(DType::kF32, one_query ? std::vector<int64_t>{Hq} : std::vector<int64_t>{total_q, Hq});
    lse_view = dlse.view;
  }
  DeviceBuffer d_qo_indptr = upload_i32(q.indptr);
  const TensorView qo_indptr = i32_view(d_qo_indptr, B + 1);

  tessera::AttentionOptions opt;
  opt.sm_scale = c.sm_scale;
  opt.causal = c.causal;
  DeviceBuffer d_k_scale, d_v_scale, d_q_scale;
  if (c.fp8 != Fp8KV::kNone) opt.kv_scales = fp8_scales.options(d_k_scale, d_v_scale, d_q_scale);
  tessera_ref::Options ropt;
  if (vs.active) {
    opt.variant = vs.options;
    opt.variant.user = vs.has_user ? &vs.spec : nullptr;
    ropt = vs.ref;
  }
  ropt.sm_scale = c.sm_scale;
  if (vs.ref_scale_factor != 1.0) {
    ropt.sm_scale = (c.sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : c.sm_scale) * vs.ref_scale_factor;
  }
  ropt.causal = c.causal;
  const tessera_ref::HeadConfig heads{Hq, Hkv, D, Dv};

  // Device K/V stay alive until the stream is synchronised.
  DeviceTensor dk, dv;
  DeviceBuffer d_kv_indptr;
  DevicePaged paged;
  tessera_ref::PagedCache cache;
  switch (c.entry) {
    case Entry::kSingle: {
      const int64_t kv_len = len.kv[0];
      const bool hnd = c.layout == Layout::kHND;
      const std::vector<int64_t> shape = hnd ? std::vector<int64_t>{Hkv, kv_len, D} : std::vector<int64_t>{kv_len, Hkv, D};
      std::vector<int64_t> v_shape = shape;
      v_shape.back() = Dv;
      dk = upload_tensor(kv_dtype, hnd ? nhd_to_hnd(k.values, kv_len, Hkv, D) : k.values, shape,
                         c.strided ? padded_strides(shape, 0, 32) : std::vector<int64_t>{});
      dv = upload_tensor(kv_dtype, hnd ? nhd_to_hnd(v.values, kv_len, Hkv, Dv) : v.values, v_shape,
                         c.strided ? padded_strides(v_shape, 16, 0) : std::vector<int64_t>{});
      if (c.decode) {
        tessera::single_decode(dq.view, dk.view, dv.view, c.layout, dout.view, lse_view, opt, nullptr, c.kernel);
      } else {
        tessera::single_prefill(dq.view, dk.view, dv.view, c.layout, dout.view, lse_view, opt, nullptr);
      }
      break;
    }
    case Entry::kRagged: {
      const std::vector<int64_t> shape = {total_kv, Hkv, D}, v_shape = {total_kv, Hkv, Dv};
      dk = upload_tensor(kv_dtype, k.values, shape, c.strided ? padded_strides(shape, 0, 32) : std::vector<int64_t>{});
      dv = upload_tensor(kv_dtype, v.values, v_shape, c.strided ? padded_strides(v_shape, 16, 0) : std::vector<int64_t>{});
      d_kv_indptr = upload_i32(k.indptr);
      const TensorView kv_indptr = i32_view(d_kv_indptr, B + 1);
      if (c.decode) {
        tessera::batch_decode_ragged(dq.view, dk.view, dv.view, kv_indptr, dout.view, lse_view, opt, nullptr, c.kernel);
      } else {
        tessera::batch_prefill_ragged(dq.view, qo_indptr, max_qo, dk.view, dv.view, kv_indptr, dout.view, lse_view,
                                      opt, nullptr);
      }
      break;
    }
    case Entry::kPaged: {
      // Shuffled page ids with 3 spare pages; unused slots NaN (kernels must zero-fill/mask, not
      // multiply them by 0) or 0.
      cache = tessera_ref::build_paged(k_store, v_store, len.kv, Hkv, D, c.page_size, ref_layout(c.layout), seed | 1,
                                       /*extra_pages=*/3, c.nan_unused ? kNaN : 0.0, Dv);
      // Pads keep 16-byte rows: 8 elements of a 16-bit cache, 16 of an fp8 one.
      paged = upload_paged(kv_dtype, cache, c.layout, c.combined_kv, c.strided ? 64 : 0,
                           c.strided ? (tessera::dtype_size(kv_dtype) == 1 ? 16 : 8) : 0);
      if (c.decode) {
        tessera::batch_decode_paged(dq.view, paged.view, dout.view, lse_view, opt, nullptr, c.kernel);
      } else {
        tessera::batch_prefill_paged(dq.view, qo_indptr, max_qo, paged.view, dout.view, lse_view, opt, nullptr);
      }
      break;
    }
  }
  ASSERT_CUDA_OK(cudaGetLastError());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());

  const std::vector<double> o = read_tensor(dout);
  const std::vector<double> lse = c.with_lse ? read_tensor(dlse) : std::vector<double>{};
  EXPECT_EQ(padding_changes(dout), 0u) << what << ": elements of o's buffer outside the view were written";

  tessera_ref::State ref;
  if (vs.q_ref.empty() && c.fp8 != Fp8KV::kNone) {
    // fp8: the oracle sees the dequantized K/V, in the same ragged reference for every format.
    const Packed rk = pack_rows(k_parts, Hkv * D), rv = pack_rows(v_parts, Hkv * D);
    if (c.entry == Entry::kSingle) {
      ref = tessera_ref::attention_single(q.values, rk.values, rv.values, len.qo[0], len.kv[0], heads, ropt);
    } else {
      ref = tessera_ref::attention_ragged(q.values, q.indptr, rk.values, rv.values, rk.indptr, heads, ropt);
    }
  } else if (!vs.q_ref.empty()) {
    // Transformed operands (RoPE, user transforms): the oracle sees what the kernel multiplies;
    // every KV format has the same ragged reference.
    const Packed rq = pack_rows(vs.q_ref, Hq * D), rk = pack_rows(vs.k_ref, Hkv * D), rv = pack_rows(vs.v_ref, Hkv * D);
    if (c.entry == Entry::kSingle) {
      ref = tessera_ref::attention_single(rq.values, rk.values, rv.values, len.qo[0], len.kv[0], heads, ropt);
    } else {
      ref = tessera_ref::attention_ragged(rq.values, rq.indptr, rk.values, rv.values, rk.indptr, heads, ropt);
    }
  } else {
    switch (c.entry) {
      case Entry::kSingle:
        ref = tessera_ref::attention_single(q.values, k.values, v.values, len.qo[0], len.kv[0], heads, ropt);
        break;
      case Entry::kRagged:
        ref = tessera_ref::attention_ragged(q.values, q.indptr, k.values, v.values, k.indptr, heads, ropt);
        break;
      case Entry::kPaged:
        ref = tessera_ref::attention_paged(q.values, q.indptr, cache, heads, ropt);
        break;
    }
  }
  if (vs.lse_shift != 0.0) {
    for (double& x : ref.lse) {
      if (std::isfinite(x)) x += vs.lse_shift;
    }
  }
  if (vs.output_parity_factor) {
    int64_t row = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < len.qo[b]; ++i, ++row) {
        const double factor = 2.0 + static_cast<double>(query_position(len.qo[b], len.kv[b], i) & 1);
        for (int64_t e = 0; e < Hq * D; ++e) ref.o[row * Hq * D + e] *= factor;
      }
    }
  }
  if (c.fp8_q) {
    // FP8 attention: P is rounded to fp8 for P V and the logits are accumulated by fp8 MMAs, so
    // o and the LSE meet the case's own tolerances. Also measured: o against the unquantized
    // inputs.
    expect_matches_oracle(c.dtype, o, c.with_lse ? &lse : nullptr, ref, what, c.fp8_rel_tolerance,
                          c.fp8_lse_tolerance);
    const Packed uq = pack_rows(q_unquantized, Hq * D), uk = pack_rows(k_unquantized, Hkv * D),
                 uv = pack_rows(v_unquantized, Hkv * D);
    const tessera_ref::State unquantized =
        c.entry == Entry::kSingle
            ? tessera_ref::attention_single(uq.values, uk.values, uv.values, len.qo[0], len.kv[0], heads, ropt)
            : tessera_ref::attention_ragged(uq.values, uq.indptr, uk.values, uv.values, uk.indptr, heads, ropt);
    if (fp8_errors != nullptr) {
      fp8_errors->dequantized = tessera_ref::rel_error(o, ref.o);
      fp8_errors->unquantized = tessera_ref::rel_error(o, unquantized.o);
    }
  } else if (c.variant.sigmoid) {
    // Softmax off: no log-sum-exp; the kernel writes NaN (the oracle's LSE is NaN too).
    expect_matches_oracle(c.dtype, o, nullptr, ref, what);
    size_t not_nan = 0;
    for (double x : lse) not_nan += !std::isnan(x);
    EXPECT_EQ(not_nan, 0u) << what << ": sigmoid attention has no LSE; these lse elements are not NaN";
  } else {
    expect_matches_oracle(c.dtype, o, c.with_lse ? &lse : nullptr, ref, what);
  }
}

// ---------------------------------------------------------------------------------------------
// Block-sparse cases.

std::string block_sparse_case_name(const BlockSparseCase& c) {
  std::string s = std::string(tessera::dtype_name(c.dtype)) + "_br" + std::to_string(c.block_rows) + "_bc" +
                  std::to_string(c.block_cols) + "_m" + std::to_string(c.rows) + "_n" + std::to_string(c.cols) +
                  "_g" + std::to_string(c.group) + "_hkv" + std::to_string(c.num_kv_heads) + "_d" +
                  std::to_string(c.head_dim) + "_density" + std::to_string(static_cast<int>(c.density * 100 + 0.5));
  if (c.causal) s += "_causal";
  if (c.strided) s += "_strided";
  if (!c.with_lse) s += "_nolse";
  s += c.tag;
  if (c.sanitize) s += "_sanitize";
  return s;
}

void PrintTo(const BlockSparseCase& c, std::ostream* os) { *os << block_sparse_case_name(c); }

double oracle_cost(const BlockSparseCase& c) {
  const double pairs = static_cast<double>(c.rows) * static_cast<double>(c.cols) * c.density * (c.causal ? 0.6 : 1.0);
  return pairs * static_cast<double>(c.num_qo_heads() * c.head_dim);
}

std::vector<BlockSparseCase> block_sparse_cases() {
  struct Shape {
    int64_t br, bc, m, n;
  };
  // (Br, Bc) of the issue plus vector sparsity both ways; M and N not multiples of the blocks
  // (partial last block row and column block), M <= N so that causal rows all have keys in range.
  const Shape shapes[] = {{1, 1, 70, 333},     {16, 16, 300, 1000}, {64, 16, 577, 2049}, {7, 3, 128, 515},
                          {128, 64, 600, 2049}, {1, 16, 17, 4100},   {16, 1, 130, 512}};
  Deck dtype({0, 1}, 51), dim({64, 96, 128, 256}, 52), group({1, 4, 5, 7, 8}, 53), hkv({1, 2}, 54),
      density({15, 40, 70, 100}, 55), strided({1, 0, 0, 0}, 56), nolse({1, 0, 0, 0, 0}, 57);
  std::vector<BlockSparseCase> cases;
  for (const Shape& sh : shapes) {
    for (bool causal : {false, true}) {
      BlockSparseCase c;
      c.block_rows = sh.br;
      c.block_cols = sh.bc;
      c.rows = sh.m;
      c.cols = sh.n;
      c.causal = causal;
      c.dtype = dtype_of(dtype.next());
      c.head_dim = dim.next();
      c.group = group.next();
      c.num_kv_heads = hkv.next();
      c.density = static_cast<double>(density.next()) / 100;
      c.strided = strided.next();
      c.with_lse = !nolse.next();
      fit(c, 3e8);
      cases.push_back(c);
    }
  }
  // More query rows than KV columns (non-causal), and an MQA case.
  BlockSparseCase wide;
  wide.dtype = DType::kBF16;
  wide.block_rows = 16;
  wide.block_cols = 16;
  wide.rows = 577;
  wide.cols = 129;
  wide.group = 5;
  wide.num_kv_heads = 1;
  wide.head_dim = 128;
  wide.density = 0.7;
  cases.push_back(wide);
  BlockSparseCase mqa = wide;
  mqa.dtype = DType::kF16;
  mqa.block_rows = 64;
  mqa.block_cols = 64;
  mqa.rows = 512;
  mqa.cols = 1024;
  mqa.group = 8;
  mqa.head_dim = 256;
  mqa.density = 0.4;
  mqa.causal = true;
  cases.push_back(mqa);
  // The compute-sanitizer subset.
  BlockSparseCase s1;
  s1.dtype = DType::kF16;
  s1.block_rows = 7;
  s1.block_cols = 3;
  s1.rows = 40;
  s1.cols = 50;
  s1.group = 5;
  s1.head_dim = 64;
  s1.density = 0.5;
  s1.causal = true;
  s1.sanitize = true;
  BlockSparseCase s2 = s1;
  s2.dtype = DType::kBF16;
  s2.block_rows = 16;
  s2.block_cols = 16;
  s2.rows = 70;
  s2.cols = 100;
  s2.group = 1;
  s2.num_kv_heads = 2;
  s2.head_dim = 128;
  s2.causal = false;
  s2.strided = true;
  BlockSparseCase s3 = s2;  // head_dim 96: padded shared-memory rows
  s3.head_dim = 96;
  s3.block_rows = 1;
  s3.block_cols = 16;
  s3.group = 4;
  s3.causal = true;
  s3.strided = false;
  cases.push_back(s1);
  cases.push_back(s2);
  cases.push_back(s3);
  make_names_unique(cases, block_sparse_case_name);
  return cases;
}

}  // namespace attn
}  // namespace tessera_test
