// Discovery from sysfs, the primary source. Every file it reads is named in the error when
// that file is missing (where required) or malformed.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include "platform/pci.hpp"
#include "platform/sysfs.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "topology/machine_facts.hpp"

namespace tierflow::detail {

namespace fs = std::filesystem;

numa_node* machine_facts::find(int id) {
  for (auto& node : nodes) {
    if (node.id.value == id) {
      return &node;
    }
  }
  return nullptr;
}

namespace {

std::optional<std::string> read_optional(const fs::path& path) {
  std::string text;
  const int code = platform::read_text_file(path, text);
  if (code == ENOENT || code == ENOTDIR) {
    return std::nullopt;
  }
  if (code != 0) {
    throw input_error(path.string(), std::string("cannot read (") + std::strerror(code) + ")");
  }
  return text;
}

std::string read_required(const fs::path& path) {
  std::string text;
  const int code = platform::read_text_file(path, text);
  if (code != 0) {
    throw input_error(path.string(), std::string("cannot read (") + std::strerror(code) + ")");
  }
  return text;
}

std::vector<int> parse_list_or_throw(const fs::path& path, const std::string& text) {
  auto ids = parse_id_list(text);
  if (!ids) {
    throw input_error(path.string(), "expected a list of ids like '0-3,8'", text);
  }
  return *ids;
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) {
      ++i;
    }
    const auto start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') {
      ++i;
    }
    if (i > start) {
      out.push_back(line.substr(start, i - start));
    }
  }
  return out;
}

// `prefix` followed by a decimal number, e.g. node12 or memory_tier4.
std::optional<int> numbered_name(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) {
    return std::nullopt;
  }
  const auto number = parse_u64(name.substr(prefix.size()));
  if (!number || name.size() == prefix.size() || *number > (1u << 20)) {
    return std::nullopt;
  }
  return static_cast<int>(*number);
}

std::optional<unsigned> parse_hex(std::string_view text) {
  text = trim(text);
  if (text.substr(0, 2) == "0x" || text.substr(0, 2) == "0X") {
    text.remove_prefix(2);
  }
  if (text.empty() || text.size() > 8) {
    return std::nullopt;
  }
  unsigned value = 0;
  for (char c : text) {
    const int digit = std::isdigit(static_cast<unsigned char>(c))
                          ? c - '0'
                          : (std::isxdigit(static_cast<unsigned char>(c))
                                 ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                 : -1);
    if (digit < 0) {
      return std::nullopt;
    }
    value = value * 16 + static_cast<unsigned>(digit);
  }
  return value;
}

fs::path node_dir(const fs::path& root, int id) {
  return platform::under_root(root, "/sys/devices/system/node/node" + std::to_string(id));
}

void read_distances(const fs::path& root, const std::vector<int>& online, machine_facts& facts) {
  for (const auto& node : facts.nodes) {
    const auto path = node_dir(root, node.id.value) / "distance";
    const auto text = read_optional(path);
    if (!text) {
      continue;
    }
    const auto fields = words(trim(*text));
    if (fields.size() != online.size()) {
      throw input_error(
          path.string(),
          "expected " + std::to_string(online.size()) + " distances (one per online node)", *text);
    }
    for (std::size_t i = 0; i < fields.size(); ++i) {
      const auto value = parse_u64(fields[i]);
      if (!value || *value == 0 || *value > 255) {
        throw input_error(path.string(), "expected SLIT distances from 10 to 255", *text);
      }
      facts.distances[{node.id.value, online[i]}] = static_cast<std::uint32_t>(*value);
    }
  }
}

void read_memory_tiers(const fs::path& root, machine_facts& facts) {
  const auto base = platform::under_root(root, "/sys/devices/virtual/memory_tiering");
  // In tier order (memory_tier4 before memory_tier22), skipping power/, uevent and the like.
  std::map<int, std::string> tiers;
  for (const auto& name : platform::list_directory(base)) {
    if (const auto number = numbered_name(name, "memory_tier")) {
      tiers.emplace(*number, name);
    }
  }
  std::map<int, std::string> tier_of_node;  // node -> name of the memory tier that lists it
  for (const auto& [tier_number, name] : tiers) {
    const auto path = base / name / "nodelist";
    const auto text = read_required(path);
    const auto ids = parse_list_or_throw(path, text);
    if (ids.empty()) {
      throw input_error(path.string(), "memory tier lists no node", text);
    }
    for (int id : ids) {
      if (auto [it, inserted] = tier_of_node.emplace(id, name); !inserted) {
        throw input_error(path.string(), "node " + std::to_string(id) + " is also in " + it->second,
                          text);
      }
      if (auto* node = facts.find(id)) {
        node->memory_tier = tier_number;
      }
    }
  }
}

void read_hmat(const fs::path& root, machine_facts& facts) {
  // access0: the best initiators of any kind; access1: the best CPU initiators. A value of 0
  // means the firmware gave none.
  for (const auto& node : facts.nodes) {
    for (const char* access_class : {"access0", "access1"}) {
      const auto dir = node_dir(root, node.id.value) / access_class / "initiators";
      if (!platform::path_exists(dir)) {
        continue;
      }
      std::vector<int> initiators;
      for (const auto& name : platform::list_directory(dir)) {
        if (const auto id = numbered_name(name, "node")) {
          initiators.push_back(*id);
        }
      }
      access_perf perf;
      const std::pair<const char*, perf_value*> fields[] = {
          {"read_bandwidth", &perf.read_bandwidth},
          {"write_bandwidth", &perf.write_bandwidth},
          {"read_latency", &perf.read_latency},
          {"write_latency", &perf.write_latency},
      };
      for (const auto& [file, target] : fields) {
        const auto path = dir / file;
        const auto text = read_optional(path);
        if (!text) {
          continue;
        }
        const auto value = parse_u64(*text);
        if (!value) {
          throw input_error(path.string(), "expected a whole number", *text);
        }
        if (*value > 0) {
          *target = perf_value{static_cast<double>(*value), attr_source::hmat};
        }
      }
      for (int initiator : initiators) {
        auto& entry = facts.access[{initiator, node.id.value}];
        for (auto [mine, theirs] : {std::pair{&entry.read_bandwidth, &perf.read_bandwidth},
                                    std::pair{&entry.write_bandwidth, &perf.write_bandwidth},
                                    std::pair{&entry.read_latency, &perf.read_latency},
                                    std::pair{&entry.write_latency, &perf.write_latency}}) {
          if (theirs->known()) {
            *mine = *theirs;
          }
        }
      }
    }
  }
}

void read_dax(const fs::path& root, machine_facts& facts) {
  const auto base = platform::under_root(root, "/sys/bus/dax/devices");
  for (const auto& name : platform::list_directory(base)) {
    const auto path = base / name / "target_node";
    const auto text = read_optional(path);
    if (!text) {
      continue;
    }
    const auto target = parse_i64(*text);
    if (!target || *target < -1) {
      throw input_error(path.string(), "expected a node number or -1", *text);
    }
    auto* node = *target >= 0 ? facts.find(static_cast<int>(*target)) : nullptr;
    if (node == nullptr) {
      continue;  // not onlined as system RAM (devdax), so not a memory node of ours
    }
    // A CXL memory region appears as .../ACPI0017:00/root0/decoderX.Y/regionZ/dax_regionZ/...
    bool cxl_root = false;
    bool region = false;
    for (const auto& part : platform::resolve_links(base / name)) {
      const auto text_part = part.string();
      cxl_root = cxl_root || text_part.rfind("ACPI0017", 0) == 0;
      region = region || numbered_name(text_part, "region").has_value();
    }
    if (cxl_root && region) {
      node->dax_device = name;
    }
  }
}

void read_pci_gpus(const fs::path& root, machine_facts& facts) {
  const auto base = platform::under_root(root, "/sys/bus/pci/devices");
  for (const auto& name : platform::list_directory(base)) {
    const auto dir = base / name;
    const auto vendor_text = read_optional(dir / "vendor");
    const auto class_text = read_optional(dir / "class");
    if (!vendor_text || !class_text) {
      continue;
    }
    const auto vendor = parse_hex(*vendor_text);
    if (!vendor) {
      throw input_error((dir / "vendor").string(), "expected a hex vendor id", *vendor_text);
    }
    const auto device_class = parse_hex(*class_text);
    if (!device_class) {
      throw input_error((dir / "class").string(), "expected a hex class code", *class_text);
    }
    if (!platform::is_cuda_gpu(*vendor, *device_class >> 8)) {
      continue;
    }
    gpu_device gpu;
    gpu.pci_bus_id = name;
    std::transform(gpu.pci_bus_id.begin(), gpu.pci_bus_id.end(), gpu.pci_bus_id.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (const auto text = read_optional(dir / "numa_node")) {
      const auto node = parse_i64(*text);
      if (!node || *node < -1) {
        throw input_error((dir / "numa_node").string(), "expected a node number or -1", *text);
      }
      if (*node >= 0) {
        gpu.nearest_nodes.push_back(numa_node_id{static_cast<int>(*node)});
      }
    }
    if (gpu.nearest_nodes.empty()) {
      // No firmware locality: the nodes whose CPUs the device reports as local.
      if (const auto text = read_optional(dir / "local_cpulist")) {
        const auto cpus = parse_list_or_throw(dir / "local_cpulist", *text);
        for (const auto& node : facts.nodes) {
          const bool shares_cpu = std::any_of(node.cpus.begin(), node.cpus.end(), [&](int c) {
            return std::binary_search(cpus.begin(), cpus.end(), c);
          });
          if (shares_cpu) {
            gpu.nearest_nodes.push_back(node.id);
          }
        }
      }
    }
    facts.gpus.push_back(std::move(gpu));
  }
}

}  // namespace

std::pair<std::uint64_t, std::uint64_t> read_node_meminfo(const fs::path& root, int id) {
  const auto path = node_dir(root, id) / "meminfo";
  const auto text = read_required(path);
  std::optional<std::uint64_t> total;
  std::optional<std::uint64_t> free;
  for (auto line : split(text, '\n')) {
    const auto fields = words(line);
    if (fields.size() < 3) {
      continue;
    }
    const bool is_total = fields[2] == "MemTotal:";
    const bool is_free = fields[2] == "MemFree:";
    if (!is_total && !is_free) {
      continue;
    }
    const bool well_formed = fields.size() == 5 && fields[0] == "Node" &&
                             fields[1] == std::to_string(id) && fields[4] == "kB";
    const std::uint64_t kib =
        well_formed ? parse_u64(fields[3]).value_or(~std::uint64_t{0}) : ~std::uint64_t{0};
    if (kib > (std::uint64_t{1} << 53)) {
      throw input_error(
          path.string(),
          "expected 'Node " + std::to_string(id) + " " + std::string(fields[2]) + " <number> kB'",
          std::string(line));
    }
    (is_total ? total : free) = kib * 1024;
  }
  if (!total || !free) {
    throw input_error(path.string(), std::string("no ") + (total ? "MemFree" : "MemTotal") +
                                         " line for node " + std::to_string(id));
  }
  if (*free > *total) {
    throw input_error(path.string(), "MemFree is larger than MemTotal");
  }
  return {*total, *free};
}

machine_facts read_sysfs(const fs::path& root) {
  machine_facts facts;
  facts.memory_from_sysfs = true;
  facts.sources.push_back("sysfs:" + root.string());
  const auto node_base = platform::under_root(root, "/sys/devices/system/node");

  const auto online_path = node_base / "online";
  const auto online_text = read_required(online_path);
  const auto online = parse_list_or_throw(online_path, online_text);
  if (online.empty()) {
    throw input_error(online_path.string(), "no online NUMA node listed", online_text);
  }

  std::vector<int> memory_nodes = online;
  if (const auto text = read_optional(node_base / "has_memory")) {
    const auto with_memory = parse_list_or_throw(node_base / "has_memory", *text);
    std::erase_if(memory_nodes, [&](int id) {
      return !std::binary_search(with_memory.begin(), with_memory.end(), id);
    });
    if (memory_nodes.empty()) {
      throw input_error((node_base / "has_memory").string(), "no online node has memory", *text);
    }
  }
  std::optional<std::vector<int>> with_cpu;
  if (const auto text = read_optional(node_base / "has_cpu")) {
    with_cpu = parse_list_or_throw(node_base / "has_cpu", *text);
  }

  for (int id : memory_nodes) {
    numa_node node;
    node.id = numa_node_id{id};
    const auto cpulist_path = node_dir(root, id) / "cpulist";
    if (const auto text = read_optional(cpulist_path)) {
      node.cpus = parse_list_or_throw(cpulist_path, *text);
    }
    node.has_cpu =
        with_cpu ? std::binary_search(with_cpu->begin(), with_cpu->end(), id) : !node.cpus.empty();
    const auto [total, free] = read_node_meminfo(root, id);
    node.capacity_bytes = total;
    node.free_bytes = free;
    facts.nodes.push_back(std::move(node));
  }

  read_distances(root, online, facts);
  read_memory_tiers(root, facts);
  read_hmat(root, facts);
  read_dax(root, facts);
  read_pci_gpus(root, facts);
  return facts;
}

}  // namespace tierflow::detail
