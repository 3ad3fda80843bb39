#pragma once
// offload_adam's private state (offload_adam.cpp): the shared core, the mode's unit, the
// speculation of overlap backward, the call gate and the params' owner's write guard.
#include <memory>
#include <vector>

#include "core/call_gate.hpp"
#include "optim/adam_core.hpp"
#include "optim/adam_cpu_step.hpp"
#include "optim/adam_speculation.hpp"
#include "optim/adam_streamed_step.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow {

struct offload_adam::impl {
  detail::adam_core core;
  // The mode's unit: one of them is made, after the core's state.
  std::unique_ptr<detail::adam_cpu_step> cpu;
  std::unique_ptr<detail::adam_streamed_step> streamed;
  std::unique_ptr<detail::adam_speculation> speculation;  // overlap backward, cpu mode
  // One public call at a time (grad_ready()s shared): a second thread's call is refused.
  mutable detail::call_gate gate;
  param_write_guard* guard = nullptr;  // the params' owner (a session), if any

  impl(device& d, adam_options o, placement_policy& p) : core(d, std::move(o), p) {}
  // The speculation's work done, the device idle and the host memory unregistered before the
  // units (the undo ring's HBM, the workers, the upload ring) and then the state are freed.
  ~impl() {
    cancel_speculation();
    core.shut_down();
  }
  // Restores what grad_ready() updated, before a call that reads or replaces the state.
  void cancel_speculation() noexcept {
    if (speculation) {
      speculation->cancel();
    }
  }
  // Before a call that may write params in host memory: the owner's check.
  void guard_writes() const {
    if (guard != nullptr) {
      guard->before_writes();
    }
  }

  // @p address is host memory (not the device's): the CPU reads and writes it in place.
  [[nodiscard]] bool in_host_memory(const void* address) const;
  // Refuses a device @p grad for @p p when it has no room in the host grads buffer.
  void check_grad(const detail::param_state& p, const void* grad) const;
  void validate(const std::vector<adam_group>& in);
  void allocate_state(std::vector<adam_group>& in);
  void make_chunks();
  void read_initial_params();
  // Reads @p p's device values into its master weights. @throws device_error (master as
  // before)
  void read_params(const detail::param_state& p);
  void refuse_while_pending(const char* call) const;
  // set_grad()'s checks, changing nothing. @throws tierflow::error
  void check_set_grad(std::size_t group, std::size_t param, const void* grad) const;
  // The bodies of set_grad() and grad_ready(), for callers that hold the gate.
  void set_grad(std::size_t group, std::size_t param, const void* grad);
  void grad_ready(std::size_t group, std::size_t param);
  [[nodiscard]] bool pending() const noexcept { return streamed && streamed->recovery().pending(); }
};

}  // namespace tierflow
