#include "src/jit/kernel_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "src/check.h"
#include "src/jit/embedded_headers.h"
#include "src/jit/sha256.h"
#include "tessera/version.h"

namespace tessera {
namespace jit {
namespace {

constexpr const char* kMetaMagic = "tessera-jit-cache 1";

std::string errno_text(int err) { return std::strerror(err); }

/// The whole file, or false if it cannot be opened or read.
bool read_file(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[1 << 16];
  bool ok = true;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return ok;
}

/// Writes `data` to a temporary file next to `path`, flushes it and renames it onto `path`
/// (atomic within one file system). Returns "" on success, else what went wrong.
std::string write_file_atomic(const std::string& path, std::string_view data) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = str_cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return str_cat("cannot create ", tmp, ": ", errno_text(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return str_cat("cannot write ", tmp, ": ", errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
  // Durable before it becomes visible: after a crash the name points at complete data or at
  // nothing (a torn file would still be caught by the checksums).
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return str_cat("cannot flush ", tmp, ": ", errno_text(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return str_cat("cannot rename ", tmp, " to ", path, ": ", errno_text(err));
  }
  return {};
}

/// mkdir -p. Returns "" on success.
std::string make_dirs(const std::string& path) {
  if (path.empty()) return "empty cache directory";
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return str_cat("cannot create directory ", prefix, ": ", errno_text(errno));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return str_cat(path, " is not a directory");
  return {};
}

/// A cache root inside a world-writable directory (/tmp) must belong to us: anyone could have
/// created it and planted code for our GPU. Returns "" when acceptable.
std::string check_root_owner(const std::string& dir) {
  std::string parent = dir;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
  struct stat parent_st, st;
  if (::stat(parent.c_str(), &parent_st) != 0 || ::stat(dir.c_str(), &st) != 0) return {};
  if ((parent_st.st_mode & S_IWOTH) != 0 && st.st_uid != ::geteuid()) {
    return str_cat(dir, " is owned by uid ", st.st_uid, ", not by this user, in world-writable ", parent);
  }
  return {};
}

/// Closes the lock file (and so releases its flock) on every path.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

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

enum class EntryState { kMissing, kCorrupt, kValid };

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

CacheStats KernelCache::stats() const {
  CacheStats s;
  s.memory_hits = memory_hits_.load();
  s.disk_hits = disk_hits_.load();
  s.compiles = compiles_.load();
  s.corrupt_entries = corrupt_entries_.load();
  s.lock_waits = lock_waits_.load();
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

std::shared_ptr<CachedKernel> KernelCache::try_load(const std::string& arch, const std::string& key,
                                                    bool* corrupt) const {
  *corrupt = false;
  const std::string cubin_file = cubin_path(arch, key);
  const std::string meta_file = str_cat(dir_, "/", arch, "/", key, ".meta");
  std::string meta;
  if (!read_file(meta_file, &meta)) {
    // No metadata: never written, or a crash between the two renames (the .cubin goes first).
    return nullptr;
  }
  auto k = std::make_shared<CachedKernel>();
  uint64_t cubin_bytes = 0;
  std::string cubin_sha;
  std::string cubin;
  if (!parse_meta(meta, key, arch, k.get(), &cubin_bytes, &cubin_sha) || !read_file(cubin_file, &cubin) ||
      cubin.size() != cubin_bytes || sha256_hex(cubin) != cubin_sha) {
    *corrupt = true;
    return nullptr;
  }
  k->cubin.assign(cubin.begin(), cubin.end());
  k->cubin_path = cubin_file;
  return k;
}

std::shared_ptr<const CachedKernel> KernelCache::load_or_compile(const CompileRequest& request,
                                                                 const std::string& key) {
  const std::string& arch = request.arch;
  bool corrupt = false;
  std::string disk_problem = check_root_owner(dir_);  // before reading anything from it
  // Fast path without the lock: entries are only ever replaced by rename(), so what we read is
  // some complete version of the files, and the checksums reject a mismatched pair.
  if (disk_problem.empty()) {
    if (std::shared_ptr<CachedKernel> k = try_load(arch, key, &corrupt)) {
      ++disk_hits_;
      return k;
    }
  }

  const std::string arch_dir = str_cat(dir_, "/", arch);
  if (disk_problem.empty()) disk_problem = make_dirs(arch_dir);
  if (disk_problem.empty()) disk_problem = check_root_owner(dir_);  // we may just have created it
  FdGuard lock;
  if (disk_problem.empty()) {
    const std::string lock_file = str_cat(arch_dir, "/", key, ".lock");
    lock.fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock.fd < 0) {
      disk_problem = str_cat("cannot open ", lock_file, ": ", errno_text(errno));
    } else if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) ++lock_waits_;  // another process or thread is compiling this key
      int rc;
      do {
        rc = ::flock(lock.fd, LOCK_EX);
      } while (rc != 0 && errno == EINTR);
      // A file system without flock: go on unlocked (at worst a duplicate compile; the renames
      // keep every reader safe).
      if (rc != 0) warn_disk(str_cat("cannot lock ", lock_file, ": ", errno_text(errno)));
    }
  }
  if (!disk_problem.empty()) {
    warn_disk(disk_problem);
  } else {
    // With the lock held: someone may have finished this entry while we waited.
    if (std::shared_ptr<CachedKernel> k = try_load(arch, key, &corrupt)) {
      ++disk_hits_;
      return k;
    }
    if (corrupt) ++corrupt_entries_;
  }

  CompileResult result = compile_to_cubin(request);
  auto k = std::make_shared<CachedKernel>();
  k->key = key;
  k->arch = arch;
  k->name = request.name;
  k->cubin = std::move(result.cubin);
  k->lowered_names = std::move(result.lowered_names);
  if (disk_problem.empty()) {
    const std::string cubin_file = cubin_path(arch, key);
    // The .cubin first, the .meta (which vouches for it) second.
    std::string problem = write_file_atomic(cubin_file, std::string_view(k->cubin.data(), k->cubin.size()));
    if (problem.empty()) problem = write_file_atomic(str_cat(arch_dir, "/", key, ".meta"), make_meta(*k));
    if (problem.empty()) {
      k->cubin_path = cubin_file;
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
