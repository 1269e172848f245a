// Get-or-compile cache of JIT kernels (docs/design.md §7): in process, then on disk, then NVRTC.
//
// Key: SHA-256 (sha256.h), as 64 hex digits, over length-prefixed fields:
//   "tessera-jit-key-v1", the generated source text, the SHA-256 of the embedded kernel headers
//   (every name and text, in name order), the NVRTC version ("13.0", from nvrtcVersion), the
//   architecture ("90a"), the Tessera version ("0.1.0", include/tessera/version.h), the full
//   NVRTC option list (nvrtc_options(): includes the CUDA include paths) and the name
//   expressions (they decide which templates are instantiated and which lowered names exist).
//   A change to any kernel header therefore invalidates every cached kernel.
//
// Layout under the cache directory (default_cache_dir()):
//   <dir>/<arch>/<key>.cubin   the CUBIN exactly as NVRTC produced it (cuobjdump can read it)
//   <dir>/<arch>/<key>.meta    text: key, arch, name, CUBIN byte count and SHA-256, one
//                              "lowered <symbol>\t<name expression>" line per kernel, and a last
//                              line with the SHA-256 of everything before it
//   <dir>/<arch>/<key>.lock    flock()ed while the entry is compiled and written; never deleted
// An entry is valid only if its .meta is complete (checksum) and names this key, and the .cubin
// has the recorded length and SHA-256; anything else (a truncated or empty file, a crash between
// the two renames, bit rot) counts as corrupt and is recompiled and overwritten.
//
// Concurrency: in process, one mutex per key, so two threads asking for the same kernel compile
// it once. Across processes, the compiling process holds an exclusive flock on <key>.lock, checks
// again for a valid entry once it has the lock (another process may just have written it), and
// writes each file to a temporary file in the same directory that it then rename()s into place,
// so readers (which take no lock) never see a partial file.
//
// The disk cache is best effort: if the directory cannot be created or written, the kernel is
// still compiled and cached in process, and one warning goes to stderr.
//
// Logging: a compile (not a hit) prints one line to stderr,
//   tessera: JIT compiled <name> for sm_<arch> in <ms> ms (cache <dir>/<arch>/<key>.cubin)
// unless TESSERA_JIT_QUIET=1.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/jit/nvrtc_compiler.h"

namespace tessera {
namespace jit {

/// A compiled kernel module: the CUBIN and the lowered names of its kernels.
struct CachedKernel {
  std::string key;   ///< 64 hex digits
  std::string arch;  ///< "90a"
  std::string name;  ///< the request's name
  std::vector<char> cubin;
  std::vector<LoweredName> lowered_names;
  std::string cubin_path;  ///< where it lives on disk ("" when the disk cache was unusable)

  /// The lowered name of `expression` (one of the request's name expressions); throws
  /// kInvalidArgument for any other expression.
  const std::string& lowered_name(const std::string& expression) const;
};

/// Where each get_or_compile was answered from. Counters only grow.
struct CacheStats {
  uint64_t memory_hits = 0;      ///< found in this process's map
  uint64_t disk_hits = 0;        ///< loaded from a valid disk entry (no NVRTC)
  uint64_t compiles = 0;         ///< compiled with NVRTC
  uint64_t corrupt_entries = 0;  ///< disk entries found invalid (then recompiled)
  uint64_t lock_waits = 0;       ///< times the per-key file lock was held by someone else
};

/// $TESSERA_CACHE_DIR if set and non-empty, else $HOME/.cache/tessera, else (HOME unset or
/// empty) /tmp/tessera-cache-<uid>. Read on every call.
std::string default_cache_dir();

class KernelCache {
 public:
  /// A cache over `dir` (created on first write, with parents).
  explicit KernelCache(std::string dir);
  /// A cache over default_cache_dir() as of construction.
  KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  /// The kernel for `request`, compiled at most once per key across processes sharing `dir`.
  /// Compile errors propagate (see compile_to_cubin) and are not cached.
  std::shared_ptr<const CachedKernel> get_or_compile(const CompileRequest& request);

  /// The cache key of `request` (see the top of this file).
  static std::string key_of(const CompileRequest& request);

  const std::string& dir() const { return dir_; }
  /// "<dir>/<arch>/<key>.cubin"
  std::string cubin_path(const std::string& arch, const std::string& key) const;
  CacheStats stats() const;

 private:
  struct Slot {
    std::mutex mutex;  // held while this key is loaded or compiled
    std::shared_ptr<const CachedKernel> kernel;
  };
  std::shared_ptr<const CachedKernel> load_or_compile(const CompileRequest& request, const std::string& key);
  /// The disk entry if valid, else nullptr; *corrupt tells an invalid entry from a missing one.
  std::shared_ptr<CachedKernel> try_load(const std::string& arch, const std::string& key, bool* corrupt) const;
  void warn_disk(const std::string& message);

  std::string dir_;
  std::mutex mutex_;  // guards slots_
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, compiles_{0}, corrupt_entries_{0}, lock_waits_{0};
  std::atomic<bool> warned_{false};
};

/// The process-wide cache over default_cache_dir(), created on first use.
KernelCache& default_kernel_cache();

}  // namespace jit
}  // namespace tessera
