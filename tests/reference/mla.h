// fp64 reference of multi-head latent attention (DeepSeek-V2/V3 MLA) in its absorbed form,
// written from the definition; shares no code with the library or its kernels.
//
// Per token j the cache holds a latent ckv_j (width d_c, 512 in DeepSeek) and a rotary key part
// kpe_j (width d_r, 64) shared by every head. Head h's key and value are up-projections of the
// latent, k_h,j = [W_UK,h ckv_j ; kpe_j] and v_h,j = W_UV,h ckv_j. Absorbed form: the query's
// no-rope part is given already multiplied by W_UK,h^T (q_nope, width d_c), so
//   x_ij = sm_scale * (q_nope_i · ckv_j + q_pe_i · kpe_j)
// and the output is returned in latent space, o_i = sum_j softmax_j(x_ij) ckv_j (width d_c); the
// caller's W_UV,h takes it to head space. Positions as in oracle.h: query i of qo_len sits at
// kv_len - qo_len + i; causal hides keys after it. LSE in natural log (-inf for no key).
#pragma once

#include <cstdint>
#include <vector>

#include "reference/oracle.h"

namespace tessera_ref {

struct MlaShape {
  int64_t num_heads = 1;   // H, query heads (every one reads the one latent cache)
  int64_t latent_dim = 1;  // d_c
  int64_t rope_dim = 1;    // d_r
};

// One request. q_nope [qo_len, H, d_c], q_pe [qo_len, H, d_r], ckv [kv_len, d_c],
// kpe [kv_len, d_r]. Returns State{rows qo_len, heads H, head_dim d_c}.
State mla_attention_single(const std::vector<double>& q_nope, const std::vector<double>& q_pe,
                           const std::vector<double>& ckv, const std::vector<double>& kpe, int64_t qo_len,
                           int64_t kv_len, const MlaShape& shape, double sm_scale, bool causal);

// A paged latent cache: two PagedCache (oracle.h) with the same page table, one KV head each:
// ckv.k_pages [num_pages, page_size, 1, d_c] and kpe.k_pages [num_pages, page_size, 1, d_r] (their
// v_pages are not read). build_mla_paged makes one from per-request [kv_len_b, d] arrays.
struct MlaPagedCache {
  PagedCache ckv;
  PagedCache kpe;
};
MlaPagedCache build_mla_paged(const std::vector<std::vector<double>>& ckv,
                              const std::vector<std::vector<double>>& kpe, const std::vector<int64_t>& kv_lens,
                              const MlaShape& shape, int64_t page_size, uint64_t shuffle_seed);

// A batch over a paged latent cache: q_nope [total_q, H, d_c], q_pe [total_q, H, d_r] with
// qo_indptr [B + 1]. Returns State over all packed rows.
State mla_attention_paged(const std::vector<double>& q_nope, const std::vector<double>& q_pe,
                          const std::vector<int32_t>& qo_indptr, const MlaPagedCache& cache, const MlaShape& shape,
                          double sm_scale, bool causal);

}  // namespace tessera_ref
