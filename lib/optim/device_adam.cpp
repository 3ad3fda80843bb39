// The streamed step's device side on the emulated device: the CUDA kernels' CPU twins, run as
// host callbacks on the compute stream over the emulated device's memory (host memory), with
// the same kernels as the cpu mode, so the two modes give the same bits.
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "optim/adam_internal.hpp"
#include "platform/stream_copy.hpp"

namespace tierflow::detail {

namespace {

class emulated_device_adam final : public device_adam {
 public:
  emulated_device_adam(adam_kernel kernel, std::size_t chunks)
      : kernel_(kernel), sums_(std::make_shared<std::vector<double>>(chunks, 0.0)) {}

  void sum_squares(stream& on, std::size_t chunk, const void* grad, param_dtype dtype,
                   std::size_t n) override {
    on.host_callback([sums = sums_, kernel = kernel_, chunk, grad, dtype, n] {
      (*sums)[chunk] = grad_sum_squares(kernel, grad, dtype, n);
    });
  }

  void collect(stream& on, std::vector<double>& sums) override {
    on.synchronize();
    sums = *sums_;
  }

  void update(stream& on, float* master, float* m, float* v, const void* grad, void* param,
              param_dtype dtype, std::size_t n, const adam_scalars& scalars) override {
    on.host_callback([=, kernel = kernel_] {
      adam_update(kernel, master, m, v, grad, dtype, n, scalars);
      store_params(kernel, master, param, dtype, n);
    });
  }

  void update_state(stream& on, float* master, const state_arrays& moments, const void* grad,
                    void* param, param_dtype dtype, std::size_t n,
                    const adam_scalars& scalars) override {
    on.host_callback([=, kernel = kernel_] {
      adam_update_state(kernel, master, moments, 0, grad, dtype, n, scalars);
      store_params(kernel, master, param, dtype, n);
    });
  }

 private:
  adam_kernel kernel_;
  std::shared_ptr<std::vector<double>> sums_;  // shared with callbacks still queued
};

}  // namespace

std::unique_ptr<device_adam> make_device_adam(device& dev, adam_kernel kernel, std::size_t chunks) {
  if (dev.properties().backend != "cuda") {
    return std::make_unique<emulated_device_adam>(kernel, chunks);
  }
  auto cuda = make_cuda_device_adam(dev, chunks);
  if (!cuda) {
    throw device_error(
        "offload_adam: streamed mode on a CUDA device needs the CUDA kernels, "
        "and this build has none (built without CUDA)");
  }
  return cuda;
}

double measure_host_bandwidth_gbps() {
  constexpr std::size_t bytes = std::size_t{32} << 20;
  std::vector<unsigned char> a(bytes, 1);
  std::vector<unsigned char> b(bytes, 2);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    platform::stream_copy(b.data(), a.data(), bytes);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) {
      best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
    }
    std::swap(a, b);
  }
  return best > 0 ? best : 10.0;
}

}  // namespace tierflow::detail
