// streamed mode: the norm pass runs on the device, then the prefetch scheduler streams each
// chunk's master weights and moments into HBM, the kernel (on the emulated device its CPU
// twin, a host callback) updates them and the device params in place, and the scheduler
// writes them back behind. Once a chunk is staged, a device-to-device copy on the compute
// stream, before its kernel, snapshots its pre-step state into the HBM undo ring; a chunk's
// slot is reused only once an event after its write-back has fired (docs/reliability.md).
#include "optim/adam_streamed_step.hpp"

#include <algorithm>
#include <utility>

#include "tierflow/log.hpp"

namespace tierflow::detail {

void adam_streamed_step::build() {
  schedule_plan plan;
  // A chunk's master, m and v (and int8's scales) as stored: compressed moments cross the link
  // compressed.
  static constexpr const char* piece_names[] = {".master", ".exp_avg", ".exp_avg_sq",
                                                ".exp_avg.scale", ".exp_avg_sq.scale"};
  for (const auto& c : core_.chunks) {
    const param_state& p = core_.param_of(c);
    const std::string base =
        p.desc.name + "#" + std::to_string(c.offset / core_.options.chunk_elements);
    std::vector<buffer_id> ids;
    const state_piece_list pieces = chunk_pieces(p, c);
    for (std::size_t i = 0; i < pieces.count; ++i) {
      const state_piece& piece = pieces.items[i];
      ids.push_back(plan.add_buffer({base + piece_names[i], piece.at, piece.bytes, false, true}));
    }
    plan.add_step({base, {}, ids});
    chunk_buffers_.push_back(std::move(ids));
  }
  const adam_options& options = core_.options;
  scheduler_options so;
  so.window = options.window;
  so.hbm_budget_bytes = options.hbm_budget_bytes;  // 0: the scheduler's default
  so.h2d_gbps = options.h2d_gbps;
  so.d2h_gbps = options.d2h_gbps;
  core_.scheduler = std::make_unique<prefetch_scheduler>(core_.dev, std::move(plan), so);
  device_side_ = make_device_adam(core_.dev, core_.kernel, core_.chunks.size());
  const std::size_t chunks = core_.chunks.size();
  // A chunk is staged again for the next pass only when the window spans the plan; then its
  // write-back waits for that pass, and only the end-of-step flush commits it.
  trust_writeback_events_ = chunks > options.window;
  // Write-backs in flight are bounded by the staging slots (window + 2 by default): a few
  // more ring slots keep the host from waiting for them; every chunk when none is trusted.
  undo_.allocate(trust_writeback_events_
                     ? std::min<std::size_t>(chunks, static_cast<std::size_t>(options.window) + 3)
                     : chunks);
  written_back_.assign(chunks, 0);
}

// The grads' Σ g² on the device, then one host sync for the verdict.
// @throws adam_step_error (not_applied) when it or the work before it failed or timed out
void adam_streamed_step::norm_pass() {
  stream& compute = core_.dev.compute_stream();
  try {
    for (const auto& c : core_.chunks) {
      const param_state& p = core_.param_of(c);
      if (!p.active) {
        continue;  // its sum is zeroed below
      }
      const std::size_t eb = dtype_bytes(p.desc.dtype);
      device_side_->sum_squares(compute, c.index,
                                static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb,
                                p.desc.dtype, c.count);
    }
    if (const step_deadline deadline = deadline_after(core_.options.device_timeout_s); deadline) {
      compute.record(*core_.compute_done);
      await(*core_.compute_done, deadline,
            "the grads (the work that makes them, then the norm pass)");
    }
    device_side_->collect(compute, core_.partial);
    for (const auto& c : core_.chunks) {
      core_.partial[c.index] = core_.active(c) ? core_.partial[c.index] : 0.0;
    }
  } catch (const device_timeout& e) {
    throw core_.timed_out("streamed", e);  // the work stays queued; the next step runs after it
  } catch (const device_error& e) {
    throw core_.failed_before_update("streamed", "the grad norm pass on the device", e);
  }
}

adam_step_result adam_streamed_step::run(adam_step_result result) {
  stream& compute = core_.dev.compute_stream();
  norm_pass();
  std::vector<adam_scalars> scalars;
  if (!core_.judge_grads(result, scalars)) {
    return result;
  }
  undo_.clear();
  std::fill(written_back_.begin(), written_back_.end(), 0);
  std::optional<std::size_t> acquired;
  try {
    for (const auto& c : core_.chunks) {
      stream_chunk(c, scalars, acquired);
    }
    // The step returns only once it is in the tiers: a write-back that failed later would
    // otherwise be lost with the staging the next failure discards.
    if (trust_writeback_events_) {
      core_.chunk_events[core_.chunks.size() - 1]->synchronize();
    } else {
      core_.scheduler->flush();
    }
    compute.synchronize();
  } catch (const device_error& e) {
    recover(std::move(result), scalars, acquired, e.what());
  }
  core_.count_step();
  result.applied = true;
  return result;
}

// Stages chunk @p c (@p acquired names it while it is held), snapshots it into the undo
// ring, enqueues its kernel and releases it for its write-back.
void adam_streamed_step::stream_chunk(const chunk_ref& c, const std::vector<adam_scalars>& scalars,
                                      std::optional<std::size_t>& acquired) {
  // The chunk's undo slot is free once its previous chunk is surely in its tier copy.
  if (const std::size_t previous = undo_.previous(c.index); previous < core_.chunks.size()) {
    core_.chunk_events[previous]->synchronize();  // throws when its write-back failed
  }
  const staged_step& staged = core_.scheduler->acquire(c.index);
  acquired = c.index;
  param_state& p = core_.param_of(c);
  const std::size_t eb = dtype_bytes(p.desc.dtype);
  // The chunk's pieces staged in HBM, in chunk_pieces' order.
  state_piece_list pieces = chunk_pieces(p, c);
  auto& in_hbm = pieces.items;
  const std::vector<buffer_id>& ids = chunk_buffers_[c.index];
  for (std::size_t i = 0; i < pieces.count; ++i) {
    in_hbm[i].at = static_cast<unsigned char*>(staged.pointer(ids[i]));
  }
  auto* master = reinterpret_cast<float*>(in_hbm[0].at);
  const bool scaled = pieces.count > 3;
  const state_arrays moments{p.state_dtype(), in_hbm[1].at, in_hbm[2].at,
                             scaled ? reinterpret_cast<float*>(in_hbm[3].at) : nullptr,
                             scaled ? reinterpret_cast<float*>(in_hbm[4].at) : nullptr};
  const void* grad =
      p.active ? static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb : nullptr;
  void* param = static_cast<unsigned char*>(p.desc.param) + c.offset * eb;
  undo_.save(c, staged.compute(), pieces);
  // A param without a grad this step streams through unchanged (its undo copy and write-back
  // hold what it held), so that recovery treats every chunk alike.
  if (p.active) {
    device_side_->update_state(staged.compute(), master, moments, grad, param, p.desc.dtype,
                               c.count, scalars[c.slot]);
  }
  acquired.reset();
  core_.scheduler->release(c.index, true);
  // After the write-back the release enqueued (the d2h stream runs in order).
  core_.dev.d2h_stream().record(*core_.chunk_events[c.index]);
  written_back_[c.index] = 1;
}

void adam_streamed_step::recover(adam_step_result result, const std::vector<adam_scalars>& scalars,
                                 std::optional<std::size_t> acquired, const std::string& failure) {
  // 1. Let the scheduler drop what it staged and the device go idle.
  if (acquired) {
    try {
      core_.scheduler->release(*acquired, false);
    } catch (const std::exception& e) {
      log(log_level::debug, std::string("offload_adam: recovery: ") + e.what());
    }
  }
  try {
    core_.scheduler->flush();
  } catch (const std::exception& e) {
    log(log_level::debug, std::string("offload_adam: recovery: ") + e.what());
  }
  core_.settle_device();
  // 2. The chunks whose write-back surely landed hold the step in their tier copy.
  std::vector<char> done(core_.chunks.size(), 0);
  std::size_t done_count = 0;
  if (trust_writeback_events_) {
    for (const auto& c : core_.chunks) {
      if (written_back_[c.index] == 0) {
        continue;
      }
      try {
        core_.chunk_events[c.index]->synchronize();
        done[c.index] = 1;
        ++done_count;
      } catch (const device_error&) {
      }
    }
  }
  // 3.–5. The others are restored, then rolled back or forward.
  recovery_.settle(std::move(result), scalars, done, done_count, failure);
}

}  // namespace tierflow::detail
