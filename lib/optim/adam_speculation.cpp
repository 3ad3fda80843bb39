// The speculative step (see adam_speculation.hpp). Threads: grad_ready() runs on the caller's
// threads under mutex_, writes a chunk's announced_, deadline_ and queue_ entries and the
// param's scalars_, then hands the chunk to a pool (extend() takes the pool's lock, which
// orders those writes before the worker's reads). A worker writes only its chunk's partial
// sum, updated_ flag and state; step() reads them after wait() (the pool's lock again).
#include "optim/adam_speculation.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

#include "tierflow/log.hpp"

namespace tierflow::detail {

void adam_speculation::allocate() {
  std::size_t slots = 0;
  for (const auto& g : core_.groups) {
    slots += g.params.size();
  }
  chunks_of_.resize(slots);
  scalars_.resize(slots);
  for (const auto& g : core_.groups) {
    for (const auto& p : g.params) {
      param_by_slot_.push_back(&p);
      // The master's floats, then the moments packed as they are stored (compressed or not).
      backup_.push_back(core_.placement.allocate(
          data_class::optimizer_state, p.desc.elements * sizeof(float) +
                                           packed_moments_bytes(p.state_dtype(), p.desc.elements)));
      core_.totals.rollback_bytes += backup_.back().size();
    }
  }
  for (const auto& c : core_.chunks) {
    chunks_of_[c.slot].push_back(c.index);
    queue_[c.node].push_back(0);  // room for every chunk of the node: never reallocated
    queued_[c.node] = 0;
  }
  deadline_.resize(core_.chunks.size());
  announced_.assign(core_.chunks.size(), 0);
  updated_.assign(core_.chunks.size(), 0);
  published_.assign(core_.chunks.size(), 0);
  written_.assign(core_.chunks.size(), 0);
  for (const auto& c : core_.chunks) {
    if (core_.param_of(c).adopts_param_writes()) {
      reference_.resize(std::max(reference_.size(), c.count));
    }
  }
}

bool adam_speculation::announced(std::size_t group, std::size_t param) const {
  if (!any_) {
    return false;
  }
  for (const auto& c : core_.chunks) {
    if (c.group == group && c.param == param) {
      return announced_[c.index] != 0;
    }
  }
  return false;
}

void adam_speculation::grad_ready(std::size_t group, std::size_t param, bool publish) {
  const std::lock_guard lock(mutex_);
  const param_state& p = core_.groups[group].params[param];
  std::size_t slot = 0;
  for (std::size_t g = 0; g < group; ++g) {
    slot += core_.groups[g].params.size();
  }
  slot += param;
  const std::vector<std::size_t>& chunks = chunks_of_[slot];
  if (announced_[chunks.front()] != 0) {
    return;  // announced twice: the first announcement holds
  }
  if (!running_) {
    for (auto& [node, pool] : pools_) {
      queued_[node] = 0;
      pool->start(0, [this, node = node](std::size_t task, std::size_t worker) {
        speculate(queue_[node][task], worker);
      });
    }
    running_ = true;
  }
  any_ = true;
  // As if no clipping applied: the step keeps the update only when its scalars are these.
  scalars_[slot] = core_.scalars_for(core_.groups[group], p, 1.0 / core_.options.loss_scale);
  stream& d2h = core_.dev.d2h_stream();
  core_.dev.compute_stream().record(*core_.compute_done);
  d2h.wait(*core_.compute_done);
  const step_deadline deadline = deadline_after(core_.options.device_timeout_s);
  for (const std::size_t index : chunks) {
    const chunk_ref& c = core_.chunks[index];
    core_.totals.bytes_d2h += core_.copy_grads_down(c, d2h);
    d2h.record(*core_.chunk_events[index]);
    announced_[index] = publish ? 1 : 2;  // 2: its params wait for step()
    deadline_[index] = deadline;
    queue_[c.node][queued_[c.node]++] = index;
    pools_.at(c.node)->extend(1);
  }
}

// On a worker: the chunk's Σ g² once its grads landed and, when finite, its update after a
// copy of its state into the backup.
void adam_speculation::speculate(std::size_t index, std::size_t worker) {
  const chunk_ref& c = core_.chunks[index];
  await(*core_.chunk_events[index], deadline_[index],
        "the grads (the work that makes them, then their copy)");
  const param_state& p = core_.param_of(c);
  const double sum = grad_sum_squares(core_.kernel, core_.host_grads(c), p.desc.dtype, c.count);
  core_.partial[index] = sum;
  if (!update_ || !std::isfinite(sum)) {
    return;  // the last step clipped (this one likely does too), or this one is skipped
  }
  if (p.adopts_param_writes()) {
    core_.adopt_param_writes(c);  // the backup holds what was written to the param
  }
  auto* backup = static_cast<unsigned char*>(backup_[c.slot].data());
  const std::size_t n = p.desc.elements;
  std::memcpy(backup + c.offset * sizeof(float), p.master_p() + c.offset, c.count * sizeof(float));
  for (const state_piece& piece : state_pieces(p.moments_at, n, c.offset, c.count)) {
    std::memcpy(backup + n * sizeof(float) + piece.packed_offset, piece.at, piece.bytes);
  }
  core_.update_on_host(c, scalars_[c.slot]);
  updated_[index] = 1;
  if (core_.options.overlap == adam_overlap::backward_publish && announced_[index] == 1) {
    publish(c, p, 2 * worker + (index % 2));  // each worker's pair of ring slots, in turn
    published_[index] = 1;
  }
}

// The chunk's master weights into its params: stored for a param in host memory, else sent up
// on the H2D stream (converted through a ring slot for 16-bit params).
void adam_speculation::publish(const chunk_ref& c, const param_state& p, std::size_t slot_hint) {
  if (p.desc.param_on_host) {
    void* dst = static_cast<unsigned char*>(p.desc.param) + c.offset * dtype_bytes(p.desc.dtype);
    store_params(core_.kernel, p.master_p() + c.offset, dst, p.desc.dtype, c.count);
  } else {
    upload_(c, slot_hint);
  }
}

bool adam_speculation::published_to_device() const {
  for (const auto& c : core_.chunks) {
    if (published_[c.index] != 0 && !core_.param_of(c).desc.param_on_host) {
      return true;
    }
  }
  return false;
}

void adam_speculation::settle_uploads() noexcept {
  try {
    core_.dev.h2d_stream().synchronize();
  } catch (const std::exception& e) {
    core_.params_stale = true;  // re-sent from the master weights before their next use
    log(log_level::debug,
        std::string("offload_adam: a speculative params upload failed: ") + e.what());
  }
}

bool adam_speculation::param_written(std::size_t index) const noexcept {
  const chunk_ref& c = core_.chunks[index];
  const param_state& p = *param_by_slot_[c.slot];
  const float* reference = left_in_param(index);
  const auto* param =
      static_cast<const unsigned char*>(p.desc.param) + c.offset * dtype_bytes(p.desc.dtype);
  return adopt_param_writes(core_.kernel, reference, nullptr, param, p.desc.dtype, c.count) > 0;
}

void adam_speculation::find_written() {
  std::fill(written_.begin(), written_.end(), 0);
  for (auto& [node, pool] : pools_) {
    std::vector<std::size_t> mine;
    for (const auto& c : core_.chunks) {
      if (c.node == node && updated(c.index) && core_.param_of(c).adopts_param_writes()) {
        mine.push_back(c.index);
      }
    }
    if (!mine.empty()) {
      pool->run(mine.size(), [this, &mine](std::size_t task, std::size_t) {
        written_[mine[task]] = param_written(mine[task]) ? 1 : 0;
      });
    }
  }
}

void adam_speculation::restore(std::size_t index, bool republish) noexcept {
  const chunk_ref& c = core_.chunks[index];
  const param_state& p = *param_by_slot_[c.slot];
  const auto* backup = static_cast<const unsigned char*>(backup_[c.slot].data());
  const std::size_t n = p.desc.elements;
  // A write to the param since the speculation (outside the optimizer) stays: its values are
  // found against what the speculation left there, then adopted into the restored master.
  const bool written = p.adopts_param_writes() && param_written(index);
  if (written) {
    const float* left = left_in_param(index);
    std::copy(left, left + c.count, reference_.begin());
  }
  std::memcpy(p.master_p() + c.offset, backup + c.offset * sizeof(float), c.count * sizeof(float));
  for (const state_piece& piece : state_pieces(p.moments_at, n, c.offset, c.count)) {
    std::memcpy(piece.at, backup + n * sizeof(float) + piece.packed_offset, piece.bytes);
  }
  if (written) {
    const auto* param =
        static_cast<const unsigned char*>(p.desc.param) + c.offset * dtype_bytes(p.desc.dtype);
    core_.adopted[index] += adopt_param_writes(
        core_.kernel, reference_.data(), p.master_p() + c.offset, param, p.desc.dtype, c.count);
  }
  // A param in host memory is always rewritten (a store): the plain step that redoes the
  // update compares it with the master for writes made outside the optimizer.
  if (published_[index] != 0 && (republish || p.desc.param_on_host)) {
    try {
      publish(c, p, index);  // the params as they were: derived from the restored master weights
    } catch (const std::exception& e) {
      core_.params_stale = true;
      log(log_level::debug, std::string("offload_adam: re-sending restored params: ") + e.what());
    }
  }
  published_[index] = 0;
  updated_[index] = 0;
  ++core_.totals.rolled_back_chunks;
}

void adam_speculation::wait() {
  if (!any_) {
    return;
  }
  const std::exception_ptr failure = running_ ? wait_all(pools_) : nullptr;
  running_ = false;
  ++core_.totals.speculative_steps;
  if (failure) {
    roll_back_all();
    end_step();
    std::rethrow_exception(failure);
  }
}

void adam_speculation::settle(const std::vector<adam_scalars>& scalars, bool clipped) {
  update_ = !clipped;
  bool rolled_back = false;
  bool uploads_settled = false;
  find_written();
  for (const auto& c : core_.chunks) {
    if (updated(c.index) &&
        (written_[c.index] != 0 ||
         std::memcmp(&scalars[c.slot], &scalars_[c.slot], sizeof(adam_scalars)) != 0)) {
      if (!uploads_settled && published_to_device()) {
        settle_uploads();  // the copies read the master weights that restore() rewrites
        uploads_settled = true;
      }
      restore(c.index, false);  // the plain step redoes it and writes its params
      rolled_back = true;
    }
  }
  core_.totals.rollbacks += rolled_back ? 1 : 0;
}

void adam_speculation::roll_back_all() noexcept {
  const bool to_device = any_ && published_to_device();
  if (to_device) {
    settle_uploads();  // the copies read the master weights that restore() rewrites
  }
  bool rolled_back = false;
  for (const auto& c : core_.chunks) {
    if (updated(c.index)) {
      restore(c.index, true);
      rolled_back = true;
    }
  }
  if (to_device) {
    settle_uploads();  // the device params are the old ones again when this returns
  }
  core_.totals.rollbacks += rolled_back ? 1 : 0;
}

void adam_speculation::end_step() noexcept {
  if (!any_) {
    return;
  }
  std::fill(announced_.begin(), announced_.end(), 0);
  std::fill(updated_.begin(), updated_.end(), 0);
  std::fill(published_.begin(), published_.end(), 0);
  any_ = false;
}

void adam_speculation::cancel() noexcept {
  if (!any_) {
    return;
  }
  const std::exception_ptr failure = running_ ? wait_all(pools_) : nullptr;
  running_ = false;
  roll_back_all();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      log(log_level::debug,
          std::string("offload_adam: speculation cancelled after a failure: ") + e.what());
    } catch (...) {
      log(log_level::debug, "offload_adam: speculation cancelled after a failure");
    }
    end_step();  // the grads' copies may not have landed, and their memory may be gone
    lost_ = true;
    core_.settle_device();  // as a failed step does: the next one starts on a healthy device
    return;
  }
  // The grads announced stay copied and summed; the step redoes the updates.
  std::fill(updated_.begin(), updated_.end(), 0);
  std::fill(published_.begin(), published_.end(), 0);
}

}  // namespace tierflow::detail
