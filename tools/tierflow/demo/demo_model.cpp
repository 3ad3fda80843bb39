// The demo's model (demo_model.hpp). Built with -O3 in every build type (CMakeLists.txt).
#include "demo/demo_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "tierflow/detail/adam_kernels.hpp"

namespace tierflow::cli::demo {

// z[i][o] = Σ_k h[i][k] w[o][k]: 16 partial sums per dot product, combined in a fixed order.
void forward_matmul(const float* h, const float* w, float* z, std::size_t batch,
                    std::size_t width) {
  for (std::size_t i = 0; i < batch; ++i) {
    const float* hi = h + i * width;
    for (std::size_t o = 0; o < width; ++o) {
      const float* wo = w + o * width;
      float acc[16] = {};
      std::size_t k = 0;
      for (; k + 16 <= width; k += 16) {
        for (std::size_t j = 0; j < 16; ++j) {
          acc[j] += hi[k + j] * wo[k + j];
        }
      }
      for (; k < width; ++k) {
        acc[k % 16] += hi[k] * wo[k];
      }
      for (std::size_t step = 8; step > 0; step /= 2) {
        for (std::size_t j = 0; j < step; ++j) {
          acc[j] += acc[j + step];
        }
      }
      z[i * width + o] = acc[0];
    }
  }
}

// dW[o][k] = Σ_i dz[i][o] h[i][k]; dh[i][k] = Σ_o dz[i][o] w[o][k] (when dh is not null).
void backward_matmul(const float* dz, const float* h, const float* w, float* dw, float* dh,
                     std::size_t batch, std::size_t width) {
  std::fill(dw, dw + width * width, 0.0f);
  for (std::size_t i = 0; i < batch; ++i) {
    for (std::size_t o = 0; o < width; ++o) {
      const float g = dz[i * width + o];
      float* row = dw + o * width;
      const float* hi = h + i * width;
      for (std::size_t k = 0; k < width; ++k) {
        row[k] += g * hi[k];
      }
    }
  }
  if (dh == nullptr) {
    return;
  }
  std::fill(dh, dh + batch * width, 0.0f);
  for (std::size_t i = 0; i < batch; ++i) {
    float* out = dh + i * width;
    for (std::size_t o = 0; o < width; ++o) {
      const float g = dz[i * width + o];
      const float* wo = w + o * width;
      for (std::size_t k = 0; k < width; ++k) {
        out[k] += g * wo[k];
      }
    }
  }
}

data_set make_data(const demo_options& o, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t w = o.width;
  std::vector<float> t1(w * w), t2(w * w);
  const float scale = 1.5f / std::sqrt(static_cast<float>(w));
  for (auto& v : t1) {
    v = normal(gen) * scale;
  }
  for (auto& v : t2) {
    v = normal(gen) * scale;
  }
  data_set d;
  d.x.resize(o.samples * w);
  d.t.resize(o.samples * w);
  for (auto& v : d.x) {
    v = normal(gen);
  }
  std::vector<float> hidden(o.samples * w);
  forward_matmul(d.x.data(), t1.data(), hidden.data(), o.samples, w);
  for (auto& v : hidden) {
    v = std::tanh(v);
  }
  forward_matmul(hidden.data(), t2.data(), d.t.data(), o.samples, w);
  return d;
}

std::vector<std::vector<float>> init_weights(const demo_options& o, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(o.width)));
  std::vector<std::vector<float>> w(o.layers, std::vector<float>(o.width * o.width));
  for (auto& layer : w) {
    for (auto& v : layer) {
      v = normal(gen);
    }
  }
  return w;
}

detail::adam_scalars resident_adam::next_step() {
  return detail::make_adam_scalars(hyper, ++steps, 1.0);
}

std::uint64_t demo_layer_bytes(const demo_options& o) {
  return o.width * o.width * sizeof(float);
}

std::vector<std::vector<session_weight>> demo_blocks(const demo_options& o, bool resident) {
  std::vector<std::vector<session_weight>> blocks;
  for (std::size_t l = 0; l < o.layers; ++l) {
    blocks.push_back(
        {{"layer" + std::to_string(l) + ".w", demo_layer_bytes(o), nullptr, resident}});
  }
  return blocks;
}

schedule_plan demo_plan(const demo_options& o) {
  return session_plan(demo_blocks(o, false));
}

std::uint64_t demo_staging_budget(const demo_options& o) {
  scheduler_options so;
  so.window = o.window;
  return default_hbm_budget(demo_plan(o), so);
}

}  // namespace tierflow::cli::demo
