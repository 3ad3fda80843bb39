// The C ABI: each call catches everything, maps it to a tf_status and keeps the message in a
// thread-local string.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "capi/adam_handle.hpp"
#include "capi/capi_support.hpp"
#include "core/call_gate.hpp"
#include "optim/adam_internal.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/device.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/tierflow.h"
#include "tierflow/topology.hpp"

namespace {

using namespace tierflow::capi;

tierflow::adam_hyper to_hyper(const tf_adam_hyper& h) {
  tierflow::adam_hyper out;
  out.lr = h.lr;
  out.beta1 = h.beta1;
  out.beta2 = h.beta2;
  out.eps = h.eps;
  out.weight_decay = h.weight_decay;
  out.decay =
      h.decoupled != 0 ? tierflow::weight_decay_mode::decoupled : tierflow::weight_decay_mode::l2;
  out.bias_correction = h.bias_correction != 0;
  return out;
}

// A C state_dtype (0 fp32, 1 bf16, 2 int8) as the enum. @throws tierflow::error naming @p what
tierflow::adam_state_dtype state_dtype_of(int value, const std::string& what) {
  constexpr std::array dtypes{tierflow::adam_state_dtype::f32, tierflow::adam_state_dtype::bf16,
                              tierflow::adam_state_dtype::int8};
  if (value < 0 || value > 2) {
    throw tierflow::error(what + " must be 0 (fp32), 1 (bf16) or 2 (int8), not " +
                          std::to_string(value));
  }
  return dtypes[static_cast<std::size_t>(value)];
}

// A group's state_dtype: -1 (the options') or one of state_dtype_of's.
void check_group_state_dtype(const tf_adam_hyper& h, std::size_t group) {
  if (h.state_dtype != -1) {
    (void)state_dtype_of(h.state_dtype,
                         "hypers[" + std::to_string(group) + "].state_dtype (-1: the options')");
  }
}

// Param @p index (in the order given to tf_adam_create): its group and index in the group.
std::pair<std::size_t, std::size_t> param_at(const tf_adam* adam, std::size_t index) {
  if (index >= adam->where.size()) {
    throw tierflow::error("index " + std::to_string(index) + " out of range (" +
                          std::to_string(adam->where.size()) + " params)");
  }
  return adam->where[index];
}

// The result of a tf_adam_step*: *applied says what the state holds also when it throws.
void run_step(tf_adam* adam, int* applied, double* grad_norm) {
  tierflow::adam_step_result r;
  try {
    r = adam->opt->step();
  } catch (const tierflow::adam_step_error& e) {
    if (applied != nullptr) {
      *applied = e.result() == tierflow::adam_step_error::outcome::applied   ? 1
                 : e.result() == tierflow::adam_step_error::outcome::pending ? 2
                                                                             : 0;
    }
    throw;
  }
  if (applied != nullptr) {
    *applied = r.applied ? 1 : 0;
  }
  if (grad_norm != nullptr) {
    *grad_norm = r.grad_norm;
  }
  if (!r.applied) {
    last_error = r.skip_reason;  // not a failure, but the caller may want to say why
  }
}

// tf_adam_where_json's document: per state class, pages per node, and each node's tier.
std::string where_json(const tf_adam& adam) {
  tierflow::metrics::json_writer w;
  w.begin_object();
  std::size_t page_bytes = 0;
  for (const auto cls :
       {tierflow::data_class::master_params, tierflow::data_class::optimizer_state}) {
    const tierflow::page_residency r = adam.opt->state_residency(cls);
    page_bytes = std::max(page_bytes, r.page_bytes);
    w.key(tierflow::to_string(cls)).begin_object();
    w.key("total_pages").value(std::uint64_t{r.total_pages});
    w.key("untouched_pages").value(std::uint64_t{r.untouched_pages});
    w.key("nodes").begin_object();
    for (const auto& [node, pages] : r.pages_on_node) {
      w.key(std::to_string(node)).value(std::uint64_t{pages});
    }
    w.end_object().end_object();
  }
  w.key("page_bytes").value(std::uint64_t{page_bytes});
  w.key("node_tiers").begin_object();
  for (const auto& t : adam.topo->tiers()) {
    for (const auto& n : t.nodes) {
      w.key(std::to_string(n.value)).value(t.name);
    }
  }
  w.end_object().end_object();
  return w.str();
}

tierflow::param_dtype to_dtype(int d, std::size_t index) {
  switch (d) {
    case TF_DTYPE_F32:
      return tierflow::param_dtype::f32;
    case TF_DTYPE_BF16:
      return tierflow::param_dtype::bf16;
    case TF_DTYPE_F16:
      return tierflow::param_dtype::f16;
    default:
      break;
  }
  throw tierflow::error("params[" + std::to_string(index) + "]: unknown dtype " +
                        std::to_string(d));
}

}  // namespace

namespace tierflow::capi {

std::vector<adam_group> adam_groups(const tf_adam_param* params, std::size_t count,
                                    const std::size_t* weights, const tf_adam_hyper* hypers,
                                    std::size_t groups, tf_adam& a) {
  need(params, "params");
  need(hypers, "hypers");
  if (count == 0 || groups == 0) {
    throw tierflow::error("count and groups must be > 0");
  }
  std::vector<adam_group> gs(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    gs[g].hyper = to_hyper(hypers[g]);
    check_group_state_dtype(hypers[g], g);
    if (hypers[g].state_dtype != -1) {
      gs[g].state_dtype = state_dtype_of(hypers[g].state_dtype, "hypers[g].state_dtype");
    }
  }
  a.group_state_dtype.clear();
  for (std::size_t g = 0; g < groups; ++g) {
    a.group_state_dtype.push_back(hypers[g].state_dtype);
  }
  a.elements.resize(groups);
  for (std::size_t i = 0; i < count; ++i) {
    const tf_adam_param& p = params[i];
    const std::string where = "params[" + std::to_string(i) + "]";
    if (p.group >= groups) {
      throw tierflow::error(where + ".group is " + std::to_string(p.group) + ", but there are " +
                            std::to_string(groups) + " groups");
    }
    adam_param ap;
    ap.name = p.name != nullptr ? p.name : "param" + std::to_string(i);
    ap.grad = p.grad;
    ap.dtype = to_dtype(enum_value(p.dtype), i);
    ap.elements = p.elements;
    if (weights != nullptr && weights[i] != TF_NO_WEIGHT) {
      ap.weight = weights[i];  // the session fills param and param_on_host
    } else {
      ap.param = p.param;
      ap.param_on_host = p.param_on_host != 0;
    }
    a.where.emplace_back(p.group, gs[p.group].params.size());
    a.elements[p.group].push_back(p.elements);
    gs[p.group].params.push_back(std::move(ap));
  }
  return gs;
}

adam_options adam_options_of(const tf_adam_options* options) {
  adam_options o;
  if (options == nullptr) {
    return o;
  }
  switch (enum_value(options->mode)) {
    case TF_ADAM_CPU:
      o.mode = adam_mode::cpu;
      break;
    case TF_ADAM_STREAMED:
      o.mode = adam_mode::streamed;
      break;
    case TF_ADAM_AUTO:
      o.mode = adam_mode::automatic;
      break;
    default:
      throw tierflow::error("options->mode is not a tf_adam_mode");
  }
  if (options->chunk_elements != 0) {
    o.chunk_elements = options->chunk_elements;
  }
  o.threads = options->threads;
  o.max_grad_norm = options->max_grad_norm;
  o.loss_scale = options->loss_scale;
  o.device_timeout_s = options->device_timeout_s;
  if (options->overlap < 0 || options->overlap > 2) {
    throw tierflow::error(
        "options->overlap must be 0 (none), 1 (backward) or 2 (backward_publish), not " +
        std::to_string(options->overlap));
  }
  constexpr std::array overlaps{adam_overlap::none, adam_overlap::backward,
                                adam_overlap::backward_publish};
  o.overlap = overlaps[static_cast<std::size_t>(options->overlap)];
  o.state_dtype = state_dtype_of(options->state_dtype, "options->state_dtype");
  if (options->master != 0 && options->master != 1) {
    throw tierflow::error("options->master must be 0 (fp32) or 1 (remainder), not " +
                          std::to_string(options->master));
  }
  o.master = options->master == 0 ? tierflow::adam_master::fp32 : tierflow::adam_master::remainder;
  return o;
}

}  // namespace tierflow::capi

extern "C" {

const char* tf_last_error(void) {
  return tierflow::capi::last_error.c_str();
}

const char* tf_version(void) {
  return TIERFLOW_VERSION_STRING;
}

void tf_adam_hyper_default(tf_adam_hyper* hyper) {
  if (hyper == nullptr) {
    return;
  }
  const tierflow::adam_hyper d;
  hyper->lr = d.lr;
  hyper->beta1 = d.beta1;
  hyper->beta2 = d.beta2;
  hyper->eps = d.eps;
  hyper->weight_decay = 0.01;  // torch.optim.AdamW's default
  hyper->decoupled = 1;
  hyper->bias_correction = 1;
  hyper->state_dtype = -1;
}

void tf_adam_options_default(tf_adam_options* options) {
  if (options == nullptr) {
    return;
  }
  options->mode = TF_ADAM_AUTO;
  options->chunk_elements = 0;
  options->threads = 0;
  options->max_grad_norm = 0;
  options->loss_scale = 1;
  options->device_timeout_s = 0;
  options->placement = nullptr;
  options->overlap = 0;
  options->state_dtype = 0;
  options->master = 0;
}

tf_status tf_adam_check(const tf_adam_hyper* hyper, size_t group, const tf_adam_options* options) {
  return guarded("tf_adam_check", [&] {
    if (hyper != nullptr) {
      tierflow::detail::check_hyper(to_hyper(*hyper), "group " + std::to_string(group));
      check_group_state_dtype(*hyper, group);
    }
    if (options != nullptr) {
      tierflow::adam_options o = tierflow::capi::adam_options_of(options);
      tierflow::detail::check_options(o, {});
    }
  });
}

tf_status tf_topology_json(const char* sysfs_root, char* buffer, size_t capacity, size_t* needed) {
  std::string json;
  const tf_status s = guarded("tf_topology_json", [&] {
    tierflow::discovery_options o;
    if (sysfs_root != nullptr) {
      o.sysfs_root = sysfs_root;
      o.use_hwloc = false;
      o.use_cuda = false;
    }
    json = tierflow::to_json(tierflow::topology::discover(o));
  });
  return s != TF_OK ? s : json_out("tf_topology_json", json, buffer, capacity, needed);
}

tf_status tf_adam_create(tf_device* device, const tf_adam_param* params, size_t count,
                         const tf_adam_hyper* hypers, size_t groups, const tf_adam_options* options,
                         tf_adam** out) {
  return guarded("tf_adam_create", [&] {
    need(out, "out");
    *out = nullptr;
    need(device, "device");
    auto a = std::make_unique<tf_adam>();
    std::vector<tierflow::adam_group> gs =
        tierflow::capi::adam_groups(params, count, nullptr, hypers, groups, *a);
    const tierflow::adam_options o = tierflow::capi::adam_options_of(options);
    tierflow::placement_options po;
    if (options != nullptr && options->placement != nullptr) {
      po.spec = std::string(options->placement);
    }
    a->own_topo = std::make_unique<tierflow::topology>(tierflow::topology::discover());
    a->own_placement = std::make_unique<tierflow::placement_policy>(*a->own_topo, std::move(po));
    a->topo = a->own_topo.get();
    a->dev = device->dev;
    a->owned =
        std::make_unique<tierflow::offload_adam>(*device->dev, std::move(gs), o, *a->own_placement);
    a->opt = a->owned.get();
    *out = a.release();
  });
}

void tf_adam_destroy(tf_adam* adam) {
  delete adam;
}

tf_status tf_adam_step(tf_adam* adam, int* applied, double* grad_norm) {
  return guarded("tf_adam_step", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_step");
    run_step(adam, applied, grad_norm);
  });
}

tf_status tf_adam_sync_params(tf_adam* adam, int* current) {
  return guarded("tf_adam_sync_params", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_sync_params");
    try {
      adam->opt->sync_params();
    } catch (const tierflow::device_error&) {
      if (current != nullptr) {
        *current = 0;
      }
      throw;
    }
    if (current != nullptr) {
      *current = adam->opt->params_current() ? 1 : 0;
    }
  });
}

tf_status tf_adam_set_lr(tf_adam* adam, double lr) {
  return guarded("tf_adam_set_lr", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_set_lr");
    adam->opt->set_lr(lr);
  });
}

tf_status tf_adam_set_hyper(tf_adam* adam, size_t group, const tf_adam_hyper* hyper) {
  return guarded("tf_adam_set_hyper", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_set_hyper");
    need(hyper, "hyper");
    if (group < adam->group_state_dtype.size() && hyper->state_dtype != -1 &&
        hyper->state_dtype != adam->group_state_dtype[group]) {
      throw tierflow::error("hyper->state_dtype is " + std::to_string(hyper->state_dtype) +
                            ", group " + std::to_string(group) + " was made with " +
                            std::to_string(adam->group_state_dtype[group]) +
                            ": a group's state_dtype is fixed at creation (-1: keep it)");
    }
    adam->opt->set_hyper(group, to_hyper(*hyper));
  });
}

tf_status tf_adam_step_count(const tf_adam* adam, size_t group, unsigned long long* out) {
  return guarded("tf_adam_step_count", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_step_count");
    need(out, "out");
    *out = adam->opt->step_count(group);
  });
}

tf_status tf_adam_mode_in_force(const tf_adam* adam, tf_adam_mode* out) {
  return guarded("tf_adam_mode_in_force", [&] {
    need(adam, "adam");
    need(out, "out");
    *out = adam->opt->mode() == tierflow::adam_mode::cpu ? TF_ADAM_CPU : TF_ADAM_STREAMED;
  });
}

tf_status tf_adam_metrics_json(const tf_adam* adam, char* buffer, size_t capacity, size_t* needed) {
  std::string json;
  const tf_status s = guarded("tf_adam_metrics_json", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_metrics_json");
    json = adam->opt->metrics().to_json();
  });
  return s != TF_OK ? s : json_out("tf_adam_metrics_json", json, buffer, capacity, needed);
}

tf_status tf_adam_save(const tf_adam* adam, const char* path) {
  return guarded("tf_adam_save", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_save");
    need(path, "path");
    adam->opt->save(path);
  });
}

tf_status tf_adam_load(tf_adam* adam, const char* path) {
  return guarded("tf_adam_load", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_load");
    need(path, "path");
    adam->opt->load(path);
  });
}

tf_status tf_adam_master_weights(const tf_adam* adam, size_t index, float* out, size_t elements) {
  return guarded("tf_adam_master_weights", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_master_weights");
    need(out, "out");
    const auto [g, i] = param_at(adam, index);
    const auto w = adam->opt->master_weights(g, i);
    if (elements != w.size()) {
      throw tierflow::error("param " + std::to_string(index) + " has " + std::to_string(w.size()) +
                            " elements, " + std::to_string(elements) + " asked for");
    }
    std::memcpy(out, w.data(), w.size() * sizeof(float));
  });
}

tf_status tf_adam_param_count(const tf_adam* adam, size_t* out) {
  return guarded("tf_adam_param_count", [&] {
    need(adam, "adam");
    need(out, "out");
    *out = adam->where.size();
  });
}

tf_status tf_adam_param_elements(const tf_adam* adam, size_t index, size_t* out) {
  return guarded("tf_adam_param_elements", [&] {
    need(adam, "adam");
    need(out, "out");
    const auto [g, i] = param_at(adam, index);
    *out = adam->elements[g][i];
  });
}

tf_status tf_adam_step_on(tf_adam* adam, const void* const* grads, size_t count, void* stream,
                          int* applied, double* grad_norm) {
  return guarded("tf_adam_step_on", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_step_on");
    if (grads != nullptr) {
      if (count != adam->where.size()) {
        throw tierflow::error("count is " + std::to_string(count) + ", but the optimizer has " +
                              std::to_string(adam->where.size()) + " params");
      }
      // All checked before any is set: a refused grad leaves every grad as it was.
      std::vector<tierflow::offload_adam::grad_binding> bindings(count);
      for (std::size_t k = 0; k < count; ++k) {
        bindings[k] = {adam->where[k].first, adam->where[k].second, grads[k]};
      }
      adam->opt->set_grads(bindings);
    }
    tierflow::device& dev = *adam->dev;
    dev.stream_after_native(dev.compute_stream(), stream);
    run_step(adam, applied, grad_norm);
    // The params were written on the compute stream (streamed mode) or the h2d stream.
    dev.native_after_stream(stream, dev.compute_stream());
    dev.native_after_stream(stream, dev.h2d_stream());
  });
}

tf_status tf_adam_grad_ready(tf_adam* adam, size_t index, const void* grad, void* stream) {
  return guarded("tf_adam_grad_ready", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::shared hold(adam->gate, "tf_adam_grad_ready");
    const auto [g, i] = param_at(adam, index);
    adam->dev->stream_after_native(adam->dev->compute_stream(), stream);
    if (grad != nullptr) {
      adam->opt->grad_ready(g, i, grad);
    } else {
      adam->opt->grad_ready(g, i);
    }
  });
}

tf_status tf_adam_discard_grads(tf_adam* adam) {
  return guarded("tf_adam_discard_grads", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_discard_grads");
    adam->opt->discard_grads();
  });
}

tf_status tf_adam_grad_copy_stream(const tf_adam* adam, void** stream, int* copies) {
  return guarded("tf_adam_grad_copy_stream", [&] {
    need(adam, "adam");
    need(stream, "stream");
    need(copies, "copies");
    *stream = adam->dev->d2h_stream().native_handle();
    *copies = adam->opt->copies_announced_grads() ? 1 : 0;
  });
}

tf_status tf_adam_get_state(const tf_adam* adam, size_t index, float* master, float* exp_avg,
                            float* exp_avg_sq, size_t elements, unsigned long long* step) {
  return guarded("tf_adam_get_state", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_get_state");
    const auto [g, i] = param_at(adam, index);
    if (elements != adam->elements[g][i] && (master || exp_avg || exp_avg_sq)) {
      throw tierflow::error("param " + std::to_string(index) + " has " +
                            std::to_string(adam->elements[g][i]) + " elements, " +
                            std::to_string(elements) + " asked for");
    }
    const auto copy = [](const std::vector<float>& values, float* out) {
      std::memcpy(out, values.data(), values.size() * sizeof(float));
    };
    if (master != nullptr) {
      copy(adam->opt->master_weights(g, i), master);
    }
    if (exp_avg != nullptr) {
      copy(adam->opt->exp_avg(g, i), exp_avg);
    }
    if (exp_avg_sq != nullptr) {
      copy(adam->opt->exp_avg_sq(g, i), exp_avg_sq);
    }
    if (step != nullptr) {
      *step = adam->opt->step_count(g, i);
    }
  });
}

tf_status tf_adam_set_state(tf_adam* adam, size_t index, const float* master, const float* exp_avg,
                            const float* exp_avg_sq, size_t elements, unsigned long long step) {
  return guarded("tf_adam_set_state", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_set_state");
    const auto [g, i] = param_at(adam, index);
    // The step counter is 64 bits and each step adds 1: at 2^64 - 1 the next step wraps it to
    // t = 0, whose bias correction 1 - beta^0 is 0 (lr / 0: NaN weights, the step still
    // "applied"). Any t >= 1 is fine for that math (beta^t only tends to 0), so the bound is
    // headroom, not precision: up to 2^63 - 1 leaves 2^63 steps before a wrap (more than any
    // run takes) and keeps the count within a signed 64-bit integer, as callers often hold it.
    constexpr unsigned long long max_step = std::numeric_limits<std::int64_t>::max();
    if (step > max_step) {
      throw tierflow::error(
          "step " + std::to_string(step) + " is too large (at most " + std::to_string(max_step) +
          ", so that later steps cannot wrap the 64-bit step counter to 0); nothing changed");
    }
    adam->opt->set_state(g, i, master, exp_avg, exp_avg_sq, elements, step);
  });
}

tf_status tf_adam_refresh_master(tf_adam* adam, size_t index) {
  return guarded("tf_adam_refresh_master", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_refresh_master");
    const auto [g, i] = param_at(adam, index);
    adam->opt->refresh_master(g, i);
  });
}

tf_status tf_adam_where_json(const tf_adam* adam, char* buffer, size_t capacity, size_t* needed) {
  std::string json;
  const tf_status s = guarded("tf_adam_where_json", [&] {
    need(adam, "adam");
    const tierflow::detail::call_gate::exclusive hold(adam->gate, "tf_adam_where_json");
    json = where_json(*adam);
  });
  return s != TF_OK ? s : json_out("tf_adam_where_json", json, buffer, capacity, needed);
}

}  // extern "C"
