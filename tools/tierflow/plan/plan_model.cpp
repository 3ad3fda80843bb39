// `tierflow plan`'s sizing model (plan_model.hpp; formulas in docs/cli/plan.md).
#include "plan/plan_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tierflow/error.hpp"

namespace tierflow::cli::plan {

namespace {

// How many of Ψ elements each rank holds of one kind of state.
struct shards {
  double params = 0;     // weights
  double grads = 0;      // gradients, while accumulating
  double optimizer = 0;  // master, m, v
};

bool gathers_layers(const plan_spec& s) {
  return s.shard == sharding::zero3 || s.shard == sharding::fsdp;
}

bool shards_grads(const plan_spec& s) {
  return s.shard != sharding::none && s.shard != sharding::zero1;
}

shards shard_sizes(const plan_spec& s, double ranks) {
  const double psi = s.params;
  shards sh;
  sh.optimizer = s.shard == sharding::none ? psi : psi / ranks;
  sh.grads = shards_grads(s) ? psi / ranks : psi;
  sh.params = gathers_layers(s) ? psi / ranks : psi;
  return sh;
}

// The fp32 master copy exists only when the params are kept in a narrower type; a remainder
// master is its low 16 bits (the bf16 weight beside it is the high 16).
double master_bytes(const plan_spec& s) {
  if (s.master == master_kind::remainder) {
    return 2.0;
  }
  return s.param_bytes < s.state_bytes ? s.state_bytes : 0.0;
}

// One Adam moment (m or v) per param: uncompressed, model.state_dtype; int8 codes carry one
// fp32 scale per block of 256 (include/tierflow/detail/adam_state.hpp's state_block).
double moment_bytes(const plan_spec& s) {
  switch (s.adam_state) {
    case adam_state_dtype::bf16:
      return 2.0;
    case adam_state_dtype::int8:
      return 1.0 + 4.0 / 256.0;
    case adam_state_dtype::f32:
      break;
  }
  return s.state_bytes;
}

double optimizer_state_bytes(const plan_spec& s) {
  return master_bytes(s) + 2.0 * moment_bytes(s);
}

// The update's bytes per param of the optimizer shard: it reads the state and each gradient
// copy (and, with a remainder master, the bf16 weight that is the master's high half) and
// writes the state and the updated weight.
double optimizer_reads(const plan_spec& s, double grad_copies) {
  const double weight = s.master == master_kind::remainder ? s.param_bytes : 0.0;
  return optimizer_state_bytes(s) + s.grad_bytes * grad_copies + weight;
}

double optimizer_writes(const plan_spec& s) {
  return optimizer_state_bytes(s) + s.param_bytes;
}

double micro_batch_sbh(const plan_spec& s) {
  return static_cast<double>(s.seq_len) * static_cast<double>(s.micro_batch) *
         static_cast<double>(s.hidden);
}

// The activation checkpoints of one micro-batch: one 16-bit s·b·h tensor per layer.
double checkpoint_bytes(const plan_spec& s) {
  return s.recompute ? 2.0 * micro_batch_sbh(s) * static_cast<double>(s.layers) : 0.0;
}

// Activations in HBM for one micro-batch in 16-bit types (Korthikanti et al. 2022: 34·s·b·h
// bytes per layer with flash attention); with recompute, the checkpoints (unless offloaded)
// plus one layer's.
double activation_bytes(const plan_spec& s) {
  const double sbh = micro_batch_sbh(s);
  if (!s.recompute) {
    return 34.0 * sbh * static_cast<double>(s.layers);
  }
  return (s.offload_activations ? 0.0 : checkpoint_bytes(s)) + 34.0 * sbh;
}

void size_memory(const plan_spec& s, plan_result& r) {
  const double ranks = static_cast<double>(s.nodes * s.gpus_per_node);
  const shards sh = shard_sizes(s, ranks);
  const double layer = s.params / static_cast<double>(s.layers * s.layer_tiles);
  (s.offload_params ? r.host : r.hbm).weights = sh.params * s.param_bytes;
  rank_bytes& opt = s.offload_optimizer ? r.host : r.hbm;
  opt.master = sh.optimizer * master_bytes(s);
  opt.adam_m = sh.optimizer * moment_bytes(s);
  opt.adam_v = sh.optimizer * moment_bytes(s);
  if (s.offload_optimizer) {
    // The host holds this rank's gradient partition; an unsharded gradient also stays whole in
    // HBM until it is reduced, a sharded one passes through a bucket (staging).
    r.host.grads = sh.optimizer * s.grad_bytes;
    r.hbm.grads = shards_grads(s) ? 0.0 : s.params * s.grad_bytes;
    r.hbm.staging += shards_grads(s) ? layer * s.grad_bytes : 0.0;
  } else {
    r.hbm.grads = sh.grads * s.grad_bytes;
  }
  if (gathers_layers(s) || s.offload_params) {
    r.hbm.staging += 2.0 * layer * s.param_bytes;  // the layer running and the next one
  }
  r.hbm.activations = activation_bytes(s);
  r.host.activations = s.offload_activations ? checkpoint_bytes(s) : 0.0;
  r.hbm_capacity_bytes = s.hbm_bytes;
  r.hbm_fits = r.hbm.total() <= s.hbm_bytes;
}

void spill_host(const plan_spec& s, plan_result& r) {
  double left = r.host.total() * static_cast<double>(s.gpus_per_node);
  r.tiers.clear();
  r.spill.clear();
  for (const auto& t : s.tiers) {
    const double used = std::min(left, t.capacity_bytes);
    left -= used;
    r.tiers.push_back({t.name, t.capacity_bytes, used});
    if (used > 0) {
      r.spill.push_back(t.name);
    }
  }
  r.host_fits = left <= 0;
}

plan_result size_memory_only(const plan_spec& s) {
  plan_result r;
  size_memory(s, r);
  spill_host(s, r);
  return r;
}

struct step_bytes {
  double h2d = 0, d2h = 0;                 // per GPU
  double tier_reads = 0, tier_writes = 0;  // per node
  double network = 0;                      // per node, each direction
};

step_bytes count_step_bytes(const plan_spec& s, double accumulation) {
  const double ranks = static_cast<double>(s.nodes * s.gpus_per_node);
  const shards sh = shard_sizes(s, ranks);
  const bool sharded_grads = shards_grads(s);
  step_bytes b;
  if (s.offload_activations) {  // out in the forward pass, back in the backward pass
    b.d2h += accumulation * checkpoint_bytes(s);
    b.h2d += accumulation * checkpoint_bytes(s);
  }
  if (s.offload_params) {
    b.h2d += 2.0 * accumulation * sh.params * s.param_bytes;  // forward and backward
  }
  double update_reads = 0;
  double update_writes = 0;
  if (s.offload_optimizer) {
    const double grad_copies = sharded_grads ? accumulation : 1.0;
    b.d2h += grad_copies * sh.optimizer * s.grad_bytes;
    if (!s.offload_params) {
      b.h2d += sh.optimizer * s.param_bytes;  // the updated shard
    }
    update_reads = sh.optimizer * optimizer_reads(s, grad_copies);
    update_writes = sh.optimizer * optimizer_writes(s);
  } else if (s.offload_params) {
    b.d2h += sh.params * s.param_bytes;  // updated weights back to their tier
  }
  const double gpus = static_cast<double>(s.gpus_per_node);
  b.tier_reads = gpus * (b.h2d + update_reads);
  b.tier_writes = gpus * (b.d2h + update_writes);
  // Collectives over the whole model; a node moves (nodes-1)/nodes of each one's volume
  // (hierarchical: NVLink inside the node, a ring of nodes between them).
  const double psi = s.params;
  double volume = 0;
  switch (s.shard) {
    case sharding::none:
      volume = 2.0 * psi * s.grad_bytes;  // all-reduce
      break;
    case sharding::zero1:
      volume = psi * s.grad_bytes + psi * s.param_bytes;
      break;
    case sharding::zero2:
      volume = accumulation * psi * s.grad_bytes + psi * s.param_bytes;
      break;
    case sharding::zero3:
    case sharding::fsdp:
      volume = accumulation * (psi * s.grad_bytes + 2.0 * psi * s.param_bytes);
      break;
  }
  const double nodes = static_cast<double>(s.nodes);
  b.network = (nodes - 1.0) / nodes * volume;
  return b;
}

void add_stage(plan_result& r, const char* name, const char* scope, double bytes, double gbps) {
  if (bytes > 0) {
    r.stages.push_back({name, scope, bytes, gbps, bytes / (gbps * 1e9)});
  }
}

// A tier's time: its share of the host state's traffic at its read and write bandwidths.
void add_tier_stages(const plan_spec& s, const step_bytes& b, plan_result& r) {
  double held = 0;
  for (const auto& t : r.tiers) {
    held += t.used_bytes;
  }
  for (std::size_t i = 0; i < r.tiers.size() && held > 0; ++i) {
    const double share = r.tiers[i].used_bytes / held;
    if (share <= 0) {
      continue;
    }
    const double reads = share * b.tier_reads;
    const double writes = share * b.tier_writes;
    const double time =
        reads / (s.tiers[i].read_gbps * 1e9) + writes / (s.tiers[i].write_gbps * 1e9);
    const double bytes = reads + writes;
    r.stages.push_back({"tier:" + r.tiers[i].name, "per node", bytes, bytes / time / 1e9, time});
  }
}

std::string format_gbps(double gbps) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3g GB/s", gbps);
  return text;
}

// The smallest node count (from the spec's up to 10^6) at which @p ok holds, or 0.
template <typename predicate>
std::uint64_t nodes_needed(plan_spec s, predicate ok) {
  std::uint64_t high = s.nodes;
  while (true) {
    s.nodes = high;
    if (ok(size_memory_only(s))) {
      break;
    }
    if (high >= 1000000) {
      return 0;
    }
    high = std::min<std::uint64_t>(high * 2, 1000000);
  }
  std::uint64_t low = std::max<std::uint64_t>(high / 2, 1);
  while (low < high) {
    s.nodes = low + (high - low) / 2;
    if (ok(size_memory_only(s))) {
      high = s.nodes;
    } else {
      low = s.nodes + 1;
    }
  }
  return high;
}

void advise_memory(const plan_spec& s, plan_result& r) {
  if (!r.hbm_fits) {
    std::string text = "HBM: " + format_byte_count(byte_count(r.hbm.total())) + " per GPU of " +
                       format_byte_count(byte_count(s.hbm_bytes)) + ": ";
    if (!s.offload_optimizer) {
      text += "offload the optimizer state (training.offload_optimizer)";
    } else if (!gathers_layers(s)) {
      text += "shard the weights (zero3 or fsdp) or offload them (training.offload_params)";
    } else if (!s.offload_params) {
      text += "offload the weights (training.offload_params)";
    } else {
      text += "a smaller micro_batch (activations " +
              format_byte_count(byte_count(r.hbm.activations)) + ")";
    }
    if (const auto n = nodes_needed(s, [](const plan_result& p) { return p.hbm_fits; }); n > 0) {
      text += ", or " + std::to_string(n) + " nodes";
    }
    r.advice.push_back(text);
  }
  if (!r.host_fits) {
    double capacity = 0;
    for (const auto& t : s.tiers) {
      capacity += t.capacity_bytes;
    }
    const double missing = r.host.total() * static_cast<double>(s.gpus_per_node) - capacity;
    std::string text = "host tiers: add " + format_byte_count(byte_count(missing)) +
                       " of capacity per node (e.g. CXL expanders)";
    if (const auto n = nodes_needed(s, [](const plan_result& p) { return p.host_fits; });
        n > 0 && s.shard != sharding::none) {
      text += ", or " + std::to_string(n) + " nodes";
    }
    r.advice.push_back(text);
  }
}

void advise_bottleneck(const plan_spec& s, plan_result& r) {
  std::vector<stage_bound> sorted = r.stages;
  std::sort(sorted.begin(), sorted.end(),
            [](const stage_bound& a, const stage_bound& b) { return a.time_s > b.time_s; });
  const stage_bound& worst = sorted.front();
  const double next = sorted.size() > 1 ? sorted[1].time_s : 0.0;
  char text[512];
  if (worst.name == "compute") {
    std::snprintf(text, sizeof text,
                  "compute-bound: the memory system keeps up (next: %s at %.3g s); more GPUs or "
                  "faster ones shorten the step",
                  sorted.size() > 1 ? sorted[1].name.c_str() : "none", next);
    r.advice.emplace_back(text);
    return;
  }
  const double factor = worst.time_s / std::max(next, 1e-30);
  const std::string target = sorted[1].name;
  if (worst.name == "h2d" || worst.name == "d2h") {
    std::snprintf(text, sizeof text,
                  "%s-bound: %s per GPU host<->GPU link (now %s) brings it to the %s bound",
                  worst.name.c_str(), format_gbps(s.host_link_gbps * factor).c_str(),
                  format_gbps(s.host_link_gbps).c_str(), target.c_str());
  } else if (worst.name == "network") {
    std::snprintf(text, sizeof text,
                  "network-bound: %s per node (now %s) brings it to the %s bound%s",
                  format_gbps(s.network_gbps * factor).c_str(), format_gbps(s.network_gbps).c_str(),
                  target.c_str(),
                  r.grad_accumulation > 1 && s.shard != sharding::none && s.shard != sharding::zero1
                      ? "; or fewer, larger micro-batches (collectives run per micro-batch)"
                      : "");
  } else {
    std::snprintf(text, sizeof text,
                  "%s-bound: %.3gx its bandwidth, i.e. add %s of tier bandwidth per node (e.g. "
                  "CXL expanders, state interleaved across tiers by bandwidth) to reach the %s "
                  "bound",
                  worst.name.c_str(), factor, format_gbps(worst.rate * (factor - 1.0)).c_str(),
                  target.c_str());
  }
  r.advice.emplace_back(text);
}

// The largest Ψ with a·Ψ + c ≤ capacity, where the bytes of @p at are a·Ψ + c (c: the
// activations, the one kind that does not grow with Ψ; every other kind is linear in Ψ).
double max_params(const rank_bytes& at, double psi, double per, double capacity) {
  const double slope = per * (at.total() - at.activations) / psi;
  if (!(slope > 0)) {
    return std::numeric_limits<double>::infinity();
  }
  return std::max(0.0, (capacity - per * at.activations) / slope);
}

state_capacity size_state(plan_spec s, adam_state_dtype dtype, master_kind master) {
  s.adam_state = dtype;
  s.master = master;
  state_capacity c;
  c.state_dtype = dtype;
  c.master = master;
  c.state_bytes_per_param = optimizer_state_bytes(s);
  c.step_bytes_per_param = optimizer_reads(s, 1.0) + optimizer_writes(s);
  const plan_result r = size_memory_only(s);
  double capacity = 0;
  for (const auto& t : s.tiers) {
    capacity += t.capacity_bytes;
  }
  c.max_params_hbm = max_params(r.hbm, s.params, 1.0, s.hbm_bytes);
  c.max_params_host = max_params(r.host, s.params, static_cast<double>(s.gpus_per_node), capacity);
  return c;
}

void size_states(const plan_spec& s, plan_result& r) {
  const auto held = [&](const state_capacity& c) {
    return s.offload_optimizer ? c.max_params_host : c.max_params_hbm;
  };
  r.state_options.clear();
  if (s.state_bytes == 4) {
    std::vector<master_kind> masters = {master_kind::fp32};
    if (remainder_refusal(s).empty()) {
      masters.push_back(master_kind::remainder);
    }
    for (const auto master : masters) {
      for (const auto dtype :
           {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
        r.state_options.push_back(size_state(s, dtype, master));
      }
    }
  } else {
    r.state_options.push_back(size_state(s, s.adam_state, s.master));
  }
  const double baseline = held(r.state_options.front());
  for (auto& c : r.state_options) {
    c.vs_fp32 = baseline > 0 ? held(c) / baseline : std::numeric_limits<double>::quiet_NaN();
    if (c.state_dtype == s.adam_state && c.master == s.master) {
      r.state = c;
    }
  }
}

}  // namespace

plan_result size_plan(const plan_spec& s) {
  plan_result r = size_memory_only(s);
  r.ranks = s.nodes * s.gpus_per_node;
  const double ranks = static_cast<double>(r.ranks);
  const double micro_step = ranks * static_cast<double>(s.micro_batch * s.seq_len);
  const double tokens = s.tokens_per_step > 0 ? s.tokens_per_step : micro_step;
  const double accumulation = tokens / micro_step;
  if (!(micro_step <= 1e15)) {
    char value[64];
    std::snprintf(value, sizeof value, "%.17g", micro_step);
    throw input_error(s.source,
                      "training.micro_batch: ranks x micro_batch x seq_len is more than 1e15 "
                      "tokens per micro-step",
                      value);
  }
  if (accumulation < 1 || std::floor(accumulation) != accumulation) {
    char value[64];
    std::snprintf(value, sizeof value, "%.17g", tokens);
    char problem[192];
    std::snprintf(problem, sizeof problem,
                  "training.tokens_per_step: must be a positive multiple of ranks x micro_batch x "
                  "seq_len (%.17g)",
                  micro_step);
    throw input_error(s.source, problem, value);
  }
  r.tokens_per_step = tokens;
  r.grad_accumulation = static_cast<std::uint64_t>(accumulation);
  const step_bytes b = count_step_bytes(s, accumulation);
  const double flops = (s.recompute ? 8.0 : 6.0) * s.params * tokens / ranks;
  r.stages.push_back({"compute", "per GPU", 0, s.gpu_tflops, flops / (s.gpu_tflops * 1e12)});
  add_stage(r, "h2d", "per GPU", b.h2d, s.host_link_gbps);
  add_stage(r, "d2h", "per GPU", b.d2h, s.host_link_gbps);
  add_tier_stages(s, b, r);
  add_stage(r, "network", "per node", b.network, s.network_gbps);
  for (const auto& st : r.stages) {
    r.step_serial_s += st.time_s;
    if (st.time_s > r.step_bound_s) {
      r.step_bound_s = st.time_s;
      r.bottleneck = st.name;
    }
  }
  r.tokens_per_s = tokens / r.step_bound_s;
  r.mfu = 6.0 * s.params * tokens / (r.step_bound_s * ranks * s.gpu_tflops * 1e12);
  if (!std::isfinite(r.step_serial_s) || !std::isfinite(r.mfu) || !(r.step_bound_s > 0)) {
    throw input_error(s.source, "the spec's numbers give a step time that is not finite");
  }
  advise_memory(s, r);
  advise_bottleneck(s, r);
  size_states(s, r);
  return r;
}

}  // namespace tierflow::cli::plan
