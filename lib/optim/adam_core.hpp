#pragma once
// What every part of an offload_adam works on (private to lib/optim): the state of groups and
// params, the chunks, the host grads buffer, the events a step waits on, the running totals,
// and the waits and errors that the cpu and streamed steps share. The facade (offload_adam.cpp)
// builds it; the modes' units (adam_cpu_step, adam_streamed_step) and the recovery
// (adam_recovery) step it.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/adam_internal.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::detail {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start);

/** @p value as an ostream writes it (for messages). */
std::string number(double value);

// The device work a step depends on did not finish by the step's deadline
// (adam_options::device_timeout_s); the work itself is still queued.
class device_timeout : public device_error {
 public:
  using device_error::device_error;
};

// When the wait for the work a step depends on gives up (none: never).
using step_deadline = std::optional<clock_type::time_point>;

step_deadline deadline_after(double seconds);

// Waits for @p e: as long as it takes without a deadline, else polling until the deadline
// (the device interface has no timed wait), with a short back-off so that a late event costs
// little. @throws device_timeout when the deadline passes first; device_error when the work
// failed
void await(event& e, const step_deadline& deadline, const char* what);

// Host memory registered with the device for its lifetime.
struct registration {
  page_locker* locker = nullptr;
  void* address = nullptr;
  std::size_t bytes = 0;
};

struct adam_core {
  device& dev;
  adam_options options;
  placement_policy& placement;
  std::vector<group_state> groups;
  std::vector<chunk_ref> chunks;
  adam_kernel kernel = adam_kernel::scalar;
  adam_mode mode = adam_mode::cpu;
  std::string mode_reason;
  std::uint64_t total_elements = 0;

  tier_allocation grads_host;  // every param's grads, dtype as on the device
  std::vector<std::unique_ptr<event>> chunk_events;
  std::unique_ptr<event> compute_done;
  std::vector<registration> registered;
  std::vector<double> partial;  // per chunk: Σ g²
  // per chunk: param values adopted this step (written by the chunk's worker only)
  std::vector<std::uint64_t> adopted;
  // Per chunk: this step reads its grads where they are (host memory), not in grads_host.
  std::vector<char> grads_in_place;
  // streamed mode's prefetch scheduler (null in cpu mode): adam_streamed_step makes it and
  // streams the state through it; flush_state() drops its prefetches before the host reads or
  // writes the state.
  std::unique_ptr<prefetch_scheduler> scheduler;

  // The device params lag the master weights (atomic: params_current() may read it from
  // another thread while a step runs).
  std::atomic<bool> params_stale{false};

  adam_metrics totals;

  adam_core(device& d, adam_options o, placement_policy& p)
      : dev(d), options(std::move(o)), placement(p) {}

  // Stops the scheduler, waits for the device (logging a failure) and unregisters the host
  // memory, before anything is freed.
  void shut_down() noexcept;
  void register_host(void* address, std::size_t bytes);
  // Waits for the device to go idle and takes (logs) any failure it still holds, so that the
  // next work runs on healthy streams.
  void settle_device() noexcept;
  void flush_state();

  [[nodiscard]] param_state& param_of(const chunk_ref& c) {
    return groups[c.group].params[c.param];
  }
  [[nodiscard]] const param_state& param_of(const chunk_ref& c) const {
    return groups[c.group].params[c.param];
  }
  // Chunk @p c's grads on the host (in the param's dtype): where they are when this step reads
  // them in place, else in the host grads buffer.
  [[nodiscard]] const unsigned char* host_grads(const chunk_ref& c) const;
  // Chunk @p c's room in the host grads buffer.
  [[nodiscard]] unsigned char* grads_staging(const chunk_ref& c) const;
  // Enqueues the copy of chunk @p c's grads into the host grads buffer on @p d2h; its bytes.
  std::size_t copy_grads_down(const chunk_ref& c, stream& d2h);
  // Chunk @p c's grads are read where they are this step (host memory); false if not.
  bool read_grads_in_place(const chunk_ref& c);
  // The Adam update of chunk @p c in the tier, from its grads in the host grads buffer. With
  // @p adopt_writes, a param that adopts_param_writes() first has its master take what was
  // written to the param outside the optimizer, and then the new values, block by block (each
  // block's compare, update and store in cache). Returns whether the param holds the update
  // (that, or it is the master or its high half), so that no upload is due.
  bool update_on_host(const chunk_ref& c, const adam_scalars& scalars, bool adopt_writes = false);
  // Chunk @p c's master takes its param's values where they differ from the master stored as
  // the param's dtype (counted in adopted); for a param that adopts_param_writes().
  void adopt_param_writes(const chunk_ref& c);
  // The values adopted since the last call, into totals.param_writes_adopted.
  void count_adopted();
  // Every active param's step count, and that of each group with an active param, +1.
  void count_step();
  [[nodiscard]] bool active(const chunk_ref& c) const { return param_of(c).active; }

  const group_state& group_at(std::size_t group) const;
  const param_state& param_at(std::size_t group, std::size_t param) const;
  // Per param (by chunk_ref::slot): its group's hyper-parameters at its own step count.
  [[nodiscard]] adam_scalars scalars_for(const group_state& g, const param_state& p,
                                         double grad_scale) const {
    return make_adam_scalars(g.hyper, p.steps + 1, grad_scale);
  }
  [[nodiscard]] std::string skip_reason() const;
  // The first non-finite grad of @p c (its element index in the param), or std::string::npos:
  // from grads_host in cpu mode, copied down from the device in streamed mode.
  // @throws device_error when that copy fails
  [[nodiscard]] std::size_t first_non_finite(const chunk_ref& c) const;
  // From the chunks' Σ g²: the norm, the clip coefficient and each param's scalars; false
  // (with the reason in @p result) when a grad is not finite.
  bool judge_grads(adam_step_result& result, std::vector<adam_scalars>& scalars) const;
  [[nodiscard]] adam_step_error timed_out(const char* in_mode, const device_timeout& e) const;
  [[nodiscard]] adam_step_error failed_before_update(const char* in_mode, const char* what,
                                                     const device_error& e);
};

}  // namespace tierflow::detail
