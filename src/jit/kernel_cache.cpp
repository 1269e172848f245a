#include "src/jit/kernel_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "src/check.h"
#include "src/jit/embedded_headers.h"
#include "src/jit/sha256.h"
#include "tessera/version.h"

namespace tessera {
namespace jit {
namespace {

constexpr const char* kMetaMagic = "tessera-jit-cache 1";
// Modes of what the cache creates, applied with fchmod/chmod after creation: the umask can only
// remove bits, and a umask of 0777 would leave a directory its owner cannot enter.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;
constexpr size_t kKeyChars = 64;

std::string errno_text(int err) { return std::strerror(err); }

/// Owns a file descriptor; closing it releases any flock taken through it.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

/// Why `st` must not be trusted, or "" if it may: a directory or a regular file (as `want_dir`
/// says), owned by this process's effective user and writable by nobody else. Anyone else who
/// could write it could put code there that this process would run on its GPU. With POSIX ACLs
/// the group bits hold the ACL mask, so a write grant to another user or group shows up as
/// S_IWGRP and is refused too.
std::string untrusted_reason(const struct stat& st, bool want_dir) {
  if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    return want_dir ? "not a directory" : "not a regular file";
  }
  if (st.st_uid != ::geteuid()) {
    return str_cat("owned by uid ", st.st_uid, ", not by this process's user (uid ", ::geteuid(), ")");
  }
  const bool group = (st.st_mode & S_IWGRP) != 0, others = (st.st_mode & S_IWOTH) != 0;
  if (group || others) {
    return str_cat("writable by ", group && others ? "group and others" : group ? "group" : "others", " (mode ",
                   octal_mode(st.st_mode), ")");
  }
  return {};
}

/// "<path>: <reason>" when `st` fails untrusted_reason, else "".
std::string trust_problem(const std::string& path, const struct stat& st, bool want_dir) {
  const std::string reason = untrusted_reason(st, want_dir);
  return reason.empty() ? reason : str_cat(path, ": ", reason);
}

/// Reads all of `fd` from its current offset; false on a read error.
bool read_fd(int fd, std::string* out) {
  out->clear();
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
  }
}

/// Reads regular file `fd` (at offset 0) straight into *out when it holds exactly `expected` bytes;
/// false on a read error or any other length. One read into the final buffer: a warm load copies
/// nothing, and a bad size in the metadata allocates nothing.
bool read_fd_exact(int fd, uint64_t expected, std::vector<char>* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<uint64_t>(st.st_size) != expected) return false;
  out->resize(static_cast<size_t>(expected) + 1);  // the extra byte catches a file that grew
  size_t got = 0;
  while (got < out->size()) {
    const ssize_t n = ::read(fd, out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != expected) return false;
  out->resize(static_cast<size_t>(expected));
  return true;
}

enum class OpenResult { kOpened, kMissing, kUntrusted, kFailed };

/// Opens `name` in `dir_fd` for reading, without following a symbolic link and without blocking
/// on a FIFO, and checks the file it got (not the name, which could be swapped after a check).
/// `path` names it in *problem.
OpenResult open_trusted_file(int dir_fd, const std::string& name, const std::string& path, Fd* fd,
                             std::string* problem) {
  fd->reset(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd->valid()) {
    const int err = errno;
    if (err == ENOENT) return OpenResult::kMissing;
    if (err == ELOOP) {
      *problem = str_cat(path, ": a symbolic link");
      return OpenResult::kUntrusted;
    }
    *problem = str_cat("cannot open ", path, ": ", errno_text(err));
    return OpenResult::kFailed;
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) {
    *problem = str_cat("cannot stat ", path, ": ", errno_text(errno));
    return OpenResult::kFailed;
  }
  *problem = trust_problem(path, st, /*want_dir=*/false);
  return problem->empty() ? OpenResult::kOpened : OpenResult::kUntrusted;
}

/// Writes `data` to a temporary file next to `name` in `dir_fd`, mode 0600, flushes it and
/// renames it onto `name` (atomic within one file system; rename replaces a planted symbolic
/// link rather than following it). `dir_path` names the directory in messages. Returns "" on
/// success, else what went wrong.
std::string write_file_atomic(int dir_fd, const std::string& dir_path, const std::string& name,
                              std::string_view data) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = str_cat(name, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  const std::string tmp_path = str_cat(dir_path, "/", tmp);
  Fd fd(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  if (!fd.valid()) return str_cat("cannot create ", tmp_path, ": ", errno_text(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    const std::string message = str_cat("cannot ", what, " ", tmp_path, ": ", errno_text(err));
    fd.reset();
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return message;
  };
  if (::fchmod(fd.get(), kFileMode) != 0) return fail("set the mode of");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write");
    done += static_cast<size_t>(n);
  }
  // Durable before it becomes visible: after a crash the name points at complete data or at
  // nothing (a torn file would still be caught by the checksums).
  if (::fsync(fd.get()) != 0) return fail("flush");
  if (::close(fd.release()) != 0) return fail("close");
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return str_cat("cannot rename ", tmp_path, " to ", dir_path, "/", name, ": ", errno_text(err));
  }
  return {};
}

/// mkdir -p. Each directory it creates gets mode 0700. Returns "" on success.
std::string make_private_dirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), kDirMode) == 0) {
      if (::chmod(prefix.c_str(), kDirMode) != 0) {
        return str_cat("cannot set the mode of directory ", prefix, ": ", errno_text(errno));
      }
    } else if (errno != EEXIST) {
      return str_cat("cannot create directory ", prefix, ": ", errno_text(errno));
    }
  }
  return {};
}

/// The cache directory and its <arch>/ subdirectory, open, checked and ready for *at() calls.
struct CacheDirs {
  Fd root;
  Fd arch;
};

enum class DirsResult { kUsable, kRefused, kUnavailable };

/// Opens `root` and `root`/`arch`, creating what is missing (0700), and checks both directories
/// it opened. kRefused: one of them failed the trust check (*problem is "<path>: <reason>");
/// kUnavailable: they could not be created or opened.
DirsResult open_cache_dirs(const std::string& root, const std::string& arch, CacheDirs* dirs, std::string* problem) {
  *problem = make_private_dirs(root);
  if (!problem->empty()) return DirsResult::kUnavailable;
  // The root may be reached through a symbolic link (a user's choice, e.g. ~/.cache on another
  // disk): what is checked is the directory opened.
  dirs->root.reset(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirs->root.valid()) {
    *problem = str_cat("cannot open directory ", root, ": ", errno_text(errno));
    return DirsResult::kUnavailable;
  }
  struct stat st;
  if (::fstat(dirs->root.get(), &st) != 0) {
    *problem = str_cat("cannot stat ", root, ": ", errno_text(errno));
    return DirsResult::kUnavailable;
  }
  *problem = trust_problem(root, st, /*want_dir=*/true);
  if (!problem->empty()) return DirsResult::kRefused;

  const std::string arch_path = str_cat(root, "/", arch);
  if (::mkdirat(dirs->root.get(), arch.c_str(), kDirMode) == 0) {
    // Before opening it: a umask of 0777 leaves no read bit to open it with. By name, but in a
    // root only this user can write to (checked above), so the name is still the new directory.
    if (::fchmodat(dirs->root.get(), arch.c_str(), kDirMode, 0) != 0) {
      *problem = str_cat("cannot set the mode of directory ", arch_path, ": ", errno_text(errno));
      return DirsResult::kUnavailable;
    }
  } else if (errno != EEXIST) {
    *problem = str_cat("cannot create directory ", arch_path, ": ", errno_text(errno));
    return DirsResult::kUnavailable;
  }
  dirs->arch.reset(::openat(dirs->root.get(), arch.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dirs->arch.valid()) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      *problem = str_cat(arch_path, ": a symbolic link or not a directory");
      return DirsResult::kRefused;
    }
    *problem = str_cat("cannot open directory ", arch_path, ": ", errno_text(err));
    return DirsResult::kUnavailable;
  }
  if (::fstat(dirs->arch.get(), &st) != 0) {
    *problem = str_cat("cannot stat ", arch_path, ": ", errno_text(errno));
    return DirsResult::kUnavailable;
  }
  *problem = trust_problem(arch_path, st, /*want_dir=*/true);
  return problem->empty() ? DirsResult::kUsable : DirsResult::kRefused;
}

enum class LockResult { kLocked, kBusy, kFailed };

/// Opens (creating, 0600) `name` in `dir_fd` and takes an exclusive flock on it, trying until
/// `timeout_ms` has passed. kBusy: someone else held it the whole time; kFailed: the file could
/// not be opened or the file system has no flock (*problem says which). *waited is set when the
/// first try found the lock held. The lock file may be unlinked by whoever holds it (eviction,
/// cleanup of orphaned locks), so after locking, the descriptor is compared with the file now
/// under `name`: holding the lock means holding the file that name leads to, never an unlinked
/// one that a third process could not see.
LockResult lock_file(int dir_fd, const std::string& name, const std::string& path, int64_t timeout_ms, Fd* lock,
                     bool* waited, std::string* problem) {
  using Clock = std::chrono::steady_clock;
  // Beyond ~30 years, "wait forever" (and no overflow of the clock's nanoseconds).
  constexpr int64_t kForeverMs = int64_t{1000} * 1000 * 1000 * 1000;
  const Clock::time_point deadline = timeout_ms >= kForeverMs ? Clock::time_point::max()
                                                              : Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::chrono::milliseconds pause(1);
  *waited = false;
  for (;;) {
    lock->reset(::openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, kFileMode));
    if (!lock->valid()) {
      *problem = str_cat("cannot open ", path, ": ", errno_text(errno));
      return LockResult::kFailed;
    }
    struct stat held;
    if (::fstat(lock->get(), &held) == 0 && held.st_uid == ::geteuid() && (held.st_mode & 07777) != kFileMode) {
      ::fchmod(lock->get(), kFileMode);  // best effort: the lock file's content is never read
    }
    for (;;) {
      if (::flock(lock->get(), LOCK_EX | LOCK_NB) == 0) break;
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        *problem = str_cat("cannot lock ", path, ": ", errno_text(errno));
        return LockResult::kFailed;
      }
      *waited = true;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        lock->reset();
        return LockResult::kBusy;
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
    struct stat named;
    if (::fstat(lock->get(), &held) != 0) return LockResult::kLocked;  // cannot tell: keep it
    if (::fstatat(dir_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) return LockResult::kLocked;
    } else if (held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      return LockResult::kLocked;
    }
    // Unlinked or replaced while we waited: lock whatever the name leads to now.
  }
}

/// $name parsed by `parse` (which returns false for a malformed value), or `fallback` when the
/// variable is unset or empty.
template <typename Parse>
int64_t env_limit(const char* name, int64_t fallback, const char* expected, Parse parse) {
  const char* text = std::getenv(name);
  if (text == nullptr || text[0] == '\0') return fallback;
  int64_t value = 0;
  TESSERA_CHECK_ARG(parse(std::string_view(text), &value))
      << name << " = '" << text << "', expected " << expected;
  return value;
}

/// A decimal integer in [0, INT64_MAX] with no sign, space or other characters; the rest of
/// `text` after its digits goes to *rest.
bool parse_decimal(std::string_view text, int64_t* value, std::string_view* rest) {
  size_t i = 0;
  uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    v = v * 10 + static_cast<uint64_t>(text[i] - '0');
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
  }
  if (i == 0) return false;
  *value = static_cast<int64_t>(v);
  *rest = text.substr(i);
  return true;
}

/// What a cache file's name says it is: part of entry `key`, or a temporary.
struct CacheFileName {
  enum Kind { kCubin, kMeta, kLock, kTemporary, kOther } kind = kOther;
  std::string key;
};

CacheFileName classify_file(std::string_view name) {
  CacheFileName f;
  if (name.size() <= kKeyChars + 1 || name[kKeyChars] != '.') return f;
  if (name.substr(0, kKeyChars).find_first_not_of("0123456789abcdef") != std::string_view::npos) return f;
  const std::string_view rest = name.substr(kKeyChars + 1);
  if (rest == "cubin") {
    f.kind = CacheFileName::kCubin;
  } else if (rest == "meta") {
    f.kind = CacheFileName::kMeta;
  } else if (rest == "lock") {
    f.kind = CacheFileName::kLock;
  } else if (rest.rfind("cubin.tmp.", 0) == 0 || rest.rfind("meta.tmp.", 0) == 0) {
    f.kind = CacheFileName::kTemporary;
  } else {
    return f;
  }
  f.key = std::string(name.substr(0, kKeyChars));
  return f;
}

/// The names in directory `dir_fd` (which stays open and keeps its offset), without "." and "..".
std::vector<std::string> list_dir(int dir_fd) {
  std::vector<std::string> names;
  const int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

bool is_arch_name(const std::string& name) {
  try {
    check_arch(name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

const std::string& headers_digest() {
  static const std::string digest = [] {
    Sha256 h;
    h.field(std::to_string(kNumEmbeddedHeaders));
    for (std::size_t i = 0; i < kNumEmbeddedHeaders; ++i) {
      h.field(kEmbeddedHeaders[i].name);
      h.field(std::string_view(kEmbeddedHeaders[i].text(), kEmbeddedHeaders[i].size));
    }
    return h.hex_digest();
  }();
  return digest;
}

bool quiet() {
  const char* q = std::getenv("TESSERA_JIT_QUIET");
  return q != nullptr && q[0] != '\0' && std::strcmp(q, "0") != 0;
}

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s;
}

std::string make_meta(const CachedKernel& k) {
  std::string body = str_cat(kMetaMagic, "\nkey ", k.key, "\narch ", k.arch, "\nname ", one_line(k.name),
                             "\ncubin_bytes ", k.cubin.size(), "\ncubin_sha256 ",
                             sha256_hex(std::string_view(k.cubin.data(), k.cubin.size())), "\n");
  for (const LoweredName& n : k.lowered_names) body += str_cat("lowered ", n.lowered, "\t", n.expression, "\n");
  return body + str_cat("meta_sha256 ", sha256_hex(body), "\n");
}

/// kUntrusted: a file of the entry failed the trust check (owner, mode, type); kCorrupt: its
/// files are ours but do not make a valid entry for this key.
enum class EntryState { kMissing, kCorrupt, kUntrusted, kValid };

/// Parses and checks a .meta file; fills key/arch/name/lowered names and the expected CUBIN
/// size and hash.
bool parse_meta(const std::string& text, const std::string& key, const std::string& arch, CachedKernel* k,
                uint64_t* cubin_bytes, std::string* cubin_sha) {
  if (text.size() < 2 || text.back() != '\n') return false;
  const size_t last = text.rfind('\n', text.size() - 2);
  const size_t last_begin = last == std::string::npos ? 0 : last + 1;
  const std::string body = text.substr(0, last_begin);
  const std::string last_line = text.substr(last_begin, text.size() - 1 - last_begin);
  if (last_line != "meta_sha256 " + sha256_hex(body)) return false;

  bool magic = false, has_bytes = false;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find('\n', pos);
    const std::string line = body.substr(pos, end - pos);
    pos = end + 1;
    const size_t space = line.find(' ');
    const std::string field = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (line == kMetaMagic) {
      magic = true;
    } else if (field == "key") {
      if (value != key) return false;
      k->key = value;
    } else if (field == "arch") {
      if (value != arch) return false;
      k->arch = value;
    } else if (field == "name") {
      k->name = value;
    } else if (field == "cubin_bytes") {
      char* end_ptr = nullptr;
      *cubin_bytes = std::strtoull(value.c_str(), &end_ptr, 10);
      has_bytes = !value.empty() && *end_ptr == '\0';
    } else if (field == "cubin_sha256") {
      *cubin_sha = value;
    } else if (field == "lowered") {
      const size_t tab = value.find('\t');
      if (tab == std::string::npos || tab == 0) return false;
      k->lowered_names.push_back(LoweredName{value.substr(tab + 1), value.substr(0, tab)});
    } else {
      return false;
    }
  }
  return magic && has_bytes && k->key == key && k->arch == arch && cubin_sha->size() == 64 &&
         !k->lowered_names.empty();
}

}  // namespace

const std::string& CachedKernel::lowered_name(const std::string& expression) const {
  for (const LoweredName& n : lowered_names) {
    if (n.expression == expression) return n.lowered;
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument) << "JIT kernel '" << name << "' has no name expression '" << expression
                                             << "'";
}

std::string default_cache_dir() {
  const char* dir = std::getenv("TESSERA_CACHE_DIR");
  if (dir != nullptr && dir[0] != '\0') return dir;
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return str_cat(home, "/.cache/tessera");
  return str_cat("/tmp/tessera-cache-", ::getuid());
}

KernelCache::KernelCache(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  TESSERA_CHECK_ARG(!dir_.empty()) << "JIT cache directory is empty";
}

KernelCache::KernelCache() : KernelCache(default_cache_dir()) {}

std::string KernelCache::cubin_path(const std::string& arch, const std::string& key) const {
  return str_cat(dir_, "/", arch, "/", key, ".cubin");
}

int64_t cache_max_bytes() {
  return env_limit("TESSERA_CACHE_MAX_BYTES", kDefaultCacheMaxBytes,
                   "a positive number of bytes, optionally with a K, M, G or T suffix (powers of 1024)",
                   [](std::string_view text, int64_t* value) {
                     std::string_view rest;
                     if (!parse_decimal(text, value, &rest) || *value == 0) return false;
                     if (rest.empty()) return true;
                     if (rest.size() != 1) return false;
                     const size_t shift = std::string_view("KMGT").find(rest[0]);
                     if (shift == std::string_view::npos) return false;
                     const int bits = 10 * static_cast<int>(shift + 1);
                     if (*value > (INT64_MAX >> bits)) return false;
                     *value <<= bits;
                     return true;
                   });
}

int64_t cache_lock_timeout_ms() {
  return env_limit("TESSERA_CACHE_LOCK_TIMEOUT_MS", kDefaultCacheLockTimeoutMs,
                   "a non-negative whole number of milliseconds", [](std::string_view text, int64_t* value) {
                     std::string_view rest;
                     return parse_decimal(text, value, &rest) && rest.empty();
                   });
}

CacheStats KernelCache::stats() const {
  CacheStats s;
  s.memory_hits = memory_hits_.load();
  s.disk_hits = disk_hits_.load();
  s.compiles = compiles_.load();
  s.corrupt_entries = corrupt_entries_.load();
  s.lock_waits = lock_waits_.load();
  s.untrusted_entries = untrusted_entries_.load();
  s.evictions = evictions_.load();
  return s;
}

std::string KernelCache::key_of(const CompileRequest& request) {
  check_arch(request.arch);
  Sha256 h;
  h.field("tessera-jit-key-v1");
  h.field(request.source.text);
  h.field(headers_digest());
  h.field(nvrtc_version_string());
  h.field(request.arch);
  h.field(str_cat(TESSERA_VERSION_MAJOR, ".", TESSERA_VERSION_MINOR, ".", TESSERA_VERSION_PATCH));
  const std::vector<std::string> options = nvrtc_options(request.arch, request.extra_options);
  h.field(std::to_string(options.size()));
  for (const std::string& o : options) h.field(o);
  h.field(std::to_string(request.name_expressions.size()));
  for (const std::string& n : request.name_expressions) h.field(n);
  return h.hex_digest();
}

void KernelCache::warn_disk(const std::string& message) {
  if (warned_.exchange(true)) return;
  std::fprintf(stderr, "tessera: warning: JIT disk cache: %s (further warnings suppressed)\n", message.c_str());
}

std::shared_ptr<const CachedKernel> KernelCache::get_or_compile(const CompileRequest& request) {
  check_arch(request.arch);
  TESSERA_CHECK_ARG(!request.name_expressions.empty())
      << "JIT compile of '" << request.name << "': no name expressions, expected at least one kernel to keep";
  for (const std::string& n : request.name_expressions) {
    TESSERA_CHECK_ARG(!n.empty() && n.find_first_of("\n\r\t") == std::string::npos)
        << "JIT name expression '" << n << "' is empty or contains a tab or line break";
  }
  const std::string key = key_of(request);
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Slot>& s = slots_[key];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  if (slot->kernel) {
    ++memory_hits_;
    return slot->kernel;
  }
  slot->kernel = load_or_compile(request, key);
  return slot->kernel;
}

struct KernelCache::DiskEntry {
  EntryState state = EntryState::kMissing;
  std::shared_ptr<CachedKernel> kernel;  // kValid only
  std::string problem;                   // kUntrusted: which file and why
};

KernelCache::DiskEntry KernelCache::try_load(int arch_fd, const std::string& arch, const std::string& key) const {
  DiskEntry entry;
  const std::string arch_path = str_cat(dir_, "/", arch);
  const std::string meta_name = key + ".meta", cubin_name = key + ".cubin";
  // Each file is checked on the descriptor it is then read from, and neither is read before both
  // passed: a planted file never reaches the parser or the GPU.
  Fd meta_fd, cubin_fd;
  switch (open_trusted_file(arch_fd, meta_name, str_cat(arch_path, "/", meta_name), &meta_fd, &entry.problem)) {
    case OpenResult::kOpened: break;
    // No metadata: never written, or a crash between the two renames (the .cubin goes first).
    case OpenResult::kMissing: return entry;
    case OpenResult::kUntrusted: entry.state = EntryState::kUntrusted; return entry;
    case OpenResult::kFailed: entry.state = EntryState::kCorrupt; return entry;
  }
  switch (open_trusted_file(arch_fd, cubin_name, cubin_path(arch, key), &cubin_fd, &entry.problem)) {
    case OpenResult::kOpened: break;
    case OpenResult::kUntrusted: entry.state = EntryState::kUntrusted; return entry;
    case OpenResult::kMissing:
    case OpenResult::kFailed: entry.state = EntryState::kCorrupt; return entry;
  }
  auto k = std::make_shared<CachedKernel>();
  uint64_t cubin_bytes = 0;
  std::string meta, cubin_sha;
  if (!read_fd(meta_fd.get(), &meta) || !parse_meta(meta, key, arch, k.get(), &cubin_bytes, &cubin_sha) ||
      !read_fd_exact(cubin_fd.get(), cubin_bytes, &k->cubin) ||
      sha256_hex(std::string_view(k->cubin.data(), k->cubin.size())) != cubin_sha) {
    entry.state = EntryState::kCorrupt;
    return entry;
  }
  // Recency for eviction, recorded by the cache itself: atime may be off (noatime, relatime).
  // Best effort: a read-only cache still serves hits.
  ::futimens(cubin_fd.get(), nullptr);
  k->cubin_path = cubin_path(arch, key);
  entry.state = EntryState::kValid;
  entry.kernel = std::move(k);
  return entry;
}

void KernelCache::clean_and_evict(int root_fd, const std::string& keep_arch, const std::string& keep_key,
                                  int64_t max_bytes) {
  struct Entry {
    std::string arch, key;
    int64_t bytes = 0;
    struct timespec used = {0, 0};  // the latest modification time of its .cubin and .meta
    bool has_data = false;          // a .cubin or a .meta exists
  };
  std::map<std::string, Fd> arch_dirs;  // arch -> open, trusted directory
  std::vector<Entry> entries;
  int64_t total = 0;
  const time_t now = ::time(nullptr);
  for (const std::string& arch : list_dir(root_fd)) {
    if (!is_arch_name(arch)) continue;
    Fd fd(::openat(root_fd, arch.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    // Nothing is counted or deleted in a directory the cache would not load from.
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !untrusted_reason(st, /*want_dir=*/true).empty()) {
      continue;
    }
    std::map<std::string, Entry> by_key;
    for (const std::string& name : list_dir(fd.get())) {
      const CacheFileName f = classify_file(name);
      if (f.kind == CacheFileName::kOther) continue;
      struct stat fst;
      if (::fstatat(fd.get(), name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      if (f.kind == CacheFileName::kTemporary) {
        // A writer renames its temporary within a second; an old one is a crashed writer's.
        if (now - fst.st_mtime > kStaleTemporarySeconds) ::unlinkat(fd.get(), name.c_str(), 0);
        continue;
      }
      Entry& e = by_key[f.key];
      e.arch = arch;
      e.key = f.key;
      if (f.kind == CacheFileName::kLock) continue;
      e.has_data = true;
      e.bytes += fst.st_size;
      if (fst.st_mtim.tv_sec > e.used.tv_sec ||
          (fst.st_mtim.tv_sec == e.used.tv_sec && fst.st_mtim.tv_nsec > e.used.tv_nsec)) {
        e.used = fst.st_mtim;
      }
    }
    for (auto& [key, e] : by_key) {
      total += e.bytes;
      entries.push_back(std::move(e));
    }
    arch_dirs.emplace(arch, std::move(fd));
  }

  // Deletes the files of entry `e` if nobody holds its lock; the lock goes last, while held, so
  // that a process that opened it meanwhile sees the name gone and starts over (lock_file).
  auto remove_if_unlocked = [&](const Entry& e) {
    const int dir_fd = arch_dirs.at(e.arch).get();
    const std::string lock_name = e.key + ".lock";
    Fd lock;
    bool waited = false;
    std::string problem;
    if (lock_file(dir_fd, lock_name, str_cat(dir_, "/", e.arch, "/", lock_name), /*timeout_ms=*/0, &lock, &waited,
                  &problem) != LockResult::kLocked) {
      return false;
    }
    ::unlinkat(dir_fd, (e.key + ".meta").c_str(), 0);  // first: without it the .cubin is never loaded
    ::unlinkat(dir_fd, (e.key + ".cubin").c_str(), 0);
    ::unlinkat(dir_fd, lock_name.c_str(), 0);
    return true;
  };
  const auto is_kept = [&](const Entry& e) { return e.arch == keep_arch && e.key == keep_key; };

  // Locks left by entries that no longer exist (an eviction elsewhere, a failed compile).
  for (const Entry& e : entries) {
    if (!e.has_data && !is_kept(e)) remove_if_unlocked(e);
  }
  if (total <= max_bytes) return;
  std::vector<const Entry*> by_age;
  for (const Entry& e : entries) {
    if (e.has_data && !is_kept(e)) by_age.push_back(&e);
  }
  std::sort(by_age.begin(), by_age.end(), [](const Entry* a, const Entry* b) {
    if (a->used.tv_sec != b->used.tv_sec) return a->used.tv_sec < b->used.tv_sec;
    if (a->used.tv_nsec != b->used.tv_nsec) return a->used.tv_nsec < b->used.tv_nsec;
    return a->key < b->key;
  });
  for (const Entry* e : by_age) {
    if (total <= max_bytes) break;
    if (remove_if_unlocked(*e)) {
      total -= e->bytes;
      ++evictions_;
    }
  }
}

std::shared_ptr<const CachedKernel> KernelCache::load_or_compile(const CompileRequest& request,
                                                                 const std::string& key) {
  // Read first, so that a malformed value fails every call, hit or miss.
  const int64_t max_bytes = cache_max_bytes();
  const int64_t lock_timeout_ms = cache_lock_timeout_ms();
  const std::string& arch = request.arch;
  const std::string arch_path = str_cat(dir_, "/", arch);
  CacheDirs dirs;
  bool use_disk = !disk_refused_.load();
  if (use_disk) {
    std::string problem;
    switch (open_cache_dirs(dir_, arch, &dirs, &problem)) {
      case DirsResult::kUsable: break;
      case DirsResult::kRefused:
        // Someone else could have written there: nothing in it is used again by this cache.
        disk_refused_ = true;
        warn_disk(str_cat("refusing ", problem, "; using the in-memory cache only"));
        use_disk = false;
        break;
      case DirsResult::kUnavailable:
        warn_disk(problem);
        use_disk = false;
        break;
    }
  }

  Fd lock;
  if (use_disk) {
    // Fast path without the lock: entries are only ever replaced by rename(), so what we read is
    // some complete version of the files, and the checksums reject a mismatched pair.
    DiskEntry entry = try_load(dirs.arch.get(), arch, key);
    if (entry.state == EntryState::kValid) {
      ++disk_hits_;
      return entry.kernel;
    }
    const std::string lock_name = key + ".lock", lock_path = str_cat(arch_path, "/", lock_name);
    bool waited = false;
    std::string problem;
    const LockResult locked =
        lock_file(dirs.arch.get(), lock_name, lock_path, lock_timeout_ms, &lock, &waited, &problem);
    if (waited) ++lock_waits_;  // another process or thread is compiling (or evicting) this key
    if (locked == LockResult::kBusy) {
      TESSERA_FAIL(StatusCode::kInternal)
          << "JIT cache lock timeout: " << lock_path << " was held by another process for "
          << lock_timeout_ms << " ms (TESSERA_CACHE_LOCK_TIMEOUT_MS) while compiling '" << request.name
          << "'; a process that compiles this kernel may be stuck or stopped: end it, or set "
             "TESSERA_CACHE_DIR to another directory";
    }
    // A file system without flock: go on unlocked (at worst a duplicate compile; the renames
    // keep every reader safe).
    if (locked == LockResult::kFailed) warn_disk(problem);
    // With the lock held: someone may have finished this entry while we waited.
    entry = try_load(dirs.arch.get(), arch, key);
    switch (entry.state) {
      case EntryState::kValid: ++disk_hits_; return entry.kernel;
      case EntryState::kCorrupt: ++corrupt_entries_; break;
      case EntryState::kUntrusted:
        // Replaced below by files of our own (rename() swaps the name, whoever owned the old file).
        ++untrusted_entries_;
        warn_disk(str_cat("not loading ", entry.problem, "; compiling the kernel again into a private file"));
        break;
      case EntryState::kMissing: break;
    }
  }

  CompileResult result = compile_to_cubin(request);
  auto k = std::make_shared<CachedKernel>();
  k->key = key;
  k->arch = arch;
  k->name = request.name;
  k->cubin = std::move(result.cubin);
  k->lowered_names = std::move(result.lowered_names);
  if (use_disk) {
    // The .cubin first, the .meta (which vouches for it) second.
    const std::string_view cubin(k->cubin.data(), k->cubin.size());
    std::string problem = write_file_atomic(dirs.arch.get(), arch_path, key + ".cubin", cubin);
    if (problem.empty()) problem = write_file_atomic(dirs.arch.get(), arch_path, key + ".meta", make_meta(*k));
    if (problem.empty()) {
      k->cubin_path = cubin_path(arch, key);
      clean_and_evict(dirs.root.get(), arch, key, max_bytes);
    } else {
      warn_disk(problem);
    }
  }
  ++compiles_;
  if (!quiet()) {
    std::fprintf(stderr, "tessera: JIT compiled %s for sm_%s in %.0f ms (cache %s)\n", request.name.c_str(),
                 arch.c_str(), result.compile_ms, k->cubin_path.empty() ? "in memory only" : k->cubin_path.c_str());
  }
  return k;
}

KernelCache& default_kernel_cache() {
  static KernelCache* cache = new KernelCache();  // never destroyed: usable from static destructors
  return *cache;
}

}  // namespace jit
}  // namespace tessera
