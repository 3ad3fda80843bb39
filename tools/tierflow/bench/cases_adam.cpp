// The Adam cases of `tierflow bench`: the Adam-shaped memory bound, tierflow's CPU Adam
// kernel, and the whole cpu-mode step through offload_adam (with and without the norm's pass),
// over state on each node, from the first initiator's CPUs (every CPU of it, or each --threads
// count), the cases' samples taken in rotation.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/case_registry.hpp"
#include "tierflow/detail/adam_bound.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using detail::adam_bytes_per_param;

// p, g, m and v on the target node, written by the initiator's threads, each staggered in
// its buffer so that no two are equal modulo the aliasing span (tierflow/detail/stagger.hpp:
// consecutive mmaps of 256 MiB land exactly that far apart, and the kernel then runs ~2.5 x
// slower), and the measurements of the selected cases, taken in rotation.
struct adam_measure;

struct adam_state final : site_fixture {
  adam_state(const numa_node& to, std::size_t bytes, bool huge, bool aliased)
      : n(bytes / sizeof(float) / 64 * 64), aliased_layout(aliased) {
    if (aliased) {
      // One buffer, the four arrays exactly alias_span apart: the layout to avoid, on purpose.
      buffers.push_back(std::make_unique<node_buffer>(to.id.value, 4 * detail::alias_span, huge));
      auto* base = buffers.back()->as<unsigned char>();
      p = reinterpret_cast<float*>(base);
      g = reinterpret_cast<float*>(base + detail::alias_span);
      m = reinterpret_cast<float*>(base + 2 * detail::alias_span);
      v = reinterpret_cast<float*>(base + 3 * detail::alias_span);
    } else {
      for (float** a : {&p, &g, &m, &v}) {
        buffers.push_back(
            std::make_unique<node_buffer>(to.id.value, n * 4 + detail::stagger_slack, huge));
        auto* base = buffers.back()->as<unsigned char>();
        *a = reinterpret_cast<float*>(base + detail::stagger_offset(base, apart));
      }
    }
    hyper.weight_decay = 0.01;
  }
  ~adam_state() override;
  adam_state(const adam_state&) = delete;
  adam_state& operator=(const adam_state&) = delete;

  void fill(unsigned threads) {
    team->run([&](unsigned t) {
      const auto [begin, end] = part(n, t, threads);
      for (std::size_t i = begin; i < end; ++i) {
        p[i] = 0.5f + static_cast<float>(i % 97) * 0.01f;
        g[i] = 0.001f * static_cast<float>(i % 13) - 0.006f;
        m[i] = 0.0001f * static_cast<float>(i % 7);
        v[i] = 1e-6f * static_cast<float>(i % 11 + 1);
      }
    });
  }

  // Each array's address modulo the aliasing span, KiB (the layout the run used).
  [[nodiscard]] json layout() const {
    json out = json::object();
    out["kind"] = aliased_layout ? "aliased" : "staggered";
    const std::pair<const char*, const float*> arrays[] = {{"p", p}, {"g", g}, {"m", m}, {"v", v}};
    for (const auto& [name, a] : arrays) {
      out[name] = reinterpret_cast<std::uintptr_t>(a) % detail::alias_span / 1024;
    }
    return out;
  }

  std::size_t n;
  bool aliased_layout;
  std::vector<std::unique_ptr<node_buffer>> buffers;
  std::vector<std::uintptr_t> apart;
  float* p = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  adam_kernel kernel = detail::resolve_kernel(adam_kernel::automatic);
  adam_hyper hyper;
  std::size_t probe = n / 3;  // the element verified against the scalar reference
  std::unique_ptr<pinned_team> team;
  std::vector<std::unique_ptr<adam_measure>> measures;  // of the site's thread count now
};

// One case at one site: a sample at a time (the cases take turns), then its testcase.
struct adam_measure {
  adam_measure(const char* case_name, adam_state& state, const bench_site& where)
      : name(case_name), st(state), site(where) {}
  virtual ~adam_measure() = default;
  adam_measure(const adam_measure&) = delete;
  adam_measure& operator=(const adam_measure&) = delete;
  // One run over the arrays, seconds; checks the probe element.
  virtual double once() = 0;
  virtual void describe(json& /*tc*/) const {}

  const char* name;
  adam_state& st;
  bench_site site;
  std::vector<double> seconds;
  bool verified = true;
};

adam_state::~adam_state() = default;

// Appends the testcase of @p m from its samples' seconds.
void add_adam_case(run_context& ctx, const adam_measure& m) {
  const adam_state& state = m.st;
  std::vector<double> gbps;
  for (const double s : m.seconds) {
    gbps.push_back(adam_bytes_per_param * static_cast<double>(state.n) / s / 1e9);
  }
  json tc = testcase(m.name, "adam", "GB/s", gbps);
  tc["mparams_per_s"] = bench::summarize(gbps).median * 1e9 / adam_bytes_per_param / 1e6;
  tc["params"] = state.n;
  tc["bytes"] = 28 * state.n;
  tc["threads"] = m.site.threads;
  tc["initiator"] = m.site.from.id.value;
  tc["target"] = m.site.to.id.value;
  tc["kernel"] = std::string(to_string(state.kernel));
  tc["layout"] = state.layout();
  m.describe(tc);
  tc["verified"] = m.verified;
  ctx.testcases.push_back(std::move(tc));
  ctx.step(std::string(m.name) + " node " + std::to_string(m.site.to.id.value));
}

struct bound_measure final : adam_measure {
  using adam_measure::adam_measure;
  double once() override {
    const float g0 = st.g[st.probe], m0 = st.m[st.probe];
    const double s = st.team->run([&](unsigned t) {
      const auto [begin, end] = part(st.n, t, site.threads);
      detail::adam_bound_pass(st.kernel, st.p + begin, st.m + begin, st.v + begin, st.g + begin,
                              end - begin);
    });
    verified = verified && st.m[st.probe] == m0 + g0;
    return s;
  }
};

struct kernel_measure final : adam_measure {
  using adam_measure::adam_measure;
  double once() override {
    const auto scalars = detail::make_adam_scalars(st.hyper, 10, 1.0);
    float rp = st.p[st.probe], rm = st.m[st.probe], rv = st.v[st.probe];
    const double s = st.team->run([&](unsigned t) {
      const auto [begin, end] = part(st.n, t, site.threads);
      detail::adam_update(st.kernel, st.p + begin, st.m + begin, st.v + begin, st.g + begin,
                          param_dtype::f32, end - begin, scalars);
    });
    detail::adam_reference(rp, rm, rv, st.g[st.probe], scalars);
    verified = verified && st.p[st.probe] == rp && st.m[st.probe] == rm && st.v[st.probe] == rv;
    return s;
  }
};

// The whole step as a user calls it: offload_adam in cpu mode over p and g in host memory
// (its own m and v, placed on the target node; p is its own master), through the public API.
struct step_measure final : adam_measure {
  step_measure(const char* case_name, adam_state& state, const bench_site& where,
               const run_context& ctx, bool clip)
      : adam_measure(case_name, state, where),
        dev(open_device("emulated")),
        placement(ctx.topo, options_for(ctx.topo, where.to)) {
    adam_param param;
    param.name = "p";
    param.param = st.p;
    param.grad = st.g;
    param.elements = st.n;
    adam_options options;
    options.mode = adam_mode::cpu;
    options.threads = where.threads;
    options.max_grad_norm = clip ? 1e30 : 0;  // the norm's pass, with a coefficient of 1
    tierflow::adam_group group;
    group.params.push_back(param);
    group.hyper = st.hyper;
    opt = std::make_unique<offload_adam>(*dev, std::vector<tierflow::adam_group>{group}, options,
                                         placement);
  }

  double once() override {
    float rp = st.p[st.probe];
    const auto scalars = detail::make_adam_scalars(st.hyper, ++steps, 1.0);
    const auto begin = bench::clock_type::now();
    const adam_step_result r = opt->step();
    const double s = std::chrono::duration<double>(bench::clock_type::now() - begin).count();
    detail::adam_reference(rp, rm, rv, st.g[st.probe], scalars);
    verified = verified && r.applied && st.p[st.probe] == rp;
    return s;
  }

  void describe(json& tc) const override {
    const adam_metrics m = opt->metrics();
    tc["api"] = "offload_adam::step, cpu mode, p and g in host memory";
    tc["bytes_d2h"] = m.bytes_d2h;
    tc["state_bytes"] = m.state_bytes;
    // Where a step's time goes (means over every step, the warm-up's included): the grads'
    // pass (norm, finiteness) and the update's.
    const double taken = static_cast<double>(m.steps > 0 ? m.steps : 1);
    tc["grads_pass_seconds"] = m.grad_seconds / taken;
    tc["update_pass_seconds"] = m.update_seconds / taken;
  }

  // The state on the target node's tier.
  static placement_options options_for(const topology& topo, const numa_node& to) {
    placement_options o;
    for (const auto& t : topo.tiers()) {
      if (std::find(t.nodes.begin(), t.nodes.end(), to.id) != t.nodes.end()) {
        o.spec = "optimizer_state=" + t.name + ";master_params=" + t.name + ";grads=" + t.name +
                 ";staging=" + t.name;
      }
    }
    return o;
  }

  std::unique_ptr<device> dev;
  placement_policy placement;
  std::unique_ptr<offload_adam> opt;
  std::uint64_t steps = 0;
  float rm = 0, rv = 0;  // its m and v start at zero
};

// --threads when given, else every CPU of the initiator.
std::vector<unsigned> adam_threads(const bench_config& config, const numa_node& from) {
  return config.threads.empty() ? std::vector<unsigned>{static_cast<unsigned>(from.cpus.size())}
                                : config.threads;
}

using make_measure = std::unique_ptr<adam_measure> (*)(const char*, const run_context&, adam_state&,
                                                       const bench_site&);

registered_case adam_case(const char* name, const char* what, make_measure make) {
  return {{name, "adam", what},
          case_need::cpu_node,
          [](const bench_config& config, const numa_node& from) {
            return adam_threads(config, from).size();
          },
          [name, make](run_context& ctx, site_fixture& fixture, const bench_site& site) {
            auto& st = static_cast<adam_state&>(fixture);
            st.measures.push_back(make(name, ctx, st, site));
          }};
}

template <typename M>
std::unique_ptr<adam_measure> make_simple(const char* name, const run_context&, adam_state& st,
                                          const bench_site& site) {
  return std::make_unique<M>(name, st, site);
}

template <bool Clip>
std::unique_ptr<adam_measure> make_step(const char* name, const run_context& ctx, adam_state& st,
                                        const bench_site& site) {
  return std::make_unique<step_measure>(name, st, site, ctx, Clip);
}

void run_adam_site(run_context& ctx, const numa_node& from, const numa_node& to,
                   const std::vector<const registered_case*>& selected) {
  if (!fits(to, 6 * ctx.array_bytes)) {  // p, g, m, v, and a step's own m and v
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name, short_of_memory(to, 6, ctx.array_bytes),
                                     from.id.value, to.id.value));
    }
    return;
  }
  adam_state state(to, ctx.array_bytes, ctx.config.huge_pages, ctx.config.adam_aliased);
  for (const unsigned threads : adam_threads(ctx.config, from)) {
    state.team = std::make_unique<pinned_team>(from.cpus, threads);
    state.fill(threads);
    state.measures.clear();
    for (const auto* c : selected) {
      c->run(ctx, state, {from, to, threads});
    }
    // One warm-up each, then the samples in rotation: a drift of the machine falls on every
    // case alike.
    for (int s = -1; s < ctx.config.samples; ++s) {
      for (auto& m : state.measures) {
        const double seconds = m->once();
        if (s >= 0) {
          m->seconds.push_back(seconds);
        }
      }
    }
    for (const auto& m : state.measures) {
      add_adam_case(ctx, *m);
    }
    state.measures.clear();
  }
}

}  // namespace

case_group adam_group() {
  return {case_site::first_initiator,
          {adam_case("adam_bound", "Adam-shaped memory bound: 28 B/param, trivial arithmetic",
                     make_simple<bound_measure>),
           adam_case("adam_cpu", "tierflow's CPU Adam step (best SIMD kernel), 28 B/param",
                     make_simple<kernel_measure>),
           adam_case("adam_step",
                     "the whole cpu-mode step through offload_adam (params, grads in host memory)",
                     make_step<false>),
           adam_case("adam_step_clip", "adam_step with max_grad_norm (the norm's pass)",
                     make_step<true>)},
          run_adam_site};
}

}  // namespace tierflow::cli
