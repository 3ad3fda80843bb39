// The demo's math on the emulated device (demo_compute.hpp). Built with -O3 in every build type.
#include <algorithm>
#include <cmath>

#include "demo/demo_compute.hpp"
#include "tierflow/detail/adam_kernels.hpp"

namespace tierflow::cli::demo {

namespace {

// The emulated device: demo_model.hpp's code as host callbacks over its (host) memory.
class host_compute final : public demo_compute {
 public:
  host_compute(std::size_t batch, std::size_t width) : batch_(batch), width_(width) {}
  void forward(stream& on, const float* h, const float* w, float* z, bool apply_tanh) override {
    on.host_callback([batch = batch_, width = width_, h, w, z, apply_tanh] {
      forward_matmul(h, w, z, batch, width);
      if (apply_tanh) {
        for (std::size_t i = 0; i < batch * width; ++i) {
          z[i] = std::tanh(z[i]);
        }
      }
    });
  }
  void loss(stream& on, const float* y, const float* target, float* dy, double* loss_out) override {
    on.host_callback([count = batch_ * width_, y, target, dy, loss_out] {
      // The mean squared error over the batch's outputs, and its gradient.
      double loss = 0;
      const float scale = 2.0f / static_cast<float>(count);
      for (std::size_t i = 0; i < count; ++i) {
        const float d = y[i] - target[i];
        loss += static_cast<double>(d) * d;
        dy[i] = scale * d;
      }
      *loss_out = loss / static_cast<double>(count);
    });
  }
  void backward(stream& on, float* dz, const float* h_out, const float* h_in, const float* w,
                float* dw, float* dh) override {
    on.host_callback([batch = batch_, width = width_, dz, h_out, h_in, w, dw, dh] {
      if (h_out != nullptr) {  // through the tanh: dz = dh ⊙ (1 - h²)
        for (std::size_t i = 0; i < batch * width; ++i) {
          const float h = h_out[i];
          dz[i] = dz[i] * (1.0f - h * h);
        }
      }
      backward_matmul(dz, h_in, w, dw, dh, batch, width);
    });
  }
  void adam_step(stream& on, resident_adam& adam, const std::vector<float*>& params,
                 const std::vector<float*>& grads, std::size_t n) override {
    on.host_callback([&adam, params, grads, n] {
      const auto s = adam.next_step();
      for (std::size_t l = 0; l < params.size(); ++l) {
        for (std::size_t i = 0; i < n; ++i) {  // the scalar definition: the oracle
          detail::adam_reference(params[l][i], adam.m[l][i], adam.v[l][i], grads[l][i], s);
        }
      }
    });
  }
  void zero(stream& on, float* p, std::size_t n) override {
    on.host_callback([p, n] { std::fill(p, p + n, 0.0f); });
  }

 private:
  std::size_t batch_;
  std::size_t width_;
};

}  // namespace

std::unique_ptr<demo_compute> make_host_compute(std::size_t batch, std::size_t width) {
  return std::make_unique<host_compute>(batch, width);
}

}  // namespace tierflow::cli::demo
