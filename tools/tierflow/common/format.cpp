#include "common/format.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tierflow/error.hpp"

namespace tierflow::cli {

std::string format_bytes(std::optional<std::uint64_t> bytes) {
  if (!bytes) {
    return "-";
  }
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  constexpr double mib = 1024.0 * 1024.0;
  char text[64];
  const auto value = static_cast<double>(*bytes);
  if (value >= gib) {
    std::snprintf(text, sizeof text, "%.1f GiB", value / gib);
  } else if (value >= mib) {
    std::snprintf(text, sizeof text, "%.0f MiB", value / mib);
  } else {
    std::snprintf(text, sizeof text, "%.0f KiB", value / 1024.0);
  }
  return text;
}

std::string format_number(std::optional<double> value, int decimals) {
  if (!value) {
    return "-";
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, *value);
  return text;
}

std::string format_bandwidth(std::optional<double> gbps) {
  if (!gbps) {
    return "-";
  }
  const int decimals = *gbps >= 100.0 ? 0 : (*gbps >= 10.0 ? 1 : 2);
  return format_number(gbps, decimals);
}

std::string render_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  widen(header);
  for (const auto& row : rows) {
    widen(row);
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t i = 0; i < width.size(); ++i) {
      const auto& cell = i < row.size() ? row[i] : std::string();
      line += cell;
      if (i + 1 < width.size()) {
        line += std::string(width[i] - cell.size() + 2, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line + '\n';
  };
  emit(header);
  for (const auto& row : rows) {
    emit(row);
  }
  return out;
}

void check_output_file(const char* flag, const std::string& path) {
  std::error_code ec;
  const auto parent = std::filesystem::absolute(path, ec).parent_path();
  if (ec || !std::filesystem::is_directory(parent, ec)) {
    throw input_error(flag, "no such directory: " + parent.string(), path);
  }
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (existed && !S_ISREG(st.st_mode)) {
    throw input_error(flag, S_ISDIR(st.st_mode) ? "is a folder" : "is not a regular file", path);
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int code = errno;
    // The path is well formed; the machine refused it (permission, read-only, no room).
    throw environment_error(std::string(flag) + ": cannot write the file '" + path + "'", path,
                            code);
  }
  ::close(fd);
  if (!existed) {
    ::unlink(path.c_str());
  }
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    const int code = errno;  // what the failed open, write or close left
    throw environment_error(path.string() + ": cannot write the file", path.string(), code);
  }
}

}  // namespace tierflow::cli
