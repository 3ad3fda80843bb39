// Built when tierflow has no CUDA backend.
#include "device/device_internal.hpp"

namespace tierflow::detail {

std::unique_ptr<device> open_cuda_device(int, std::string& why) {
  why = "tierflow was built without the CUDA backend (TIERFLOW_WITH_CUDA=OFF or no toolkit)";
  return nullptr;
}

void* cuda_stream_handle(stream&) noexcept {
  return nullptr;
}

}  // namespace tierflow::detail
