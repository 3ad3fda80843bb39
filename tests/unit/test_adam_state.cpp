// Compressed Adam moments (issue 37): the int8 codes against a brute-force nearest-code search,
// the per-block error over extreme ranges, every kernel's compressed step bit for bit against
// the test's own statement of the rule, and offload_adam with bf16 and int8 state (cpu mode,
// the overlap, set_state, the refusals).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "adam_host_fixture.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_state.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"

using namespace tierflow;
using namespace tierflow::test::host_fixture;
using detail::state_block;

namespace {

// The code (0 .. top) whose value is nearest @p y, ties to the even code: a search over all.
template <typename Decode>
unsigned nearest_code(float y, unsigned top, Decode decode) {
  unsigned best = 0;
  double best_gap = std::fabs(static_cast<double>(decode(0)) - y);
  for (unsigned c = 1; c <= top; ++c) {
    const double gap = std::fabs(static_cast<double>(decode(c)) - y);
    if (gap < best_gap || (gap == best_gap && c % 2 == 0)) {
      best = c;
      best_gap = gap;
    }
  }
  return best;
}

float decode_m(unsigned c) {
  return detail::decode_m8(static_cast<std::uint8_t>(c));
}
float decode_v(unsigned c) {
  return detail::decode_v8(static_cast<std::uint8_t>(c));
}

// The test's statement of a param's int8 moments and of the step over them
// (tierflow/detail/adam_state.hpp): per block, decode, the fp32 update of every element, the
// block's largest |m| and sqrt(v), and the nearest codes of the values times top / largest.
struct int8_reference {
  std::vector<std::uint8_t> mc, vc;
  std::vector<float> ms, vs;

  explicit int8_reference(std::size_t n)
      : mc(n), vc(n), ms((n + state_block - 1) / state_block), vs(ms.size()) {}

  void step(std::vector<float>& master, const std::vector<float>& g,
            const detail::adam_scalars& s) {
    const std::size_t n = master.size();
    for (std::size_t b = 0; b * state_block < n; ++b) {
      const std::size_t first = b * state_block;
      const std::size_t last = std::min(n, first + state_block);
      std::vector<float> m(last - first), root(last - first);
      float m_max = 0, v_max = 0;
      for (std::size_t i = first; i < last; ++i) {
        float mi = detail::decode_m8(mc[i]) * ms[b];
        const float si = detail::decode_v8(vc[i]) * vs[b];
        float vi = si * si;
        detail::adam_reference(master[i], mi, vi, g[i], s);
        m[i - first] = mi;
        root[i - first] = std::sqrt(vi);
        m_max = std::max(m_max, std::fabs(mi));
        v_max = std::max(v_max, root[i - first]);
      }
      ms[b] = m_max > 0 ? m_max / 1.875f : 0.0f;
      vs[b] = v_max > 0 ? v_max / 1.9375f : 0.0f;
      const float m_inv = m_max > 0 ? 1.875f / m_max : 0.0f;
      const float v_inv = v_max > 0 ? 1.9375f / v_max : 0.0f;
      for (std::size_t i = first; i < last; ++i) {
        mc[i] = detail::encode_m8(m[i - first] * m_inv);
        vc[i] = detail::encode_v8(root[i - first] * v_inv);
      }
    }
  }

  [[nodiscard]] detail::state_arrays arrays() {
    return {adam_state_dtype::int8, mc.data(), vc.data(), ms.data(), vs.data()};
  }
};

// Grads of every scale: most near 1e-2, a few blocks tiny or huge, an outlier per block.
std::vector<float> wild_grads(std::size_t n, std::mt19937_64& gen) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> g(n);
  for (std::size_t b = 0; b * state_block < n; ++b) {
    const int k = kind(gen);
    const float scale = k == 0 ? 1e-12f : k == 1 ? 1e6f : 1e-2f;
    for (std::size_t i = b * state_block; i < std::min(n, (b + 1) * state_block); ++i) {
      g[i] = d(gen) * scale;
    }
    if (k == 2) {
      g[b * state_block] = 1e3f;  // one outlier
    }
  }
  return g;
}

}  // namespace

TEST_CASE("int8 codes: every code round-trips and encoding picks the nearest code",
          "[adam][state]") {
  auto gen = tierflow::test::rng(3701);
  for (unsigned c = 0; c < 256; ++c) {
    if (c != 0x80) {  // -0: encodes as +0
      CHECK(detail::encode_m8(decode_m(c)) == c);
    }
    CHECK(detail::encode_v8(decode_v(c)) == c);
  }
  for (unsigned c = 0; c + 1 < 128; ++c) {
    CHECK(decode_m(c) < decode_m(c + 1));
  }
  for (unsigned c = 0; c + 1 < 256; ++c) {
    CHECK(decode_v(c) < decode_v(c + 1));
  }
  CHECK(decode_m(0x7f) == 1.875f);
  CHECK(decode_v(0xff) == 1.9375f);
  // Midpoints between neighbours go to the even code.
  for (unsigned c = 0; c + 1 < 128; ++c) {
    const float mid = (decode_m(c) + decode_m(c + 1)) / 2;
    CHECK(detail::encode_m8(mid) == (c % 2 == 0 ? c : c + 1));
    CHECK(detail::encode_m8(-mid) == ((c % 2 == 0 ? c : c + 1) | (mid > 0 ? 0x80u : 0u)));
  }
  for (unsigned c = 1; c + 1 < 256; ++c) {
    const float mid = (decode_v(c) + decode_v(c + 1)) / 2;
    CHECK(detail::encode_v8(mid) == (c % 2 == 0 ? c : c + 1));
  }
  // Random values of every magnitude: the nearest code, by search.
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::uniform_int_distribution<int> exponent(-24, 0);
  for (int i = 0; i < 20000; ++i) {
    const float y = std::ldexp(1.0f + unit(gen), exponent(gen)) * 0.9f;
    INFO("y = " << y);
    CHECK(detail::encode_m8(y) == nearest_code(std::min(y, 1.875f), 127, decode_m));
    const unsigned v_code = nearest_code(std::min(y, 1.9375f), 255, decode_v);
    CHECK(detail::encode_v8(y) == std::max(v_code, 1u));  // a positive v is never 0
  }
  CHECK(detail::encode_v8(0.0f) == 0);
  CHECK(detail::encode_m8(1e-30f) == 0);
  CHECK(detail::encode_v8(1e-30f) == 1);
}

TEST_CASE("int8 and bf16 moments: the per-block error over extreme ranges is bounded",
          "[adam][state]") {
  auto gen = tierflow::test::rng(3702);
  std::normal_distribution<float> d(0.f, 1.f);
  const std::size_t n = 64 * state_block + 77;
  struct field {
    const char* name;
    std::vector<float> m, v;
  };
  std::vector<field> fields;
  const auto make = [&](const char* name, auto draw) {
    field f{name, std::vector<float>(n), std::vector<float>(n)};
    for (std::size_t i = 0; i < n; ++i) {
      f.m[i] = draw(i);
      f.v[i] = f.m[i] * f.m[i] * (1.0f + std::fabs(d(gen)));
    }
    fields.push_back(std::move(f));
  };
  make("tiny", [&](std::size_t) { return d(gen) * 1e-18f; });
  make("huge", [&](std::size_t) { return d(gen) * 1e15f; });
  make("mixed",
       [&](std::size_t) { return d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20); });
  make("zeros", [&](std::size_t i) { return i % 3 == 0 ? 0.0f : d(gen); });
  make("outlier", [&](std::size_t i) { return i % state_block == 5 ? 1e4f : d(gen) * 1e-3f; });
  for (adam_state_dtype dtype : {adam_state_dtype::bf16, adam_state_dtype::int8}) {
    for (const field& f : fields) {
      std::vector<unsigned char> m_raw(detail::moment_bytes(dtype, n));
      std::vector<unsigned char> v_raw(detail::moment_bytes(dtype, n));
      std::vector<float> ms(detail::scale_count(dtype, n)), vs(ms.size());
      const detail::state_arrays st{dtype, m_raw.data(), v_raw.data(), ms.data(), vs.data()};
      detail::encode_moments(adam_kernel::scalar, st, 0, n, f.m.data(), f.v.data());
      std::vector<float> m(n), v(n);
      detail::decode_moments(st, 0, n, m.data(), v.data());
      double worst_m = 0, worst_v = 0;
      for (std::size_t b = 0; b * state_block < n; ++b) {
        float m_max = 0, s_max = 0;
        const std::size_t last = std::min(n, (b + 1) * state_block);
        for (std::size_t i = b * state_block; i < last; ++i) {
          m_max = std::max(m_max, std::fabs(f.m[i]));
          s_max = std::max(s_max, std::sqrt(f.v[i]));
        }
        for (std::size_t i = b * state_block; i < last; ++i) {
          INFO(to_string(dtype) << " " << f.name << " element " << i << ": m " << f.m[i] << " -> "
                                << m[i] << ", v " << f.v[i] << " -> " << v[i]);
          const double em = std::fabs(double(m[i]) - f.m[i]);
          const double es = std::fabs(std::sqrt(double(v[i])) - std::sqrt(double(f.v[i])));
          if (dtype == adam_state_dtype::bf16) {
            CHECK(em <= std::max(std::fabs(f.m[i]) * 0x1p-8, 0x1p-134));  // subnormals: half a unit
            CHECK(std::fabs(double(v[i]) - f.v[i]) <= std::max(f.v[i] * 0x1p-8, 0x1p-134));
            continue;
          }
          // Relative half a code's step in the codes' normal range, else half the smallest step.
          CHECK(em <= std::max(std::fabs(f.m[i]) * 0x1p-4, m_max * 0x1p-18));
          CHECK(es <= std::max(std::sqrt(f.v[i]) * 0x1p-5, s_max * 0x1p-18) * 1.000001);
          CHECK((f.v[i] > 0) == (v[i] > 0));  // a positive v stays positive
          CHECK(std::signbit(m[i]) == (f.m[i] < 0));
          if (std::fabs(f.m[i]) >= m_max * 0x1p-14f && f.m[i] != 0) {
            worst_m = std::max(worst_m, em / std::fabs(f.m[i]));
          }
          if (std::sqrt(f.v[i]) >= s_max * 0x1p-14f && f.v[i] != 0) {
            worst_v = std::max(worst_v, std::fabs(double(v[i]) - f.v[i]) / f.v[i]);
          }
        }
      }
      if (dtype == adam_state_dtype::int8) {
        std::cout << "int8 " << f.name << ": worst relative error m " << worst_m << ", v "
                  << worst_v << " (within 2^14 of the block's largest)\n";
      }
    }
  }
}

TEST_CASE("compressed steps: every kernel gives the bytes of the test's reference",
          "[adam][state]") {
  auto gen = tierflow::test::rng(3703);
  adam_hyper hyper;
  hyper.lr = 3e-3;
  hyper.weight_decay = 0.01;
  for (adam_kernel kernel : tierflow::test::kernels_here()) {
    for (param_dtype gtype : {param_dtype::f32, param_dtype::bf16}) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 20)(gen) * state_block +
                            std::uniform_int_distribution<std::size_t>(0, state_block - 1)(gen);
      INFO("kernel " << to_string(kernel) << ", grads " << to_string(gtype) << ", " << n
                     << " elements");
      std::normal_distribution<float> d(0.f, 1.f);
      std::vector<float> start(n);
      for (auto& x : start) {
        x = d(gen);
      }
      // int8: the library's kernel against the test's rule.
      std::vector<float> lib_master = start, ref_master = start;
      int8_reference lib(n), ref(n);
      // bf16: the library's kernel against fp32 moments rounded to bf16 after each update.
      std::vector<float> bf_master = start, bf_ref_master = start;
      std::vector<std::uint16_t> bm(n), bv(n);
      std::vector<float> rm(n, 0.f), rv(n, 0.f);
      for (std::uint64_t t = 1; t <= 5; ++t) {
        std::vector<float> g = wild_grads(n, gen);
        std::vector<std::uint16_t> g16(n);
        detail::store_params(adam_kernel::scalar, g.data(), g16.data(), param_dtype::bf16, n);
        if (gtype == param_dtype::bf16) {
          detail::load_as_f32(g16.data(), param_dtype::bf16, g.data(), n);
        }
        const void* grad =
            gtype == param_dtype::f32 ? static_cast<const void*>(g.data()) : g16.data();
        const auto s = detail::make_adam_scalars(hyper, t, 1.0);
        // Chunks of whole blocks, as offload_adam splits a param.
        const std::size_t chunk =
            state_block * std::uniform_int_distribution<std::size_t>(1, 4)(gen);
        for (std::size_t off = 0; off < n; off += chunk) {
          const std::size_t count = std::min(chunk, n - off);
          const auto* gp = static_cast<const unsigned char*>(grad) + off * dtype_bytes(gtype);
          detail::adam_update_state(kernel, lib_master.data() + off, lib.arrays(), off, gp, gtype,
                                    count, s);
          detail::state_arrays bst{adam_state_dtype::bf16, bm.data(), bv.data(), nullptr, nullptr};
          detail::adam_update_state(kernel, bf_master.data() + off, bst, off, gp, gtype, count, s);
        }
        ref.step(ref_master, g, s);
        for (std::size_t i = 0; i < n; ++i) {
          detail::adam_reference(bf_ref_master[i], rm[i], rv[i], g[i], s);
          rm[i] = detail::bf16_to_float(detail::float_to_bf16(rm[i]));
          rv[i] = detail::bf16_to_float(detail::float_to_bf16(rv[i]));
        }
        INFO("step " << t);
        REQUIRE(same_bits(lib_master, ref_master));
        REQUIRE(lib.mc == ref.mc);
        REQUIRE(lib.vc == ref.vc);
        REQUIRE(same_bits(lib.ms, ref.ms));
        REQUIRE(same_bits(lib.vs, ref.vs));
        REQUIRE(same_bits(bf_master, bf_ref_master));
        std::vector<float> bmf(n), bvf(n);
        detail::load_as_f32(bm.data(), param_dtype::bf16, bmf.data(), n);
        detail::load_as_f32(bv.data(), param_dtype::bf16, bvf.data(), n);
        REQUIRE(same_bits(bmf, rm));
        REQUIRE(same_bits(bvf, rv));
      }
    }
  }
}

TEST_CASE("offload_adam with bf16 and int8 moments: cpu mode, the reference's bits, less state",
          "[adam][state]") {
  auto gen = tierflow::test::rng(3704);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  adam_hyper hyper;
  hyper.lr = 1e-2;
  hyper.weight_decay = 0.05;
  std::uint64_t fp32_state = 0;
  // The same params' sizes and overlap for each dtype: the state bytes compare.
  const bool overlap = gen() % 2 == 0;
  const std::size_t sizes[] = {40000 + gen() % 3000, 9000 + gen() % 3000, 100 + gen() % 3000};
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    INFO("state " << to_string(dtype) << (overlap ? ", overlap backward" : ""));
    // One large fp32 param (its own master without an overlap), a bf16 one, and a small one
    // that int8 keeps in fp32.
    std::vector<host_param> params;
    params.emplace_back(param_dtype::f32, sizes[0], gen);
    params.emplace_back(param_dtype::bf16, sizes[1], gen);
    params.emplace_back(param_dtype::f32, sizes[2], gen);
    const adam_group group = group_of(params, "p", hyper);
    adam_options o;
    o.mode = adam_mode::automatic;
    o.state_dtype = dtype;
    o.threads = 2;
    o.chunk_elements = 1000 + gen() % 9000;  // rounded up to whole blocks for int8
    o.overlap = overlap ? adam_overlap::backward : adam_overlap::none;
    offload_adam opt(*dev, {group}, o, policy);
    REQUIRE(opt.mode() == adam_mode::cpu);
    // The references: int8 for the large params, fp32 for the small one; bf16 for all.
    std::vector<int8_reference> int8_refs;
    std::vector<std::vector<std::uint16_t>> bf_m, bf_v;
    for (auto& p : params) {
      int8_refs.emplace_back(p.size());
      bf_m.emplace_back(p.size());
      bf_v.emplace_back(p.size());
    }
    for (int step = 1; step <= 4; ++step) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        host_param& p = params[i];
        p.draw_grads(gen);
        std::vector<float> gf(p.size());
        detail::load_as_f32(p.grad(), p.dtype, gf.data(), p.size());
        const auto s = detail::make_adam_scalars(hyper, ++p.steps, 1.0);
        const bool small = p.size() < int8_min_elements;
        if (dtype == adam_state_dtype::int8 && !small) {
          int8_refs[i].step(p.master, gf, s);
        } else if (dtype == adam_state_dtype::bf16) {
          detail::state_arrays st{dtype, bf_m[i].data(), bf_v[i].data(), nullptr, nullptr};
          detail::adam_update_state(adam_kernel::scalar, p.master.data(), st, 0, gf.data(),
                                    param_dtype::f32, p.size(), s);
        } else {
          --p.steps;
          p.reference_step(hyper);
        }
      }
      if (overlap) {
        opt.grad_ready(0, 0);  // speculated; kept (no clip)
      }
      REQUIRE(opt.step().applied);
      for (std::size_t i = 0; i < params.size(); ++i) {
        INFO("param " << i << " (" << params[i].size() << "), step " << step);
        CHECK(same_bits(opt.master_weights(0, i), params[i].master));
        CHECK(same_bits(params[i].param_as_f32(), [&] {
          std::vector<float> out(params[i].size());
          std::vector<std::uint16_t> p16(params[i].size());
          if (params[i].dtype == param_dtype::f32) {
            return params[i].master;
          }
          detail::store_params(adam_kernel::scalar, params[i].master.data(), p16.data(),
                               params[i].dtype, out.size());
          detail::load_as_f32(p16.data(), params[i].dtype, out.data(), out.size());
          return out;
        }()));
        if (dtype == adam_state_dtype::int8 && params[i].size() >= int8_min_elements) {
          std::vector<float> m(params[i].size()), v(params[i].size());
          detail::decode_moments(int8_refs[i].arrays(), 0, m.size(), m.data(), v.data());
          CHECK(same_bits(opt.exp_avg(0, i), m));
          CHECK(same_bits(opt.exp_avg_sq(0, i), v));
        }
      }
    }
    const std::uint64_t state = opt.metrics().state_bytes;
    if (dtype == adam_state_dtype::f32) {
      fp32_state = state;
    } else {
      // Moments of the large params 8 B -> 4 B (bf16) or 2 B + 8 B per block (int8) per
      // element; a little more is allowed for the arrays' alignment.
      const auto large = static_cast<double>(params[0].size() + params[1].size());
      const double saved = dtype == adam_state_dtype::bf16
                               ? 4 * (large + static_cast<double>(sizes[2]))  // small one too
                               : 6 * large - large / 32;
      INFO("fp32 state " << fp32_state << " B, " << to_string(dtype) << " " << state
                         << " B; params " << params[0].size() << ", " << params[1].size() << ", "
                         << params[2].size());
      CHECK(static_cast<double>(state) <= static_cast<double>(fp32_state) - saved + 1024);
    }
  }
}

TEST_CASE("compressed moments: set_state quantizes, groups choose", "[adam][state]") {
  auto gen = tierflow::test::rng(3705);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  std::vector<host_param> a, b;
  a.emplace_back(param_dtype::f32, 5000 + gen() % 1000, gen);
  b.emplace_back(param_dtype::f32, 5000 + gen() % 1000, gen);
  adam_group ga = group_of(a, "a");
  adam_group gb = group_of(b, "b");
  gb.state_dtype = adam_state_dtype::f32;  // this group keeps fp32 moments
  adam_options o;
  o.state_dtype = adam_state_dtype::int8;
  o.mode = adam_mode::cpu;
  offload_adam opt(*dev, {ga, gb}, o, policy);
  const std::size_t n = a[0].size();
  std::vector<float> m(n), v(n), mb(b[0].size()), vb(b[0].size());
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = d(gen) * 1e-3f;
    v[i] = m[i] * m[i] * 2;
  }
  for (std::size_t i = 0; i < mb.size(); ++i) {
    mb[i] = d(gen);
    vb[i] = mb[i] * mb[i];
  }
  opt.set_state(0, 0, nullptr, m.data(), v.data(), n, 3);
  opt.set_state(1, 0, nullptr, mb.data(), vb.data(), mb.size(), 3);
  // Group 0 holds the quantized values: what encode then decode gives, close to what was set.
  std::vector<unsigned char> mc(n), vc(n);
  std::vector<float> ms(detail::scale_count(adam_state_dtype::int8, n)), vs(ms.size());
  const detail::state_arrays st{adam_state_dtype::int8, mc.data(), vc.data(), ms.data(), vs.data()};
  detail::encode_moments(adam_kernel::scalar, st, 0, n, m.data(), v.data());
  std::vector<float> m8(n), v8(n);
  detail::decode_moments(st, 0, n, m8.data(), v8.data());
  CHECK(same_bits(opt.exp_avg(0, 0), m8));
  CHECK(same_bits(opt.exp_avg_sq(0, 0), v8));
  CHECK_FALSE(same_bits(opt.exp_avg(0, 0), m));
  // Group 1 keeps fp32: exact.
  CHECK(same_bits(opt.exp_avg(1, 0), mb));
  CHECK(same_bits(opt.exp_avg_sq(1, 0), vb));
  // Only exp_avg given: exp_avg_sq stays as it was.
  std::vector<float> m2 = m;
  std::reverse(m2.begin(), m2.end());
  opt.set_state(0, 0, nullptr, m2.data(), nullptr, n, 3);
  CHECK(same_bits(opt.exp_avg_sq(0, 0), v8));
  CHECK(opt.step_count(0, 0) == 3);
}
