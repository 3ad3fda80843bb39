#include "core/durable_file.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow::detail {
namespace {

// One read or write call moves at most this much: POSIX leaves larger counts than SSIZE_MAX
// undefined, and Linux stops at about 2 GiB anyway.
constexpr std::size_t max_io_bytes = std::size_t{1} << 30;

std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hard-to-guess temp name suffix without std::random_device, which may throw: the pid
// alone is not enough (threads of one process, or a pid reused after a crash left a temp
// file), so mix in a per-process counter, the clock and a stack address. O_EXCL settles any
// collision that is left.
std::string random_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  const auto now =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  int on_stack = 0;
  const std::uint64_t value =
      mix(mix(counter.fetch_add(1, std::memory_order_relaxed) ^ now) ^
          static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&on_stack)));
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// The longest file name a folder takes (Linux, and every file system tierflow writes to).
constexpr std::size_t max_name_bytes = NAME_MAX;
// What a temp name adds to its stem: ".tmp.", a pid of at most 10 digits, "." and 16 hex digits.
constexpr std::size_t temp_name_extra = 5 + 10 + 1 + 16;

// The start of every temp name of @p target: `STEM.tmp.`, STEM the target's name cut so that
// the temp name stays within NAME_MAX (a name of 230 to 255 bytes could not be saved when its
// temp name took all of it). Two long names that agree in their first bytes share a stem; the
// temp names still differ (pid, suffix, O_EXCL), and only dead writers' files are ever removed.
std::string temp_prefix(const std::string& target) {
  return target.substr(0, max_name_bytes - temp_name_extra) + ".tmp.";
}

// The writer PID of a temp file named `STEM.tmp.PID.SUFFIX` (SUFFIX: 16 hex digits), or 0
// when @p name is not such a name for @p target.
pid_t temp_writer(const std::string& name, const std::string& target) {
  const std::string prefix = temp_prefix(target);
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return 0;
  }
  const std::string_view rest = std::string_view(name).substr(prefix.size());
  const auto dot = rest.find('.');
  if (dot == std::string_view::npos || rest.size() - dot - 1 != 16 ||
      rest.find_first_not_of("0123456789abcdef", dot + 1) != std::string_view::npos) {
    return 0;
  }
  const auto pid = parse_u64(rest.substr(0, dot));
  if (!pid || *pid == 0 || *pid > static_cast<std::uint64_t>(std::numeric_limits<pid_t>::max())) {
    return 0;
  }
  return static_cast<pid_t>(*pid);
}

}  // namespace

void remove_stale_temps(const std::filesystem::path& path) noexcept {
  try {
    const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    const std::string target = path.filename().string();
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const pid_t writer = temp_writer(it->path().filename().string(), target);
      // Only a writer that is gone for sure (ESRCH): a live pid, even a reused one, keeps its
      // file, and so does every writer of this process.
      std::error_code type_ec;
      if (writer != 0 && writer != ::getpid() && ::kill(writer, 0) != 0 && errno == ESRCH &&
          it->is_regular_file(type_ec)) {
        ::unlink(it->path().c_str());
      }
    }
  } catch (...) {  // out of memory while listing: the stale files wait for the next save
  }
}

void durable_writer::check_target() const {
  if (path_.empty()) {
    throw input_error(what_, "empty path", "");
  }
  const std::string name = path_.filename().string();
  if (name.empty()) {
    throw input_error(path_.string(), "the " + what_ + " path names a folder (it ends in '/')",
                      path_.string());
  }
  if (name.size() > max_name_bytes) {
    throw input_error(path_.string(),
                      "the file name is " + std::to_string(name.size()) +
                          " bytes long, above the " + std::to_string(max_name_bytes) +
                          " a file name may have",
                      name);
  }
  // A folder that is not there is the caller's mistake, not the machine's refusal. A folder
  // that cannot even be looked at (EACCES) is left to the open below: the environment.
  const auto dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int code = errno;
    if (code == ENOENT || code == ENOTDIR) {
      throw input_error(path_.string(), "the folder of the " + what_ + " does not exist",
                        dir.string());
    }
  } else if (!S_ISDIR(st.st_mode)) {
    throw input_error(path_.string(), "the folder of the " + what_ + " is not a folder",
                      dir.string());
  }
}

durable_writer::durable_writer(std::filesystem::path path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  check_target();
  // rename() replaces whatever has the name: a device node (/dev/null), a FIFO, a socket.
  struct stat existing {};
  if (::stat(path_.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    fail(std::string(S_ISDIR(existing.st_mode) ? "is a directory" : "is not a regular file") +
             "; refusing to replace it",
         0);
  }
  remove_stale_temps(path_);
  const auto folder = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path();
  const std::string prefix =
      (folder / temp_prefix(path_.filename().string())).string() + std::to_string(::getpid()) + ".";
  // A name already taken (a leftover of a crashed writer with the same pid) is retried with
  // a fresh suffix; anything else is the caller's problem (no directory, no permission).
  for (int attempt = 0; attempt < 8; ++attempt) {
    temp_ = prefix + random_suffix();
    fd_ = ::open(temp_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd_ >= 0 || errno != EEXIST) {
      break;
    }
  }
  if (fd_ < 0) {
    const int code = errno;
    fail("cannot create the temp file " + temp_.string(), code);
  }
  temp_present_ = true;
}

durable_writer::~durable_writer() {
  discard();
}

void durable_writer::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (temp_present_) {
    ::unlink(temp_.c_str());
    temp_present_ = false;
  }
}

// Callers save errno before building the problem text: allocating it may change errno.
// What the system refused (an errno; a write that made no progress) is the environment's
// fault; the rest (a folder at the path, a spent writer) the caller's.
void durable_writer::fail(const std::string& problem, int code, bool environment) {
  discard();
  const std::string message = what_ + " " + path_.string() + ": " + problem;
  if (code != 0 || environment) {
    throw environment_error(message, path_.string(), code);
  }
  throw error(message);
}

void durable_writer::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) {
    fail("write after the writer failed or was committed", 0);
  }
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min(bytes, max_io_bytes));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      const int code = errno;
      fail("write failed", code);
    }
    if (n == 0) {
      // Not expected from a regular file, but looping on it would never end.
      fail("write failed: no progress", 0, true);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void durable_writer::commit() {
  if (fd_ < 0) {
    fail("commit after the writer failed or was committed", 0);
  }
  if (::fsync(fd_) != 0) {
    const int code = errno;
    fail("fsync failed", code);
  }
  // close() may report a deferred write error (NFS); the descriptor is gone either way, so it
  // is not retried.
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int code = errno;
    fail("close failed", code);
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int code = errno;
    fail("cannot rename " + temp_.string() + " over it", code);
  }
  temp_present_ = false;

  // The rename is only durable once the directory entry is on disk.
  const auto dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int code = errno;
    fail("in place, but cannot open its directory to fsync it", code);
  }
  const int rc = ::fsync(dir_fd);
  const int code = errno;
  ::close(dir_fd);
  // Some filesystems cannot fsync a directory at all (EINVAL); nothing more can be done there.
  if (rc != 0 && code != EINVAL) {
    fail("in place, but the fsync of its directory failed", code);
  }
}

input_file::input_file(const std::filesystem::path& path, std::string what, std::uint64_t max_bytes)
    : source_(path.string()), what_(std::move(what)) {
  // O_NONBLOCK only so that opening a FIFO by mistake does not hang; it is refused below, and
  // regular files ignore the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    const int code = errno;
    throw input_error(source_, "cannot read the " + what_ + ": " + std::strerror(code));
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd_, &st) != 0) {
    problem = std::string("cannot stat the ") + what_ + ": " + std::strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    problem = "the " + what_ + " is a directory";
  } else if (!S_ISREG(st.st_mode)) {
    problem = "the " + what_ + " is not a regular file";
  } else if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    problem = "the " + what_ + " is too large: " + std::to_string(st.st_size) + " bytes, at most " +
              std::to_string(max_bytes) + " allowed";
  }
  if (!problem.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw input_error(source_, problem);
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

input_file::~input_file() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

std::vector<unsigned char> read_file(const std::filesystem::path& path, const std::string& what,
                                     std::uint64_t max_bytes) {
  const input_file file(path, what, max_bytes);
  const std::string& source = file.source();
  const auto too_large = [&] {
    return input_error(source, "the " + what + " is too large: over " + std::to_string(max_bytes) +
                                   " bytes, at most " + std::to_string(max_bytes) + " allowed");
  };
  // The size is only a hint (the file may grow while it is read, and /proc-style files claim
  // 0), so read to the end, one byte past the limit at most.
  const std::uint64_t size = file.size();
  const std::uint64_t limit = std::min<std::uint64_t>(
      max_bytes == std::numeric_limits<std::uint64_t>::max() ? max_bytes : max_bytes + 1,
      std::numeric_limits<std::size_t>::max());
  std::vector<unsigned char> bytes(static_cast<std::size_t>(std::min(size + 1, limit)));
  std::size_t filled = 0;
  for (;;) {
    if (filled == bytes.size()) {
      if (filled >= limit) {
        throw too_large();
      }
      bytes.resize(static_cast<std::size_t>(
          std::min<std::uint64_t>(std::max<std::size_t>(2 * filled, 64 * 1024), limit)));
    }
    const ssize_t n =
        ::read(file.fd(), bytes.data() + filled, std::min(bytes.size() - filled, max_io_bytes));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      const int code = errno;
      throw input_error(source, "read of the " + what + " failed: " + std::strerror(code));
    }
    if (n == 0) {
      break;
    }
    filled += static_cast<std::size_t>(n);
  }
  if (filled > max_bytes) {
    throw too_large();
  }
  bytes.resize(filled);
  return bytes;
}

std::string read_text_file(const std::filesystem::path& path, const std::string& what,
                           std::uint64_t max_bytes) {
  const auto bytes = read_file(path, what, max_bytes);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace tierflow::detail
