// Recovery (docs/reliability.md). streamed mode cannot roll back chunks whose write-back
// landed, so it rolls forward: the chunks whose write-back surely landed hold the step, D2H
// copies from the HBM undo ring restore the others to their pre-step state, and the host runs
// the step for those from their grads (the same kernels, so the same bits); with no chunk
// written back the step is rolled back. A second fault leaves the step pending.
#include "optim/adam_recovery.hpp"

namespace tierflow::detail {

namespace {

void upload_params(adam_core& core) {
  core.flush_state();
  stream& h2d = core.dev.h2d_stream();
  for (auto& g : core.groups) {
    for (auto& p : g.params) {
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      if (p.desc.param_on_host) {
        if (!p.update_writes_param()) {
          store_params(core.kernel, p.master_p(), p.desc.param, p.desc.dtype, p.desc.elements);
        }
        continue;
      }
      if (p.desc.dtype == param_dtype::f32) {
        core.dev.copy_async(p.desc.param, p.master_p(), p.desc.elements * eb, copy_kind::h2d, h2d);
        continue;
      }
      // The grads buffer has room for every param in its own dtype.
      auto* staging = static_cast<unsigned char*>(core.grads_host.data()) + p.grad_offset;
      store_params(core.kernel, p.master_p(), staging, p.desc.dtype, p.desc.elements);
      core.dev.copy_async(p.desc.param, staging, p.desc.elements * eb, copy_kind::h2d, h2d);
    }
  }
  h2d.synchronize();
}

}  // namespace

bool try_upload_params(adam_core& core, std::string& failure) {
  core.params_stale = true;
  try {
    upload_params(core);
  } catch (const device_error& e) {
    failure = e.what();
    core.settle_device();
    return false;
  }
  core.params_stale = false;
  return true;
}

void resend_stale_params(adam_core& core, const char* during) {
  if (!core.params_stale) {
    return;
  }
  std::string failure;
  if (!try_upload_params(core, failure)) {
    throw adam_step_error(std::string("offload_adam: ") + during +
                              ": re-sending the params that a failed call left behind the "
                              "master weights failed again, so nothing was done and the state is "
                              "as before; retry once the fault is gone: " +
                              failure,
                          adam_step_error::outcome::not_applied);
  }
}

void streamed_recovery::settle(adam_step_result result, const std::vector<adam_scalars>& scalars,
                               const std::vector<char>& done, std::size_t done_count,
                               const std::string& failure) {
  // 3. The others go back to their pre-step state: those whose snapshot ran are copied back
  // from the HBM ring; chunks never staged were never written.
  const std::vector<std::pair<std::size_t, std::size_t>> restore = undo_.restorable(done);
  const std::size_t chunks = core_.chunks.size();
  const std::string where = "offload_adam::step (streamed mode): " + failure + "; ";
  std::vector<std::size_t> rest;
  for (const auto& c : core_.chunks) {
    if (done[c.index] == 0) {
      rest.push_back(c.index);
    }
  }
  // A failed restore is a second fault: the step is pending, and its completion retries the
  // restore from the same slots first.
  if (std::string restore_failure; !undo_.restore(restore, restore_failure)) {
    pending_ = pending_step{std::move(rest), scalars, restore, std::move(result)};
    core_.params_stale = true;
    throw adam_step_error(
        where + std::to_string(done_count) + " of " + std::to_string(chunks) +
            " chunks had been written back and restoring the others from the HBM undo copies "
            "failed (" +
            restore_failure +
            "); the step is pending: the next step() restores them and completes it from the "
            "grads on the device, which must not change before then",
        adam_step_error::outcome::pending);
  }
  if (done_count == 0) {
    std::string text = where +
                       "no chunk's write-back had surely landed, so the step was rolled back "
                       "(not applied) from the undo copies: the state is as before; call step() "
                       "again once the fault is gone; ";
    resend_params(text);
    throw adam_step_error(text, adam_step_error::outcome::not_applied);
  }
  // 4. Complete the step on the host for the chunks still at their pre-step state.
  // One try: a failure now is a second fault, and the pending step survives it.
  std::string host_failure;
  if (finish_on_host(rest, scalars, host_failure)) {
    core_.count_step();
    std::string text = where + std::to_string(done_count) + " of " + std::to_string(chunks) +
                       " chunks had been written back, so the step was completed on the host "
                       "for the other " +
                       std::to_string(rest.size()) + " and is applied (do not repeat it); ";
    resend_params(text);
    throw adam_step_error(text, adam_step_error::outcome::applied);
  }
  pending_ = pending_step{std::move(rest), scalars, {}, std::move(result)};
  core_.params_stale = true;
  throw adam_step_error(where + std::to_string(done_count) + " of " + std::to_string(chunks) +
                            " chunks had been written back and completing the others failed (" +
                            host_failure +
                            "); the step is pending: the next step() completes it from the "
                            "grads on the device, which must not change before then",
                        adam_step_error::outcome::pending);
}

// The kernels wrote the device params of every chunk they ran: derive them from the state,
// and say in @p text how that went.
void streamed_recovery::resend_params(std::string& text) {
  std::string upload_failure;
  if (try_upload_params(core_, upload_failure)) {
    text += "the device params were re-sent";
  } else {
    text += "sending the params failed too (" + upload_failure +
            "), so the device params lag the master weights until sync_params() or the next "
            "step() re-sends them";
  }
}

// Copies the grads of chunks @p rest to the host and runs their update there; false (with
// the reason) when the copy fails, the state then untouched.
bool streamed_recovery::finish_on_host(const std::vector<std::size_t>& rest,
                                       const std::vector<adam_scalars>& scalars,
                                       std::string& failure) {
  stream& d2h = core_.dev.d2h_stream();
  try {
    core_.dev.compute_stream().record(*core_.compute_done);
    d2h.wait(*core_.compute_done);
    for (const std::size_t index : rest) {
      if (core_.active(core_.chunks[index])) {
        core_.copy_grads_down(core_.chunks[index], d2h);
      }
    }
    d2h.synchronize();
  } catch (const device_error& e) {
    failure = e.what();
    core_.settle_device();
    return false;
  }
  for (const std::size_t index : rest) {
    const chunk_ref& c = core_.chunks[index];
    if (core_.active(c)) {
      core_.update_on_host(c, scalars[c.slot]);
    }
  }
  return true;
}

adam_step_result streamed_recovery::complete_pending() {
  pending_step& waiting = *pending_;
  std::string failure;
  if (undo_.restore(waiting.restore, failure)) {
    waiting.restore.clear();
  }
  if (!waiting.restore.empty() || !finish_on_host(waiting.chunks, waiting.scalars, failure)) {
    throw adam_step_error("offload_adam::step: completing the pending step failed again (" +
                              failure +
                              "); it is still pending: call step() again once the fault is gone",
                          adam_step_error::outcome::pending);
  }
  core_.count_step();
  adam_step_result result = std::move(waiting.result);
  result.applied = true;
  pending_.reset();
  if (std::string upload_failure; !try_upload_params(core_, upload_failure)) {
    throw adam_step_error(
        "offload_adam::step: the pending step is now complete and applied (do not repeat "
        "it), but sending the params failed, so they lag the master weights until "
        "sync_params() or the next step() re-sends them: " +
            upload_failure,
        adam_step_error::outcome::applied);
  }
  return result;
}

}  // namespace tierflow::detail
