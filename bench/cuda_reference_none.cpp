// Built without CUDA: there is no cudaMallocHost reference.
#include "cuda_reference.hpp"

namespace tierflow::bench {

std::optional<double> cuda_reference_gbps(bool, std::size_t, int) {
  return std::nullopt;
}

}  // namespace tierflow::bench
