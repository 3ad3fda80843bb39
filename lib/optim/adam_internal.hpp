#pragma once
// What offload_adam's parts share: the state of groups and params, chunks and argument checks
// (the device side of the streamed step is tierflow/detail/device_adam.hpp).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/detail/device_adam.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"

namespace tierflow::detail {

/** One parameter's state: fp32 master weights and the moments m and v (fp32, or compressed:
 *  tierflow/detail/adam_state.hpp), each array staggered in its allocation
 *  (tierflow/detail/stagger.hpp) so that no two that a step streams together alias. */
struct param_state {
  adam_param desc;
  tier_allocation master;   // elements floats (+ stagger slack); empty when master_is_param
  tier_allocation moments;  // exp_avg, exp_avg_sq, then their scales (each + stagger slack)
  float* master_at = nullptr;
  state_arrays moments_at;  // where m, v (and their scales) are, and their dtype
  // An fp32 param in host memory, stepped in cpu mode without an overlap, is its own master
  // (as torch's AdamW steps it): 8 B of state per param, and no copy of the param after the
  // update.
  bool master_is_param = false;
  // adam_master::remainder: the master's low 16 bits (tierflow/detail/adam_master.hpp); the
  // bf16 param, in host memory, holds the high ones, and master_at is null.
  std::uint16_t* master_low = nullptr;
  // desc.grad is host memory the step reads in place (cpu mode): no copy into grads_host.
  bool grad_on_host = false;
  // It has room in grads_host. A param in the caller's host memory stepped without an overlap
  // has none: its grad must be host memory too (a CPU tensor's grad is), read in place.
  bool grads_staged = true;
  std::size_t grad_offset = 0;  // bytes into the host grads buffer
  std::uint64_t steps = 0;      // steps applied to this param (t of its bias correction)
  bool active = true;           // it has a grad this step (else the step leaves it alone)

  /** The fp32 master (null when it is split: read_master and write_master serve both). */
  [[nodiscard]] float* master_p() const noexcept { return master_at; }
  [[nodiscard]] bool master_split() const noexcept { return master_low != nullptr; }
  /** The update writes the param itself (it is its own master, or the master's high half). */
  [[nodiscard]] bool update_writes_param() const noexcept {
    return master_is_param || master_split();
  }
  [[nodiscard]] adam_state_dtype state_dtype() const noexcept { return moments_at.dtype; }
  /** A param in host memory with a master of its own: a write to the param that the master
   *  did not see (through a tensor's .data: no version records it) is found by comparing the
   *  param with the master stored as the param's dtype, and adopted (adopt_param_writes). */
  [[nodiscard]] bool adopts_param_writes() const noexcept {
    return desc.param_on_host && !update_writes_param();
  }
  /** The master weights' bytes (the param's own, when it is the master). */
  [[nodiscard]] std::size_t master_bytes() const noexcept { return desc.elements * sizeof(float); }
};

/** Elements [offset, offset + n) of @p p's master as fp32, split or not. */
void read_master(const param_state& p, std::size_t offset, std::size_t n, float* out) noexcept;
/** Stores @p in as elements [offset, offset + n) of @p p's master (a split one: into the param
 *  and the remainders at once). */
void write_master(const param_state& p, std::size_t offset, std::size_t n,
                  const float* in) noexcept;

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

/** Refuses params that overlap another param or any grad (tierflow::error naming both). */
void check_no_overlap(const std::vector<adam_group>& in);

/** The longest adam_options::device_timeout_s, seconds (about 11.6 days). */
inline constexpr double max_device_timeout_s = 1e6;

/** The most adam_options::threads: 4 x the hardware threads, at most 1024. */
unsigned max_adam_threads() noexcept;

/** Every check of @p options against each other and the params of @p in (whose counts are
 *  already checked), and the chunk clamped to the largest param. Throws tierflow::error
 *  naming the option and its value. */
void check_options(adam_options& options, const std::vector<adam_group>& in);

/** A short measurement of host memory copy bandwidth (GB/s, read + write counted). */
double measure_host_bandwidth_gbps();

}  // namespace tierflow::detail
