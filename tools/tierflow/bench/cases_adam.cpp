// The Adam cases of `tierflow bench`: the Adam-shaped memory bound, tierflow's CPU Adam
// kernel, and the whole cpu-mode step through offload_adam (with and without the norm's pass),
// (and over bf16 params with the master in 16 bits), over state on each node, from the first
// initiator's CPUs (every CPU of it, or each --threads
// count), for each --state-dtype (the moments fp32, bf16 or int8; each with its own bound), the
// cases' samples taken in rotation.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/case_registry.hpp"
#include "tierflow/detail/adam_bound.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_master.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::ordered_json;
using detail::adam_bytes_per_param_for;
using detail::state_block;

// Bytes of one compressed moment's values per element (bf16 2, int8 1; fp32: none here).
std::size_t narrow_width(adam_state_dtype dtype) {
  return dtype == adam_state_dtype::bf16 ? 2 : dtype == adam_state_dtype::int8 ? 1 : 0;
}

// p, g, m and v on the target node, written by the initiator's threads, each staggered in
// its buffer so that no two are equal modulo the aliasing span (tierflow/detail/stagger.hpp:
// consecutive mmaps of 256 MiB land exactly that far apart, and the kernel then runs ~2.5 x
// slower), and the measurements of the selected cases, taken in rotation.
struct adam_measure;

struct adam_state final : site_fixture {
  adam_state(const numa_node& to, std::size_t bytes, bool huge, bool aliased,
             const std::vector<adam_state_dtype>& narrow)
      : n(bytes / sizeof(float) / state_block * state_block), aliased_layout(aliased) {
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
    for (const adam_state_dtype kind : narrow) {  // each compressed dtype's own moments
      detail::state_arrays& a = compressed[kind];
      a.dtype = kind;
      for (void** at : {&a.m, &a.v}) {
        buffers.push_back(std::make_unique<node_buffer>(
            to.id.value, n * narrow_width(kind) + detail::stagger_slack, huge));
        auto* base = buffers.back()->as<unsigned char>();
        *at = base + detail::stagger_offset(base, apart);
      }
      for (float** at : {&a.m_scale, &a.v_scale}) {
        buffers.push_back(
            std::make_unique<node_buffer>(to.id.value, n / state_block * sizeof(float), huge));
        *at = buffers.back()->as<float>();
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
      for (auto& [kind, a] : compressed) {  // zero moments, as a new optimizer's
        const std::size_t width = narrow_width(kind);
        std::fill(static_cast<unsigned char*>(a.m) + width * begin,
                  static_cast<unsigned char*>(a.m) + width * end, 0);
        std::fill(static_cast<unsigned char*>(a.v) + width * begin,
                  static_cast<unsigned char*>(a.v) + width * end, 0);
      }
    });
    for (auto& [kind, a] : compressed) {
      std::fill(a.m_scale, a.m_scale + n / state_block, 0.0f);
      std::fill(a.v_scale, a.v_scale + n / state_block, 0.0f);
    }
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
  // Each compressed dtype's moments (the kernel and bound cases'), with int8's block scales.
  std::map<adam_state_dtype, detail::state_arrays> compressed;
  adam_state_dtype dtype = adam_state_dtype::f32;  // of the measures being made
  adam_kernel kernel = detail::resolve_kernel(adam_kernel::automatic);
  adam_hyper hyper;
  std::size_t probe = n / 3;  // the element verified against the scalar reference
  std::unique_ptr<pinned_team> team;
  std::vector<std::unique_ptr<adam_measure>> measures;  // of the site's thread count now
};

// One case at one site: a sample at a time (the cases take turns), then its testcase.
struct adam_measure {
  adam_measure(const char* case_name, adam_state& state, const bench_site& where)
      : name(case_name), st(state), site(where), dtype(state.dtype) {
    if (dtype != adam_state_dtype::f32) {
      name += "_" + std::string(to_string(dtype));
    }
  }
  virtual ~adam_measure() = default;
  adam_measure(const adam_measure&) = delete;
  adam_measure& operator=(const adam_measure&) = delete;
  // One run over the arrays, seconds; checks the probe element.
  virtual double once() = 0;
  // The bytes a step of this case must move per param (its bound's count).
  [[nodiscard]] virtual double bytes_per_param() const { return adam_bytes_per_param_for(dtype); }
  virtual void describe(json& /*tc*/) const {}

  std::string name;  // the case's, with _bf16 or _int8 for compressed moments
  adam_state& st;
  bench_site site;
  adam_state_dtype dtype;
  std::vector<double> seconds;
  bool verified = true;
};

adam_state::~adam_state() = default;

// Appends the testcase of @p m from its samples' seconds.
void add_adam_case(run_context& ctx, const adam_measure& m) {
  const adam_state& state = m.st;
  const double per_param = m.bytes_per_param();
  std::vector<double> gbps;
  for (const double s : m.seconds) {
    gbps.push_back(per_param * static_cast<double>(state.n) / s / 1e9);
  }
  json tc = testcase(m.name, "adam", "GB/s", gbps);
  tc["mparams_per_s"] = bench::summarize(gbps).median * 1e9 / per_param / 1e6;
  tc["params"] = state.n;
  tc["state_dtype"] = std::string(to_string(m.dtype));
  tc["bytes_per_param"] = per_param;
  tc["bytes"] = static_cast<std::uint64_t>(per_param * static_cast<double>(state.n));
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
    if (dtype != adam_state_dtype::f32) {
      const detail::state_arrays& a = st.compressed.at(dtype);
      const std::size_t width = narrow_width(dtype);
      const bool scaled = dtype == adam_state_dtype::int8;
      const float p0 = st.p[st.probe], g0 = st.g[st.probe];
      const double s = st.team->run([&](unsigned t) {
        auto [begin, end] = part(st.n / state_block, t, site.threads);
        begin *= state_block;
        end = std::min(end * state_block, st.n);
        detail::adam_bound_pass_narrow(
            st.kernel, st.p + begin, static_cast<unsigned char*>(a.m) + begin * width,
            static_cast<unsigned char*>(a.v) + begin * width,
            scaled ? a.m_scale + begin / state_block : nullptr,
            scaled ? a.v_scale + begin / state_block : nullptr, st.g + begin, end - begin, width);
      });
      verified = verified && st.p[st.probe] == p0 - g0;
      return s;
    }
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

// The probe's block of compressed moments copied aside, stepped by the scalar kernel: what the
// measured kernel must give it (every kernel gives the scalar one's bytes).
struct block_reference {
  block_reference(const adam_state& st, const detail::state_arrays& a, std::size_t start)
      : first(start),
        width(narrow_width(a.dtype)),
        p(st.p + first, st.p + first + state_block),
        m(static_cast<const unsigned char*>(a.m) + first * width,
          static_cast<const unsigned char*>(a.m) + (first + state_block) * width),
        v(static_cast<const unsigned char*>(a.v) + first * width,
          static_cast<const unsigned char*>(a.v) + (first + state_block) * width),
        ms(a.m_scale[first / state_block]),
        vs(a.v_scale[first / state_block]),
        arrays{a.dtype, m.data(), v.data(), &ms, &vs} {}
  block_reference(const block_reference&) = delete;
  block_reference& operator=(const block_reference&) = delete;
  void step(const float* g, const detail::adam_scalars& s) {
    detail::adam_update_state(adam_kernel::scalar, p.data(), arrays, 0, g + first, param_dtype::f32,
                              state_block, s);
  }
  [[nodiscard]] bool matches(const adam_state& st, const detail::state_arrays& a) const {
    return std::equal(p.begin(), p.end(), st.p + first) &&
           std::equal(m.begin(), m.end(), static_cast<const unsigned char*>(a.m) + first * width);
  }
  std::size_t first;
  std::size_t width;
  std::vector<float> p;
  std::vector<unsigned char> m, v;
  float ms, vs;
  detail::state_arrays arrays;
};

struct kernel_measure final : adam_measure {
  using adam_measure::adam_measure;
  double once() override {
    const auto scalars = detail::make_adam_scalars(st.hyper, 10, 1.0);
    if (dtype != adam_state_dtype::f32) {
      const detail::state_arrays& arrays = st.compressed.at(dtype);
      block_reference ref(st, arrays, st.probe / state_block * state_block);
      const double s = st.team->run([&](unsigned t) {
        auto [begin, end] = part(st.n / state_block, t, site.threads);
        begin *= state_block;
        end = std::min(end * state_block, st.n);
        detail::adam_update_state(st.kernel, st.p + begin, arrays, begin, st.g + begin,
                                  param_dtype::f32, end - begin, scalars);
      });
      ref.step(st.g, scalars);
      verified = verified && ref.matches(st, arrays);
      return s;
    }
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
// With @p split, the params and grads are bf16 (p and g rounded) and the master is kept in 16
// bits beside the param (adam_master::remainder): a bf16 model's step. With @p bf16 alone, the
// same bf16 params with a separate fp32 master, which each step compares with the param (a
// write outside the optimizer is adopted) before updating it.
struct step_measure final : adam_measure {
  step_measure(const char* case_name, adam_state& state, const bench_site& where,
               const run_context& ctx, bool clip, bool split, bool bf16)
      : adam_measure(case_name, state, where),
        dev(open_device("emulated")),
        placement(ctx.topo, options_for(ctx.topo, where.to)),
        remainder(split),
        bf16_params(split || bf16) {
    adam_param param;
    param.name = "p";
    param.param = st.p;
    param.grad = st.g;
    param.elements = st.n;
    adam_options options;
    if (bf16_params) {
      for (std::uint16_t** a : {&p16, &g16}) {
        halves.push_back(std::make_unique<node_buffer>(
            where.to.id.value, st.n * 2 + detail::stagger_slack, ctx.config.huge_pages));
        auto* base = halves.back()->as<unsigned char>();
        *a = reinterpret_cast<std::uint16_t*>(base + detail::stagger_offset(base, st.apart));
      }
      detail::store_params(st.kernel, st.p, p16, param_dtype::bf16, st.n);
      detail::store_params(st.kernel, st.g, g16, param_dtype::bf16, st.n);
      param.param = p16;
      param.grad = g16;
      param.dtype = param_dtype::bf16;
      options.master = remainder ? adam_master::remainder : adam_master::fp32;
      const std::size_t first = st.probe / state_block * state_block;
      detail::load_as_f32(p16 + first, param_dtype::bf16, probe_master.data(), state_block);
    }
    options.mode = adam_mode::cpu;
    options.threads = where.threads;
    options.state_dtype = dtype;
    options.max_grad_norm = clip ? 1e30 : 0;  // the norm's pass, with a coefficient of 1
    tierflow::adam_group group;
    group.params.push_back(param);
    group.hyper = st.hyper;
    opt = std::make_unique<offload_adam>(*dev, std::vector<tierflow::adam_group>{group}, options,
                                         placement);
  }

  [[nodiscard]] double bytes_per_param() const override {
    if (remainder) {
      return detail::adam_bytes_per_param_remainder(dtype);
    }
    // bf16 params with an fp32 master: g 2 B, the master read and written 8, the param read
    // (the compare) and written 4, where fp32 params move 12 (g 4, p 8).
    return adam_bytes_per_param_for(dtype) + (bf16_params ? 2.0 : 0.0);
  }

  double once() override {
    if (bf16_params) {
      return once_split();
    }
    // The probe's block: p as the other cases left it, the moments as this optimizer's
    // (stepped alongside by the scalar kernel, from zero as the optimizer's started).
    const std::size_t first = st.probe / state_block * state_block;
    std::vector<float> p(st.p + first, st.p + first + state_block);
    const auto scalars = detail::make_adam_scalars(st.hyper, ++steps, 1.0);
    const auto begin = bench::clock_type::now();
    const adam_step_result r = opt->step();
    const double s = std::chrono::duration<double>(bench::clock_type::now() - begin).count();
    detail::adam_update_state(adam_kernel::scalar, p.data(), block.arrays, 0, st.g + first,
                              param_dtype::f32, state_block, scalars);
    verified = verified && r.applied && std::equal(p.begin(), p.end(), st.p + first);
    return s;
  }

  // The probe's block stepped beside by the scalar kernel from its fp32 master (the param's
  // value at the start): the param must be that master rounded after each step (ties away in
  // 16 bits, to nearest even from an fp32 master).
  double once_split() {
    const std::size_t first = st.probe / state_block * state_block;
    const auto scalars = detail::make_adam_scalars(st.hyper, ++steps, 1.0);
    const auto begin = bench::clock_type::now();
    const adam_step_result r = opt->step();
    const double s = std::chrono::duration<double>(bench::clock_type::now() - begin).count();
    detail::adam_update_state(adam_kernel::scalar, probe_master.data(), block.arrays, 0,
                              g16 + first, param_dtype::bf16, state_block, scalars);
    std::vector<std::uint16_t> high(state_block), low(state_block);
    if (remainder) {
      detail::split_master(probe_master.data(), high.data(), low.data(), state_block);
    } else {
      detail::store_params(adam_kernel::scalar, probe_master.data(), high.data(), param_dtype::bf16,
                           state_block);
    }
    verified = verified && r.applied && std::equal(high.begin(), high.end(), p16 + first);
    return s;
  }

  void describe(json& tc) const override {
    const adam_metrics m = opt->metrics();
    tc["api"] = "offload_adam::step, cpu mode, p and g in host memory, " +
                std::string(to_string(dtype)) + " moments" +
                (remainder     ? ", bf16 p and g, the master in 16 bits (remainder)"
                 : bf16_params ? ", bf16 p and g, an fp32 master compared with p each step"
                               : "");
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
  bool remainder = false;
  bool bf16_params = false;                          // remainder, or an fp32 master
  std::vector<std::unique_ptr<node_buffer>> halves;  // bf16 p and g
  std::uint16_t* p16 = nullptr;
  std::uint16_t* g16 = nullptr;
  std::vector<float> probe_master = std::vector<float>(state_block);
  std::unique_ptr<offload_adam> opt;
  std::uint64_t steps = 0;
  // The probe block's moments in the optimizer's dtype, from zero as its own.
  struct zero_block {
    explicit zero_block(adam_state_dtype dtype) : m(2 * state_block * sizeof(float)), v(m.size()) {
      arrays = {dtype, m.data(), v.data(), &ms, &vs};
    }
    zero_block(const zero_block&) = delete;
    zero_block& operator=(const zero_block&) = delete;
    std::vector<unsigned char> m, v;
    float ms = 0, vs = 0;
    detail::state_arrays arrays;
  } block{dtype};
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

template <bool Clip, bool Split = false, bool Bf16 = false>
std::unique_ptr<adam_measure> make_step(const char* name, const run_context& ctx, adam_state& st,
                                        const bench_site& site) {
  return std::make_unique<step_measure>(name, st, site, ctx, Clip, Split, Bf16);
}

void run_adam_site(run_context& ctx, const numa_node& from, const numa_node& to,
                   const std::vector<const registered_case*>& selected) {
  const std::vector<adam_state_dtype>& dtypes = ctx.config.state_dtypes;
  std::vector<adam_state_dtype> narrow;
  std::copy_if(dtypes.begin(), dtypes.end(), std::back_inserter(narrow),
               [](adam_state_dtype d) { return d != adam_state_dtype::f32; });
  // p, g, m, v, a step's own m and v per dtype (at most fp32's), and the compressed moments
  // (+ 1: a remainder step's bf16 p and g)
  const unsigned arrays =
      5 + 2 * static_cast<unsigned>(dtypes.size()) + static_cast<unsigned>(narrow.size());
  if (!fits(to, arrays * ctx.array_bytes)) {
    for (const auto* c : selected) {
      ctx.testcases.push_back(waived(c->info.name,
                                     short_of_memory(to, static_cast<int>(arrays), ctx.array_bytes),
                                     from.id.value, to.id.value));
    }
    return;
  }
  adam_state state(to, ctx.array_bytes, ctx.config.huge_pages, ctx.config.adam_aliased, narrow);
  for (const unsigned threads : adam_threads(ctx.config, from)) {
    state.team = std::make_unique<pinned_team>(from.cpus, threads);
    state.fill(threads);
    state.measures.clear();
    for (const adam_state_dtype dtype : dtypes) {
      state.dtype = dtype;
      for (const auto* c : selected) {
        c->run(ctx, state, {from, to, threads});
      }
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
                     make_step<true>),
           adam_case("adam_step_remainder",
                     "adam_step over bf16 params and grads, the master in 16 bits beside them",
                     make_step<false, true>),
           adam_case("adam_step_bf16",
                     "adam_step over bf16 params and grads with an fp32 master (compared with "
                     "the param each step)",
                     make_step<false, false, true>)},
          run_adam_site};
}

}  // namespace tierflow::cli
