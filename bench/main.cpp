// tessera-bench: runs named suites of benchmark workloads (bench/README.md) and prints a table plus
// JSON lines. See bench/README.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "harness.h"
#include "tessera/error.h"
#include "tessera/validate.h"

namespace tb = tessera_bench;

namespace {

constexpr int kMinIters = 20;  // docs/design.md §9: median of at least 20 timed runs
constexpr const char* kAllSuite = "all";
constexpr const char* kDefaultSuite = "quick";

struct Options {
  std::vector<std::string> suites;
  std::string json_path;  // "" none, "-" stdout
  std::string filter;     // substring of workload names; empty = all
  int iters = 30;
  int warmup = 5;
  int cooldown_ms = 1000;
  int device = 0;
  bool list = false;
  bool help = false;
  bool samples = false;
};

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: tessera-bench [options]\n"
               "  --suite NAME     suite to run; repeatable or a comma list (default: %s; 'all' runs\n"
               "                   every workload). The ceilings always run first.\n"
               "  --list           list suites and workloads, then exit\n"
               "  --json PATH      append one JSON line per result to PATH ('-': print them to\n"
               "                   stdout after the table)\n"
               "  --iters N        timed runs per workload, >= %d (default 30)\n"
               "  --warmup N       untimed warm-up runs per workload (default 5)\n"
               "  --cooldown-ms N  the GPU idles N ms before each measurement, so no result depends on\n"
               "                   the power state earlier workloads left (default 1000; 0: none)\n"
               "  --samples        the JSON lines also list every timed run (\"samples_us\", in run order)\n"
               "  --filter TEXT    run only workloads whose name contains TEXT, or one of A|B|... (ceilings\n"
               "                   still run)\n"
               "  --device N       CUDA device to use (default 0)\n"
               "  --help           this text\n",
               kDefaultSuite, kMinIters);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "tessera-bench: %s\n", message.c_str());
  print_usage(stderr);
  std::exit(2);
}

int parse_int(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0 || v > 1000000) {
    usage_error(option + " expects a non-negative integer, got '" + text + "'");
  }
  return static_cast<int>(v);
}

void split_into(const std::string& list, std::vector<std::string>& out) {
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
}

Options parse_args(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_value = true;
      }
    }
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(arg + " expects a value");
      return argv[++i];
    };
    if (arg == "--suite") {
      split_into(take_value(), opt.suites);
    } else if (arg == "--json") {
      opt.json_path = take_value();
      if (opt.json_path.empty()) usage_error("--json expects a path or '-'");
    } else if (arg == "--iters") {
      opt.iters = parse_int(arg, take_value());
    } else if (arg == "--warmup") {
      opt.warmup = parse_int(arg, take_value());
    } else if (arg == "--cooldown-ms") {
      opt.cooldown_ms = parse_int(arg, take_value());
    } else if (arg == "--device") {
      opt.device = parse_int(arg, take_value());
    } else if (arg == "--filter") {
      opt.filter = take_value();
    } else if (arg == "--list" && !has_value) {
      opt.list = true;
    } else if (arg == "--samples" && !has_value) {
      opt.samples = true;
    } else if ((arg == "--help" || arg == "-h") && !has_value) {
      opt.help = true;
    } else {
      usage_error("unknown argument '" + std::string(argv[i]) + "'");
    }
  }
  if (opt.iters < kMinIters) {
    usage_error("--iters must be at least " + std::to_string(kMinIters) + " (docs/design.md §9)");
  }
  if (opt.suites.empty()) opt.suites.push_back(kDefaultSuite);
  return opt;
}

std::set<std::string> known_suites() {
  std::set<std::string> suites = {kAllSuite};
  for (const tb::Workload& w : tb::registered_workloads()) suites.insert(w.suites.begin(), w.suites.end());
  return suites;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

void print_list() {
  const std::set<std::string> suites = known_suites();
  std::printf("suites: %s\n\n", join(std::vector<std::string>(suites.begin(), suites.end()), ", ").c_str());
  std::printf("%-24s %-20s %s\n", "workload", "suites", "description");
  for (const tb::Workload& w : tb::registered_workloads()) {
    std::printf("%-24s %-20s %s\n", w.name.c_str(), join(w.suites, ",").c_str(), w.description.c_str());
  }
}

bool in_suite(const tb::Workload& w, const std::string& suite) {
  return std::find(w.suites.begin(), w.suites.end(), suite) != w.suites.end();
}

// The ceilings first (registration order), then the workloads of the requested suites that match
// the filter, grouped by their own suite.
/// True when `filter` is empty or `name` contains one of its '|'-separated alternatives.
bool matches_filter(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t begin = 0;
  while (true) {
    const size_t end = filter.find('|', begin);
    const std::string part = filter.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

std::vector<const tb::Workload*> select_workloads(const Options& opt) {
  std::vector<const tb::Workload*> ceilings, others;
  const bool all = std::find(opt.suites.begin(), opt.suites.end(), kAllSuite) != opt.suites.end();
  for (const tb::Workload& w : tb::registered_workloads()) {
    if (in_suite(w, tb::kCeilingsSuite)) {
      ceilings.push_back(&w);
      continue;
    }
    const bool requested = all || std::any_of(opt.suites.begin(), opt.suites.end(),
                                              [&](const std::string& s) { return in_suite(w, s); });
    if (requested && matches_filter(w.name, opt.filter)) {
      others.push_back(&w);
    }
  }
  std::stable_sort(others.begin(), others.end(), [](const tb::Workload* a, const tb::Workload* b) {
    return a->suite() < b->suite();
  });
  ceilings.insert(ceilings.end(), others.begin(), others.end());
  return ceilings;
}

std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

int run(const Options& opt) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    std::printf("tessera-bench: no CUDA device found; nothing to measure\n");
    return 0;
  }
  if (opt.device >= device_count) {
    usage_error("--device " + std::to_string(opt.device) + " but only " +
                std::to_string(device_count) + " CUDA device(s)");
  }

  const std::vector<const tb::Workload*> workloads = select_workloads(opt);
  std::unique_ptr<tb::OutputSink> sink;
  int failures = 0;
  try {
    BENCH_CUDA(cudaSetDevice(opt.device));
    cudaDeviceProp props{};
    BENCH_CUDA(cudaGetDeviceProperties(&props, opt.device));
    const tb::RunInfo info = tb::make_run_info(opt.device);
    int runtime_version = 0, driver_version = 0;
    BENCH_CUDA(cudaRuntimeGetVersion(&runtime_version));
    BENCH_CUDA(cudaDriverGetVersion(&driver_version));

    sink = std::make_unique<tb::OutputSink>(info, opt.json_path, opt.samples);
    tb::BenchContext ctx(opt.device, opt.iters, opt.warmup, opt.cooldown_ms, *sink);

    std::printf("tessera-bench %s, %s: %s (sm_%d%d, %d SMs, L2 %d MiB), CUDA runtime %s, driver %s\n",
                info.commit.c_str(), info.date.c_str(), info.gpu.c_str(), props.major, props.minor,
                info.sm_count, props.l2CacheSize >> 20, cuda_version_text(runtime_version).c_str(),
                cuda_version_text(driver_version).c_str());
    std::printf("suites: %s; median of %d timed runs after %d warm-up, L2 flushed before each, %d ms idle "
                "before each measurement\n\n",
                join(opt.suites, ",").c_str(), opt.iters, opt.warmup, opt.cooldown_ms);
    if (tessera::checked_mode()) {
      std::fprintf(stderr, "tessera-bench: warning: checked mode is on (TESSERA_CHECKED); timings "
                           "include host copies of index arrays and synchronisation\n");
    }
    std::fflush(stdout);

    for (const tb::Workload* w : workloads) {
      ctx.begin_workload(*w);
      try {
        w->fn(ctx);
      } catch (const tb::FatalError&) {
        throw;
      } catch (const std::exception& e) {  // tessera::Error (e.g. kUnsupported) or a host error
        ++failures;
        std::fprintf(stderr, "tessera-bench: workload %s failed: %s\n", w->name.c_str(), e.what());
        // Go on with the next workload only if the GPU is still usable.
        BENCH_CUDA(cudaDeviceSynchronize());
        BENCH_CUDA(cudaGetLastError());
      }
    }
  } catch (const std::exception& e) {
    if (sink) sink->finish();
    std::fprintf(stderr, "tessera-bench: %s\n", e.what());
    return 1;
  }
  sink->finish();
  if (failures > 0) {
    std::fprintf(stderr, "tessera-bench: %d workload(s) failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_args(argc, argv);
  if (opt.help) {
    print_usage(stdout);
    return 0;
  }
  if (opt.list) {
    print_list();
    return 0;
  }
  const std::set<std::string> suites = known_suites();
  for (const std::string& s : opt.suites) {
    if (suites.count(s) == 0) {
      usage_error("unknown suite '" + s + "' (known: " +
                  join(std::vector<std::string>(suites.begin(), suites.end()), ", ") + ")");
    }
  }
  return run(opt);
}
