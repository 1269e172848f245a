// fp64 reference oracle: KV formats (ragged, paged, block-sparse) on top of the dense core.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reference/oracle.h"
#include "reference/oracle_internal.h"

namespace tessera_ref {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

State make_state(int64_t rows, const HeadConfig& heads) {
  State s;
  s.rows = rows;
  s.heads = heads.num_qo_heads;
  s.head_dim = heads.value_dim();
  s.o.assign(rows * heads.num_qo_heads * heads.value_dim(), 0.0);
  s.lse.assign(rows * heads.num_qo_heads, 0.0);
  return s;
}

// Offset of (page, slot, head) in a paged tensor of head dim `dim` (c.head_dim for K,
// c.value_dim() for V); the dim elements of that head start there.
int64_t page_offset(const PagedCache& c, int64_t page, int64_t slot, int64_t head, int64_t dim) {
  if (c.layout == Layout::NHD) return ((page * c.page_size + slot) * c.num_kv_heads + head) * dim;
  return ((page * c.num_kv_heads + head) * c.page_size + slot) * dim;
}

void check_cache(const PagedCache& c) {
  using detail::require;
  require(c.page_size >= 1, "PagedCache::page_size = " + str(c.page_size) + " must be >= 1");
  require(c.num_pages >= 0, "PagedCache::num_pages must be >= 0");
  require(c.num_kv_heads >= 1 && c.head_dim >= 1 && c.head_dim_vo >= 0,
          "PagedCache: num_kv_heads, head_dim must be >= 1, head_dim_vo >= 0");
  const int64_t slots = c.num_pages * c.page_size * c.num_kv_heads;
  require(static_cast<int64_t>(c.k_pages.size()) == slots * c.head_dim,
          "PagedCache::k_pages has " + str(c.k_pages.size()) + " elements, expected " + str(slots * c.head_dim));
  require(static_cast<int64_t>(c.v_pages.size()) == slots * c.value_dim(),
          "PagedCache::v_pages has " + str(c.v_pages.size()) + " elements, expected " +
              str(slots * c.value_dim()));
  require(!c.indptr.empty(), "PagedCache::indptr is empty (needs batch_size + 1 entries)");
  const int64_t B = c.batch_size();
  detail::check_indptr(c.indptr, B + 1, static_cast<int64_t>(c.indices.size()), true,
                       "PagedCache::indptr");
  require(static_cast<int64_t>(c.last_page_len.size()) == B,
          "PagedCache::last_page_len has " + str(c.last_page_len.size()) + " entries, expected " +
              str(B));
  for (int64_t b = 0; b < B; ++b) {
    for (int32_t n = c.indptr[b]; n < c.indptr[b + 1]; ++n) {
      require(c.indices[n] >= 0 && c.indices[n] < c.num_pages,
              "PagedCache::indices[" + str(n) + "] = " + str(c.indices[n]) +
                  " is out of range [0, " + str(c.num_pages) + ")");
    }
    if (c.indptr[b + 1] > c.indptr[b]) {
      require(c.last_page_len[b] >= 1 && c.last_page_len[b] <= c.page_size,
              "PagedCache::last_page_len[" + str(b) + "] = " + str(c.last_page_len[b]) +
                  " is out of range [1, " + str(c.page_size) + "]");
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Ragged
// ------------------------------------------------------------------------------------------------

State attention_ragged(const std::vector<double>& q, const std::vector<int32_t>& qo_indptr,
                       const std::vector<double>& k, const std::vector<double>& v,
                       const std::vector<int32_t>& kv_indptr, const HeadConfig& heads,
                       const Options& opts) {
  detail::check_heads(heads);
  const int64_t Hq = heads.num_qo_heads, Hkv = heads.num_kv_heads, D = heads.head_dim;
  detail::require(!qo_indptr.empty(), "attention_ragged: qo_indptr is empty");
  const int64_t B = static_cast<int64_t>(qo_indptr.size()) - 1;
  const int64_t total_q = detail::packed_rows(q, Hq, D, "attention_ragged: q");
  const int64_t total_kv = detail::packed_rows(k, Hkv, D, "attention_ragged: k");
  const int64_t Dv = heads.value_dim();
  detail::require(static_cast<int64_t>(v.size()) == total_kv * Hkv * Dv,
                  "attention_ragged: v has " + str(v.size()) + " elements, expected total_kv*Hkv*Dv = " +
                      str(total_kv * Hkv * Dv));
  detail::check_indptr(qo_indptr, B + 1, total_q, false, "qo_indptr");
  detail::check_indptr(kv_indptr, B + 1, total_kv, false, "kv_indptr");
  detail::check_batch_options(opts, B);

  State s = make_state(total_q, heads);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;
    const int64_t k0 = kv_indptr[b], kv_len = kv_indptr[b + 1] - k0;
    detail::attend_request(q.data() + q0 * Hq * D, k.data() + k0 * Hkv * D,
                           v.data() + k0 * Hkv * Dv, qo_len, kv_len, heads, opts, b, nullptr,
                           s.o.data() + q0 * Hq * Dv, s.lse.data() + q0 * Hq);
  }
  return s;
}

// ------------------------------------------------------------------------------------------------
// Paged
// ------------------------------------------------------------------------------------------------

int64_t paged_kv_len(const PagedCache& cache, int64_t b) {
  detail::require(b >= 0 && b < cache.batch_size(),
                  "paged_kv_len: request " + str(b) + " out of range [0, " +
                      str(cache.batch_size()) + ")");
  const int64_t pages = cache.indptr[b + 1] - cache.indptr[b];
  if (pages == 0) return 0;
  return (pages - 1) * cache.page_size + cache.last_page_len[b];
}

DenseKV gather_paged(const PagedCache& cache, int64_t b) {
  check_cache(cache);
  DenseKV out;
  out.kv_len = paged_kv_len(cache, b);
  const int64_t H = cache.num_kv_heads, D = cache.head_dim, Dv = cache.value_dim();
  out.k.resize(out.kv_len * H * D);
  out.v.resize(out.kv_len * H * Dv);
  for (int64_t t = 0; t < out.kv_len; ++t) {
    const int64_t page = cache.indices[cache.indptr[b] + t / cache.page_size];
    const int64_t slot = t % cache.page_size;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t k_src = page_offset(cache, page, slot, h, D), v_src = page_offset(cache, page, slot, h, Dv);
      std::copy(cache.k_pages.begin() + k_src, cache.k_pages.begin() + k_src + D, out.k.begin() + (t * H + h) * D);
      std::copy(cache.v_pages.begin() + v_src, cache.v_pages.begin() + v_src + Dv, out.v.begin() + (t * H + h) * Dv);
    }
  }
  return out;
}

PagedCache build_paged(const std::vector<std::vector<double>>& k,
                       const std::vector<std::vector<double>>& v,
                       const std::vector<int64_t>& kv_lens, int64_t num_kv_heads,
                       int64_t head_dim, int64_t page_size, Layout layout,
                       uint64_t shuffle_seed, int64_t extra_pages, double unused_fill, int64_t head_dim_vo) {
  using detail::require;
  const int64_t B = static_cast<int64_t>(kv_lens.size());
  require(static_cast<int64_t>(k.size()) == B && static_cast<int64_t>(v.size()) == B,
          "build_paged: k, v and kv_lens must have one entry per request");
  require(page_size >= 1, "build_paged: page_size = " + str(page_size) + " must be >= 1");
  require(num_kv_heads >= 1 && head_dim >= 1, "build_paged: num_kv_heads, head_dim must be >= 1");
  require(extra_pages >= 0, "build_paged: extra_pages must be >= 0");
  require(head_dim_vo >= 0, "build_paged: head_dim_vo = " + str(head_dim_vo) + " must be >= 0 (0: head_dim)");
  const int64_t value_dim = head_dim_vo == 0 ? head_dim : head_dim_vo;

  PagedCache c;
  c.layout = layout;
  c.page_size = page_size;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.head_dim_vo = head_dim_vo;
  c.indptr.assign(1, 0);
  int64_t used_pages = 0;
  for (int64_t b = 0; b < B; ++b) {
    require(kv_lens[b] >= 0, "build_paged: kv_lens[" + str(b) + "] is negative");
    const int64_t row = num_kv_heads * head_dim, v_row = num_kv_heads * value_dim;
    require(static_cast<int64_t>(k[b].size()) == kv_lens[b] * row &&
                static_cast<int64_t>(v[b].size()) == kv_lens[b] * v_row,
            "build_paged: k[" + str(b) + "] / v[" + str(b) + "] must have kv_lens[b]*Hkv*D = " +
                str(kv_lens[b] * row) + " / kv_lens[b]*Hkv*Dv = " + str(kv_lens[b] * v_row) + " elements");
    const int64_t pages = (kv_lens[b] + page_size - 1) / page_size;
    used_pages += pages;
    c.indptr.push_back(static_cast<int32_t>(used_pages));
    c.last_page_len.push_back(
        static_cast<int32_t>(pages == 0 ? 0 : kv_lens[b] - (pages - 1) * page_size));
  }
  c.num_pages = used_pages + extra_pages;

  // Logical page n (in request order) is stored in physical page perm[n].
  std::vector<int32_t> perm(c.num_pages);
  for (int64_t n = 0; n < c.num_pages; ++n) perm[n] = static_cast<int32_t>(n);
  if (shuffle_seed != 0) {
    std::mt19937_64 gen(shuffle_seed);
    for (int64_t n = c.num_pages - 1; n > 0; --n) {
      const int64_t m = static_cast<int64_t>(gen() % static_cast<uint64_t>(n + 1));
      std::swap(perm[n], perm[m]);
    }
  }
  c.indices.assign(perm.begin(), perm.begin() + used_pages);

  const int64_t slots = c.num_pages * page_size * num_kv_heads;
  c.k_pages.assign(slots * head_dim, unused_fill);
  c.v_pages.assign(slots * value_dim, unused_fill);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < kv_lens[b]; ++t) {
      const int64_t page = c.indices[c.indptr[b] + t / page_size];
      const int64_t slot = t % page_size;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int64_t k_src = (t * num_kv_heads + h) * head_dim, v_src = (t * num_kv_heads + h) * value_dim;
        std::copy(k[b].begin() + k_src, k[b].begin() + k_src + head_dim,
                  c.k_pages.begin() + page_offset(c, page, slot, h, head_dim));
        std::copy(v[b].begin() + v_src, v[b].begin() + v_src + value_dim,
                  c.v_pages.begin() + page_offset(c, page, slot, h, value_dim));
      }
    }
  }
  return c;
}

State attention_paged(const std::vector<double>& q, const std::vector<int32_t>& qo_indptr,
                      const PagedCache& cache, const HeadConfig& heads, const Options& opts) {
  detail::check_heads(heads);
  check_cache(cache);
  detail::require(heads.value_dim() == cache.value_dim(),
                  "attention_paged: heads' value dim " + str(heads.value_dim()) + " differs from the cache's " +
                      str(cache.value_dim()));
  detail::require(heads.num_kv_heads == cache.num_kv_heads && heads.head_dim == cache.head_dim,
                  "attention_paged: heads (Hkv = " + str(heads.num_kv_heads) + ", D = " +
                      str(heads.head_dim) + ") do not match the cache (Hkv = " +
                      str(cache.num_kv_heads) + ", D = " + str(cache.head_dim) + ")");
  const int64_t Hq = heads.num_qo_heads, D = heads.head_dim;
  const int64_t B = cache.batch_size();
  const int64_t total_q = detail::packed_rows(q, Hq, D, "attention_paged: q");
  detail::check_indptr(qo_indptr, B + 1, total_q, false, "qo_indptr");
  detail::check_batch_options(opts, B);

  const int64_t Dv = heads.value_dim();
  State s = make_state(total_q, heads);
  for (int64_t b = 0; b < B; ++b) {
    const DenseKV kv = gather_paged(cache, b);
    const int64_t q0 = qo_indptr[b], qo_len = qo_indptr[b + 1] - q0;
    detail::attend_request(q.data() + q0 * Hq * D, kv.k.data(), kv.v.data(), qo_len, kv.kv_len,
                           heads, opts, b, nullptr, s.o.data() + q0 * Hq * Dv,
                           s.lse.data() + q0 * Hq);
  }
  return s;
}

// ------------------------------------------------------------------------------------------------
// Block-sparse
// ------------------------------------------------------------------------------------------------

State attention_block_sparse(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, int64_t M, int64_t N,
                             const BlockSparse& bsr, const HeadConfig& heads, const Options& opts) {
  using detail::require;
  detail::check_heads(heads);
  require(heads.value_dim() == heads.head_dim, "attention_block_sparse: head_dim_vo = " + str(heads.head_dim_vo) +
                                                   " differs from head_dim = " + str(heads.head_dim) +
                                                   " (not supported here)");
  const int64_t Hq = heads.num_qo_heads, Hkv = heads.num_kv_heads, D = heads.head_dim;
  require(M >= 0 && N >= 0, "attention_block_sparse: M and N must be >= 0");
  require(static_cast<int64_t>(q.size()) == M * Hq * D,
          "attention_block_sparse: q has " + str(q.size()) + " elements, expected M*Hq*D = " +
              str(M * Hq * D));
  require(static_cast<int64_t>(k.size()) == N * Hkv * D && v.size() == k.size(),
          "attention_block_sparse: k and v must have N*Hkv*D = " + str(N * Hkv * D) + " elements");
  require(bsr.block_rows >= 1 && bsr.block_cols >= 1,
          "BlockSparse: block_rows and block_cols must be >= 1");
  const int64_t row_blocks = (M + bsr.block_rows - 1) / bsr.block_rows;
  const int64_t col_blocks = (N + bsr.block_cols - 1) / bsr.block_cols;
  detail::check_indptr(bsr.indptr, row_blocks + 1, static_cast<int64_t>(bsr.indices.size()), true,
                       "BlockSparse::indptr");

  // allowed[rb * N + j]: KV column j is in one of block row rb's blocks.
  std::vector<uint8_t> allowed(row_blocks * N, 0);
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    for (int32_t n = bsr.indptr[rb]; n < bsr.indptr[rb + 1]; ++n) {
      const int64_t cb = bsr.indices[n];
      require(cb >= 0 && cb < col_blocks, "BlockSparse::indices[" + str(n) + "] = " + str(cb) +
                                              " is out of range [0, " + str(col_blocks) + ")");
      const int64_t j0 = cb * bsr.block_cols, j1 = std::min(N, j0 + bsr.block_cols);
      for (int64_t j = j0; j < j1; ++j) {
        require(allowed[rb * N + j] == 0, "BlockSparse: column block " + str(cb) +
                                              " listed twice in block row " + str(rb));
        allowed[rb * N + j] = 1;
      }
    }
  }
  const detail::KeyFilter filter = [&](int64_t i, int64_t j) {
    return allowed[(i / bsr.block_rows) * N + j] != 0;
  };

  State s = make_state(M, heads);
  detail::attend_request(q.data(), k.data(), v.data(), M, N, heads, opts, 0, &filter, s.o.data(),
                         s.lse.data());
  return s;
}

// ------------------------------------------------------------------------------------------------
// Composable
// ------------------------------------------------------------------------------------------------

State merge_levels(const std::vector<State>& levels) { return merge_states(levels, false); }

}  // namespace tessera_ref
