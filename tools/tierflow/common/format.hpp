#pragma once
// Human formatting for CLI output: sizes, bandwidths and fixed-width tables.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tierflow::cli {

/** `12.0 GiB`, `512 MiB`, `-` when unknown. */
std::string format_bytes(std::optional<std::uint64_t> bytes);

/** A value with @p decimals digits, or `-` when unknown. */
std::string format_number(std::optional<double> value, int decimals);

/** A bandwidth in GB/s with 3 significant digits (`131`, `32.8`, `0.02`), `-` when unknown. */
std::string format_bandwidth(std::optional<double> gbps);

/** Refuses an output file that cannot be written, before any work is done: its folder is
 *  missing, it is a folder or not a regular file, or opening it for writing fails (read-only
 *  file system, no permission, /proc). A file the check creates is removed again.
 *  @throws input_error naming @p flag, the reason and the path for a path that is a folder or
 *  not a regular file, or whose folder does not exist; environment_error naming them when the
 *  system refuses to create the file (permission, read-only file system, no room) */
void check_output_file(const char* flag, const std::string& path);

/** Writes @p text to @p path, replacing it. @throws environment_error naming the file */
void write_text_file(const std::filesystem::path& path, const std::string& text);

/** Renders rows under a header, each column as wide as its widest cell. */
std::string render_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows);

}  // namespace tierflow::cli
