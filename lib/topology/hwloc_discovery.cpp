// Discovery from hwloc (the second source), and merging one source's facts into another's.

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "platform/hwloc_probe.hpp"
#include "platform/sysfs.hpp"
#include "tierflow/detail/input_file.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "topology/machine_facts.hpp"

namespace tierflow::detail {

namespace fs = std::filesystem;

namespace {

std::string first_line(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  return std::string(trim(line));
}

// hwloc reports no more than "invalid argument" for a bad XML file; check what we can first so
// the user is told what is wrong with it.
void check_xml_file(const fs::path& path) {
  constexpr std::uint64_t max_xml_bytes = std::uint64_t{64} << 20;
  const std::string text = read_text_file(path, "hwloc XML", max_xml_bytes);
  const auto body = trim(text);
  if (body.empty()) {
    throw input_error(path.string(), "empty file, expected hwloc topology XML");
  }
  if (body.front() != '<') {
    throw input_error(path.string(), "not XML, expected hwloc topology XML", first_line(text));
  }
  if (body.find("<topology") == std::string_view::npos) {
    throw input_error(path.string(), "no <topology> element, expected hwloc topology XML",
                      first_line(text));
  }
}

perf_value hmat_value(const std::optional<std::uint64_t>& specific,
                      const std::optional<std::uint64_t>& generic) {
  const auto& value = specific ? specific : generic;
  if (!value) {
    return {};
  }
  return perf_value{static_cast<double>(*value), attr_source::hmat};
}

void fill_unknown(perf_value& mine, const perf_value& theirs) {
  if (!mine.known() && theirs.known()) {
    mine = theirs;
  }
}

}  // namespace

machine_facts read_hwloc(const fs::path* xml) {
  if (xml != nullptr) {
    check_xml_file(*xml);
  }
  platform::hwloc_facts raw;
  std::string why;
  if (platform::hwloc_probe(xml != nullptr ? xml->c_str() : nullptr, raw, why) != 0) {
    if (xml != nullptr) {
      std::string text;
      platform::read_text_file(*xml, text);
      throw input_error(xml->string(), "not a valid hwloc topology: " + why, first_line(text));
    }
    throw input_error("hwloc (live machine)", why);
  }
  machine_facts facts;
  facts.sources.push_back(xml != nullptr ? "hwloc-xml:" + xml->string() : "hwloc:live");
  for (const auto& n : raw.nodes) {
    numa_node node;
    node.id = numa_node_id{n.os_index};
    node.has_cpu = n.has_cpu;
    node.cpus = n.cpus;
    node.capacity_bytes = n.local_memory;
    node.hwloc_subtype = n.subtype;
    facts.nodes.push_back(std::move(node));
  }
  if (facts.nodes.empty()) {
    throw input_error(xml != nullptr ? xml->string() : "hwloc (live machine)",
                      "the topology has no NUMA node");
  }
  for (const auto& d : raw.distances) {
    facts.distances[{d.from, d.to}] = static_cast<std::uint32_t>(d.value);
  }
  for (const auto& a : raw.access) {
    access_perf perf;
    perf.read_bandwidth = hmat_value(a.read_bandwidth, a.bandwidth);
    perf.write_bandwidth = hmat_value(a.write_bandwidth, a.bandwidth);
    perf.read_latency = hmat_value(a.read_latency, a.latency);
    perf.write_latency = hmat_value(a.write_latency, a.latency);
    facts.access[{a.initiator, a.target}] = perf;
  }
  for (const auto& g : raw.gpus) {
    gpu_device gpu;
    gpu.pci_bus_id = g.pci_bus_id;
    for (int id : g.nearest_nodes) {
      gpu.nearest_nodes.push_back(numa_node_id{id});
    }
    facts.gpus.push_back(std::move(gpu));
  }
  return facts;
}

void merge_facts(machine_facts& primary, const machine_facts& secondary) {
  auto known = [&](int id) { return primary.find(id) != nullptr; };
  for (const auto& theirs : secondary.nodes) {
    if (auto* mine = primary.find(theirs.id.value);
        mine != nullptr && mine->hwloc_subtype.empty()) {
      mine->hwloc_subtype = theirs.hwloc_subtype;
    }
  }
  if (primary.distances.empty()) {
    for (const auto& [pair, value] : secondary.distances) {
      if (known(pair.first) && known(pair.second)) {
        primary.distances[pair] = value;
      }
    }
  }
  for (const auto& [pair, theirs] : secondary.access) {
    if (!known(pair.first) || !known(pair.second)) {
      continue;
    }
    auto& mine = primary.access[pair];
    fill_unknown(mine.read_bandwidth, theirs.read_bandwidth);
    fill_unknown(mine.write_bandwidth, theirs.write_bandwidth);
    fill_unknown(mine.read_latency, theirs.read_latency);
    fill_unknown(mine.write_latency, theirs.write_latency);
  }
  for (const auto& theirs : secondary.gpus) {
    auto it = std::find_if(primary.gpus.begin(), primary.gpus.end(),
                           [&](const auto& g) { return g.pci_bus_id == theirs.pci_bus_id; });
    if (it == primary.gpus.end()) {
      primary.gpus.push_back(theirs);
    } else if (it->nearest_nodes.empty()) {
      it->nearest_nodes = theirs.nearest_nodes;
    }
  }
  primary.sources.insert(primary.sources.end(), secondary.sources.begin(), secondary.sources.end());
}

}  // namespace tierflow::detail
