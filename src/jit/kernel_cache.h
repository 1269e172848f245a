// Get-or-compile cache of JIT kernels (docs/design.md §7): in process, then on disk, then NVRTC.
// docs/jit-cache.md describes the disk cache as a user sees it: layout, key, trust model,
// eviction, environment variables and failure modes. In brief:
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
//   <dir>/<arch>/<key>.lock    flock()ed while the entry is compiled, written or evicted
// An entry is valid only if its .meta is complete (checksum) and names this key, and the .cubin
// has the recorded length and SHA-256; anything else (a truncated or empty file, a crash between
// the two renames, bit rot) counts as corrupt and is recompiled and overwritten.
//
// Trust: a CUBIN is code that runs on the GPU, so the disk cache is used only if nobody but this
// process's user can have written it. Directories are created 0700 and files 0600 (set
// explicitly, whatever the umask). The cache directory and <arch>/ must be owned by the
// effective user and not writable by group or others, and <arch>/ must not be a symbolic link;
// otherwise the disk cache is refused for the rest of this KernelCache's life (one warning names
// the path and the reason) and kernels are compiled and kept in memory only. Every .cubin and
// .meta is opened without following symbolic links and checked (a regular file with the same
// owner and mode rules) on the descriptor it is then read from; one that fails is not loaded: it
// is counted in CacheStats::untrusted_entries, warned about, and replaced by a fresh compile.
//
// Concurrency: in process, one mutex per key, so two threads asking for the same kernel compile
// it once. Across processes, the compiling process holds an exclusive flock on <key>.lock, checks
// again for a valid entry once it has the lock (another process may just have written it), and
// writes each file to a temporary file in the same directory that it then rename()s into place,
// so readers (which take no lock) never see a partial file. A lock wait gives up after
// cache_lock_timeout_ms() with a tessera::Error whose message starts "JIT cache lock timeout".
//
// Size: after each write the cache evicts whole entries, least recently used first, until the
// .cubin and .meta files of every <arch>/ add up to at most cache_max_bytes(). "Used" is the
// modification time, which a disk hit sets to now (so it works with noatime mounts). An entry
// whose lock is held (by another process or another thread) and the entry just written are never
// evicted. The same pass removes temporaries older than kStaleTemporarySeconds and locks of
// entries that have no files left and that nobody holds.
//
// Other disk problems (a directory that cannot be created or written, a file system without
// flock) are not fatal: the kernel is still compiled and cached in process, and one warning goes
// to stderr.
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
#include <map>
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
  uint64_t memory_hits = 0;        ///< found in this process's map
  uint64_t disk_hits = 0;          ///< loaded from a valid disk entry (no NVRTC)
  uint64_t compiles = 0;           ///< compiled with NVRTC
  uint64_t corrupt_entries = 0;    ///< disk entries found invalid (then recompiled)
  uint64_t lock_waits = 0;         ///< times the per-key file lock was held by someone else
  uint64_t untrusted_entries = 0;  ///< disk entries not loaded for their owner, mode or file type
  uint64_t evictions = 0;          ///< entries this cache removed to stay under cache_max_bytes()
};

/// Default of cache_max_bytes(): 2 GiB, thousands of kernels (a CUBIN is a few KiB to a few hundred).
inline constexpr int64_t kDefaultCacheMaxBytes = int64_t{2} << 30;
/// Default of cache_lock_timeout_ms(): one minute, far above one NVRTC compile (about a second for
/// a prefill kernel), so only a stuck or stopped process holding the lock makes a wait fail.
inline constexpr int64_t kDefaultCacheLockTimeoutMs = 60 * 1000;
/// Age in seconds after which a "<name>.tmp.<pid>.<n>" file is a crashed writer's leftover: a
/// writer needs well under a second between creating and renaming it.
inline constexpr int64_t kStaleTemporarySeconds = 10 * 60;

/// The size cap of the disk cache in bytes: $TESSERA_CACHE_MAX_BYTES if set and non-empty, a
/// positive decimal integer with an optional K, M, G or T suffix (powers of 1024), else
/// kDefaultCacheMaxBytes. Read on every call; a malformed value throws kInvalidArgument naming it.
int64_t cache_max_bytes();

/// How long a get_or_compile waits for another process's lock on an entry, in milliseconds:
/// $TESSERA_CACHE_LOCK_TIMEOUT_MS if set and non-empty (a non-negative decimal integer; 0 means
/// one try), else kDefaultCacheLockTimeoutMs. Read on every call; a malformed value throws
/// kInvalidArgument naming it.
int64_t cache_lock_timeout_ms();

/// $TESSERA_CACHE_DIR if set and non-empty, else $HOME/.cache/tessera, else (HOME unset or
/// empty) /tmp/tessera-cache-<uid>. Read on every call.
std::string default_cache_dir();

class KernelCache {
 public:
  /// A cache over `dir` (created on first use with its missing parents, each 0700).
  explicit KernelCache(std::string dir);
  /// A cache over default_cache_dir() as of construction.
  KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  /// The kernel for `request`, compiled at most once per key across processes sharing `dir`.
  /// Compile errors propagate (see compile_to_cubin) and are not cached. Throws kInvalidArgument
  /// for a malformed TESSERA_CACHE_MAX_BYTES or TESSERA_CACHE_LOCK_TIMEOUT_MS, and kInternal
  /// ("JIT cache lock timeout: ...") when another process holds the entry's lock for longer than
  /// cache_lock_timeout_ms().
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
  struct DiskEntry;
  std::shared_ptr<const CachedKernel> load_or_compile(const CompileRequest& request, const std::string& key);
  /// Reads and checks the entry `key` in `arch_fd` (the open <dir>/<arch>/ directory).
  DiskEntry try_load(int arch_fd, const std::string& arch, const std::string& key) const;
  /// Removes stale temporaries and orphaned locks under every <arch>/ of `root_fd`, then evicts
  /// the least recently used entries (never `keep_key` of `keep_arch`) until the cache holds at
  /// most `max_bytes`.
  void clean_and_evict(int root_fd, const std::string& keep_arch, const std::string& keep_key, int64_t max_bytes);
  void warn_disk(const std::string& message);

  std::string dir_;
  std::mutex mutex_;  // guards slots_
  // key -> slot. An ordered map: a hash map made libtessera import std::__detail symbols.
  std::map<std::string, std::shared_ptr<Slot>> slots_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, compiles_{0}, corrupt_entries_{0}, lock_waits_{0},
      untrusted_entries_{0}, evictions_{0};
  std::atomic<bool> warned_{false};
  std::atomic<bool> disk_refused_{false};  // a directory failed the trust check: memory only from then on
};

/// The process-wide cache over default_cache_dir(), created on first use.
KernelCache& default_kernel_cache();

}  // namespace jit
}  // namespace tessera
