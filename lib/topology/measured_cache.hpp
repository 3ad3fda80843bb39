#pragma once
// The measured-attribute cache that `tierflow bench` writes and discovery applies. A text
// file per machine (host name, kernel release, NUMA node ids), format in docs/measured-cache.md.

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tierflow/topology.hpp"
#include "topology/machine_facts.hpp"

namespace tierflow::detail {

/** The cache folder the environment names (see measured_cache_dir()); nullopt when none does
 *  (no TIERFLOW_CACHE_DIR, XDG_CACHE_HOME or HOME that is an absolute path).
 *  @throws input_error for a relative TIERFLOW_CACHE_DIR */
std::optional<std::filesystem::path> default_measured_cache_dir();

/** The key a cache file is valid for: `HOST|KERNEL_RELEASE|NODE_IDS`. */
std::string measured_cache_key(const std::vector<int>& node_ids);

/** The file for @p key in @p dir. */
std::filesystem::path measured_cache_path(const std::filesystem::path& dir, std::string_view key);

/** Parses a cache file's text. Sets @p key to its key line.
 *  @throws input_error naming @p origin, the line and what was wrong */
std::vector<measured_access> parse_measured_cache(std::string_view text, std::string_view origin,
                                                  std::string& key);

/** Reads and parses the cache file @p path; sets @p key to its key line.
 *  @throws input_error or error when it cannot be read or is malformed */
std::vector<measured_access> load_measured_cache(const std::filesystem::path& path,
                                                 std::string& key);

/** The text of a cache file. */
std::string format_measured_cache(std::string_view key, const std::vector<measured_access>& values);

/** Applies this machine's cache in @p dir (if present, valid and of this machine's key) to
 *  @p facts: values replace firmware ones with source `measured`. A malformed file is logged
 *  as a warning and ignored (a cache never stops discovery). */
void apply_measured_cache(machine_facts& facts, const std::filesystem::path& dir);

}  // namespace tierflow::detail
