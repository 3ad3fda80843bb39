// The Adam cases of `tierflow bench`: the Adam-shaped memory bound and tierflow's CPU Adam
// kernel over state on each node, from the first initiator's CPUs (every CPU of it, or each
// --threads count).

#include "bench/case_registry.hpp"
#include "tierflow/detail/adam_bound.hpp"
#include "tierflow/detail/adam_kernels.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using detail::adam_bytes_per_param;

// p, g, m and v on the target node, written by the initiator's threads, and the kernel.
struct adam_state final : site_fixture {
  adam_state(const numa_node& to, std::size_t bytes, bool huge)
      : n(bytes / sizeof(float) / 64 * 64),
        bp(to.id.value, n * 4, huge),
        bg(to.id.value, n * 4, huge),
        bm(to.id.value, n * 4, huge),
        bv(to.id.value, n * 4, huge),
        p(bp.as<float>()),
        g(bg.as<float>()),
        m(bm.as<float>()),
        v(bv.as<float>()) {
    hyper.weight_decay = 0.01;
  }

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

  std::size_t n;
  node_buffer bp, bg, bm, bv;
  float* p;
  float* g;
  float* m;
  float* v;
  adam_kernel kernel = detail::resolve_kernel(adam_kernel::automatic);
  adam_hyper hyper;
  std::size_t probe = n / 3;  // the element verified against the scalar reference
  std::unique_ptr<pinned_team> team;
};

// Appends the testcase of @p name from its samples' seconds.
void add_adam_case(run_context& ctx, const adam_state& state, const bench_site& site,
                   const char* name, const std::vector<double>& seconds, bool verified) {
  std::vector<double> gbps;
  for (const double s : seconds) {
    gbps.push_back(adam_bytes_per_param * static_cast<double>(state.n) / s / 1e9);
  }
  json tc = testcase(name, "adam", "GB/s", gbps);
  tc["mparams_per_s"] = bench::summarize(gbps).median * 1e9 / adam_bytes_per_param / 1e6;
  tc["params"] = state.n;
  tc["bytes"] = 28 * state.n;
  tc["threads"] = site.threads;
  tc["initiator"] = site.from.id.value;
  tc["target"] = site.to.id.value;
  tc["kernel"] = std::string(to_string(state.kernel));
  tc["verified"] = verified;
  ctx.testcases.push_back(std::move(tc));
  ctx.step(std::string(name) + " node " + std::to_string(site.to.id.value));
}

void measure_bound(run_context& ctx, adam_state& st, const bench_site& site) {
  const float g0 = st.g[st.probe], m0 = st.m[st.probe];
  int runs = 0;
  const auto seconds = sample(ctx.config.samples, [&] {
    ++runs;
    return st.team->run([&](unsigned t) {
      const auto [begin, end] = part(st.n, t, site.threads);
      detail::adam_bound_pass(st.kernel, st.p + begin, st.m + begin, st.v + begin, st.g + begin,
                              end - begin);
    });
  });
  float expect = m0;
  for (int r = 0; r < runs; ++r) {
    expect += g0;
  }
  add_adam_case(ctx, st, site, "adam_bound", seconds, st.m[st.probe] == expect);
}

void measure_kernel(run_context& ctx, adam_state& st, const bench_site& site) {
  const auto scalars = detail::make_adam_scalars(st.hyper, 10, 1.0);
  bool verified = true;
  float rp = st.p[st.probe], rm = st.m[st.probe], rv = st.v[st.probe];
  const float rg = st.g[st.probe];
  const auto seconds = sample(ctx.config.samples, [&] {
    const double s = st.team->run([&](unsigned t) {
      const auto [begin, end] = part(st.n, t, site.threads);
      detail::adam_update(st.kernel, st.p + begin, st.m + begin, st.v + begin, st.g + begin,
                          param_dtype::f32, end - begin, scalars);
    });
    detail::adam_reference(rp, rm, rv, rg, scalars);
    verified = verified && st.p[st.probe] == rp && st.m[st.probe] == rm && st.v[st.probe] == rv;
    return s;
  });
  add_adam_case(ctx, st, site, "adam_cpu", seconds, verified);
}

// --threads when given, else every CPU of the initiator.
std::vector<unsigned> adam_threads(const bench_config& config, const numa_node& from) {
  return config.threads.empty() ? std::vector<unsigned>{static_cast<unsigned>(from.cpus.size())}
                                : config.threads;
}

registered_case adam_case(const char* name, const char* what,
                          void (*measure)(run_context&, adam_state&, const bench_site&)) {
  return {{name, "adam", what},
          case_need::cpu_node,
          [](const bench_config& config, const numa_node& from) {
            return adam_threads(config, from).size();
          },
          [measure](run_context& ctx, site_fixture& fixture, const bench_site& site) {
            measure(ctx, static_cast<adam_state&>(fixture), site);
          }};
}

void run_adam_site(run_context& ctx, const numa_node& from, const numa_node& to,
                   const std::vector<const registered_case*>& selected) {
  if (!fits(to, 4 * ctx.array_bytes)) {
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name, short_of_memory(to, 4, ctx.array_bytes),
                                     from.id.value, to.id.value));
    }
    return;
  }
  adam_state state(to, ctx.array_bytes, ctx.config.huge_pages);
  for (const unsigned threads : adam_threads(ctx.config, from)) {
    state.team = std::make_unique<pinned_team>(from.cpus, threads);
    state.fill(threads);
    for (const auto* c : selected) {
      c->run(ctx, state, {from, to, threads});
    }
  }
}

}  // namespace

case_group adam_group() {
  return {case_site::first_initiator,
          {adam_case("adam_bound", "Adam-shaped memory bound: 28 B/param, trivial arithmetic",
                     measure_bound),
           adam_case("adam_cpu", "tierflow's CPU Adam step (best SIMD kernel), 28 B/param",
                     measure_kernel)},
          run_adam_site};
}

}  // namespace tierflow::cli
