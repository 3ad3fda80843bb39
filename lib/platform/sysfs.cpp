#include "platform/sysfs.hpp"

#include <algorithm>
#include <cerrno>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace tierflow::detail::platform {

int read_text_file(const std::filesystem::path& path, std::string& out) noexcept {
  // sysfs files report a size of 4096 whatever they hold, so read until EOF; cap the size so
  // a mistaken path (a device node, a huge file) cannot exhaust memory.
  constexpr std::size_t max_bytes = 1 << 20;
  // O_NONBLOCK: a FIFO under a mistaken --sysfs-root reads as empty instead of hanging.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return errno;
  }
  int result = 0;
  try {
    out.clear();
    char buffer[4096];
    while (true) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        result = errno;
        break;
      }
      if (n == 0) {
        break;
      }
      out.append(buffer, static_cast<std::size_t>(n));
      if (out.size() > max_bytes) {
        result = EFBIG;
        break;
      }
    }
  } catch (...) {
    result = ENOMEM;
  }
  ::close(fd);
  return result;
}

std::vector<std::string> list_directory(const std::filesystem::path& dir) noexcept {
  std::vector<std::string> names;
  try {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
  } catch (...) {
    names.clear();
  }
  return names;
}

bool path_exists(const std::filesystem::path& path) noexcept {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

std::filesystem::path resolve_links(const std::filesystem::path& path) noexcept {
  try {
    std::error_code ec;
    auto resolved = std::filesystem::canonical(path, ec);
    return ec ? path : resolved;
  } catch (...) {
    return path;
  }
}

std::filesystem::path under_root(const std::filesystem::path& root, const std::string& relative) {
  std::string rel = relative;
  while (!rel.empty() && rel.front() == '/') {
    rel.erase(rel.begin());
  }
  return root / rel;
}

}  // namespace tierflow::detail::platform
