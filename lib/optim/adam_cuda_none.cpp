// Built without CUDA: no device kernels (a CUDA device cannot be opened either).
#include "optim/adam_internal.hpp"

namespace tierflow::detail {

std::unique_ptr<device_adam> make_cuda_device_adam(device&, std::size_t) {
  return nullptr;
}

}  // namespace tierflow::detail
