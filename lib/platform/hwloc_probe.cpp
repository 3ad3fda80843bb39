#include "platform/hwloc_probe.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include <hwloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "platform/pci.hpp"

namespace tierflow::detail::platform {
namespace {

struct topology_deleter {
  void operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
};
using topology_ptr = std::unique_ptr<hwloc_topology, topology_deleter>;

// Subtypes hwloc gives memory that has no CPUs of its own.
bool is_memory_only_subtype(const std::string& subtype) {
  return subtype == "MCDRAM" || subtype == "HBM" || subtype == "SPM" || subtype == "NVM" ||
         subtype == "CXL-DRAM" || subtype == "GPUMemory";
}

// hwloc attaches a NUMA node to the object that holds its local CPUs; a CPU-less node is
// attached to a larger ancestor and so inherits that ancestor's cpuset. Memory-side caches may
// sit between a node and that object.
hwloc_obj_t locality_parent(hwloc_obj_t node) {
  hwloc_obj_t parent = node->parent;
  while (parent != nullptr && hwloc_obj_type_is_memory(parent->type)) {
    parent = parent->parent;
  }
  return parent;
}

std::vector<int> cpus_of(hwloc_const_cpuset_t cpuset) {
  std::vector<int> cpus;
  if (cpuset == nullptr) {
    return cpus;
  }
  int id = -1;
  while ((id = hwloc_bitmap_next(cpuset, id)) != -1) {
    cpus.push_back(id);
  }
  return cpus;
}

// hwloc alone cannot say whether a node has CPUs. Rule: among the nodes attached to one
// locality parent, a node whose subtype names memory-only technology is CPU-less; of the
// others, the lowest os_index owns the parent's CPUs and the rest are CPU-less.
void infer_cpu_ownership(std::vector<hwloc_node_facts>& nodes,
                         const std::vector<hwloc_obj_t>& objects) {
  std::map<hwloc_obj_t, std::size_t> owner;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    const auto parent = locality_parent(objects[i]);
    const bool has_pus =
        parent != nullptr && parent->cpuset != nullptr && !hwloc_bitmap_iszero(parent->cpuset);
    if (!has_pus || is_memory_only_subtype(nodes[i].subtype)) {
      continue;
    }
    auto it = owner.find(parent);
    if (it == owner.end() || nodes[i].os_index < nodes[it->second].os_index) {
      owner[parent] = i;
    }
  }
  for (const auto& [parent, index] : owner) {
    nodes[index].has_cpu = true;
    nodes[index].cpus = cpus_of(parent->cpuset);
  }
}

std::optional<std::uint64_t> memattr(hwloc_topology_t topo, hwloc_memattr_id_t id,
                                     hwloc_obj_t target, hwloc_cpuset_t initiator) {
  hwloc_location location{};
  location.type = HWLOC_LOCATION_TYPE_CPUSET;
  location.location.cpuset = initiator;
  hwloc_uint64_t value = 0;
  if (hwloc_memattr_get_value(topo, id, target, &location, 0, &value) != 0 || value == 0) {
    return std::nullopt;
  }
  return value;
}

void collect_distances(hwloc_topology_t topo, std::vector<hwloc_distance_facts>& out) {
  unsigned count = 1;
  hwloc_distances_s* matrix = nullptr;
  if (hwloc_distances_get_by_type(topo, HWLOC_OBJ_NUMANODE, &count, &matrix,
                                  HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) != 0 ||
      count == 0 || matrix == nullptr) {
    return;
  }
  for (unsigned i = 0; i < matrix->nbobjs; ++i) {
    for (unsigned j = 0; j < matrix->nbobjs; ++j) {
      out.push_back({static_cast<int>(matrix->objs[i]->os_index),
                     static_cast<int>(matrix->objs[j]->os_index),
                     matrix->values[i * matrix->nbobjs + j]});
    }
  }
  hwloc_distances_release(topo, matrix);
}

void collect_gpus(hwloc_topology_t topo, std::vector<hwloc_gpu_facts>& out) {
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(topo, pci)) {
    const auto& attr = pci->attr->pcidev;
    if (!is_cuda_gpu(attr.vendor_id, attr.class_id)) {
      continue;
    }
    hwloc_gpu_facts gpu;
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.%01x", attr.domain, attr.bus, attr.dev,
                  attr.func);
    gpu.pci_bus_id = bus_id;
    hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(topo, pci);
    if (parent != nullptr && parent->nodeset != nullptr) {
      int id = -1;
      while ((id = hwloc_bitmap_next(parent->nodeset, id)) != -1) {
        gpu.nearest_nodes.push_back(id);
      }
    }
    out.push_back(std::move(gpu));
  }
}

}  // namespace

namespace {

// hwloc 2.9 can crash on some malformed XML (found by fuzz_hwloc_xml: a NULL read in
// hwloc_bitmap_compare_first during load), and it leaks the objects it had built when it
// refuses a file cut short mid-body. Loading a user's file first in a child process turns
// such a crash into an error instead of taking the caller down, and a file the child saw
// refused is never loaded here, so the caller leaks nothing either.
constexpr int reported = 3;  // the child's exit status once it has written its report

// The messages for a file hwloc refuses, at set_xml or at load (the child and the direct load
// report the same way).
std::string refused_by_set_xml(int code) {
  return std::string("hwloc rejected the XML (") + std::strerror(code) + ")";
}
std::string refused_by_load(int code) {
  return std::string("hwloc_topology_load failed: ") + std::strerror(code);
}

// What the child reports through its pipe: the stage that refused the file and its errno.
struct child_report {
  int stage = 0;  // 0: loaded; 1: set_xml refused it; 2: load refused it
  int code = 0;
};

// 0 when the file loads (or the child cannot be made: the caller then loads it directly);
// otherwise an errno, with `error` saying why.
int check_in_child(const char* xml_path, std::string& error) noexcept {
  int fds[2];
  if (::pipe(fds) != 0) {
    return 0;  // cannot isolate: load it directly
  }
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return 0;
  }
  if (child == 0) {
    // Die plainly on a fault: no crash handler of the parent's (a sanitizer's, a fuzzer's)
    // should run in this throwaway copy.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
      ::signal(sig, SIG_DFL);
    }
    ::close(fds[0]);
    child_report report;
    hwloc_topology_t topo = nullptr;
    if (hwloc_topology_init(&topo) == 0) {
      if (hwloc_topology_set_xml(topo, xml_path) != 0) {
        report = {1, errno != 0 ? errno : EINVAL};
      } else {
        hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_load(topo) != 0) {
          report = {2, errno != 0 ? errno : EINVAL};
        }
      }
      hwloc_topology_destroy(topo);
    }
    const bool sent = ::write(fds[1], &report, sizeof report) == sizeof report;
    ::_exit(sent ? reported : 1);
  }
  ::close(fds[1]);
  child_report report;
  ssize_t got = -1;
  do {
    got = ::read(fds[0], &report, sizeof report);
  } while (got < 0 && errno == EINTR);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  // A signal, or any other exit status (a sanitizer reports a crash and exits 1), is a crash.
  if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != reported ||
      got != static_cast<ssize_t>(sizeof report)) {
    error = WIFSIGNALED(status) ? "hwloc crashed reading this XML (signal " +
                                      std::to_string(WTERMSIG(status)) + "): the file is malformed"
                                : "hwloc crashed reading this XML: the file is malformed";
    return EINVAL;
  }
  if (report.stage == 1) {
    error = refused_by_set_xml(report.code);
    return report.code;
  }
  if (report.stage == 2) {
    error = refused_by_load(report.code);
    return report.code;
  }
  return 0;
}

}  // namespace

int hwloc_probe(const char* xml_path, hwloc_facts& out, std::string& error) noexcept {
  if (xml_path != nullptr) {
    if (const int code = check_in_child(xml_path, error); code != 0) {
      return code;
    }
  }
  try {
    hwloc_topology_t raw = nullptr;
    if (hwloc_topology_init(&raw) != 0) {
      error = std::string("hwloc_topology_init failed: ") + std::strerror(errno);
      return errno != 0 ? errno : EINVAL;
    }
    topology_ptr topo(raw);
    if (xml_path != nullptr) {
      // set_xml validates the file; on failure hwloc would silently load the live machine.
      if (hwloc_topology_set_xml(raw, xml_path) != 0) {
        const int code = errno != 0 ? errno : EINVAL;
        error = refused_by_set_xml(code);
        return code;
      }
      hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    }
    if (hwloc_topology_load(raw) != 0) {
      const int code = errno != 0 ? errno : EINVAL;
      error = refused_by_load(code);
      return code;
    }
    out = {};
    std::vector<hwloc_obj_t> objects;
    for (hwloc_obj_t node = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, nullptr);
         node != nullptr; node = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, node)) {
      hwloc_node_facts facts;
      facts.os_index = static_cast<int>(node->os_index);
      facts.local_memory = node->attr != nullptr ? node->attr->numanode.local_memory : 0;
      facts.subtype = node->subtype != nullptr ? node->subtype : "";
      out.nodes.push_back(std::move(facts));
      objects.push_back(node);
    }
    infer_cpu_ownership(out.nodes, objects);

    for (std::size_t t = 0; t < objects.size(); ++t) {
      for (std::size_t i = 0; i < objects.size(); ++i) {
        if (!out.nodes[i].has_cpu) {
          continue;
        }
        hwloc_cpuset_t initiator = locality_parent(objects[i])->cpuset;
        hwloc_access_facts access;
        access.initiator = out.nodes[i].os_index;
        access.target = out.nodes[t].os_index;
        access.read_bandwidth =
            memattr(raw, HWLOC_MEMATTR_ID_READ_BANDWIDTH, objects[t], initiator);
        access.write_bandwidth =
            memattr(raw, HWLOC_MEMATTR_ID_WRITE_BANDWIDTH, objects[t], initiator);
        access.bandwidth = memattr(raw, HWLOC_MEMATTR_ID_BANDWIDTH, objects[t], initiator);
        access.read_latency = memattr(raw, HWLOC_MEMATTR_ID_READ_LATENCY, objects[t], initiator);
        access.write_latency = memattr(raw, HWLOC_MEMATTR_ID_WRITE_LATENCY, objects[t], initiator);
        access.latency = memattr(raw, HWLOC_MEMATTR_ID_LATENCY, objects[t], initiator);
        if (access.read_bandwidth || access.write_bandwidth || access.bandwidth ||
            access.read_latency || access.write_latency || access.latency) {
          out.access.push_back(access);
        }
      }
    }
    collect_distances(raw, out.distances);
    collect_gpus(raw, out.gpus);
    std::sort(out.nodes.begin(), out.nodes.end(),
              [](const auto& a, const auto& b) { return a.os_index < b.os_index; });
    return 0;
  } catch (const std::bad_alloc&) {
    error = "out of memory while reading the hwloc topology";
    return ENOMEM;
  } catch (...) {
    error = "unexpected failure while reading the hwloc topology";
    return EINVAL;
  }
}

}  // namespace tierflow::detail::platform
