// The demo's math on a CUDA device (demo_compute.hpp): the launchers of demo_kernels.hpp.
#include <cstdlib>
#include <new>
#include <string>

#include "demo/demo_compute.hpp"
#include "demo/demo_kernels.hpp"
#include "tierflow/detail/device_adam.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli::demo {

namespace {

// A CUDA device: demo_kernels.cu on the stream's cudaStream_t (stream::native_handle()).
class cuda_compute final : public demo_compute {
 public:
  cuda_compute(device& dev, std::size_t batch, std::size_t width)
      : dev_(dev), batch_(batch), width_(width) {
    check(demo_cuda::device_index(dev.properties().pci_bus_id.c_str(), &index_),
          "cudaDeviceGetByPCIBusId");
    loss_ = static_cast<double*>(dev_.memory().allocate(sizeof(double)));
    // A copy into pageable memory would block this thread until the forward pass is done.
    loss_host_ = static_cast<double*>(std::aligned_alloc(page_bytes, page_bytes));
    if (loss_host_ == nullptr) {
      dev_.memory().deallocate(loss_, sizeof(double));
      throw std::bad_alloc();
    }
    try {
      dev_.host_registration().lock(loss_host_, page_bytes);
    } catch (...) {
      std::free(loss_host_);
      dev_.memory().deallocate(loss_, sizeof(double));
      throw;
    }
  }
  ~cuda_compute() override {
    dev_.host_registration().unlock(loss_host_, page_bytes);
    std::free(loss_host_);
    dev_.memory().deallocate(loss_, sizeof(double));
  }
  cuda_compute(const cuda_compute&) = delete;
  cuda_compute& operator=(const cuda_compute&) = delete;

  void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) override {
    check(demo_cuda::forward(handle(on), h, w, z, batch_, width_, apply_tanh), "forward");
  }
  void loss(stream& on, const float* y, const float* target, float* dy, double* loss_out) override {
    check(demo_cuda::loss(handle(on), y, target, dy, batch_ * width_,
                          2.0f / static_cast<float>(batch_ * width_), loss_),
          "loss");
    dev_.copy_async(loss_host_, loss_, sizeof(double), copy_kind::d2h, on);
    on.host_callback([loss_out, from = loss_host_] { *loss_out = *from; });
  }
  void backward(stream& on, float* dz, const float* h_out, const float* h_in, const float* w,
                float* dw, float* dh) override {
    check(demo_cuda::backward(handle(on), dz, h_out, h_in, w, dw, dh, batch_, width_), "backward");
  }
  void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                 const std::vector<float*>& grads, std::size_t n) override {
    (void)handle(on);  // this device current on the calling thread
    const auto s = adam.next_step();
    if (!adam_) {
      adam_ = detail::make_device_adam(dev_, adam_kernel::automatic, 1);
    }
    for (std::size_t l = 0; l < params.size(); ++l) {
      // The library's kernel, the scalar reference's operations on the device; an fp32 param
      // is its own master weights.
      adam_->update(on, params[l], adam.m[l], adam.v[l], grads[l], params[l], param_dtype::f32, n,
                    s);
    }
  }
  void zero(stream& on, float* p, std::size_t n) override {
    check(demo_cuda::zero(handle(on), p, n), "zero");
  }

 private:
  void* handle(stream& on) {
    void* h = on.native_handle();
    if (h == nullptr) {
      throw device_error("demo: the CUDA kernels need a stream of a CUDA device, not '" +
                         std::string(on.name()) + "'");
    }
    check(demo_cuda::set_device(index_), "cudaSetDevice");
    return h;
  }
  static void check(int code, const char* what) {
    if (code != 0) {
      throw device_error(std::string("demo: ") + what +
                         " kernel launch failed: " + demo_cuda::error_string(code));
    }
  }

  device& dev_;
  std::size_t batch_;
  std::size_t width_;
  static constexpr std::size_t page_bytes = 4096;
  int index_ = 0;
  double* loss_ = nullptr;                     // device
  double* loss_host_ = nullptr;                // page-locked
  std::unique_ptr<detail::device_adam> adam_;  // the resident run's, made at its first step
};

}  // namespace

std::unique_ptr<demo_compute> make_cuda_compute(device& dev, std::size_t batch, std::size_t width) {
  return std::make_unique<cuda_compute>(dev, batch, width);
}

}  // namespace tierflow::cli::demo
