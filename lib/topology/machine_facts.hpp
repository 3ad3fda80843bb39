#pragma once
// What discovery learnt about a machine before classification: the raw material of a topology.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tierflow/topology.hpp"

namespace tierflow::detail {

struct machine_facts {
  std::vector<numa_node> nodes;  // memory nodes by id; kind not yet set
  std::map<std::pair<int, int>, std::uint32_t> distances;
  std::map<std::pair<int, int>, access_perf> access;
  // The firmware's values where the measured cache replaced some (tiers are grouped on these:
  // measurements never split or merge a tier); empty when no cache was applied.
  std::map<std::pair<int, int>, access_perf> firmware_access;
  std::vector<gpu_device> gpus;
  std::string gpu_status;
  std::vector<std::string> sources;
  bool memory_from_sysfs = false;

  numa_node* find(int id);
};

/** Reads /sys under @p root (nodes, meminfo, distances, memory tiers, HMAT, DAX, PCI GPUs).
 *  @throws input_error naming the file and offending text. */
machine_facts read_sysfs(const std::filesystem::path& root);

/** MemTotal and MemFree of node @p id, read now. @throws input_error */
std::pair<std::uint64_t, std::uint64_t> read_node_meminfo(const std::filesystem::path& root,
                                                          int id);

/** Facts from hwloc: the live machine (@p xml empty) or an XML file. @throws input_error */
machine_facts read_hwloc(const std::filesystem::path* xml);

/** Adds what @p secondary knows and @p primary does not (subtypes, HMAT values, distances,
 *  GPU locality). Nodes only @p secondary knows are dropped. */
void merge_facts(machine_facts& primary, const machine_facts& secondary);

/** Adds the GPUs the CUDA runtime sees, matched to PCI-seen ones by bus id. */
void add_cuda_gpus(machine_facts& facts, bool query_free_memory);

}  // namespace tierflow::detail
