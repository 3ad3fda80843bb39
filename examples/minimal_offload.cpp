// Link tierflow into a trainer: Adam state in host tiers, params and grads on the device.
#include <cstdio>
#include <vector>

#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

int main() {
  auto dev = tierflow::open_device("auto");  // CUDA when present, else the emulated device
  const tierflow::topology topo = tierflow::topology::discover();
  tierflow::placement_policy placement(topo);  // optimizer state in DRAM/CXL (TIERFLOW_PLACEMENT)
  const std::size_t n = 1 << 20;
  std::vector<float> host(n, 0.5f);
  void* w = dev->memory().allocate(n * sizeof(float));  // a layer's weights ...
  void* g = dev->memory().allocate(n * sizeof(float));  // ... and their grads, on the device
  dev->copy_async(w, host.data(), n * sizeof(float), tierflow::copy_kind::h2d, dev->h2d_stream());
  dev->copy_async(g, host.data(), n * sizeof(float), tierflow::copy_kind::h2d, dev->h2d_stream());
  dev->h2d_stream().synchronize();
  tierflow::adam_group group;
  group.hyper.lr = 1e-3;
  group.hyper.weight_decay = 0.01;  // AdamW
  group.params.push_back({"layer0.w", w, g, tierflow::param_dtype::f32, n});
  tierflow::offload_adam adam(*dev, {group}, {}, placement);
  for (int step = 0; step < 3; ++step) {  // your forward + backward fill g, then:
    const auto r = adam.step();
    std::printf("step %d: applied %d, grad norm %.3f, mode %s\n", step, r.applied, r.grad_norm,
                std::string(tierflow::to_string(adam.mode())).c_str());
  }
  dev->memory().deallocate(w, n * sizeof(float));
  dev->memory().deallocate(g, n * sizeof(float));
  return adam.step_count(0) == 3 ? 0 : 1;
}
