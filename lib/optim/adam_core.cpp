#include "optim/adam_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "tierflow/detail/adam_master.hpp"
#include "tierflow/log.hpp"

namespace tierflow::detail {

void read_master(const param_state& p, std::size_t offset, std::size_t n, float* out) noexcept {
  if (p.master_split()) {
    join_master(static_cast<const std::uint16_t*>(p.desc.param) + offset, p.master_low + offset,
                out, n);
  } else {
    std::memcpy(out, p.master_p() + offset, n * sizeof(float));
  }
}

void write_master(const param_state& p, std::size_t offset, std::size_t n,
                  const float* in) noexcept {
  if (p.master_split()) {
    split_master(in, static_cast<std::uint16_t*>(p.desc.param) + offset, p.master_low + offset, n);
  } else {
    std::memcpy(p.master_p() + offset, in, n * sizeof(float));
  }
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

step_deadline deadline_after(double seconds) {
  if (seconds <= 0) {
    return std::nullopt;
  }
  return clock_type::now() +
         std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
}

void await(event& e, const step_deadline& deadline, const char* what) {
  if (!deadline) {
    e.synchronize();
    return;
  }
  auto pause = std::chrono::microseconds(10);
  while (!e.query()) {
    if (clock_type::now() >= *deadline) {
      throw device_timeout(std::string("timed out waiting for ") + what);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  e.synchronize();  // reports a failure
}

void adam_core::shut_down() noexcept {
  scheduler.reset();
  try {
    dev.synchronize();
  } catch (const std::exception& e) {
    log(log_level::warning,
        std::string("offload_adam: device work failed while shutting down: ") + e.what());
  }
  for (const auto& r : registered) {
    r.locker->unlock(r.address, r.bytes);
  }
}

void adam_core::register_host(void* address, std::size_t bytes) {
  page_locker& locker = dev.host_registration();
  locker.lock(address, bytes);
  registered.push_back({&locker, address, bytes});
}

void adam_core::settle_device() noexcept {
  try {
    dev.synchronize();
  } catch (const std::exception& e) {
    log(log_level::debug, std::string("offload_adam: settling the device: ") + e.what());
  }
}

// Between steps every tier copy is current (a step returns once its write-backs landed), so
// the flush only drops what was prefetched for the next step: a failed prefetch costs nothing
// but the refetch, and is not the caller's error.
void adam_core::flush_state() {
  if (!scheduler) {
    return;
  }
  try {
    scheduler->flush();
  } catch (const device_error& e) {
    log(log_level::debug,
        std::string("offload_adam: a prefetch for the next step failed and is dropped: ") +
            e.what());
    settle_device();
  }
}

unsigned char* adam_core::grads_staging(const chunk_ref& c) const {
  const param_state& p = param_of(c);
  return static_cast<unsigned char*>(grads_host.data()) + p.grad_offset +
         c.offset * dtype_bytes(p.desc.dtype);
}

const unsigned char* adam_core::host_grads(const chunk_ref& c) const {
  const param_state& p = param_of(c);
  if (grads_in_place[c.index] != 0) {
    return static_cast<const unsigned char*>(p.desc.grad) + c.offset * dtype_bytes(p.desc.dtype);
  }
  return grads_staging(c);
}

std::size_t adam_core::copy_grads_down(const chunk_ref& c, stream& d2h) {
  const param_state& p = param_of(c);
  const std::size_t eb = dtype_bytes(p.desc.dtype);
  grads_in_place[c.index] = 0;
  dev.copy_async(grads_staging(c), static_cast<const unsigned char*>(p.desc.grad) + c.offset * eb,
                 c.count * eb, copy_kind::d2h, d2h);
  return c.count * eb;
}

bool adam_core::read_grads_in_place(const chunk_ref& c) {
  const bool here = mode == adam_mode::cpu && param_of(c).grad_on_host;
  grads_in_place[c.index] = here ? 1 : 0;
  return here;
}

void adam_core::adopt_param_writes(const chunk_ref& c) {
  const param_state& p = param_of(c);
  float* master = p.master_p() + c.offset;
  const auto* param =
      static_cast<const unsigned char*>(p.desc.param) + c.offset * dtype_bytes(p.desc.dtype);
  adopted[c.index] +=
      detail::adopt_param_writes(kernel, master, master, param, p.desc.dtype, c.count);
}

void adam_core::count_adopted() {
  for (auto& n : adopted) {
    totals.param_writes_adopted += n;
    n = 0;
  }
}

bool adam_core::update_on_host(const chunk_ref& c, const adam_scalars& scalars, bool adopt_writes) {
  param_state& p = param_of(c);
  if (adopt_writes && p.adopts_param_writes()) {
    // Blocks of 4 Ki elements (a multiple of an int8 state block; 16 KiB of master, in L1):
    // compared, updated, then stored into the param, which the compare brought into cache (no
    // later pass reads the master again to write it).
    constexpr std::size_t block = std::size_t{1} << 12;
    const std::size_t eb = dtype_bytes(p.desc.dtype);
    for (std::size_t off = 0; off < c.count; off += block) {
      chunk_ref part = c;
      part.offset = c.offset + off;
      part.count = std::min(block, c.count - off);
      adopt_param_writes(part);
      float* master = p.master_p() + part.offset;
      adam_update_state(kernel, master, p.moments_at, part.offset, host_grads(c) + off * eb,
                        p.desc.dtype, part.count, scalars);
      store_params(kernel, master, static_cast<unsigned char*>(p.desc.param) + part.offset * eb,
                   p.desc.dtype, part.count);
    }
    return true;
  }
  if (p.master_split()) {
    adam_update_split(kernel, static_cast<std::uint16_t*>(p.desc.param) + c.offset,
                      p.master_low + c.offset, p.moments_at, c.offset, host_grads(c), p.desc.dtype,
                      c.count, scalars);
    return true;
  }
  adam_update_state(kernel, p.master_p() + c.offset, p.moments_at, c.offset, host_grads(c),
                    p.desc.dtype, c.count, scalars);
  return p.master_is_param;
}

void adam_core::count_step() {
  for (auto& g : groups) {
    bool any = false;
    for (auto& p : g.params) {
      p.steps += p.active ? 1 : 0;
      any = any || p.active;
    }
    g.steps += any ? 1 : 0;
  }
}

const group_state& adam_core::group_at(std::size_t group) const {
  if (group >= groups.size()) {
    throw error("offload_adam: group " + std::to_string(group) + " out of range (" +
                std::to_string(groups.size()) + " groups)");
  }
  return groups[group];
}

const param_state& adam_core::param_at(std::size_t group, std::size_t param) const {
  const auto& g = group_at(group);
  if (param >= g.params.size()) {
    throw error("offload_adam: param " + std::to_string(param) + " of group " +
                std::to_string(group) + " out of range (" + std::to_string(g.params.size()) +
                " params)");
  }
  return g.params[param];
}

// The first non-finite grad of chunk @p c, or npos. cpu mode scans its host copy of the grads;
// streamed mode reduced them on the device, so it copies the chunk's grads down first (the
// step is skipped anyway: a chunk's copy is cheap next to the lost step).
std::size_t adam_core::first_non_finite(const chunk_ref& c) const {
  const auto& p = param_of(c);
  const std::size_t width = dtype_bytes(p.desc.dtype);
  const unsigned char* grads = nullptr;
  std::vector<unsigned char> fetched;
  if (mode == adam_mode::cpu) {
    grads = host_grads(c);
  } else {
    fetched.resize(c.count * width);
    stream& d2h = dev.d2h_stream();
    dev.copy_async(fetched.data(),
                   static_cast<const unsigned char*>(p.desc.grad) + c.offset * width,
                   fetched.size(), copy_kind::d2h, d2h);
    d2h.synchronize();
    grads = fetched.data();
  }
  for (std::size_t e = 0; e < c.count; ++e) {
    float value = 0;
    load_as_f32(grads + e * width, p.desc.dtype, &value, 1);
    if (!std::isfinite(value)) {
      return c.offset + e;
    }
  }
  return std::string::npos;
}

std::string adam_core::skip_reason() const {
  for (const auto& c : chunks) {
    if (active(c) && !std::isfinite(partial[c.index])) {
      const auto& p = param_of(c);
      std::size_t e = std::string::npos;
      try {
        e = first_non_finite(c);
      } catch (const device_error& failure) {  // the copy down failed: the chunk's range it is
        detail::log(
            log_level::warning,
            std::string("offload_adam: cannot read the non-finite grads back: ") + failure.what());
      }
      if (e != std::string::npos) {
        return "non-finite grad in '" + p.desc.name + "' (first at element " + std::to_string(e) +
               "): step skipped, state unchanged";
      }
      return "non-finite grad in '" + p.desc.name + "' (elements " + std::to_string(c.offset) +
             ".." + std::to_string(c.offset + c.count - 1) + "): step skipped, state unchanged";
    }
  }
  return "non-finite grad norm: step skipped, state unchanged";
}

bool adam_core::judge_grads(adam_step_result& result, std::vector<adam_scalars>& scalars) const {
  double total = 0;
  for (double sum : partial) {
    total += sum;
  }
  result.grad_norm = std::sqrt(total) / options.loss_scale;
  if (!std::isfinite(result.grad_norm)) {
    result.skip_reason = skip_reason();
    return false;
  }
  if (options.max_grad_norm > 0) {
    result.clip_coef = std::min(1.0, options.max_grad_norm / (result.grad_norm + 1e-6));
  }
  const double grad_scale = result.clip_coef / options.loss_scale;
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      scalars.push_back(scalars_for(g, p, grad_scale));
    }
  }
  return true;
}

adam_step_error adam_core::timed_out(const char* in_mode, const device_timeout& e) const {
  return adam_step_error(std::string("offload_adam::step (") + in_mode + " mode): " + e.what() +
                             " for " + number(options.device_timeout_s) +
                             " s (device_timeout_s), so the step was not applied and the state "
                             "is as before; the work stays queued, and the next step() waits "
                             "for it first",
                         adam_step_error::outcome::not_applied);
}

// A failure of the work a step waits for before it changes any state: the state is untouched;
// the copies still queued are let finish (and their failures taken) before reporting.
adam_step_error adam_core::failed_before_update(const char* in_mode, const char* what,
                                                const device_error& e) {
  settle_device();
  return adam_step_error(std::string("offload_adam::step (") + in_mode + " mode): " + what +
                             " failed, so the step was not applied and the state is as before; "
                             "call step() again once the fault is gone: " +
                             e.what(),
                         adam_step_error::outcome::not_applied);
}

}  // namespace tierflow::detail
