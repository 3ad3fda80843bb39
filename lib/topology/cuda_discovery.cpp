// GPUs from the CUDA runtime (the third source), matched to the PCI devices sysfs or hwloc saw.

#include <algorithm>

#include "platform/cuda_probe.hpp"
#include "topology/machine_facts.hpp"

namespace tierflow::detail {

void add_cuda_gpus(machine_facts& facts, bool query_free_memory) {
  std::vector<platform::cuda_device_facts> devices;
  std::string why;
  const bool answered = platform::cuda_enumerate(query_free_memory, devices, why);
  std::vector<gpu_device> ordered;
  for (const auto& device : devices) {
    gpu_device gpu;
    auto it = std::find_if(facts.gpus.begin(), facts.gpus.end(),
                           [&](const auto& g) { return g.pci_bus_id == device.pci_bus_id; });
    if (it != facts.gpus.end()) {
      gpu = *it;
      facts.gpus.erase(it);
    }
    gpu.cuda_index = device.index;
    gpu.name = device.name;
    gpu.pci_bus_id = device.pci_bus_id;
    gpu.memory_total_bytes = device.memory_total;
    gpu.memory_free_bytes = device.memory_free;
    ordered.push_back(std::move(gpu));
  }
  const auto pci_only = facts.gpus.size();
  ordered.insert(ordered.end(), facts.gpus.begin(), facts.gpus.end());
  facts.gpus = std::move(ordered);
  facts.sources.push_back("cuda");
  if (!devices.empty()) {
    facts.gpu_status = std::to_string(devices.size()) + " GPU(s) visible to CUDA";
  } else {
    facts.gpu_status =
        "no GPU visible (" + (answered ? "the CUDA runtime reports 0 devices" : why) + ")";
  }
  if (pci_only > 0) {
    facts.gpu_status +=
        "; " + std::to_string(pci_only) + " NVIDIA GPU(s) on the PCI bus not visible to CUDA";
  }
}

}  // namespace tierflow::detail
