#include "core/durable_file.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

}  // namespace

durable_writer::durable_writer(std::filesystem::path path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  const std::string prefix = path_.string() + ".tmp." + std::to_string(::getpid()) + ".";
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
void durable_writer::fail(const std::string& problem, int code) {
  discard();
  std::string message = what_ + " " + path_.string() + ": " + problem;
  if (code != 0) {
    message += std::string(": ") + std::strerror(code);
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
      fail("write failed: no progress", 0);
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

std::vector<unsigned char> read_file(const std::filesystem::path& path, const std::string& what,
                                     std::uint64_t max_bytes) {
  const std::string source = path.string();
  // O_NONBLOCK only so that opening a FIFO by mistake does not hang; it is refused below, and
  // regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int code = errno;
    throw input_error(source, "cannot open the " + what + ": " + std::strerror(code));
  }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } const close_on_exit{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int code = errno;
    throw input_error(source, "cannot stat the " + what + ": " + std::strerror(code));
  }
  if (S_ISDIR(st.st_mode)) {
    throw input_error(source, "the " + what + " is a directory");
  }
  if (!S_ISREG(st.st_mode)) {
    throw input_error(source, "the " + what + " is not a regular file");
  }
  const auto too_large = [&](std::uint64_t bytes, bool at_least) {
    return input_error(source, "the " + what + " is too large: " + (at_least ? "over " : "") +
                                   std::to_string(bytes) + " bytes, at most " +
                                   std::to_string(max_bytes) + " allowed");
  };
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw too_large(size, false);
  }

  // The size is only a hint (the file may grow while it is read, and /proc-style files claim
  // 0), so read to the end, one byte past the limit at most.
  const std::uint64_t limit = std::min<std::uint64_t>(
      max_bytes == std::numeric_limits<std::uint64_t>::max() ? max_bytes : max_bytes + 1,
      std::numeric_limits<std::size_t>::max());
  std::vector<unsigned char> bytes(static_cast<std::size_t>(std::min(size + 1, limit)));
  std::size_t filled = 0;
  for (;;) {
    if (filled == bytes.size()) {
      if (filled >= limit) {
        throw too_large(max_bytes, true);
      }
      bytes.resize(static_cast<std::size_t>(
          std::min<std::uint64_t>(std::max<std::size_t>(2 * filled, 64 * 1024), limit)));
    }
    const ssize_t n =
        ::read(fd, bytes.data() + filled, std::min(bytes.size() - filled, max_io_bytes));
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
    throw too_large(max_bytes, true);
  }
  bytes.resize(filled);
  return bytes;
}

}  // namespace tierflow::detail
