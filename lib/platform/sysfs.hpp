#pragma once
// Thin platform layer over sysfs-style text files. Returns error codes (errno values); the
// layers above turn them into exceptions with context.

#include <filesystem>
#include <string>
#include <vector>

namespace tierflow::detail::platform {

/** Reads a whole (small) text file into @p out. Returns 0 or an errno value. */
int read_text_file(const std::filesystem::path& path, std::string& out) noexcept;

/** Names of the entries of a directory, sorted; empty when it does not exist. */
std::vector<std::string> list_directory(const std::filesystem::path& dir) noexcept;

/** Whether @p path exists (following links). */
bool path_exists(const std::filesystem::path& path) noexcept;

/** @p path with its links resolved; @p path itself when that fails. */
std::filesystem::path resolve_links(const std::filesystem::path& path) noexcept;

/** `root/relative`, where @p relative is an absolute-looking path such as `/sys/...`. */
std::filesystem::path under_root(const std::filesystem::path& root, const std::string& relative);

}  // namespace tierflow::detail::platform
