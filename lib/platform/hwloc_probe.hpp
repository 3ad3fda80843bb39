#pragma once
// Thin platform layer over hwloc: loads a topology (live or from XML) and copies out the
// plain facts the topology layer needs. Returns error codes; never throws.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tierflow::detail::platform {

struct hwloc_node_facts {
  int os_index = -1;
  std::uint64_t local_memory = 0;
  std::string subtype;
  bool has_cpu = false;  // see hwloc_probe.cpp: hwloc gives CPU-less nodes their parent's cpuset
  std::vector<int> cpus;
};

struct hwloc_access_facts {
  int initiator = -1;
  int target = -1;
  // MB/s and ns, as hwloc reports them. The generic Bandwidth/Latency apply to both directions.
  std::optional<std::uint64_t> read_bandwidth, write_bandwidth, bandwidth;
  std::optional<std::uint64_t> read_latency, write_latency, latency;
};

struct hwloc_distance_facts {
  int from = -1;
  int to = -1;
  std::uint64_t value = 0;
};

struct hwloc_gpu_facts {
  std::string pci_bus_id;  // 0000:17:00.0
  std::vector<int> nearest_nodes;
};

struct hwloc_facts {
  std::vector<hwloc_node_facts> nodes;  // by increasing os_index
  std::vector<hwloc_distance_facts> distances;
  std::vector<hwloc_access_facts> access;
  std::vector<hwloc_gpu_facts> gpus;  // NVIDIA display/3D controllers on the PCI tree
};

/**
 * Loads hwloc's topology of the live machine (@p xml_path null) or of an XML file and fills
 * @p out. Returns 0, or an errno-style code with a message in @p error.
 */
int hwloc_probe(const char* xml_path, hwloc_facts& out, std::string& error) noexcept;

}  // namespace tierflow::detail::platform
