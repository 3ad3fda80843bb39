#include "topology/measured_cache.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include <sys/utsname.h>
#include <unistd.h>

#include "core/crc32c.hpp"
#include "core/durable_file.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"
#include "tierflow/settings.hpp"

namespace tierflow {
namespace detail {
namespace {

constexpr std::string_view magic = "tierflow-measured 1";
constexpr std::uint64_t max_cache_bytes = std::uint64_t{1} << 20;
// Every measured value (MB/s or ns) is at most 1e9: 1 PB/s, 1 s. Beyond is a broken file (a
// value of 1e308 broke the topo table), never a measurement.
constexpr double max_measured_value = 1e9;

std::optional<double> parse_positive(std::string_view text) {
  double value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || value <= 0 ||
      value > max_measured_value) {
    return std::nullopt;
  }
  return value;
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  for (const auto field : split(line, ' ')) {
    if (!field.empty()) {
      out.push_back(field);
    }
  }
  return out;
}

// The entry of (initiator, target) in @p values, added (empty) when there is none.
measured_access& entry_for(std::vector<measured_access>& values, numa_node_id initiator,
                           numa_node_id target) {
  const auto it = std::find_if(values.begin(), values.end(), [&](const measured_access& m) {
    return m.initiator == initiator && m.target == target;
  });
  if (it != values.end()) {
    return *it;
  }
  return values.emplace_back(measured_access{initiator, target, {}, {}, {}});
}

void check_value(const std::optional<double>& v, const char* what) {
  if (v && !(std::isfinite(*v) && *v > 0 && *v <= max_measured_value)) {
    throw input_error(std::string("measured ") + what, "must be finite, > 0 and at most 1e9",
                      std::to_string(*v));
  }
}

std::vector<int> node_ids(const topology& topo) {
  std::vector<int> ids;
  for (const auto& n : topo.nodes()) {
    ids.push_back(n.id.value);
  }
  return ids;
}

}  // namespace

std::string measured_cache_key(const std::vector<int>& node_ids) {
  utsname u{};
  ::uname(&u);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "|" + u.release + "|" + format_id_list(node_ids);
}

std::filesystem::path measured_cache_path(const std::filesystem::path& dir, std::string_view key) {
  const std::uint32_t hash = crc32c(key.data(), key.size());  // a short, stable file name
  std::string host(key.substr(0, key.find('|')));
  for (char& c : host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.')) {
      c = '_';
    }
  }
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(hash));
  return dir / ("measured-" + host + "-" + hex + ".txt");
}

std::vector<measured_access> parse_measured_cache(std::string_view text, std::string_view origin,
                                                  std::string& key) {
  std::vector<measured_access> out;
  key.clear();
  std::size_t number = 0;
  bool saw_magic = false;
  for (const auto raw : split(text, '\n')) {
    ++number;
    const auto line = trim(raw);
    const auto where = std::string(origin) + ":" + std::to_string(number);
    if (line.empty() || line.front() == '#') {
      continue;
    }
    if (!saw_magic) {
      if (line != magic) {
        throw input_error(
            where,
            "not a tierflow measured-attribute cache (expected '" + std::string(magic) + "')",
            std::string(line));
      }
      saw_magic = true;
      continue;
    }
    const auto w = words(line);
    if (w[0] == "key" && w.size() >= 2) {
      key = std::string(trim(line.substr(3)));
      continue;
    }
    if (w[0] != "access" || w.size() != 5) {
      throw input_error(where, "expected 'access INITIATOR TARGET ATTRIBUTE VALUE'",
                        std::string(line));
    }
    const auto initiator = parse_u64(w[1]);
    const auto target = parse_u64(w[2]);
    const auto value = parse_positive(w[4]);
    if (!initiator || !target || *initiator > 4095 || *target > 4095) {
      throw input_error(where, "node ids must be whole numbers 0..4095", std::string(line));
    }
    if (!value) {
      throw input_error(where, "the value is not a finite number > 0 and at most 1e9",
                        std::string(w[4]));
    }
    auto& entry = entry_for(out, numa_node_id{static_cast<int>(*initiator)},
                            numa_node_id{static_cast<int>(*target)});
    if (w[3] == "read_bandwidth_mbps") {
      entry.read_bandwidth_mbps = value;
    } else if (w[3] == "write_bandwidth_mbps") {
      entry.write_bandwidth_mbps = value;
    } else if (w[3] == "read_latency_ns") {
      entry.read_latency_ns = value;
    } else {
      throw input_error(where,
                        "unknown attribute (read_bandwidth_mbps, write_bandwidth_mbps or "
                        "read_latency_ns)",
                        std::string(w[3]));
    }
  }
  if (!saw_magic) {
    throw input_error(std::string(origin), "empty file, not a measured-attribute cache");
  }
  if (key.empty()) {
    throw input_error(std::string(origin), "no 'key' line");
  }
  return out;
}

std::string format_measured_cache(std::string_view key,
                                  const std::vector<measured_access>& values) {
  std::string text = std::string(magic) + "\n# written by tierflow bench; safe to delete\nkey " +
                     std::string(key) + "\n";
  const auto line = [&](const measured_access& m, const char* name, double v) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "access %d %d %s %.17g\n", m.initiator.value, m.target.value,
                  name, v);
    text += buf;
  };
  for (const auto& m : values) {
    if (m.read_bandwidth_mbps) {
      line(m, "read_bandwidth_mbps", *m.read_bandwidth_mbps);
    }
    if (m.write_bandwidth_mbps) {
      line(m, "write_bandwidth_mbps", *m.write_bandwidth_mbps);
    }
    if (m.read_latency_ns) {
      line(m, "read_latency_ns", *m.read_latency_ns);
    }
  }
  return text;
}

std::vector<measured_access> load_measured_cache(const std::filesystem::path& path,
                                                 std::string& key) {
  const auto bytes = read_file(path, "measured-attribute cache", max_cache_bytes);
  return parse_measured_cache(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string(),
      key);
}

void apply_measured_cache(machine_facts& facts, const std::filesystem::path& dir) {
  std::vector<int> ids;
  for (const auto& n : facts.nodes) {
    ids.push_back(n.id.value);
  }
  const auto key = measured_cache_key(ids);
  const auto path = measured_cache_path(dir, key);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return;
  }
  std::vector<measured_access> values;
  try {
    std::string file_key;
    values = load_measured_cache(path, file_key);
    if (file_key != key) {
      log(log_level::debug, "topology: " + path.string() + " is for '" + file_key +
                                "', not this machine ('" + key + "'): not applied");
      return;
    }
  } catch (const std::exception& e) {
    log(log_level::warning, std::string("topology: ignoring the measured-attribute cache: ") +
                                e.what() + " (run tierflow bench again to rewrite it)");
    return;
  }
  facts.firmware_access = facts.access;
  for (const auto& m : values) {
    if (facts.find(m.initiator.value) == nullptr || facts.find(m.target.value) == nullptr) {
      continue;
    }
    auto& perf = facts.access[{m.initiator.value, m.target.value}];
    if (m.read_bandwidth_mbps) {
      perf.read_bandwidth = {*m.read_bandwidth_mbps, attr_source::measured};
    }
    if (m.write_bandwidth_mbps) {
      perf.write_bandwidth = {*m.write_bandwidth_mbps, attr_source::measured};
    }
    if (m.read_latency_ns) {
      perf.read_latency = {*m.read_latency_ns, attr_source::measured};
    }
  }
  facts.sources.push_back("measured:" + path.string());
}

}  // namespace detail

namespace detail {

std::optional<std::filesystem::path> default_measured_cache_dir() {
  if (const auto dir = settings::from_environment().get("cache_dir")) {
    const std::filesystem::path p(dir->value);
    if (!p.is_absolute()) {
      throw input_error(dir->origin, "must be an absolute path", dir->value);
    }
    return p / "";
  }
  // As the XDG base-directory spec says: a relative XDG_CACHE_HOME is ignored.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    if (std::filesystem::path(xdg).is_absolute()) {
      return std::filesystem::path(xdg) / "tierflow";
    }
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    if (std::filesystem::path(home).is_absolute()) {
      return std::filesystem::path(home) / ".cache/tierflow";
    }
  }
  return std::nullopt;
}

}  // namespace detail

std::filesystem::path measured_cache_dir() {
  if (auto dir = detail::default_measured_cache_dir()) {
    return *dir;
  }
  throw input_error("env HOME",
                    "no cache folder: set TIERFLOW_CACHE_DIR, XDG_CACHE_HOME or HOME (absolute)");
}

std::filesystem::path measured_cache_file(const topology& topo,
                                          const std::optional<std::filesystem::path>& dir) {
  return detail::measured_cache_path(dir ? *dir : measured_cache_dir(),
                                     detail::measured_cache_key(detail::node_ids(topo)));
}

std::filesystem::path save_measured_access(const topology& topo,
                                           const std::vector<measured_access>& values,
                                           const std::optional<std::filesystem::path>& dir) {
  for (const auto& m : values) {
    if (topo.find_node(m.initiator) == nullptr || topo.find_node(m.target) == nullptr) {
      throw input_error(
          "measured access", "no such node on this machine",
          std::to_string(m.initiator.value) + " -> " + std::to_string(m.target.value));
    }
    detail::check_value(m.read_bandwidth_mbps, "read bandwidth");
    detail::check_value(m.write_bandwidth_mbps, "write bandwidth");
    detail::check_value(m.read_latency_ns, "read latency");
  }
  const auto folder = dir ? *dir : measured_cache_dir();
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    throw environment_error("measured-attribute cache: cannot create " + folder.string(),
                            folder.string(), ec.value());
  }
  const auto key = detail::measured_cache_key(detail::node_ids(topo));
  const auto path = detail::measured_cache_path(folder, key);
  std::vector<measured_access> merged;
  if (std::filesystem::exists(path, ec)) {
    try {
      std::string file_key;
      merged = detail::load_measured_cache(path, file_key);
      if (file_key != key) {
        merged.clear();
      }
    } catch (const std::exception& e) {
      detail::log(log_level::warning,
                  std::string("measured-attribute cache: replacing a bad file: ") + e.what());
      merged.clear();
    }
  }
  for (const auto& m : values) {
    auto& entry = detail::entry_for(merged, m.initiator, m.target);
    for (auto [mine, theirs] : {std::pair{&entry.read_bandwidth_mbps, &m.read_bandwidth_mbps},
                                std::pair{&entry.write_bandwidth_mbps, &m.write_bandwidth_mbps},
                                std::pair{&entry.read_latency_ns, &m.read_latency_ns}}) {
      if (*theirs) {
        *mine = *theirs;
      }
    }
  }
  const auto text = detail::format_measured_cache(key, merged);
  detail::durable_writer out(path, "measured-attribute cache");
  out.write(text.data(), text.size());
  out.commit();
  return path;
}

}  // namespace tierflow
