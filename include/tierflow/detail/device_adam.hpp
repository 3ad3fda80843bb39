#pragma once
// The device side of offload_adam's streamed step (its CUDA kernels, or their CPU twins on the
// emulated device), shared by the library and the GPU Adam benchmark.
#include <cstddef>
#include <memory>
#include <vector>

#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow::detail {

/** The device side of the streamed step: the grads' sums of squares and the update kernel,
 *  as CUDA kernels on a CUDA device and as their CPU twins (host callbacks) on the emulated
 *  one. Enqueues only; results are ready once the stream is synchronized. */
class device_adam {
 public:
  virtual ~device_adam() = default;
  /** Σ g² of chunk @p chunk (in the fixed lane order on the CPU twin). */
  virtual void sum_squares(stream& on, std::size_t chunk, const void* grad, param_dtype dtype,
                           std::size_t n) = 0;
  /** Waits for @p on and returns the sums of every chunk. */
  virtual void collect(stream& on, std::vector<double>& sums) = 0;
  /** Updates master/m/v (device pointers) and writes the params in @p dtype. */
  virtual void update(stream& on, float* master, float* m, float* v, const void* grad, void* param,
                      param_dtype dtype, std::size_t n, const adam_scalars& scalars) = 0;
  /** update() with moments of any state dtype: @p moments holds device pointers to the chunk's
   *  first element (m, v and, for int8, the chunk's first block's scales), the same bytes the
   *  cpu step's adam_update_state gives. */
  virtual void update_state(stream& on, float* master, const state_arrays& moments,
                            const void* grad, void* param, param_dtype dtype, std::size_t n,
                            const adam_scalars& scalars) = 0;
};

/** The device_adam for @p dev with room for @p chunks sums.
 *  @throws device_error for a CUDA device in a build without CUDA kernels */
std::unique_ptr<device_adam> make_device_adam(device& dev, adam_kernel kernel, std::size_t chunks);

/** The CUDA kernels (adam_cuda.cu), or null when built without CUDA. */
std::unique_ptr<device_adam> make_cuda_device_adam(device& dev, std::size_t chunks);

}  // namespace tierflow::detail
