#include "tierflow/settings.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tierflow/detail/input_file.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow {

const std::map<std::string, std::string, std::less<>>& settings::known_keys() {
  static const std::map<std::string, std::string, std::less<>> keys = {
      {"tiers", "TIERFLOW_TIERS"},
      {"placement", "TIERFLOW_PLACEMENT"},
      {"emu_link", "TIERFLOW_EMU_LINK"},
      {"cache_dir", "TIERFLOW_CACHE_DIR"},
  };
  return keys;
}

settings settings::from_text(std::string_view text, std::string_view source_name) {
  settings result;
  int line_number = 0;
  for (auto line : detail::split(text, '\n')) {
    ++line_number;
    const auto origin = std::string(source_name) + ":" + std::to_string(line_number);
    if (const auto hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = detail::trim(line);
    if (line.empty()) {
      continue;
    }
    const auto equals = line.find('=');
    if (equals == std::string_view::npos) {
      throw input_error(origin, "expected 'key = value'", std::string(line));
    }
    const auto key = detail::trim(line.substr(0, equals));
    const auto value = detail::trim(line.substr(equals + 1));
    if (known_keys().find(key) == known_keys().end()) {
      std::string names;
      for (const auto& [name, env] : known_keys()) {
        names += (names.empty() ? "" : ", ") + name;
      }
      throw input_error(origin, "unknown key (known: " + names + ")", std::string(key));
    }
    if (value.empty()) {
      throw input_error(origin, "empty value for key '" + std::string(key) + "'",
                        std::string(line));
    }
    if (auto it = result.file_values_.find(key); it != result.file_values_.end()) {
      throw input_error(
          origin, "key '" + std::string(key) + "' given twice (first at " + it->second.origin + ")",
          std::string(line));
    }
    result.file_values_.emplace(std::string(key), setting_value{std::string(value), origin});
  }
  return result;
}

settings settings::from_file(const std::filesystem::path& path) {
  // A configuration is a few lines: a bound keeps /dev/zero-like files from eating memory.
  constexpr std::uint64_t max_config_bytes = std::uint64_t{1} << 20;
  const std::string text = detail::read_text_file(path, "configuration file", max_config_bytes);
  return from_text(text, path.string());
}

settings settings::from_environment() {
  const char* path = std::getenv("TIERFLOW_CONFIG");
  if (path == nullptr || *path == '\0') {
    return {};
  }
  return from_file(path);
}

std::optional<setting_value> settings::get(std::string_view key) const {
  const auto known = known_keys().find(key);
  TIERFLOW_EXPECTS(known != known_keys().end(), "unknown settings key '" + std::string(key) + "'");
  if (const char* env = std::getenv(known->second.c_str()); env != nullptr && *env != '\0') {
    return setting_value{std::string(detail::trim(env)), "env " + known->second};
  }
  if (auto it = file_values_.find(key); it != file_values_.end()) {
    return it->second;
  }
  return std::nullopt;
}

}  // namespace tierflow
