#pragma once
// What offload_adam's parts share: the state of groups and params, chunks, argument checks and
// the device side of the streamed step.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/adam_kernels.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"

namespace tierflow::detail {

/** One parameter's state: fp32 master weights, and the moments m then v in one allocation. */
struct param_state {
  adam_param desc;
  tier_allocation master;       // elements floats
  tier_allocation moments;      // 2 × elements floats: exp_avg, then exp_avg_sq
  std::size_t grad_offset = 0;  // bytes into the host grads buffer
  std::uint64_t steps = 0;      // steps applied to this param (t of its bias correction)
  bool active = true;           // it has a grad this step (else the step leaves it alone)

  [[nodiscard]] float* master_p() const noexcept { return static_cast<float*>(master.data()); }
  [[nodiscard]] float* moments_m() const noexcept { return static_cast<float*>(moments.data()); }
  [[nodiscard]] float* moments_v() const noexcept { return moments_m() + desc.elements; }
};

struct group_state {
  adam_hyper hyper;
  std::uint64_t steps = 0;  // steps applied to any of its params
  std::vector<param_state> params;
};

/** A piece of one parameter: the unit of transfer and of thread work. */
struct chunk_ref {
  std::size_t group = 0;
  std::size_t param = 0;
  std::size_t offset = 0;  // elements into the param
  std::size_t count = 0;
  std::size_t index = 0;  // in the optimizer's chunk list
  std::size_t slot = 0;   // its param's index over every group (group 0's params first)
  int node = -1;          // NUMA node of its state (-1: unknown)
};

/** Throws tierflow::error naming @p where and the bad value. */
void check_hyper(const adam_hyper& hyper, const std::string& where);

/** A short measurement of host memory copy bandwidth (GB/s, read + write counted). */
double measure_host_bandwidth_gbps();

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
};

/** The device_adam for @p dev with room for @p chunks sums.
 *  @throws device_error for a CUDA device in a build without CUDA kernels */
std::unique_ptr<device_adam> make_device_adam(device& dev, adam_kernel kernel, std::size_t chunks);

/** The CUDA kernels (adam_cuda.cu), or null when built without CUDA. */
std::unique_ptr<device_adam> make_cuda_device_adam(device& dev, std::size_t chunks);

}  // namespace tierflow::detail
