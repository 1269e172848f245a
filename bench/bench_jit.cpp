// W8 of bench/README.md, JIT part: how long a new variant takes to become a launchable kernel.
//
// Two kernels, each the exact request libtessera makes (jit_requests.cu) for the logits soft-cap
// variant (the generated source is detail::variant_source of the resolved soft-cap options):
//   prefill  FA2-class prefill, bf16, D=128, 128-row query tiles, ragged KV (W2/W3 prefill);
//   decode   the tensor-core decode kernel, bf16, D=128, 16-row query tiles, paged KV (W1).
// Workload `w8_jit_<kernel>` reports three results (host wall clock, std::chrono::steady_clock):
//   w8_jit_cold_<kernel>  ms: KernelCache::get_or_compile over a fresh, empty cache directory
//                         (a temporary directory, removed afterwards): key, NVRTC compile to a
//                         CUBIN, disk write. Median of kColdCompiles compiles, each of a source
//                         made unique by a trailing comment (a new key: nothing can be reused).
//                         These compiles also pass `--no-cache`: NVRTC (>= 12.9) may keep its own
//                         cache of generated code, which a trailing comment does not defeat, so a
//                         cold sample could otherwise be a hit (bench/results/LOG.md). Code
//                         generation is unchanged; the library's compiles do not pass it, but a
//                         variant new to the process has nothing to hit there.
//                         One tiny NVRTC compile runs first, untimed, so loading NVRTC and its
//                         builtins is not charged to the first sample.
//   w8_jit_warm_<kernel>  ms: a new KernelCache object over the same directory (empty in-process
//                         map, as in a new process) + get_or_compile (disk hit: read and verify
//                         the .meta and .cubin) + jit::get_function (cuModuleLoadData of a module
//                         this process has not loaded, cuModuleGetFunction) + the dynamic shared
//                         memory opt-in: what variant_kernel() does on a disk hit. One sample per
//                         cold compile (each key loads once). Params split it into disk_read_ms
//                         and module_load_ms. Not included: the SHA-256 of the embedded kernel
//                         headers, computed once per process (the cold compile already did).
//   w8_jit_hit_<kernel>   us: detail::variant_kernel() once the kernel is loaded, i.e. the host
//                         cost every call of a non-default variant pays (variant_source() plus
//                         the function-map lookup). It uses the library's process-wide cache
//                         (default_cache_dir(), as any variant call): the first, untimed call may
//                         compile there. Median of 200 calls after 20.
// Anchors: FlashInfer 0.3.1 on the 16-core GPU machine, ~22 s per decode module, ~70 s per FA3
// prefill module (measured; a module holds several kernels). Targets: cold <= 10 s (FA2-class),
// warm <= 20 ms.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "jit_requests.h"
#include "src/jit/arch.h"
#include "src/jit/kernel_cache.h"
#include "src/jit/module_loader.h"
#include "src/jit/nvrtc_compiler.h"
#include "src/variant/jit_variant.h"
#include "src/variant/variant_config.h"
#include "tessera/variant.h"

namespace tessera_bench {
namespace {

namespace jit = tessera::jit;
namespace detail = tessera::detail;
using Clock = std::chrono::steady_clock;

constexpr int kColdCompiles = 5;
constexpr int kHitWarmup = 20;
constexpr int kHitCalls = 200;
constexpr int64_t kHeads = 16;
constexpr int64_t kHeadDim = 128;
constexpr double kSoftCap = 30.0;
constexpr double kTargetColdMs = 10000;  // FA2-class
constexpr double kTargetWarmMs = 20;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tessera-bench-jit-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp(" + pattern + ") failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec) std::fprintf(stderr, "tessera-bench: could not remove %s: %s\n", path_.c_str(), ec.message().c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Loads NVRTC (and its builtins library) with a trivial compile, once per process.
void warm_up_nvrtc(const std::string& arch) {
  static bool done = false;
  if (done) return;
  jit::CompileRequest r;
  r.name = "tessera-bench NVRTC warm-up";
  r.source = jit::generated_only("__global__ void tessera_bench_nop() {}\n");
  r.arch = arch;
  r.name_expressions = {"&tessera_bench_nop"};
  jit::compile_to_cubin(r);
  done = true;
}

// The soft-cap variant as the library resolves it for a call with Hq = 16, D = 128.
detail::ResolvedVariant softcap_variant(const tessera::TensorView& q) {
  tessera::VariantOptions options;
  options.logits_soft_cap = kSoftCap;
  detail::VariantContext vctx;
  vctx.q = &q;
  vctx.batch_size = 16;
  vctx.num_qo_heads = kHeads;
  vctx.head_dim = kHeadDim;
  vctx.sm_scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  return detail::resolve_variant(options, vctx);
}

// NVRTC's "--no-cache" where this NVRTC has the option (12.9 and later), else nothing.
std::vector<std::string> no_nvrtc_cache_options() {
  const std::string v = jit::nvrtc_version_string();  // "13.0"
  const int major = std::atoi(v.c_str());
  const size_t dot = v.find('.');
  const int minor = dot == std::string::npos ? 0 : std::atoi(v.c_str() + dot + 1);
  if (major > 12 || (major == 12 && minor >= 9)) return {"--no-cache"};
  return {};
}

// The CompileRequest detail::variant_kernel() builds, with `salt` appended to the source and
// `extra_options` (see no_nvrtc_cache_options) added.
jit::CompileRequest compile_request(const detail::ResolvedVariant& variant,
                                    const detail::VariantKernelRequest& request, const std::string& arch,
                                    const std::string& salt, const std::vector<std::string>& extra_options) {
  const detail::VariantSource src = detail::variant_source(variant, request);
  jit::CompileRequest creq;
  creq.name = "variant 'builtin' (features " + std::to_string(variant.features) + ") " + request.description +
              " [tessera-bench W8]";
  creq.source = jit::GeneratedSource{src.text + salt, src.has_user_snippet};
  creq.arch = arch;
  creq.name_expressions = {src.name_expression};
  creq.extra_options = extra_options;
  return creq;
}

double median_of(std::vector<double> v) { return summarize(std::move(v)).median_us; }

struct KernelCase {
  const char* tag;  ///< "prefill" / "decode"
  detail::VariantKernelRequest (*request)();
  const char* q_tile;
  const char* kv;
  const char* anchor_key;
  double anchor_ms;
};

void run_w8_jit(BenchContext& ctx, const KernelCase& kc) {
  const std::string arch = jit::current_device_arch();
  const detail::VariantKernelRequest request = kc.request();
  DeviceTensor q = ctx.empty_tensor(tessera::DType::kBF16, {1, kHeads, kHeadDim});
  const detail::ResolvedVariant variant = softcap_variant(q.view);
  warm_up_nvrtc(arch);

  const std::string nonce = std::to_string(static_cast<long long>(getpid())) + "-" +
                            std::to_string(Clock::now().time_since_epoch().count());
  const std::vector<std::string> extra_options = no_nvrtc_cache_options();
  std::vector<double> cold_us, warm_us, disk_us, load_us;
  size_t cubin_bytes = 0;
  {
    TempDir dir;
    jit::KernelCache cold_cache(dir.path());
    for (int i = 0; i < kColdCompiles; ++i) {
      const jit::CompileRequest creq = compile_request(
          variant, request, arch, "// tessera-bench W8 cold compile " + nonce + " #" + std::to_string(i) + "\n",
          extra_options);
      const std::string& expr = creq.name_expressions.front();

      // (a) Cold: nothing in memory or on disk for this key.
      const uint64_t compiles_before = cold_cache.stats().compiles;
      auto start = Clock::now();
      std::shared_ptr<const jit::CachedKernel> compiled = cold_cache.get_or_compile(creq);
      cold_us.push_back(us_since(start));
      if (cold_cache.stats().compiles != compiles_before + 1) {
        throw std::runtime_error("W8 cold compile was answered from a cache (stats().compiles unchanged)");
      }
      if (compiled->cubin_path.empty()) {
        throw std::runtime_error("W8: the kernel cache could not write " + dir.path() + "; no warm load to time");
      }
      cubin_bytes = compiled->cubin.size();

      // (b) Warm: a new cache object over the same directory, then the module load.
      start = Clock::now();
      jit::KernelCache warm_cache(dir.path());
      std::shared_ptr<const jit::CachedKernel> loaded = warm_cache.get_or_compile(creq);
      const double disk = us_since(start);
      const auto load_start = Clock::now();
      CUfunction fn = jit::get_function(*loaded, expr);
      if (request.dynamic_smem_bytes > 48 * 1024) {
        jit::set_max_dynamic_shared_memory(fn, request.dynamic_smem_bytes, creq.name);
      }
      load_us.push_back(us_since(load_start));
      warm_us.push_back(us_since(start));
      disk_us.push_back(disk);
      const jit::CacheStats ws = warm_cache.stats();
      if (ws.disk_hits != 1 || ws.compiles != 0) {
        throw std::runtime_error("W8 warm load did not come from the disk cache (disk_hits " +
                                 std::to_string(ws.disk_hits) + ", compiles " + std::to_string(ws.compiles) + ")");
      }
    }
  }  // the temporary cache directory is removed here

  // (c) In-process hit through the library's own entry point (default cache; the first call may
  // compile or load, untimed).
  std::vector<double> hit_us;
  detail::variant_kernel(variant, request);
  for (int i = 0; i < kHitWarmup + kHitCalls; ++i) {
    const auto start = Clock::now();
    detail::variant_kernel(variant, request);
    const double us = us_since(start);
    if (i >= kHitWarmup) hit_us.push_back(us);
  }

  const Params base = {{"kernel", request.description},
                       {"variant", "softcap30"},
                       {"arch", "sm_" + arch},
                       {"D", kHeadDim},
                       {"q_tile", kc.q_tile},
                       {"kv", kc.kv},
                       {"dtype", "bf16"}};
  const std::string tag = kc.tag;

  Params cold = base;
  cold.emplace_back("cubin_bytes", static_cast<int64_t>(cubin_bytes));
  cold.emplace_back("nvrtc", jit::nvrtc_version_string());
  cold.emplace_back("nvrtc_cache", extra_options.empty() ? "n/a" : "off (--no-cache)");
  cold.emplace_back("clock", "host wall");
  cold.emplace_back(kc.anchor_key, kc.anchor_ms);
  cold.emplace_back("target_ms", kTargetColdMs);
  ctx.report_time(summarize(cold_us), kMilliseconds, std::move(cold), "tessera", "w8_jit_cold_" + tag);

  Params warm = base;
  warm.emplace_back("disk_read_ms", median_of(disk_us) * 1e-3);
  warm.emplace_back("module_load_ms", median_of(load_us) * 1e-3);
  warm.emplace_back("clock", "host wall");
  warm.emplace_back("target_ms", kTargetWarmMs);
  ctx.report_time(summarize(warm_us), kMilliseconds, std::move(warm), "tessera", "w8_jit_warm_" + tag);

  Params hit = base;
  hit.emplace_back("call", "detail::variant_kernel");
  hit.emplace_back("clock", "host wall");
  ctx.report_time(summarize(hit_us), kMicroseconds, std::move(hit), "tessera", "w8_jit_hit_" + tag);
}

constexpr KernelCase kPrefill = {"prefill", &prefill_bf16_d128_q128_ragged_request, "128", "ragged",
                                 "anchor_flashinfer_fa3_prefill_module_ms", 70000};
constexpr KernelCase kDecode = {"decode", &decode_bf16_d128_q16_paged_request, "16", "paged",
                                "anchor_flashinfer_decode_module_ms", 22000};

void bench_w8_jit_prefill(BenchContext& ctx) { run_w8_jit(ctx, kPrefill); }
void bench_w8_jit_decode(BenchContext& ctx) { run_w8_jit(ctx, kDecode); }

}  // namespace

TESSERA_BENCH_WORKLOAD(bench_w8_jit_prefill, "w8_jit_prefill",
                       "W8 JIT soft-cap prefill (bf16 D128 Q128 ragged): cold compile, warm disk load, hit",
                       "runtime", "jit", "quick");
TESSERA_BENCH_WORKLOAD(bench_w8_jit_decode, "w8_jit_decode",
                       "W8 JIT soft-cap decode (bf16 D128 Q16 paged): cold compile, warm disk load, hit", "runtime",
                       "jit");

}  // namespace tessera_bench
