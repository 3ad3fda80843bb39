#pragma once
// Where the demo's math runs: on the emulated device, host callbacks over its (host) memory
// (host_compute.cpp); on a CUDA device, the kernels of demo_kernels.cu on its compute stream
// (cuda_compute.cpp).

#include <cstddef>
#include <memory>
#include <vector>

#include "demo/demo_model.hpp"
#include "tierflow/device.hpp"

namespace tierflow::cli::demo {

// The demo's math for one model shape, enqueued on a stream of the device that holds the
// buffers (all pointers are device pointers): each call runs after the stream's earlier work.
class demo_compute {
 public:
  virtual ~demo_compute() = default;
  /** z = h wᵀ over the batch, then tanh in place when @p apply_tanh. */
  virtual void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) = 0;
  /** dy = 2 (y - t) / count; the mean squared error lands in the host double @p loss_out once
   *  @p on has run this far. */
  virtual void loss(stream& on, const float* y, const float* target, float* dy,
                    double* loss_out) = 0;
  /** Through the tanh (dz ⊙= 1 - h_out², when @p h_out is not null), then dw = dzᵀ h_in and,
   *  when @p dh is not null, dh = dz w. */
  virtual void backward(stream& on, float* dz, const float* h_out, const float* h_in,
                        const float* w, float* dw, float* dh) = 0;
  /** One step of the resident Adam over every layer. */
  virtual void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                         const std::vector<float*>& grads, std::size_t n) = 0;
  /** p[0 .. n) = 0. */
  virtual void zero(stream& on, float* p, std::size_t n) = 0;
};

/** @brief The emulated device's math: demo_model.hpp's code as host callbacks. */
std::unique_ptr<demo_compute> make_host_compute(std::size_t batch, std::size_t width);

/** @brief A CUDA device's math: demo_kernels.cu on the stream's cudaStream_t.
 *  @throws device_error when @p dev's CUDA index cannot be found */
std::unique_ptr<demo_compute> make_cuda_compute(device& dev, std::size_t batch, std::size_t width);

/** @brief The math for @p dev's backend. */
inline std::unique_ptr<demo_compute> make_compute(device& dev, std::size_t batch,
                                                  std::size_t width) {
  if (dev.properties().backend == "cuda") {
    return make_cuda_compute(dev, batch, width);
  }
  return make_host_compute(batch, width);
}

}  // namespace tierflow::cli::demo
