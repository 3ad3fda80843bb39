#include "cuda_reference.hpp"

#include <vector>

#include <cuda_runtime_api.h>

#include "common/bench_util.hpp"

namespace tierflow::bench {

std::optional<double> cuda_reference_gbps(bool h2d, std::size_t bytes, int samples) {
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess ||
      cudaStreamCreate(&stream) != cudaSuccess) {
    cudaFreeHost(host);
    cudaFree(device);
    return std::nullopt;
  }
  std::vector<double> gbps;
  for (int i = -1; i < samples; ++i) {
    const auto start = clock_type::now();
    cudaMemcpyAsync(h2d ? device : host, h2d ? host : device, bytes,
                    h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    if (i >= 0) {
      gbps.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFreeHost(host);
  return summarize(gbps).median;
}

}  // namespace tierflow::bench
