#pragma once
// The bound for pinned copies on a GPU: cudaMemcpyAsync from/to a cudaMallocHost buffer.

#include <cstddef>
#include <optional>

namespace tierflow::bench {

/** Median GB/s of @p bytes copied H2D (or D2H) from cudaMallocHost memory; nullopt without
 *  CUDA. */
std::optional<double> cuda_reference_gbps(bool h2d, std::size_t bytes, int samples);

}  // namespace tierflow::bench
