// cpu mode, one step:
//   1. the D2H stream waits for the compute stream (the backward pass), then copies each
//      chunk's grads into a host buffer, recording an event per chunk; grads in host memory
//      (CPU tensors, pinned buffers) are not copied: the workers read them where they are;
//   2. the workers take chunks in order as they land and sum their squares (the norm pass
//      overlaps the copies); partial sums are per chunk, so the total does not depend on
//      which thread took which chunk;
//   3. with the norm known (and finite), the workers update each chunk in place, convert it
//      to the param dtype into a pinned ring slot and enqueue its H2D: the copy of one chunk
//      overlaps the update of the next.
// With overlap = backward, adam_speculation did steps 1 and 2, and step 3's update, for the
// params announced by grad_ready(); run() finishes that work first and keeps or restores each
// chunk's update (adam_speculation.hpp).
// The state changes only once every grad has landed, so a failed grads copy leaves it
// untouched; a failed params upload comes after the state has stepped, so the step counts as
// applied and the params are re-sent before the next use (params_stale).
#include "optim/adam_cpu_step.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
#include <string>
#include <thread>

#include "optim/adam_speculation.hpp"

namespace tierflow::detail {

namespace {

unsigned usable_cpus() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace

void adam_cpu_step::start() {
  start_workers();
  bool narrow = false;
  for (const auto& g : core_.groups) {
    for (const auto& p : g.params) {
      narrow = narrow || p.desc.dtype != param_dtype::f32;
    }
  }
  if (narrow) {
    const std::size_t slots = 2 * threads_;
    ring_mutex_ = std::make_unique<std::mutex[]>(slots);
    for (std::size_t i = 0; i < slots; ++i) {
      ring_.push_back(
          core_.placement.allocate(data_class::staging, core_.options.chunk_elements * 2));
      core_.register_host(ring_.back().data(), ring_.back().size());
      ring_events_.push_back(core_.dev.create_event());
    }
  }
}

void adam_cpu_step::set_speculation(adam_speculation* speculation) {
  speculation_ = speculation;
  if (speculation != nullptr) {
    speculation->set_uploader([this](const chunk_ref& c, std::size_t slot_hint) {
      upload_chunk(core_.dev.h2d_stream(), c, slot_hint);
    });
  }
}

void adam_cpu_step::start_workers() {
  for (const auto& c : core_.chunks) {
    chunks_by_node_[c.node].push_back(c.index);
  }
  threads_ = core_.options.threads != 0 ? core_.options.threads : usable_cpus();
  threads_ = std::max<unsigned>(threads_, static_cast<unsigned>(chunks_by_node_.size()));
  // Workers per node in proportion to its chunks, at least one each.
  unsigned left = threads_;
  std::size_t chunks_left = core_.chunks.size();
  for (auto it = chunks_by_node_.begin(); it != chunks_by_node_.end(); ++it) {
    const std::size_t nodes_after =
        static_cast<std::size_t>(std::distance(it, chunks_by_node_.end())) - 1;
    unsigned n = static_cast<unsigned>(std::max<std::size_t>(
        1, (static_cast<std::size_t>(left) * it->second.size() + chunks_left / 2) / chunks_left));
    n = std::min<unsigned>(n, left - static_cast<unsigned>(nodes_after));
    left -= n;
    chunks_left -= it->second.size();
    pools_[it->first] = std::make_unique<worker_pool>(std::vector<int>(n, it->first));
  }
  core_.totals.threads = threads_;
}

adam_step_result adam_cpu_step::run(adam_step_result result) {
  stream& d2h = core_.dev.d2h_stream();
  stream& h2d = core_.dev.h2d_stream();
  const auto grads_start = clock_type::now();
  const step_deadline deadline = deadline_after(core_.options.device_timeout_s);
  if (speculation_ != nullptr && speculation_->take_lost()) {
    throw adam_step_error(
        "offload_adam::step (cpu mode): copying the grads given by grad_ready() failed before "
        "a call that read the state; the step was not applied and the state is as before: give "
        "the grads again (run the backward pass) and call step()",
        adam_step_error::outcome::not_applied);
  }
  // What grad_ready() started (overlap = backward): its copies, sums and updates, finished
  // first; on a failure it has restored every chunk it updated.
  adam_speculation* const spec =
      speculation_ != nullptr && speculation_->any() ? speculation_ : nullptr;
  if (spec != nullptr) {
    try {
      spec->wait();
    } catch (...) {
      grads_failed(std::current_exception());
    }
  }
  const auto summed = [spec](std::size_t index) { return spec != nullptr && spec->summed(index); };
  const auto drop_speculation = [spec] {
    if (spec != nullptr) {
      spec->roll_back_all();
      spec->end_step();
    }
  };

  // 1. Grads down, chunk by chunk, after the work that made them; grads in host memory are
  //    read where they are.
  core_.dev.compute_stream().record(*core_.compute_done);
  d2h.wait(*core_.compute_done);
  bool any_in_place = false;
  for (const auto& c : core_.chunks) {
    if (!core_.active(c) || summed(c.index)) {
      continue;  // no grad this step (not read, and left alone), or already down
    }
    if (core_.read_grads_in_place(c)) {
      any_in_place = true;
      continue;
    }
    const std::size_t bytes = core_.copy_grads_down(c, d2h);
    d2h.record(*core_.chunk_events[c.index]);
    core_.totals.bytes_d2h += bytes;
  }
  // 2. Σ g² per chunk as each lands (those read in place once the work that makes them is
  //    done).
  try {
    if (any_in_place) {
      try {
        await(*core_.compute_done, deadline, "the work that makes the grads");
      } catch (...) {
        grads_failed(std::current_exception());  // as the step's error, the state untouched
      }
    }
    sum_grads(deadline);
  } catch (...) {
    drop_speculation();
    throw;
  }
  core_.totals.grad_seconds += seconds_since(grads_start);
  std::vector<adam_scalars> scalars;
  if (!core_.judge_grads(result, scalars)) {
    drop_speculation();
    return result;
  }
  if (spec != nullptr) {
    spec->settle(
        scalars,
        result.clip_coef < 1);  // a speculative update with other scalars is restored, and redone
  }

  // 3. Update each chunk in place, then send its params up while the next one updates.
  const auto update_start = clock_type::now();
  update_and_upload(h2d, scalars);
  core_.count_adopted();
  if (spec != nullptr) {
    spec->end_step();
  }
  core_.totals.update_seconds += seconds_since(update_start);
  core_.count_step();
  result.applied = true;
  for (const auto& c : core_.chunks) {
    const auto& desc = core_.param_of(c).desc;
    const bool sent = core_.active(c) && !desc.param_on_host;
    core_.totals.bytes_h2d += sent ? c.count * dtype_bytes(desc.dtype) : 0;
  }
  check_uploads(h2d);
  return result;
}

// A failure of the grads or of the work before them, as the step's error.
void adam_cpu_step::grads_failed(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const device_timeout& e) {
    // The work stays queued (the next step's copies run after it): nothing to settle.
    throw core_.timed_out("cpu", e);
  } catch (const device_error& e) {
    throw core_.failed_before_update("cpu", "copying the grads to the host", e);
  }
}

// The workers of each node's pool sum the squares of its chunks' grads as each lands.
// @throws adam_step_error (not_applied) when the grads or the work before them failed
void adam_cpu_step::sum_grads(const step_deadline& deadline) {
  const auto sum_chunk = [this, &deadline](std::size_t index) {
    const chunk_ref& c = core_.chunks[index];
    if (!core_.active(c)) {
      core_.partial[index] = 0;
      return;
    }
    if (speculation_ != nullptr && speculation_->summed(index)) {
      return;  // summed by the speculation
    }
    if (core_.grads_in_place[index] == 0) {
      await(*core_.chunk_events[index], deadline,
            "the grads (the work that makes them, then their copy)");
    }
    const param_state& p = core_.param_of(c);
    core_.partial[index] =
        grad_sum_squares(core_.kernel, core_.host_grads(c), p.desc.dtype, c.count);
  };
  const bool all_summed =
      speculation_ != nullptr &&
      std::all_of(core_.chunks.begin(), core_.chunks.end(), [this](const chunk_ref& c) {
        return !core_.active(c) || speculation_->summed(c.index);
      });
  if (all_summed) {
    for (const auto& c : core_.chunks) {
      if (!core_.active(c)) {
        core_.partial[c.index] = 0;  // as sum_chunk does
      }
    }
    return;  // every grad announced: the speculation summed them all, no pass to wake up for
  }
  for (auto& [node, pool] : pools_) {
    const auto* mine = &chunks_by_node_[node];
    pool->start(mine->size(),
                [&, mine](std::size_t task, std::size_t) { sum_chunk((*mine)[task]); });
  }
  const std::exception_ptr failure = wait_all(pools_);
  if (failure) {
    grads_failed(failure);
  }
}

void adam_cpu_step::update_and_upload(stream& h2d, const std::vector<adam_scalars>& scalars) {
  const auto update_chunk = [&](std::size_t index, std::size_t slot_hint) {
    const chunk_ref& c = core_.chunks[index];
    if (!core_.active(c)) {
      return;
    }
    bool written = false;
    if (speculation_ == nullptr || !speculation_->updated(index)) {
      // Its param is the master stored as its dtype, but where written outside the optimizer
      // (a speculative update the step did not keep was restored, params included).
      written = core_.update_on_host(c, scalars[c.slot], true);
    }
    if (!written && (speculation_ == nullptr || !speculation_->published(index))) {
      upload_chunk(h2d, c, slot_hint);
    }
  };
  std::vector<std::size_t> turns(threads_, 0);  // each worker's own count
  std::size_t pool_base = 0;
  for (auto& [node, pool] : pools_) {
    const auto* mine = &chunks_by_node_[node];
    const std::size_t base = pool_base;
    pool->start(mine->size(), [&, mine, base](std::size_t task, std::size_t worker) {
      // Each worker of each pool has its own pair of ring slots, used in turn.
      update_chunk((*mine)[task], 2 * (base + worker) + turns[base + worker]++ % 2);
    });
    pool_base += pool->size();
  }
  for (auto& [node, pool] : pools_) {
    pool->wait();  // the kernels do not throw; copy_async throws only for bad arguments
  }
}

// Sends chunk @p c's updated master weights to its params: in place for a param in host
// memory, straight from the master for f32, else converted into a ring slot first.
void adam_cpu_step::upload_chunk(stream& h2d, const chunk_ref& c, std::size_t slot_hint) {
  const param_state& p = core_.param_of(c);
  const std::size_t eb = dtype_bytes(p.desc.dtype);
  void* dst = static_cast<unsigned char*>(p.desc.param) + c.offset * eb;
  if (p.desc.param_on_host) {
    if (!p.update_writes_param()) {  // else the update wrote it
      store_params(core_.kernel, p.master_p() + c.offset, dst, p.desc.dtype, c.count);
    }
    return;
  }
  const float* master = p.master_p() + c.offset;
  if (p.desc.dtype == param_dtype::f32) {
    core_.dev.copy_async(dst, master, c.count * eb, copy_kind::h2d, h2d);
    return;
  }
  const std::size_t slot = slot_hint % ring_.size();
  const std::lock_guard lock(ring_mutex_[slot]);
  try {
    ring_events_[slot]->synchronize();  // its previous chunk has left
  } catch (const device_error&) {
    // An earlier upload failed: the h2d stream skips what follows until the failure is
    // reported after the batch; the state keeps stepping, and the params are re-sent.
  }
  store_params(core_.kernel, master, ring_[slot].data(), p.desc.dtype, c.count);
  core_.dev.copy_async(dst, ring_[slot].data(), c.count * eb, copy_kind::h2d, h2d);
  h2d.record(*ring_events_[slot]);
}

// The state has stepped; a failed upload leaves the device params behind the master
// weights, and they are re-sent before the next use (step(), sync_params(), load()).
void adam_cpu_step::check_uploads(stream& h2d) {
  try {
    h2d.synchronize();
  } catch (const device_error& e) {
    core_.params_stale = true;
    core_.settle_device();
    // Events recorded after the failure carry it until recorded again on a healthy stream.
    for (auto& e2 : ring_events_) {
      h2d.record(*e2);
    }
    core_.settle_device();
    throw adam_step_error(
        "offload_adam::step (cpu mode): the step was applied to the state (step " +
            std::to_string(core_.groups.front().steps) +
            " of group 0), but sending the params to the device failed; the device params lag "
            "the master weights until sync_params() or the next step() re-sends them: " +
            e.what(),
        adam_step_error::outcome::applied);
  }
}

}  // namespace tierflow::detail
