#pragma once
// Thin platform layer over the CUDA runtime for discovery: which GPUs the runtime sees.
// Owns the TIERFLOW_WITH_CUDA switch for discovery; never throws.

#include <cstdint>
#include <string>
#include <vector>

namespace tierflow::detail::platform {

struct cuda_device_facts {
  int index = -1;
  std::string name;
  std::string pci_bus_id;  // lower case, 0000:17:00.0
  std::uint64_t memory_total = 0;
  std::uint64_t memory_free = 0;  // 0 unless asked for
};

/**
 * Lists the GPUs the CUDA runtime sees. Returns true when the runtime answered (possibly with
 * zero devices); false with the reason in @p why (e.g. no driver, built without CUDA).
 * @p query_free creates a context on each device to ask for its free memory.
 */
bool cuda_enumerate(bool query_free, std::vector<cuda_device_facts>& out,
                    std::string& why) noexcept;

/**
 * The CUDA runtime version this build was compiled against (CUDART_VERSION: 1000 x major +
 * 10 x minor, e.g. 13000); 0 when it was built without CUDA.
 */
int cuda_runtime_version_built() noexcept;

}  // namespace tierflow::detail::platform
