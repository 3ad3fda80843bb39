#pragma once
// Device memory the demo's runs and its link probe allocate and free together.

#include <cstddef>
#include <utility>
#include <vector>

#include "tierflow/device.hpp"

namespace tierflow::cli::demo {

/** @brief Device buffers of one run (activations, the batch, grads, scratch), freed on
 *  destruction. @p dev must outlive it. */
struct device_buffers {
  device& dev;
  std::vector<std::pair<void*, std::size_t>> owned;
  explicit device_buffers(device& d) : dev(d) {}
  device_buffers(const device_buffers&) = delete;
  device_buffers& operator=(const device_buffers&) = delete;
  ~device_buffers() {
    for (auto [p, n] : owned) {
      dev.memory().deallocate(p, n);
    }
  }
  /** @brief @p n floats of device memory. */
  float* floats(std::size_t n) {
    void* p = dev.memory().allocate(n * sizeof(float));
    owned.emplace_back(p, n * sizeof(float));
    return static_cast<float*>(p);
  }
};

}  // namespace tierflow::cli::demo
