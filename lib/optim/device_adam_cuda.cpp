// The streamed step's device side on a CUDA device: the kernels of adam_cuda.cu on the
// device's compute stream; each chunk's partial sums land in one device array that a single
// copy brings back per step.
#include <vector>

#include <cuda_runtime_api.h>

#include "device/cuda/cuda_try.hpp"
#include "device/device_internal.hpp"
#include "optim/adam_cuda.hpp"
#include "optim/adam_internal.hpp"

namespace tierflow::detail {

namespace {

class cuda_device_adam final : public device_adam {
 public:
  cuda_device_adam(device& dev, std::size_t chunks) : dev_(dev), chunks_(chunks) {
    TIERFLOW_CUDA_TRY(cudaDeviceGetByPCIBusId(&index_, dev.properties().pci_bus_id.c_str()));
    bytes_ = chunks_ * cuda_adam::sum_blocks * sizeof(double);
    sums_ = static_cast<double*>(dev_.memory().allocate(bytes_));
    host_.assign(chunks_ * cuda_adam::sum_blocks, 0.0);
  }
  ~cuda_device_adam() override { dev_.memory().deallocate(sums_, bytes_); }
  cuda_device_adam(const cuda_device_adam&) = delete;
  cuda_device_adam& operator=(const cuda_device_adam&) = delete;

  void sum_squares(stream& on, std::size_t chunk, const void* grad, param_dtype dtype,
                   std::size_t n) override {
    TIERFLOW_CUDA_TRY(cudaSetDevice(index_));
    TIERFLOW_CUDA_TRY(static_cast<cudaError_t>(cuda_adam::launch_sum_squares(
        handle(on), grad, static_cast<int>(dtype), n, sums_ + chunk * cuda_adam::sum_blocks)));
  }

  void collect(stream& on, std::vector<double>& sums) override {
    TIERFLOW_CUDA_TRY(cudaSetDevice(index_));
    TIERFLOW_CUDA_TRY(cudaMemcpyAsync(host_.data(), sums_, bytes_, cudaMemcpyDeviceToHost,
                                      static_cast<cudaStream_t>(handle(on))));
    on.synchronize();
    sums.assign(chunks_, 0.0);
    for (std::size_t c = 0; c < chunks_; ++c) {
      double total = 0;
      for (int b = 0; b < cuda_adam::sum_blocks; ++b) {
        total += host_[c * cuda_adam::sum_blocks + static_cast<std::size_t>(b)];
      }
      sums[c] = total;
    }
  }

  void update(stream& on, float* master, float* m, float* v, const void* grad, void* param,
              param_dtype dtype, std::size_t n, const adam_scalars& scalars) override {
    TIERFLOW_CUDA_TRY(cudaSetDevice(index_));
    TIERFLOW_CUDA_TRY(static_cast<cudaError_t>(cuda_adam::launch_update(
        handle(on), master, m, v, grad, param, static_cast<int>(dtype), n, scalars)));
  }

  void update_state(stream& on, float* master, const state_arrays& moments, const void* grad,
                    void* param, param_dtype dtype, std::size_t n,
                    const adam_scalars& scalars) override {
    if (moments.dtype == adam_state_dtype::f32) {
      update(on, master, static_cast<float*>(moments.m), static_cast<float*>(moments.v), grad,
             param, dtype, n, scalars);
      return;
    }
    TIERFLOW_CUDA_TRY(cudaSetDevice(index_));
    TIERFLOW_CUDA_TRY(static_cast<cudaError_t>(cuda_adam::launch_update_compressed(
        handle(on), master, static_cast<int>(moments.dtype), moments.m, moments.v, moments.m_scale,
        moments.v_scale, grad, param, static_cast<int>(dtype), n, scalars)));
  }

 private:
  static void* handle(stream& on) {
    void* h = cuda_stream_handle(on);
    TIERFLOW_EXPECTS(h != nullptr, "the CUDA Adam kernels need a stream of a CUDA device");
    return h;
  }

  device& dev_;
  std::size_t chunks_;
  int index_ = 0;
  std::size_t bytes_ = 0;
  double* sums_ = nullptr;
  std::vector<double> host_;
};

}  // namespace

std::unique_ptr<device_adam> make_cuda_device_adam(device& dev, std::size_t chunks) {
  return std::make_unique<cuda_device_adam>(dev, chunks);
}

}  // namespace tierflow::detail
