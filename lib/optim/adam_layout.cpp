// offload_adam's layout (private to lib/optim): where each param's state goes (its master, its
// moments in their dtype, its room in the host grads buffer, each staggered from the arrays a
// step streams with it) and the chunks that split the params. The facade (offload_adam.cpp)
// calls these once, at construction.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "optim/adam_core.hpp"
#include "optim/adam_internal.hpp"
#include "optim/offload_adam_impl.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/where.hpp"

namespace tierflow {

using detail::chunk_ref;
using detail::param_state;

namespace {

// The node holding most of [p, p + bytes), or -1 when unknown (not faulted in, no NUMA).
int node_of(const void* p, std::size_t bytes) {
  try {
    const page_residency r = where(p, bytes);
    int best = -1;
    std::size_t most = 0;
    for (const auto& [node, pages] : r.pages_on_node) {
      if (pages > most) {
        best = node;
        most = pages;
      }
    }
    return best;
  } catch (const std::exception&) {
    return -1;
  }
}

// Bytes beyond an array of @p bytes for its stagger (none for a small one).
std::size_t stagger_slack_for(std::size_t bytes) {
  return bytes >= detail::stagger_min_bytes ? detail::stagger_slack : 0;
}

// Where an array of @p bytes starts in memory at @p base that has its stagger slack after it.
unsigned char* staggered(void* base, std::size_t bytes, std::vector<std::uintptr_t>& apart) {
  const std::size_t offset = stagger_slack_for(bytes) > 0 ? detail::stagger_offset(base, apart) : 0;
  return static_cast<unsigned char*>(base) + offset;
}

// The addresses a step streams beside chunk 0 of @p p's grads: its param and its state.
std::vector<std::uintptr_t> streamed_with(const param_state& p) {
  return {reinterpret_cast<std::uintptr_t>(p.desc.param),
          p.master_split() ? reinterpret_cast<std::uintptr_t>(p.master_low)
                           : reinterpret_cast<std::uintptr_t>(p.master_p()),
          reinterpret_cast<std::uintptr_t>(p.moments_at.m),
          reinterpret_cast<std::uintptr_t>(p.moments_at.v)};
}

// @p p's room in the host grads buffer, bytes (64-aligned; none when it has none).
std::size_t grads_span(const param_state& p) {
  return p.grads_staged ? (p.desc.elements * dtype_bytes(p.desc.dtype) + 63) / 64 * 64 : 0;
}

// Refuses adam_master::remainder for a param it cannot apply to: it needs the master's high half
// to be the param itself, a bf16 param in host memory that the cpu step writes in place (the
// caller's own, or a session's tier copy); an fp32 one there keeps an fp32 master (its own, or
// a separate one for a tier copy).
void check_remainder_applies(const adam_param& desc, bool own_host_plain, bool cpu_mode,
                             const adam_options& options) {
  const bool in_place = own_host_plain || (desc.param_on_host && cpu_mode);
  if (options.master != adam_master::remainder ||
      (in_place && (desc.dtype == param_dtype::bf16 || desc.dtype == param_dtype::f32))) {
    return;
  }
  std::string why;
  if (desc.dtype == param_dtype::f16) {
    why = "it is fp16 (an fp16 value is not the high half of an fp32 one; bf16 is)";
  } else if (!cpu_mode) {
    why = "the step does not run in cpu mode (mode " + std::string(to_string(options.mode)) +
          " and no param in host memory)";
  } else {
    why = "it is not in host memory (the high half of the master must be the param itself)";
  }
  throw error("offload_adam: param '" + desc.name + "': master 'remainder' cannot apply: " + why +
              "; use master 'fp32' (a separate fp32 master)");
}

// The dtype of a param's moments: its group's choice, else the optimizer's; int8 keeps a small
// param in fp32.
adam_state_dtype state_dtype_of(const adam_group& group, const adam_options& options,
                                const adam_param& desc) {
  const adam_state_dtype wanted = group.state_dtype.value_or(options.state_dtype);
  if (wanted == adam_state_dtype::int8 && desc.elements < int8_min_elements) {
    return adam_state_dtype::f32;
  }
  return wanted;
}

// Allocates @p p's moments in @p dtype (zero: m = v = 0 in every dtype), each array staggered.
void place_moments(param_state& p, adam_state_dtype dtype, placement_policy& placement,
                   std::vector<std::uintptr_t>& apart) {
  const std::size_t n = p.desc.elements;
  const std::size_t values = detail::moment_bytes(dtype, n);
  const std::size_t scales = detail::scale_count(dtype, n) * sizeof(float);
  const std::size_t value_span = values + stagger_slack_for(values);
  const std::size_t scale_span = scales + stagger_slack_for(scales);
  // The scales after the values are float-aligned.
  const std::size_t value_room = scales > 0 ? (value_span + 3) / 4 * 4 : value_span;
  p.moments = placement.allocate(data_class::optimizer_state, 2 * value_room + 2 * scale_span);
  std::memset(p.moments.data(), 0, p.moments.size());
  auto* base = static_cast<unsigned char*>(p.moments.data());
  detail::state_arrays& st = p.moments_at;
  st.dtype = dtype;
  st.m = staggered(base, values, apart);
  st.v = staggered(base + value_room, values, apart);
  if (scales > 0) {
    st.m_scale = reinterpret_cast<float*>(staggered(base + 2 * value_room, scales, apart));
    st.v_scale =
        reinterpret_cast<float*>(staggered(base + 2 * value_room + scale_span, scales, apart));
  }
}

}  // namespace

void offload_adam::impl::allocate_state(std::vector<adam_group>& in) {
  // cpu mode for sure: asked for, or automatic with a param in host memory (choose_mode then
  // picks it). Only then is an fp32 param in host memory its own master.
  bool any_on_host = false;
  for (const auto& g : in) {
    for (const auto& d : g.params) {
      any_on_host = any_on_host || d.param_on_host || in_host_memory(d.param);
    }
  }
  // A compressed state's step runs in cpu mode too.
  bool any_compressed = false;
  for (const auto& g : in) {
    for (const auto& d : g.params) {
      any_compressed =
          any_compressed || state_dtype_of(g, core.options, d) != adam_state_dtype::f32;
    }
  }
  const bool cpu_mode =
      core.options.mode == adam_mode::cpu ||
      (core.options.mode == adam_mode::automatic && (any_on_host || any_compressed));
  std::size_t grad_bytes = 0;
  for (std::size_t gi = 0; gi < in.size(); ++gi) {
    detail::group_state g;
    g.hyper = in[gi].hyper;
    for (std::size_t pi = 0; pi < in[gi].params.size(); ++pi) {
      adam_param& desc = in[gi].params[pi];
      if (desc.name.empty()) {
        desc.name = "g" + std::to_string(gi) + ".p" + std::to_string(pi);
      }
      param_state p;
      p.desc = desc;
      p.active = desc.grad != nullptr;  // none yet: left alone until set_grad gives one
      // The caller's own host memory (a CPU tensor) stepped without an overlap: the step reads
      // its grad in place (no room is staged for one) and, for fp32, it is its own master. A
      // tier copy marked param_on_host (a session's weight) keeps a master of its own, where
      // master_params is placed.
      const bool own_host_plain = cpu_mode && core.options.overlap == adam_overlap::none &&
                                  !desc.param_on_host && in_host_memory(desc.param);
      p.master_is_param = own_host_plain && desc.dtype == param_dtype::f32;
      check_remainder_applies(desc, own_host_plain, cpu_mode, core.options);
      const bool split =
          core.options.master == adam_master::remainder && desc.dtype == param_dtype::bf16;
      p.grads_staged = !own_host_plain;
      check_grad(p, desc.grad);
      p.grad_on_host = desc.grad != nullptr && in_host_memory(desc.grad);
      const std::size_t bytes = desc.elements * sizeof(float);
      std::vector<std::uintptr_t> apart{reinterpret_cast<std::uintptr_t>(desc.param)};
      if (desc.grad != nullptr) {
        apart.push_back(reinterpret_cast<std::uintptr_t>(desc.grad));
      }
      if (p.master_is_param) {
        p.master_at = static_cast<float*>(desc.param);
      } else if (split) {  // the param holds the high halves; the low ones beside it
        const std::size_t low = desc.elements * sizeof(std::uint16_t);
        p.master = core.placement.allocate(data_class::master_params, low + stagger_slack_for(low));
        p.master_low = reinterpret_cast<std::uint16_t*>(staggered(p.master.data(), low, apart));
      } else {
        p.master =
            core.placement.allocate(data_class::master_params, bytes + stagger_slack_for(bytes));
        p.master_at = reinterpret_cast<float*>(staggered(p.master.data(), bytes, apart));
      }
      place_moments(p, state_dtype_of(in[gi], core.options, desc), core.placement, apart);
      const std::size_t grad_span = grads_span(p);
      grad_bytes += grad_span + stagger_slack_for(grad_span);
      core.total_elements += desc.elements;
      core.totals.state_bytes += p.master.size() + p.moments.size();
      g.params.push_back(std::move(p));
    }
    core.groups.push_back(std::move(g));
  }
  if (grad_bytes > 0) {  // none when every grad is read in place
    core.grads_host = core.placement.allocate(data_class::grads, grad_bytes);
    core.register_host(core.grads_host.data(), core.grads_host.size());
  }
  auto* grads = static_cast<unsigned char*>(core.grads_host.data());
  std::size_t cursor = 0;
  for (auto& g : core.groups) {
    for (auto& p : g.params) {
      const std::size_t grad_span = grads_span(p);
      std::vector<std::uintptr_t> apart = streamed_with(p);
      if (grad_span > 0) {
        unsigned char* at = staggered(grads + cursor, grad_span, apart);
        p.grad_offset = cursor + static_cast<std::size_t>(at - (grads + cursor));
      }
      cursor += grad_span + stagger_slack_for(grad_span);
      if (!p.master_is_param) {
        core.register_host(p.master.data(), p.master.size());
      }
      core.register_host(p.moments.data(), p.moments.size());
    }
  }
}

void offload_adam::impl::make_chunks() {
  std::size_t slot = 0;
  for (std::size_t gi = 0; gi < core.groups.size(); ++gi) {
    for (std::size_t pi = 0; pi < core.groups[gi].params.size(); ++pi, ++slot) {
      const param_state& p = core.groups[gi].params[pi];
      for (std::size_t off = 0; off < p.desc.elements; off += core.options.chunk_elements) {
        chunk_ref c;
        c.group = gi;
        c.param = pi;
        c.offset = off;
        c.count = std::min(core.options.chunk_elements, p.desc.elements - off);
        c.index = core.chunks.size();
        c.slot = slot;
        c.node = node_of(static_cast<const unsigned char*>(p.moments_at.m) +
                             detail::moment_bytes(p.state_dtype(), off),
                         detail::moment_bytes(p.state_dtype(), c.count));
        core.chunks.push_back(c);
      }
    }
  }
  core.partial.assign(core.chunks.size(), 0.0);
  core.adopted.assign(core.chunks.size(), 0);
  core.grads_in_place.assign(core.chunks.size(), 0);
  core.totals.chunks = core.chunks.size();
  core.totals.params = core.total_elements;
}

}  // namespace tierflow
