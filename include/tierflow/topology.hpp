#pragma once
/** @file
 * @brief What memory this machine has: NUMA nodes, the tiers they form, their performance
 * attributes and the GPUs' locality.
 *
 * A topology is a snapshot taken by topology::discover(). Capacity and free bytes move on a
 * live machine (VMs hot-plug memory as it is used), so they are read from sysfs at discovery
 * and again on every refresh_memory() call, never cached from start-up.
 *
 * Sources, in order of trust: sysfs (node lists, meminfo, distances, memory tiers, HMAT access
 * classes, DAX devices, PCI), then hwloc (subtypes, memory attributes, distances; fed an XML
 * file on request), then the CUDA runtime for GPUs. With `hwloc_xml` set and the default sysfs
 * root, the XML alone describes the machine; with a non-default sysfs root the live hwloc and
 * CUDA runtime are not consulted, since they describe another machine.
 */

#include <compare>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tierflow {

class settings;

/** @brief The kinds of memory tier. */
enum class tier_kind {
  hbm,          ///< GPU memory, one tier per GPU
  host_hbm,     ///< on-package HBM/MCDRAM NUMA nodes of the host
  dram,         ///< DRAM local to the initiator's CPUs
  remote_dram,  ///< DRAM local to other CPUs (another socket or cluster)
  cxl,          ///< CPU-less memory nodes: CXL expanders (DAX kmem or system RAM)
};

/** @brief The stable lower-case name of a tier kind (`hbm`, `host_hbm`, ...). */
[[nodiscard]] std::string_view to_string(tier_kind kind) noexcept;

/** @brief The tier kind named @p name, or nullopt. */
[[nodiscard]] std::optional<tier_kind> parse_tier_kind(std::string_view name) noexcept;

/** @brief The OS index of a NUMA node (as in /sys/devices/system/node/nodeN). */
struct numa_node_id {
  int value = -1;  ///< the OS index; -1 means none
  friend auto operator<=>(const numa_node_id&, const numa_node_id&) = default;
};

/** @brief Where a performance value came from. */
enum class attr_source {
  unknown,   ///< no value
  hmat,      ///< firmware (ACPI HMAT) through sysfs access classes or hwloc memattrs
  measured,  ///< measured by tierflow bench
  config,    ///< given by the user
};

/** @brief The stable name of an attribute source (`hmat`, `measured`, `config`, `unknown`). */
[[nodiscard]] std::string_view to_string(attr_source source) noexcept;

/** @brief A performance value and its source. Bandwidths are MB/s (10^6 B/s), latencies ns. */
struct perf_value {
  double value = 0.0;
  attr_source source = attr_source::unknown;
  /** @brief Whether a value is present. */
  [[nodiscard]] bool known() const noexcept { return source != attr_source::unknown; }
};

/** @brief Performance of accesses from an initiator node to a target node. */
struct access_perf {
  perf_value read_bandwidth;   ///< MB/s
  perf_value write_bandwidth;  ///< MB/s
  perf_value read_latency;     ///< ns
  perf_value write_latency;    ///< ns
};

/** @brief One NUMA node and what was learnt about it. */
struct numa_node {
  numa_node_id id;
  bool has_cpu = false;
  std::vector<int> cpus;                    ///< OS CPU ids; empty for CPU-less nodes
  std::uint64_t capacity_bytes = 0;         ///< MemTotal at the last read
  std::optional<std::uint64_t> free_bytes;  ///< MemFree at the last read; unknown from XML
  std::optional<int> memory_tier;           ///< /sys/devices/virtual/memory_tiering/memory_tierN
  std::string hwloc_subtype;                ///< e.g. DRAM, MCDRAM, HBM, SPM, CXL-DRAM; may be empty
  std::string dax_device;                   ///< the DAX device under a CXL region that targets it
  tier_kind kind = tier_kind::dram;         ///< relative to topology::initiator()
  std::string kind_reason;                  ///< why it got that kind, for humans
};

/** @brief One GPU: seen by the CUDA runtime, on the PCI bus, or both. */
struct gpu_device {
  int cuda_index = -1;                      ///< CUDA device ordinal; -1 when not visible to CUDA
  std::string name;                         ///< from CUDA; empty when only seen on PCI
  std::string pci_bus_id;                   ///< `0000:17:00.0`, lower case
  std::uint64_t memory_total_bytes = 0;     ///< from CUDA; 0 when unknown
  std::uint64_t memory_free_bytes = 0;      ///< from CUDA; 0 when unknown
  std::vector<numa_node_id> nearest_nodes;  ///< host nodes nearest to it; empty when unknown
};

/** @brief A group of nodes (or one GPU's memory) that tierflow treats as one tier. */
struct tier {
  std::string name;  ///< stable, e.g. `dram0`, `cxl0`, `hbm1`
  tier_kind kind = tier_kind::dram;
  std::vector<numa_node_id> nodes;  ///< empty for hbm tiers
  int gpu = -1;                     ///< index into topology::gpus() for hbm tiers, else -1
  std::uint64_t capacity_bytes = 0;
  std::optional<std::uint64_t> free_bytes;  ///< unknown when any member's free is unknown
  access_perf perf;               ///< from the initiator: lowest bandwidth, highest latency
  std::vector<int> nearest_gpus;  ///< indices into topology::gpus() nearest to these nodes
};

/** @brief The version of to_json()'s document. */
inline constexpr int topology_json_schema_version = 1;

/** @brief What topology::discover() reads. */
struct discovery_options {
  /** @brief Prefix of /sys; tests point it at a fake tree. */
  std::filesystem::path sysfs_root = "/";
  /** @brief Load hwloc from this XML file instead of the live machine. */
  std::optional<std::filesystem::path> hwloc_xml;
  /** @brief Consult hwloc at all. */
  bool use_hwloc = true;
  /** @brief Ask the CUDA runtime for GPUs (only when describing the live machine). */
  bool use_cuda = true;
  /** @brief Also ask CUDA for each GPU's free memory. This creates a CUDA context on every
   *  GPU (hundreds of MB of HBM each), so it is off unless asked for. */
  bool query_gpu_free_memory = false;
  /** @brief The node tiers are relative to; default: nearest node of GPU 0, else the first
   *  node with CPUs. */
  std::optional<numa_node_id> initiator;
  /**
   * @brief Classification override, `KIND=NODES[;KIND=NODES...]`, e.g. `cxl=2,3;dram=0`.
   * Each entry forms one tier of the nodes it lists; unlisted nodes are classified as usual.
   * When unset, the `tiers` setting (env `TIERFLOW_TIERS`, then the config file) is used.
   */
  std::optional<std::string> tiers_override;
  /** @brief Settings to read `tiers` from when tiers_override is unset; null:
   * settings::from_environment() (the variable, then the file TIERFLOW_CONFIG names). */
  const settings* config = nullptr;
  /**
   * @brief Apply the values `tierflow bench` measured on this machine (source `measured`,
   * replacing firmware values), read from its cache file when one exists for this machine and
   * kernel. Only when describing the live machine, or when measured_cache_dir is given.
   */
  bool use_measured_cache = true;
  /** @brief Where the cache lives; default measured_cache_dir(). */
  std::optional<std::filesystem::path> measured_cache_dir;
};

/** @brief Access performance measured from one node to another (MB/s, ns), as cached. */
struct measured_access {
  numa_node_id initiator;
  numa_node_id target;
  std::optional<double> read_bandwidth_mbps;
  std::optional<double> write_bandwidth_mbps;
  std::optional<double> read_latency_ns;
};

/**
 * @brief The measured-attribute cache folder: env `TIERFLOW_CACHE_DIR`, else
 * `$XDG_CACHE_HOME/tierflow`, else `$HOME/.cache/tierflow` (a relative `XDG_CACHE_HOME` or
 * `HOME` is ignored, as the XDG spec says).
 * @throws input_error for a relative `TIERFLOW_CACHE_DIR`, or when no variable names a folder
 */
[[nodiscard]] std::filesystem::path measured_cache_dir();

/**
 * @brief The cache file of this machine (host name, kernel release and NUMA nodes of @p topo)
 * in @p dir (default measured_cache_dir()).
 */
[[nodiscard]] std::filesystem::path measured_cache_file(
    const class topology& topo, const std::optional<std::filesystem::path>& dir = {});

/**
 * @brief Stores @p values as this machine's measured attributes (written to a temporary file,
 * fsynced and renamed; the folder is created). Later discoveries apply them. A value replaces
 * the cached one of the same initiator, target and attribute; the others are kept (a valid
 * cache of this machine is merged, a malformed one replaced).
 * @return the file written
 * @throws input_error for a value that is not finite and positive or a node @p topo lacks;
 *         error when the file cannot be written
 */
std::filesystem::path save_measured_access(const class topology& topo,
                                           const std::vector<measured_access>& values,
                                           const std::optional<std::filesystem::path>& dir = {});

/** @brief The memory tiers of a machine. */
class topology {
 public:
  /**
   * @brief Discovers the topology described by @p options.
   * @throws input_error naming the file (or env var) and the offending text when an input is
   *         missing or malformed; nothing partial is returned
   */
  [[nodiscard]] static topology discover(const discovery_options& options = {});

  /** @brief Every NUMA node with memory, in increasing id order. */
  [[nodiscard]] const std::vector<numa_node>& nodes() const noexcept { return nodes_; }
  /** @brief The node with id @p id, or null. */
  [[nodiscard]] const numa_node* find_node(numa_node_id id) const noexcept;
  /** @brief The tiers, fastest kinds first (hbm, host_hbm, dram, remote_dram, cxl). */
  [[nodiscard]] const std::vector<tier>& tiers() const noexcept { return tiers_; }
  /** @brief The tier named @p name, or null. */
  [[nodiscard]] const tier* find_tier(std::string_view name) const noexcept;
  /** @brief GPUs, CUDA-visible ones first in CUDA order, then PCI-only ones by bus id. */
  [[nodiscard]] const std::vector<gpu_device>& gpus() const noexcept { return gpus_; }
  /** @brief `N GPU(s) visible` or `no GPU visible (reason)`. */
  [[nodiscard]] const std::string& gpu_status() const noexcept { return gpu_status_; }
  /** @brief The node tier kinds are relative to. */
  [[nodiscard]] numa_node_id initiator() const noexcept { return initiator_; }
  /** @brief SLIT distance between two nodes; nullopt when unknown. */
  [[nodiscard]] std::optional<std::uint32_t> distance(numa_node_id from,
                                                      numa_node_id to) const noexcept;
  /** @brief Performance of @p initiator reading/writing @p target (all unknown if none). */
  [[nodiscard]] access_perf access(numa_node_id initiator, numa_node_id target) const noexcept;
  /** @brief The inputs that were read, e.g. `sysfs:/`, `hwloc:live`, `hwloc-xml:FILE`. */
  [[nodiscard]] const std::vector<std::string>& sources() const noexcept { return sources_; }
  /** @brief Where the `tiers` override came from, when one was applied. */
  [[nodiscard]] const std::string& override_origin() const noexcept { return override_origin_; }

  /**
   * @brief Reads capacity and free bytes of every node (and tier) again from their source.
   * @throws input_error when a node's meminfo has become unreadable or malformed
   */
  void refresh_memory();

 private:
  friend struct topology_builder;
  topology() = default;

  std::vector<numa_node> nodes_;
  std::map<std::pair<int, int>, std::uint32_t> distances_;
  std::map<std::pair<int, int>, access_perf> access_;
  std::vector<gpu_device> gpus_;
  std::string gpu_status_;
  std::vector<tier> tiers_;
  numa_node_id initiator_;
  std::vector<std::string> sources_;
  std::string override_origin_;
  std::filesystem::path sysfs_root_;
  bool memory_from_sysfs_ = false;
};

/**
 * @brief @p topo as JSON, the document of `tierflow topo --json` (docs/topology.md):
 * schema_version, sources, initiator, tiers_override, gpu_status, tiers (name, kind, nodes,
 * gpu, capacity_bytes, free_bytes, perf, nearest_gpus), nodes (id, has_cpu, cpus, capacity and
 * free bytes, memory_tier, hwloc_subtype, dax_device, kind, kind_reason, distances), access and
 * gpus (index, cuda_index, name, pci_bus_id, memory bytes, nearest_nodes).
 */
[[nodiscard]] std::string to_json(const topology& topo);

}  // namespace tierflow
