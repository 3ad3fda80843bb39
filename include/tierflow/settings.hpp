#pragma once
/** @file
 * @brief User settings from a configuration file and the environment.
 *
 * A configuration file holds one `key = value` per line; `#` starts a comment; blank lines are
 * ignored. Each key has an environment variable of the same meaning, which wins over the
 * file:
 *
 * | key       | environment variable | meaning                                          |
 * |-----------|----------------------|--------------------------------------------------|
 * | tiers     | TIERFLOW_TIERS       | tier classification override (topology.hpp)      |
 * | placement | TIERFLOW_PLACEMENT   | data class placement (placement_policy.hpp)      |
 * | emu_link  | TIERFLOW_EMU_LINK    | the emulated device's link (emulated_device.hpp) |
 * | cache_dir | TIERFLOW_CACHE_DIR   | folder of `tierflow bench`'s measured cache      |
 *
 * The library reads them where they apply (topology::discover, placement_policy, the emulated
 * device, the measured cache, and so tf_adam_create and every command) through
 * settings::from_environment() unless the caller passes settings of its own; an explicit
 * argument or flag wins over both. TIERFLOW_CONFIG (the file) and TIERFLOW_LOG (read once per
 * process, before any file) are environment-only. docs/configuration.md has the whole table.
 *
 * An unknown key, a line without `=`, an empty value or a key given twice is an input_error
 * naming `FILE:LINE`.
 */

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tierflow {

/** @brief One setting's value and where it came from (`FILE:LINE` or `env NAME`). */
struct setting_value {
  std::string value;   ///< the text, trimmed
  std::string origin;  ///< where it was read, for error messages
};

/** @brief Settings read from a configuration file, looked up with the environment first. */
class settings {
 public:
  /** @brief No file: only the environment is consulted. */
  settings() = default;

  /**
   * @brief Reads a configuration file.
   * @throws input_error when the file cannot be read (a folder included) or a line is malformed
   */
  static settings from_file(const std::filesystem::path& path);

  /**
   * @brief Parses configuration text; @p source_name stands for the file in messages.
   * @throws input_error on a malformed line
   */
  static settings from_text(std::string_view text, std::string_view source_name);

  /**
   * @brief The settings named by env `TIERFLOW_CONFIG` (a file path), or none when it is unset.
   * @throws input_error when the variable names an unreadable or malformed file
   */
  static settings from_environment();

  /**
   * @brief The value of @p key: its environment variable when set and non-empty, else the
   * file's line, else nullopt.
   * @throws tierflow::error when @p key is not a known key (a programming error)
   */
  [[nodiscard]] std::optional<setting_value> get(std::string_view key) const;

  /** @brief The known keys and their environment variables. */
  [[nodiscard]] static const std::map<std::string, std::string, std::less<>>& known_keys();

 private:
  std::map<std::string, setting_value, std::less<>> file_values_;
};

}  // namespace tierflow
