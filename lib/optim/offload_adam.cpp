// offload_adam: state in tiers, the step in the tier (cpu) or streamed through HBM (streamed).
//
// This file is the facade: the public class, the construction of the state
// (groups, chunks, the mode) and the common step entry, save/load and the accessors. The parts:
//   adam_core         the state, chunks, events and totals every part shares, and their waits
//   adam_validate     the checks of hypers, options and param ranges (one function each)
//   adam_mode_choice  which mode, for adam_mode::automatic
//   adam_cpu_step     cpu mode: grads D2H, norm and update on workers near the state, params H2D
//   adam_streamed_step  streamed mode: norm pass on the device, the state streamed through HBM
//   adam_undo_ring    streamed mode's pre-step snapshots in HBM
//   adam_speculation  overlap backward: grad_ready()'s speculative update, kept or restored
//   adam_recovery     re-sending stale params; streamed mode's roll-back, roll-forward and
//                     pending step
//   adam_names        the enums' names and parsers, adam_step_error
// All or nothing: docs/reliability.md.
#include "tierflow/offload_adam.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/call_gate.hpp"
#include "optim/adam_checkpoint.hpp"
#include "optim/adam_core.hpp"
#include "optim/adam_cpu_step.hpp"
#include "optim/adam_internal.hpp"
#include "optim/adam_mode_choice.hpp"
#include "optim/adam_recovery.hpp"
#include "optim/adam_speculation.hpp"
#include "optim/adam_streamed_step.hpp"
#include "optim/offload_adam_impl.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/log.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/where.hpp"

namespace tierflow {

using detail::chunk_ref;
using detail::clock_type;
using detail::param_state;
using detail::seconds_since;

void offload_adam::impl::validate(const std::vector<adam_group>& in) {
  const adam_options& options = core.options;
  TIERFLOW_EXPECTS(!in.empty(), "offload_adam needs at least one parameter group");
  std::set<std::string> names;
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    const std::string where = "group " + std::to_string(gi);
    detail::check_hyper(in[gi].hyper, where);
    if (in[gi].params.empty()) {
      throw error("offload_adam: " + where + " has no parameters");
    }
    for (std::size_t pi = 0; pi < in[gi].params.size(); ++pi) {
      const adam_param& p = in[gi].params[pi];
      const std::string what =
          where + " param " + std::to_string(pi) + (p.name.empty() ? "" : " '" + p.name + "'");
      if (p.param == nullptr && p.weight) {
        throw error("offload_adam: " + what + ": it names session weight " +
                    std::to_string(*p.weight) +
                    ", but the optimizer was made without a session (session::make_optimizer "
                    "resolves it)");
      }
      if (p.param == nullptr) {
        throw error("offload_adam: " + what + ": param pointer is null");
      }
      if (p.elements == 0) {
        throw error("offload_adam: " + what + ": zero elements");
      }
      // The state takes 12 bytes per element (master, m, v); a count whose byte sizes wrap
      // would allocate a few bytes and then copy far past them.
      if (p.elements > std::numeric_limits<std::size_t>::max() / (3 * sizeof(float))) {
        throw error("offload_adam: " + what + ": " + std::to_string(p.elements) +
                    " elements is too many (the state would not fit in memory)");
      }
      if (p.dtype != param_dtype::f32 && p.dtype != param_dtype::bf16 &&
          p.dtype != param_dtype::f16) {
        throw error("offload_adam: " + what + ": unknown dtype");
      }
      if (p.param_on_host && options.mode == adam_mode::streamed) {
        throw error("offload_adam: " + what +
                    ": a param in host memory (a session weight's tier copy, or "
                    "param_on_host) needs cpu mode: mode='streamed' updates params on the "
                    "device");
      }
      if (!names.insert(p.name).second) {
        throw error("offload_adam: " + what + ": the name is used twice");
      }
    }
  }
  detail::check_no_overlap(in);
  detail::check_options(core.options, in);
}

void offload_adam::impl::check_grad(const detail::param_state& p, const void* grad) const {
  if (grad != nullptr && !p.grads_staged && !in_host_memory(grad)) {
    throw error("offload_adam: '" + p.desc.name +
                "' is in host memory, so its grad must be host memory too (a CPU tensor's grad "
                "is), read in place; this one is the device's (mark the param param_on_host to "
                "have its grads copied down)");
  }
}

bool offload_adam::impl::in_host_memory(const void* address) const {
  return !core.dev.is_device_memory(address);
}

void offload_adam::impl::read_params(const detail::param_state& p) {
  stream& d2h = core.dev.d2h_stream();
  core.dev.compute_stream().record(*core.compute_done);
  d2h.wait(*core.compute_done);
  auto* host = static_cast<unsigned char*>(core.grads_host.data()) + p.grad_offset;
  // With an overlap the grads' staging holds the grads announced this step (the step reads
  // them there, never their memory again): the param's values go through memory of their own.
  std::vector<unsigned char> own;
  if (speculation && !p.desc.param_on_host) {
    own.resize(p.desc.elements * dtype_bytes(p.desc.dtype));
    host = own.data();
  }
  if (!p.desc.param_on_host) {
    try {
      core.dev.copy_async(host, p.desc.param, p.desc.elements * dtype_bytes(p.desc.dtype),
                          copy_kind::d2h, d2h);
      d2h.synchronize();
    } catch (const device_error&) {
      core.settle_device();
      throw;
    }
  }
  if (p.master_split()) {  // the param's value, exactly: no remainder
    std::memset(p.master_low, 0, p.desc.elements * sizeof(std::uint16_t));
  } else if (!p.master_is_param) {
    // The values that differ from the master stored as the param's dtype (an unchanged one
    // keeps the master's precision, as a step's own check does).
    const void* values = p.desc.param_on_host ? p.desc.param : host;
    detail::adopt_param_writes(core.kernel, p.master_p(), p.master_p(), values, p.desc.dtype,
                               p.desc.elements);
  }
}

void offload_adam::impl::read_initial_params() {
  stream& d2h = core.dev.d2h_stream();
  core.compute_done = core.dev.create_event();
  core.dev.compute_stream().record(*core.compute_done);
  d2h.wait(*core.compute_done);
  auto* host = static_cast<unsigned char*>(core.grads_host.data());
  for (auto& g : core.groups) {
    for (auto& p : g.params) {
      if (!p.desc.param_on_host) {
        core.dev.copy_async(host + p.grad_offset, p.desc.param,
                            p.desc.elements * dtype_bytes(p.desc.dtype), copy_kind::d2h, d2h);
      }
    }
  }
  d2h.synchronize();
  for (auto& g : core.groups) {
    for (auto& p : g.params) {
      if (p.master_split()) {
        std::memset(p.master_low, 0, p.desc.elements * sizeof(std::uint16_t));
      } else if (!p.master_is_param) {
        detail::load_as_f32(p.desc.param_on_host ? p.desc.param : host + p.grad_offset,
                            p.desc.dtype, p.master_p(), p.desc.elements);
      }
    }
  }
}

offload_adam::offload_adam(device& dev, std::vector<adam_group> groups, adam_options options,
                           placement_policy& placement)
    : impl_(std::make_unique<impl>(dev, std::move(options), placement)) {
  impl& s = *impl_;
  detail::adam_core& core = s.core;
  s.validate(groups);
  core.kernel = detail::resolve_kernel(core.options.kernel);
  s.allocate_state(groups);
  s.make_chunks();
  detail::choose_mode(core);
  if (core.mode == adam_mode::cpu) {
    // A param in host memory (a CPU tensor) is updated where it is, as a tier copy is.
    for (auto& g : core.groups) {
      for (auto& p : g.params) {
        p.desc.param_on_host = p.desc.param_on_host || s.in_host_memory(p.desc.param);
      }
    }
  }
  for (std::size_t i = 0; i < core.chunks.size(); ++i) {
    core.chunk_events.push_back(dev.create_event());
  }
  s.read_initial_params();
  if (core.mode == adam_mode::cpu) {
    s.cpu = std::make_unique<detail::adam_cpu_step>(core);
    s.cpu->start();
    if (core.options.overlap != adam_overlap::none) {
      s.speculation = std::make_unique<detail::adam_speculation>(core, s.cpu->pools());
      s.speculation->allocate();
      s.cpu->set_speculation(s.speculation.get());
    }
  } else {
    core.totals.threads = 0;
    s.streamed = std::make_unique<detail::adam_streamed_step>(core);
    s.streamed->build();
  }
  core.totals.mode = core.mode;
  core.totals.overlap = core.options.overlap;
  core.totals.mode_reason = core.mode_reason;
  core.totals.kernel = core.kernel;
  detail::log(log_level::info, "offload_adam: " + std::to_string(core.total_elements) +
                                   " params in " + std::to_string(core.chunks.size()) +
                                   " chunks, mode " + std::string(to_string(core.mode)) + " (" +
                                   core.mode_reason + "), kernel " +
                                   std::string(to_string(core.kernel)));
}

offload_adam::~offload_adam() = default;

void offload_adam::set_write_guard(param_write_guard* guard) noexcept {
  impl_->guard = guard;
}

adam_step_result offload_adam::step() {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::step");
  impl_->guard_writes();
  impl& s = *impl_;
  detail::adam_core& core = s.core;
  const auto start = clock_type::now();
  adam_step_result result;
  try {
    if (s.pending()) {
      result = s.streamed->recovery().complete_pending();
    } else {
      detail::resend_stale_params(core, "step");
      result = core.mode == adam_mode::cpu ? s.cpu->run(std::move(result))
                                           : s.streamed->run(std::move(result));
    }
  } catch (const adam_step_error& e) {
    s.cancel_speculation();  // a failure before the cpu step ran: restore what grad_ready() did
    core.totals.steps += e.applied() ? 1 : 0;
    core.totals.step_seconds_total += seconds_since(start);
    detail::log(log_level::warning, e.what());
    throw;
  }
  result.seconds = seconds_since(start);
  if (result.applied) {
    ++core.totals.steps;
  } else {
    ++core.totals.skipped_steps;
    detail::log(log_level::warning, "offload_adam: " + result.skip_reason);
  }
  core.totals.step_seconds_total += result.seconds;
  core.totals.last_step_seconds = result.seconds;
  return result;
}

const adam_hyper& offload_adam::hyper(std::size_t group) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::hyper");
  return impl_->core.group_at(group).hyper;
}

void offload_adam::set_hyper(std::size_t group, const adam_hyper& hyper) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::set_hyper");
  impl_->core.group_at(group);
  detail::check_hyper(hyper, "group " + std::to_string(group));
  impl_->core.groups[group].hyper = hyper;
}

void offload_adam::set_lr(double lr) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::set_lr");
  for (std::size_t g = 0; g < impl_->core.groups.size(); ++g) {
    adam_hyper h = impl_->core.groups[g].hyper;
    h.lr = lr;
    detail::check_hyper(h, "group " + std::to_string(g));
  }
  for (auto& g : impl_->core.groups) {
    g.hyper.lr = lr;
  }
}

void offload_adam::sync_params() {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::sync_params");
  impl_->guard_writes();
  detail::resend_stale_params(impl_->core, "sync_params");
}

bool offload_adam::params_current() const noexcept {
  return !impl_->core.params_stale;
}

std::uint64_t offload_adam::step_count(std::size_t group) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::step_count");
  return impl_->core.group_at(group).steps;
}

std::uint64_t offload_adam::step_count(std::size_t group, std::size_t param) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::step_count");
  return impl_->core.param_at(group, param).steps;
}

std::size_t offload_adam::param_count(std::size_t group) const {
  return impl_->core.group_at(group).params.size();
}

void offload_adam::impl::refuse_while_pending(const char* call) const {
  if (pending()) {
    throw error(std::string("offload_adam::") + call +
                ": a failed step is pending (half done); step() completes it first");
  }
}

void offload_adam::impl::check_set_grad(std::size_t group, std::size_t param,
                                        const void* grad) const {
  const detail::param_state& p = core.param_at(group, param);
  refuse_while_pending("set_grad");
  if (speculation && speculation->announced(group, param) && grad != p.desc.grad) {
    throw error("offload_adam::set_grad: '" + p.desc.name +
                "' was announced by grad_ready() for this step; its grad cannot change now");
  }
  check_grad(p, grad);
}

void offload_adam::impl::set_grad(std::size_t group, std::size_t param, const void* grad) {
  check_set_grad(group, param, grad);
  detail::param_state& p = core.groups[group].params[param];
  p.active = grad != nullptr;
  if (grad != nullptr && grad != p.desc.grad) {
    p.desc.grad = grad;
    p.grad_on_host = in_host_memory(grad);
  }
}

void offload_adam::impl::grad_ready(std::size_t group, std::size_t param) {
  const detail::param_state& p = core.param_at(group, param);
  refuse_while_pending("grad_ready");
  if (!p.active) {
    throw error("offload_adam::grad_ready: '" + p.desc.name +
                "' has no grad this step (set_grad(nullptr)); give one with set_grad() first");
  }
  if (speculation) {
    const bool publish = guard == nullptr || !p.desc.param_on_host ||
                         core.options.overlap != adam_overlap::backward_publish ||
                         guard->may_write_now(p.desc.param);
    speculation->grad_ready(group, param, publish);
  }
}

void offload_adam::set_grad(std::size_t group, std::size_t param, const void* grad) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::set_grad");
  impl_->set_grad(group, param, grad);
}

void offload_adam::set_grads(const std::vector<grad_binding>& grads) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::set_grads");
  for (const auto& b : grads) {
    impl_->check_set_grad(b.group, b.param, b.grad);
  }
  for (const auto& b : grads) {
    impl_->set_grad(b.group, b.param, b.grad);
  }
}

void offload_adam::grad_ready(std::size_t group, std::size_t param) {
  const detail::call_gate::shared hold(impl_->gate, "offload_adam::grad_ready");
  impl_->grad_ready(group, param);
}

void offload_adam::grad_ready(std::size_t group, std::size_t param, const void* grad) {
  TIERFLOW_EXPECTS(grad != nullptr, "offload_adam::grad_ready: the grad pointer is null");
  const detail::call_gate::shared hold(impl_->gate, "offload_adam::grad_ready");
  impl_->set_grad(group, param, grad);
  impl_->grad_ready(group, param);
}

void offload_adam::discard_grads() {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::discard_grads");
  impl_->guard_writes();
  if (impl_->speculation) {
    impl_->speculation->discard();
  }
}

bool offload_adam::copies_announced_grads() const noexcept {
  return impl_->speculation != nullptr;
}

void offload_adam::set_state(std::size_t group, std::size_t param, const float* master,
                             const float* exp_avg, const float* exp_avg_sq, std::size_t elements,
                             std::uint64_t steps) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::set_state");
  impl_->guard_writes();
  const detail::param_state& p = impl_->core.param_at(group, param);
  impl_->refuse_while_pending("set_state");
  const std::string what = "offload_adam::set_state: '" + p.desc.name + "'";
  if (elements != p.desc.elements) {
    throw error(what + " has " + std::to_string(p.desc.elements) + " elements, " +
                std::to_string(elements) + " given");
  }
  const auto check = [&](const float* values, const char* name, bool non_negative) {
    for (std::size_t i = 0; values != nullptr && i < elements; ++i) {
      if (!std::isfinite(values[i]) || (non_negative && values[i] < 0)) {
        throw error(what + ": " + name + "[" + std::to_string(i) + "] is " +
                    detail::number(values[i]) +
                    (non_negative ? " (must be finite and >= 0)" : " (must be finite)"));
      }
    }
  };
  check(master, "master", false);
  check(exp_avg, "exp_avg", false);
  check(exp_avg_sq, "exp_avg_sq", true);
  impl_->cancel_speculation();
  impl_->core.flush_state();
  if (master != nullptr) {
    detail::write_master(p, 0, elements, master);
    if (!p.master_split()) {  // a split master is the param already
      impl_->core.params_stale = true;
    }
  }
  // Each moment given is encoded on its own (int8 scales m and v apart): the other one stays
  // as stored, bit for bit.
  detail::encode_moments(impl_->core.kernel, p.moments_at, 0, elements, exp_avg, exp_avg_sq);
  impl_->core.groups[group].params[param].steps = steps;
  auto& g = impl_->core.groups[group];
  g.steps = std::max(g.steps, steps);
}

void offload_adam::refresh_master(std::size_t group, std::size_t param) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::refresh_master");
  impl_->guard_writes();
  const detail::param_state& p = impl_->core.param_at(group, param);
  impl_->refuse_while_pending("refresh_master");
  impl_->cancel_speculation();
  impl_->core.flush_state();
  impl_->read_params(p);
}

std::size_t offload_adam::group_count() const noexcept {
  return impl_->core.groups.size();
}

adam_mode offload_adam::mode() const noexcept {
  return impl_->core.mode;
}

const std::string& offload_adam::mode_reason() const noexcept {
  return impl_->core.mode_reason;
}

adam_kernel offload_adam::kernel() const noexcept {
  return impl_->core.kernel;
}

void offload_adam::save(const std::filesystem::path& path) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::save");
  impl_->guard_writes();
  if (impl_->pending()) {
    throw error("offload_adam::save: " + path.string() +
                ": a failed step is pending (half done); step() completes it first");
  }
  impl_->cancel_speculation();
  impl_->core.flush_state();
  detail::save_checkpoint(path, impl_->core.groups, impl_->core.options.chunk_elements);
}

void offload_adam::load(const std::filesystem::path& path) {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::load");
  impl_->guard_writes();
  impl_->cancel_speculation();
  impl_->core.flush_state();
  detail::load_checkpoint(path, impl_->core.groups);
  if (impl_->streamed) {
    impl_->streamed->recovery().drop_pending();
  }
  if (std::string failure; !detail::try_upload_params(impl_->core, failure)) {
    throw adam_step_error("offload_adam::load: " + path.string() +
                              ": the state was loaded, but sending the params failed, so they "
                              "lag the master weights until sync_params() or the next step() "
                              "re-sends them: " +
                              failure,
                          adam_step_error::outcome::applied);
  }
}

adam_metrics offload_adam::metrics() const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::metrics");
  adam_metrics m = impl_->core.totals;
  if (impl_->core.scheduler) {
    const scheduler_metrics sm = impl_->core.scheduler->metrics();
    m.bytes_h2d = sm.bytes_in;
    m.bytes_d2h = sm.bytes_out;
    m.hbm_staging_peak_bytes = sm.hbm_staging_peak_bytes;
  }
  return m;
}

page_residency offload_adam::state_residency(data_class cls) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::state_residency");
  if (cls != data_class::master_params && cls != data_class::optimizer_state) {
    throw error(
        "offload_adam::state_residency: the state is master_params and "
        "optimizer_state, not " +
        std::string(to_string(cls)));
  }
  page_residency total;
  for (const auto& g : impl_->core.groups) {
    for (const auto& p : g.params) {
      const tier_allocation& a = cls == data_class::master_params ? p.master : p.moments;
      const page_residency r = cls == data_class::master_params && p.master_is_param
                                   ? where(p.master_p(), p.master_bytes())
                                   : where(a.data(), a.size());
      total.page_bytes = r.page_bytes;
      total.total_pages += r.total_pages;
      total.untouched_pages += r.untouched_pages;
      for (const auto& [node, pages] : r.pages_on_node) {
        total.pages_on_node[node] += pages;
      }
    }
  }
  return total;
}

namespace {

// Param @p p's moment m (@p second: v) as fp32, decoded from its dtype.
std::vector<float> moment_of(const detail::param_state& p, bool second) {
  std::vector<float> m(p.desc.elements);
  std::vector<float> v(p.desc.elements);
  detail::decode_moments(p.moments_at, 0, p.desc.elements, m.data(), v.data());
  return second ? v : m;
}

}  // namespace

std::vector<float> offload_adam::master_weights(std::size_t group, std::size_t param) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::master_weights");
  impl_->guard_writes();
  const auto& p = impl_->core.param_at(group, param);
  impl_->cancel_speculation();
  impl_->core.flush_state();
  std::vector<float> out(p.desc.elements);
  detail::read_master(p, 0, p.desc.elements, out.data());
  return out;
}

std::vector<float> offload_adam::exp_avg(std::size_t group, std::size_t param) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::exp_avg");
  impl_->guard_writes();
  const auto& p = impl_->core.param_at(group, param);
  impl_->cancel_speculation();
  impl_->core.flush_state();
  return moment_of(p, false);
}

std::vector<float> offload_adam::exp_avg_sq(std::size_t group, std::size_t param) const {
  const detail::call_gate::exclusive hold(impl_->gate, "offload_adam::exp_avg_sq");
  impl_->guard_writes();
  const auto& p = impl_->core.param_at(group, param);
  impl_->cancel_speculation();
  impl_->core.flush_state();
  return moment_of(p, true);
}

std::string adam_metrics::to_json() const {
  metrics::json_writer w;
  w.begin_object().key("schema_version").value(1).key("adam").begin_object();
  w.key("mode").value(to_string(mode)).key("mode_reason").value(mode_reason);
  w.key("kernel").value(to_string(kernel)).key("threads").value(std::uint64_t{threads});
  w.key("params").value(params).key("chunks").value(chunks);
  w.key("steps").value(steps).key("skipped_steps").value(skipped_steps);
  w.key("step_seconds_total").value(step_seconds_total);
  w.key("last_step_seconds").value(last_step_seconds);
  w.key("grad_seconds").value(grad_seconds).key("update_seconds").value(update_seconds);
  w.key("bytes_d2h").value(bytes_d2h).key("bytes_h2d").value(bytes_h2d);
  w.key("state_bytes").value(state_bytes);
  w.key("hbm_staging_peak_bytes").value(hbm_staging_peak_bytes);
  w.key("hbm_undo_bytes").value(hbm_undo_bytes);
  w.key("overlap").value(to_string(overlap)).key("rollback_bytes").value(rollback_bytes);
  w.key("speculative_steps").value(speculative_steps).key("rollbacks").value(rollbacks);
  w.key("rolled_back_chunks").value(rolled_back_chunks);
  w.key("param_writes_adopted").value(param_writes_adopted);
  w.end_object().end_object();
  return w.str();
}

}  // namespace tierflow
