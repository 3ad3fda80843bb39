#include "platform/cuda_probe.hpp"

#include "tierflow/build_config.hpp"

#ifdef TIERFLOW_WITH_CUDA
#include <algorithm>
#include <cctype>

#include <cuda_runtime_api.h>
#endif

namespace tierflow::detail::platform {

#ifdef TIERFLOW_WITH_CUDA

namespace {
std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}
}  // namespace

bool cuda_enumerate(bool query_free, std::vector<cuda_device_facts>& out,
                    std::string& why) noexcept {
  try {
    out.clear();
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      why = describe(status);
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return false;
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp props{};
      if (const auto s = cudaGetDeviceProperties(&props, i); s != cudaSuccess) {
        why = "cudaGetDeviceProperties(" + std::to_string(i) + "): " + describe(s);
        return false;
      }
      cuda_device_facts facts;
      facts.index = i;
      facts.name = props.name;
      facts.memory_total = props.totalGlobalMem;
      char bus_id[32] = {};
      if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, i) == cudaSuccess) {
        facts.pci_bus_id = bus_id;
        std::transform(facts.pci_bus_id.begin(), facts.pci_bus_id.end(), facts.pci_bus_id.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      }
      if (query_free) {
        int previous = 0;
        std::size_t free_bytes = 0;
        std::size_t total_bytes = 0;
        if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(i) == cudaSuccess &&
            cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
          facts.memory_free = free_bytes;
        }
        cudaSetDevice(previous);
      }
      out.push_back(std::move(facts));
    }
    return true;
  } catch (...) {
    why = "out of memory while listing CUDA devices";
    return false;
  }
}

int cuda_runtime_version_built() noexcept {
  return CUDART_VERSION;
}

#else

bool cuda_enumerate(bool /*query_free*/, std::vector<cuda_device_facts>& out,
                    std::string& why) noexcept {
  out.clear();
  why = "tierflow was built without CUDA (TIERFLOW_WITH_CUDA=OFF or no toolkit)";
  return false;
}

int cuda_runtime_version_built() noexcept {
  return 0;
}

#endif

}  // namespace tierflow::detail::platform
