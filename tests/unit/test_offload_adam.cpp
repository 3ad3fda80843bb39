// Offloaded Adam: the kernels against the scalar reference (bit-exact), the optimizer in every
// mode against a reference written here from the formula, against PyTorch's fixtures, and its
// checkpoints and errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using detail::adam_scalars;

namespace {

std::vector<adam_kernel> kernels_here() {
  std::vector<adam_kernel> out;
  for (adam_kernel k : {adam_kernel::scalar, adam_kernel::avx2, adam_kernel::avx512}) {
    if (kernel_supported(k)) {
      out.push_back(k);
    }
  }
  return out;
}

constexpr param_dtype all_dtypes[] = {param_dtype::f32, param_dtype::bf16, param_dtype::f16};

float from_bits(std::uint32_t b) {
  float f = 0;
  std::memcpy(&f, &b, 4);
  return f;
}

std::vector<float> decode(const unsigned char* raw, std::size_t n, param_dtype dtype) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == param_dtype::f32) {
      std::memcpy(&out[i], raw + 4 * i, 4);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, raw + 2 * i, 2);
      out[i] = dtype == param_dtype::bf16 ? detail::bf16_to_float(h) : detail::f16_to_float(h);
    }
  }
  return out;
}

// The test's own statement of the scalars: double math, one rounding to float.
adam_scalars scalars_of(const adam_hyper& h, std::uint64_t t, double grad_scale) {
  adam_scalars s;
  const bool l2 = h.decay == weight_decay_mode::l2;
  s.grad_scale = static_cast<float>(grad_scale);
  s.l2 = l2 ? static_cast<float>(h.weight_decay) : 0.0f;
  s.decay = l2 ? 1.0f : static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.eps = static_cast<float>(h.eps);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, static_cast<double>(t)) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, static_cast<double>(t)) : 1.0;
  s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return s;
}

// One element, as the formula in offload_adam.hpp writes it (volatile keeps each rounding).
void formula(float& p, float& m, float& v, float grad, const adam_scalars& s) {
  volatile float g = grad * s.grad_scale;
  g = g + s.l2 * p;
  p = p * s.decay;
  volatile float a = m * s.beta1;
  volatile float b = s.one_minus_beta1 * g;
  m = a + b;
  volatile float c = v * s.beta2;
  volatile float d = s.one_minus_beta2 * g;
  volatile float e = d * g;
  v = c + e;
  volatile float root = std::sqrt(v);
  volatile float denom = root / s.bc2_sqrt + s.eps;
  volatile float num = s.neg_step_size * m;
  volatile float upd = num / denom;
  p = p + upd;
}

// Σ g² in the documented order: 32 double lanes, i % 32, lane k + w into lane k for w = 16, 8,
// 4, 2, 1.
double sum_squares_reference(const std::vector<float>& g, std::size_t begin, std::size_t n) {
  double lanes[32] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const double x = g[begin + i];
    lanes[i % 32] += x * x;
  }
  for (std::size_t w = 16; w > 0; w /= 2) {
    for (std::size_t k = 0; k < w; ++k) {
      lanes[k] += lanes[k + w];
    }
  }
  return lanes[0];
}

std::size_t pick(std::mt19937_64& gen, std::size_t lo, std::size_t hi) {
  return std::uniform_int_distribution<std::size_t>(lo, hi)(gen);
}

}  // namespace

TEST_CASE("the Adam kernels match the scalar formula bit for bit", "[adam]") {
  auto gen = test::rng(701);
  for (int round = 0; round < 30; ++round) {
    const std::size_t n = pick(gen, 1, 3000);
    const adam_hyper h = test::random_hyper(gen);
    const auto s =
        scalars_of(h, pick(gen, 1, 50), 0.25 + static_cast<double>(pick(gen, 0, 100)) / 100);
    const param_dtype dtype = all_dtypes[pick(gen, 0, 2)];
    const auto p0 = test::nonzero_normals(n, 1.0f, gen);
    const auto m0 = test::nonzero_normals(n, 0.01f, gen);
    auto v0 = test::nonzero_normals(n, 0.001f, gen);
    for (auto& x : v0) {
      x = std::fabs(x);
    }
    const auto graw = test::encode_values(test::nonzero_normals(n, 0.1f, gen), dtype);
    const auto g = decode(graw.data(), n, dtype);
    std::vector<float> rp = p0, rm = m0, rv = v0;
    for (std::size_t i = 0; i < n; ++i) {
      formula(rp[i], rm[i], rv[i], g[i], s);
    }
    for (adam_kernel k : kernels_here()) {
      INFO("kernel " << to_string(k) << ", dtype " << to_string(dtype) << ", n " << n);
      std::vector<float> p = p0, m = m0, v = v0;
      detail::adam_update(k, p.data(), m.data(), v.data(), graw.data(), dtype, n, s);
      REQUIRE(std::memcmp(p.data(), rp.data(), 4 * n) == 0);
      REQUIRE(std::memcmp(m.data(), rm.data(), 4 * n) == 0);
      REQUIRE(std::memcmp(v.data(), rv.data(), 4 * n) == 0);
      CHECK(detail::grad_sum_squares(k, graw.data(), dtype, n) == sum_squares_reference(g, 0, n));
      std::vector<unsigned char> out(n * dtype_bytes(dtype));
      detail::store_params(k, p.data(), out.data(), dtype, n);
      REQUIRE(out == test::encode_values(p, dtype));
    }
  }
}

TEST_CASE("a non-finite grad makes the sum of squares non-finite in every kernel", "[adam]") {
  auto gen = test::rng(702);
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    for (param_dtype dtype : all_dtypes) {
      const std::size_t n = pick(gen, 1, 500);
      auto values = test::nonzero_normals(n, 1.0f, gen);
      values[pick(gen, 0, n - 1)] = bad;
      const auto raw = test::encode_values(values, dtype);
      for (adam_kernel k : kernels_here()) {
        INFO(to_string(k) << " " << to_string(dtype) << " " << bad);
        CHECK_FALSE(std::isfinite(detail::grad_sum_squares(k, raw.data(), dtype, n)));
      }
    }
  }
}

TEST_CASE("bf16 and fp16 conversions round to nearest even", "[adam]") {
  // Every half and bf16 value converts to float and back to itself (NaNs stay NaNs).
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = detail::f16_to_float(b);
    if (std::isnan(f)) {
      CHECK(std::isnan(detail::f16_to_float(detail::float_to_f16(f))));
    } else if (detail::float_to_f16(f) != b) {
      FAIL("f16 round trip of " << h);
    }
    const float g = detail::bf16_to_float(b);
    if (!std::isnan(g) && detail::float_to_bf16(g) != b) {
      FAIL("bf16 round trip of " << h);
    }
  }
  // Random floats (normals, subnormals, halfway cases) go to the nearest representable value,
  // ties to the even one: checked against the neighbours found by search.
  auto gen = test::rng(703);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t x = any(gen);
    if (i % 4 == 0) {
      x = (x & 0xffffe000u) | 0x1000u;  // exactly halfway between two halves
    } else if (i % 4 == 1) {
      x = (x & 0xffff0000u) | 0x8000u;  // exactly halfway between two bf16 values
    }
    const float f = from_bits(x);
    if (!std::isfinite(f)) {
      continue;
    }
    const auto check = [&](std::uint16_t got, float (*to_float)(std::uint16_t), const char* what) {
      const double target = f;
      const double chosen = to_float(got);
      const auto next = static_cast<std::uint16_t>(got + 1);
      const auto prev = static_cast<std::uint16_t>(got - 1);
      for (std::uint16_t other : {next, prev}) {
        const float o = to_float(other);
        if (std::isnan(o) || ((other ^ got) & 0x8000u) != 0) {
          continue;
        }
        const double dc = std::fabs(chosen - target);
        const double dn = std::fabs(static_cast<double>(o) - target);
        if (std::isinf(chosen)) {
          continue;  // overflow to infinity is checked below
        }
        INFO(what << " of " << std::hexfloat << f << " gave " << chosen << ", neighbour " << o);
        REQUIRE(dc <= dn);
        if (dc == dn) {
          REQUIRE((got & 1u) == 0);
        }
      }
    };
    if (std::fabs(f) < 65504.0f) {
      check(detail::float_to_f16(f), detail::f16_to_float, "f16");
    }
    check(detail::float_to_bf16(f), detail::bf16_to_float, "bf16");
  }
  CHECK(detail::float_to_f16(65519.0f) == 0x7bff);
  CHECK(detail::float_to_f16(65520.0f) == 0x7c00);
  CHECK(detail::float_to_f16(-1e10f) == 0xfc00);
  CHECK(detail::float_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to inf
}

namespace {

std::unique_ptr<emulated_device> adam_device() {
  emulated_device_options o;
  o.link = link_model::parse("h2d=40GB/s,d2h=40GB/s,latency=1us", "test");
  o.copy_threads = 1;
  o.hbm_bytes = std::uint64_t{1} << 30;
  return emulated_device::create(o);
}

placement_policy host_placement(const topology& topo) {
  placement_options o;
  o.reserve_bytes = 0;
  o.huge_pages = false;
  return placement_policy(topo, o);
}

// Params and grads in (emulated) device memory, with the test's own reference of the state.
struct model {
  struct tensor {
    std::string name;
    param_dtype dtype = param_dtype::f32;
    std::size_t n = 0;
    void* param = nullptr;
    void* grad = nullptr;
    std::vector<float> p, m, v;  // reference state
  };
  device& dev;
  std::vector<std::vector<tensor>> groups;
  std::vector<adam_hyper> hyper;
  std::vector<std::uint64_t> steps;

  explicit model(device& d) : dev(d) {}
  model(const model&) = delete;
  model& operator=(const model&) = delete;
  ~model() {
    for (auto& g : groups) {
      for (auto& t : g) {
        dev.memory().deallocate(t.param, t.n * dtype_bytes(t.dtype));
        dev.memory().deallocate(t.grad, t.n * dtype_bytes(t.dtype));
      }
    }
  }

  void add(std::size_t group, std::string name, param_dtype dtype, const std::vector<float>& init) {
    if (groups.size() <= group) {
      groups.resize(group + 1);
      hyper.resize(group + 1);
      steps.resize(group + 1, 0);
    }
    tensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.n = init.size();
    const auto raw = test::encode_values(init, dtype);
    t.param = dev.memory().allocate(raw.size());
    t.grad = dev.memory().allocate(raw.size());
    std::memcpy(t.param, raw.data(), raw.size());  // emulated device memory is host memory
    t.p = decode(raw.data(), t.n, dtype);
    t.m.assign(t.n, 0.0f);
    t.v.assign(t.n, 0.0f);
    groups[group].push_back(std::move(t));
  }

  std::vector<adam_group> describe() const {
    std::vector<adam_group> out;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      adam_group ag;
      ag.hyper = hyper[g];
      for (const auto& t : groups[g]) {
        ag.params.push_back({t.name, t.param, t.grad, t.dtype, t.n});
      }
      out.push_back(std::move(ag));
    }
    return out;
  }

  void set_grads(const std::vector<std::vector<std::vector<float>>>& grads) {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t i = 0; i < groups[g].size(); ++i) {
        const auto raw = test::encode_values(grads[g][i], groups[g][i].dtype);
        std::memcpy(groups[g][i].grad, raw.data(), raw.size());
      }
    }
  }

  std::vector<std::vector<std::vector<float>>> random_grads(std::mt19937_64& gen, float scale) {
    std::vector<std::vector<std::vector<float>>> out(groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const auto& t : groups[g]) {
        out[g].push_back(test::nonzero_normals(t.n, scale, gen));
      }
    }
    return out;
  }

  // The reference step: grads as decoded from their dtype, norm in chunk order.
  bool reference_step(const std::vector<std::vector<std::vector<float>>>& grads, std::size_t chunk,
                      double max_norm, double loss_scale, double& norm_out) {
    double total = 0;
    std::vector<std::vector<std::vector<float>>> g(groups.size());
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      for (std::size_t i = 0; i < groups[gi].size(); ++i) {
        const auto& t = groups[gi][i];
        const auto raw = test::encode_values(grads[gi][i], t.dtype);
        g[gi].push_back(decode(raw.data(), t.n, t.dtype));
        for (std::size_t off = 0; off < t.n; off += chunk) {
          total += sum_squares_reference(g[gi][i], off, std::min(chunk, t.n - off));
        }
      }
    }
    norm_out = std::sqrt(total) / loss_scale;
    if (!std::isfinite(norm_out)) {
      return false;
    }
    const double clip = max_norm > 0 ? std::min(1.0, max_norm / (norm_out + 1e-6)) : 1.0;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      ++steps[gi];
      const auto s = scalars_of(hyper[gi], steps[gi], clip / loss_scale);
      for (std::size_t i = 0; i < groups[gi].size(); ++i) {
        auto& t = groups[gi][i];
        for (std::size_t e = 0; e < t.n; ++e) {
          formula(t.p[e], t.m[e], t.v[e], g[gi][i][e], s);
        }
      }
    }
    return true;
  }

  // The device params equal the reference master weights in their dtype.
  void check_device_params() const {
    for (const auto& g : groups) {
      for (const auto& t : g) {
        const auto want = test::encode_values(t.p, t.dtype);
        INFO("param " << t.name);
        REQUIRE(std::memcmp(t.param, want.data(), want.size()) == 0);
      }
    }
  }

  void check_state(const offload_adam& opt) const {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t i = 0; i < groups[g].size(); ++i) {
        const auto& t = groups[g][i];
        INFO("state of " << t.name);
        REQUIRE(opt.master_weights(g, i) == t.p);
        REQUIRE(opt.exp_avg(g, i) == t.m);
        REQUIRE(opt.exp_avg_sq(g, i) == t.v);
      }
    }
  }
};

void random_model(model& mdl, std::mt19937_64& gen, std::size_t max_elements) {
  const std::size_t groups = pick(gen, 1, 3);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t params = pick(gen, 1, 3);
    for (std::size_t i = 0; i < params; ++i) {
      mdl.add(g, "g" + std::to_string(g) + ".w" + std::to_string(i), all_dtypes[pick(gen, 0, 2)],
              test::nonzero_normals(pick(gen, 1, max_elements), 1.0f, gen));
    }
    mdl.hyper[g] = test::random_hyper(gen);
  }
}

}  // namespace

TEST_CASE("offload_adam matches the reference bit for bit in cpu and streamed modes", "[adam]") {
  auto gen = test::rng(710);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    for (int round = 0; round < 3; ++round) {
      auto dev = adam_device();
      model mdl(*dev);
      random_model(mdl, gen, 5000);
      adam_options o;
      o.mode = mode;
      o.chunk_elements = pick(gen, 64, 2048);
      o.threads = static_cast<unsigned>(pick(gen, 1, 3));
      o.max_grad_norm = pick(gen, 0, 1) == 1 ? 5.0 : 0.0;
      o.loss_scale = pick(gen, 0, 1) == 1 ? 128.0 : 1.0;
      o.window = pick(gen, 0, 3);
      const auto kernels = kernels_here();
      o.kernel = kernels[pick(gen, 0, kernels.size() - 1)];
      INFO("mode " << to_string(mode) << ", kernel " << to_string(o.kernel) << ", chunk "
                   << o.chunk_elements << ", threads " << o.threads);
      offload_adam opt(*dev, mdl.describe(), o, policy);
      CHECK(opt.mode() == mode);
      mdl.check_state(opt);  // master weights from the device params, zero moments
      for (int step = 0; step < 6; ++step) {
        for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
          adam_hyper h = mdl.hyper[g];
          h.lr *= 0.5 + static_cast<double>(pick(gen, 0, 100)) / 100;  // a scheduler
          mdl.hyper[g] = h;
          opt.set_hyper(g, h);
        }
        const auto grads = mdl.random_grads(gen, static_cast<float>(o.loss_scale) * 0.3f);
        mdl.set_grads(grads);
        double norm = 0;
        REQUIRE(mdl.reference_step(grads, o.chunk_elements, o.max_grad_norm, o.loss_scale, norm));
        const auto r = opt.step();
        REQUIRE(r.applied);
        CHECK(r.grad_norm == norm);
        if (o.max_grad_norm > 0 && norm > o.max_grad_norm) {
          CHECK(r.clip_coef < 1.0);
        } else {
          CHECK(r.clip_coef == 1.0);
        }
        mdl.check_device_params();
      }
      mdl.check_state(opt);
      for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
        CHECK(opt.step_count(g) == 6);
      }
      const auto m = opt.metrics();
      CHECK(m.steps == 6);
      const auto json = nlohmann::json::parse(m.to_json());
      CHECK(json["adam"]["mode"] == std::string(to_string(mode)));
      CHECK(json["adam"]["steps"] == 6);
      CHECK(json["adam"]["hbm_staging_peak_bytes"] == m.hbm_staging_peak_bytes);
      CHECK(json["adam"]["hbm_undo_bytes"] == m.hbm_undo_bytes);
      if (mode == adam_mode::cpu) {
        CHECK(m.hbm_staging_peak_bytes == 0);  // no state in HBM
        CHECK(m.hbm_undo_bytes == 0);
      } else {
        // The undo ring: master, m and v of up to window + 3 chunks (every chunk when the
        // window spans the plan).
        CHECK(m.hbm_undo_bytes > 0);
        CHECK(m.hbm_undo_bytes % (3 * sizeof(float)) == 0);
        CHECK(m.hbm_undo_bytes <= m.chunks * 3 * o.chunk_elements *
                                      sizeof(float));  // some chunks staged, never more than the
                                                       // default budget: window + 2 chunks
        // of master, m and v (each slot rounded up to 256 B)
        CHECK(m.hbm_staging_peak_bytes > 0);
        CHECK(m.hbm_staging_peak_bytes <= (o.window + 2) * 3 * (o.chunk_elements * 4 + 256));
      }
    }
  }
}

TEST_CASE("clipping scales every group's grads by one global factor", "[adam]") {
  auto gen = test::rng(711);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "a", param_dtype::f32, test::nonzero_normals(700, 1.0f, gen));
  mdl.add(1, "b", param_dtype::f32, test::nonzero_normals(300, 1.0f, gen));
  mdl.hyper[0] = test::random_hyper(gen);
  mdl.hyper[1] = test::random_hyper(gen);
  adam_options o;
  o.mode = adam_mode::cpu;
  o.max_grad_norm = 1.0;
  o.chunk_elements = 128;
  offload_adam opt(*dev, mdl.describe(), o, policy);
  const auto grads = mdl.random_grads(gen, 2.0f);  // norm ≈ 2 √1000 ≫ 1
  mdl.set_grads(grads);
  double norm = 0;
  REQUIRE(mdl.reference_step(grads, 128, 1.0, 1.0, norm));
  const auto r = opt.step();
  REQUIRE(r.applied);
  CHECK(r.grad_norm == Approx(norm).epsilon(1e-12));
  CHECK(r.clip_coef == Approx(1.0 / (norm + 1e-6)).epsilon(1e-12));
  mdl.check_state(opt);
}

TEST_CASE("a non-finite grad anywhere skips the step and changes nothing", "[adam]") {
  auto gen = test::rng(712);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    auto dev = adam_device();
    model mdl(*dev);
    random_model(mdl, gen, 3000);
    adam_options o;
    o.mode = mode;
    o.chunk_elements = pick(gen, 64, 1024);
    offload_adam opt(*dev, mdl.describe(), o, policy);
    // One good step first, so the state is not the initial one.
    auto grads = mdl.random_grads(gen, 0.5f);
    mdl.set_grads(grads);
    double norm = 0;
    REQUIRE(mdl.reference_step(grads, o.chunk_elements, 0, 1, norm));
    REQUIRE(opt.step().applied);
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      grads = mdl.random_grads(gen, 0.5f);
      const std::size_t g = pick(gen, 0, mdl.groups.size() - 1);
      const std::size_t i = pick(gen, 0, mdl.groups[g].size() - 1);
      const std::size_t element = pick(gen, 0, grads[g][i].size() - 1);
      grads[g][i][element] = bad;
      // A second bad grad further on (often in the same chunk): the first one is named.
      const std::size_t later = element + pick(gen, 1, o.chunk_elements);
      if (later < grads[g][i].size()) {
        grads[g][i][later] = -bad;
      }
      mdl.set_grads(grads);
      const auto r = opt.step();
      INFO("mode " << to_string(mode) << ": " << r.skip_reason);
      CHECK_FALSE(r.applied);
      CHECK(r.skip_reason.find("'" + mdl.groups[g][i].name + "'") != std::string::npos);
      // Both modes name the element: cpu mode from its host copy of the grads, streamed mode
      // from the offending chunk copied down.
      CHECK_THAT(r.skip_reason,
                 Catch::Contains("(first at element " + std::to_string(element) + ")"));
      mdl.check_state(opt);
      mdl.check_device_params();
      CHECK(opt.step_count(0) == 1);
    }
    CHECK(opt.metrics().skipped_steps == 2);
    // The next good step applies normally.
    grads = mdl.random_grads(gen, 0.5f);
    mdl.set_grads(grads);
    REQUIRE(mdl.reference_step(grads, o.chunk_elements, 0, 1, norm));
    REQUIRE(opt.step().applied);
    mdl.check_state(opt);
    mdl.check_device_params();
  }
}

TEST_CASE("bad arguments to offload_adam are clear errors", "[adam]") {
  auto gen = test::rng(713);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "w", param_dtype::f32, test::nonzero_normals(100, 1.0f, gen));
  const auto expect_error =
      [&](const std::function<void(std::vector<adam_group>&, adam_options&)>& spoil,
          const std::string& words) {
        auto groups = mdl.describe();
        adam_options o;
        o.mode = adam_mode::cpu;
        spoil(groups, o);
        INFO("expecting: " << words);
        CHECK_THROWS_WITH(offload_adam(*dev, groups, o, policy), Catch::Contains(words));
      };
  expect_error([](auto& g, auto&) { g[0].hyper.lr = -1e-3; }, "lr must be finite and >= 0");
  expect_error([](auto& g, auto&) { g[0].hyper.lr = std::nan(""); }, "lr must be");
  expect_error([](auto& g, auto&) { g[0].hyper.beta1 = 1.0; }, "beta1 must be in [0, 1)");
  expect_error([](auto& g, auto&) { g[0].hyper.beta2 = 1.5; }, "beta2 must be in [0, 1)");
  expect_error([](auto& g, auto&) { g[0].hyper.eps = 0; }, "eps must be finite and > 0");
  expect_error([](auto& g, auto&) { g[0].hyper.weight_decay = -1; }, "weight_decay");
  expect_error([](auto& g, auto&) { g[0].params[0].param = nullptr; },
               "'w': param pointer is null");
  expect_error([](auto& g, auto&) { g[0].params[0].elements = 0; }, "'w': zero elements");
  expect_error([](auto& g, auto&) { g[0].params.push_back(g[0].params[0]); }, "used twice");
  expect_error([](auto& g, auto&) { g[0].params.clear(); }, "has no parameters");
  expect_error([](auto& g, auto&) { g.clear(); }, "at least one parameter group");
  expect_error([](auto&, auto& o) { o.loss_scale = 0; }, "loss_scale must be finite and > 0");
  expect_error([](auto&, auto& o) { o.chunk_elements = 0; }, "chunk_elements must be > 0");
  expect_error([](auto&, auto& o) { o.max_grad_norm = -1; }, "max_grad_norm");

  // set_hyper and set_lr check too, and leave the old values on failure.
  adam_options o;
  o.mode = adam_mode::cpu;
  offload_adam opt(*dev, mdl.describe(), o, policy);
  adam_hyper bad = opt.hyper(0);
  bad.eps = -1;
  CHECK_THROWS_WITH(opt.set_hyper(0, bad), Catch::Contains("eps"));
  CHECK(opt.hyper(0).eps == adam_hyper{}.eps);
  CHECK_THROWS_WITH(opt.set_lr(-2), Catch::Contains("lr"));
  CHECK(opt.hyper(0).lr == adam_hyper{}.lr);
  CHECK_THROWS_WITH(opt.set_hyper(3, opt.hyper(0)), Catch::Contains("group 3 out of range"));
  CHECK_THROWS_WITH(opt.master_weights(0, 5), Catch::Contains("param 5 of group 0"));
}

TEST_CASE("auto mode chooses from the rates and says why", "[adam]") {
  auto gen = test::rng(714);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "w", param_dtype::bf16, test::nonzero_normals(1000, 1.0f, gen));
  adam_options o;
  o.mode = adam_mode::automatic;
  o.host_memory_gbps = 100;  // memory far faster than the link: the step stays on the CPU
  o.h2d_gbps = o.d2h_gbps = 1;
  {
    offload_adam opt(*dev, mdl.describe(), o, policy);
    CHECK(opt.mode() == adam_mode::cpu);
    CHECK_THAT(opt.mode_reason(), Catch::Contains("ns/param"));
  }
  o.host_memory_gbps = 1;  // a slow host: streaming 24 B over a fast link wins
  o.h2d_gbps = o.d2h_gbps = 400;
  offload_adam opt(*dev, mdl.describe(), o, policy);
  CHECK(opt.mode() == adam_mode::streamed);
  CHECK_THAT(opt.metrics().to_json(), Catch::Contains("\"mode\":\"streamed\""));
}

TEST_CASE("auto mode takes the host memory rate tierflow bench measured", "[adam][measured]") {
  auto gen = test::rng(715);
  test::scratch_dir cache;
  discovery_options d;
  d.use_cuda = false;
  d.measured_cache_dir = cache.path();
  const topology plain = topology::discover(d);
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "w", param_dtype::f32, test::nonzero_normals(1000, 1.0f, gen));
  adam_options o;
  o.mode = adam_mode::automatic;
  o.h2d_gbps = o.d2h_gbps = 400;
  const auto run = [&](double read_gbps, double write_gbps) {
    std::vector<measured_access> values;
    for (const auto& n : plain.nodes()) {
      values.push_back({plain.initiator(), n.id, read_gbps * 1000.0, write_gbps * 1000.0, {}});
    }
    save_measured_access(plain, values, cache.path());
    const topology topo = topology::discover(d);
    auto policy = host_placement(topo);
    offload_adam opt(*dev, mdl.describe(), o, policy);
    return std::pair{opt.mode(), opt.mode_reason()};
  };
  std::uniform_real_distribution<double> slow(0.5, 2.0);
  const double read = slow(gen), write = slow(gen);
  const auto [mode, why] = run(read, write);
  INFO(why);
  CHECK(mode == adam_mode::streamed);  // a slow host against a 400 GB/s link
  CHECK_THAT(why, Catch::Contains("measured by tierflow bench"));
  std::ostringstream rate;
  rate.precision(3);
  rate << 28.0 / (16.0 / read + 12.0 / write) << " GB/s";
  CHECK_THAT(why, Catch::Contains(rate.str()));
  o.h2d_gbps = o.d2h_gbps = 1;
  CHECK(run(1000.0, 1000.0).first == adam_mode::cpu);  // and a fast one against a slow link
}

namespace {

std::vector<float> floats_of(const nlohmann::json& bits_list) {
  std::vector<float> out;
  for (const auto& b : bits_list) {
    out.push_back(from_bits(b.get<std::uint32_t>()));
  }
  return out;
}

// Close to PyTorch: its CPU kernels fuse multiply-adds where ours round twice, so compare with
// a tolerance scaled by the tensor's magnitude (cancellation in m makes plain relative error
// meaningless near zero).
void check_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  double rms = 0;
  for (float w : want) {
    rms += static_cast<double>(w) * w;
  }
  rms = std::sqrt(rms / static_cast<double>(want.size()));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = 1e-6 * (std::fabs(want[i]) + rms);
    if (std::fabs(static_cast<double>(got[i]) - want[i]) > tol) {
      FAIL(what << "[" << i << "] = " << got[i] << ", PyTorch " << want[i]);
    }
  }
}

}  // namespace

TEST_CASE("offload_adam follows torch.optim.AdamW and Adam (fixtures)", "[adam]") {
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(test::data_dir() / "adam")) {
    if (entry.path().extension() == ".json") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 6);
  for (const auto& file : files) {
    std::ifstream in(file);
    const auto fx = nlohmann::json::parse(in);
    REQUIRE(fx["format"] == "tierflow-adam-fixture-1");
    for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
      INFO(file.filename().string() << " in mode " << to_string(mode));
      auto dev = adam_device();
      model mdl(*dev);
      for (const auto& p : fx["params"]) {
        mdl.add(0, p["name"], param_dtype::f32, floats_of(p["initial"]));
      }
      const bool adamw = fx["optimizer"] == "AdamW";
      adam_options o;
      o.mode = mode;
      o.chunk_elements = 256;
      o.max_grad_norm = fx["max_grad_norm"];
      o.loss_scale = fx["loss_scale"];
      offload_adam opt(*dev, mdl.describe(), o, policy);
      const auto& steps = fx["steps"];
      for (std::size_t k = 0; k < steps.size(); ++k) {
        adam_hyper h;
        h.lr = steps[k]["lr"];
        h.beta1 = steps[k]["beta1"];
        h.beta2 = steps[k]["beta2"];
        h.eps = steps[k]["eps"];
        h.weight_decay = steps[k]["weight_decay"];
        h.decay = adamw ? weight_decay_mode::decoupled : weight_decay_mode::l2;
        opt.set_hyper(0, h);
        std::vector<std::vector<std::vector<float>>> grads(1);
        for (const auto& p : fx["params"]) {
          grads[0].push_back(floats_of(p["grads"][k]));
        }
        mdl.set_grads(grads);
        const auto r = opt.step();
        REQUIRE(r.applied);
        if (!fx["grad_norms"].empty()) {
          CHECK(r.grad_norm == Approx(fx["grad_norms"][k].get<double>()).epsilon(1e-6));
        }
        for (std::size_t i = 0; i < fx["params"].size(); ++i) {
          const auto& p = fx["params"][i];
          check_close(opt.master_weights(0, i), floats_of(p["expected_param"][k]), "param");
          check_close(opt.exp_avg(0, i), floats_of(p["expected_exp_avg"][k]), "exp_avg");
          check_close(opt.exp_avg_sq(0, i), floats_of(p["expected_exp_avg_sq"][k]), "exp_avg_sq");
        }
      }
    }
  }
}

TEST_CASE("checkpoints round-trip across modes and continue bit-exactly", "[adam][checkpoint]") {
  auto gen = test::rng(720);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  test::scratch_dir dir;
  const auto path = dir.path() / "adam.tfck";
  for (int round = 0; round < 2; ++round) {
    const adam_mode first = round == 0 ? adam_mode::cpu : adam_mode::streamed;
    const adam_mode second = round == 0 ? adam_mode::streamed : adam_mode::cpu;
    auto dev = adam_device();
    model mdl(*dev);
    random_model(mdl, gen, 4000);
    adam_options o;
    o.mode = first;
    o.chunk_elements = pick(gen, 100, 1000);
    std::vector<std::vector<std::vector<std::vector<float>>>> grads;
    for (int k = 0; k < 6; ++k) {
      grads.push_back(mdl.random_grads(gen, 0.3f));
    }
    {
      offload_adam opt(*dev, mdl.describe(), o, policy);
      for (int k = 0; k < 3; ++k) {
        mdl.set_grads(grads[k]);
        double norm = 0;
        REQUIRE(mdl.reference_step(grads[k], o.chunk_elements, 0, 1, norm));
        REQUIRE(opt.step().applied);
      }
      opt.save(path);
    }
    // Another optimizer over the same params, in the other mode, with another chunk size.
    const auto saved_params = mdl.describe();
    for (auto& g : mdl.groups) {
      for (auto& t : g) {
        std::memset(t.param, 0x3c, t.n * dtype_bytes(t.dtype));  // clobber the device params
      }
    }
    o.mode = second;
    o.chunk_elements = pick(gen, 100, 1000);
    std::vector<adam_group> fresh = saved_params;
    for (auto& g : fresh) {
      g.hyper = adam_hyper{};  // the checkpoint brings the hyper-parameters back
    }
    offload_adam opt(*dev, fresh, o, policy);
    opt.load(path);
    mdl.check_state(opt);
    mdl.check_device_params();
    for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
      CHECK(opt.step_count(g) == 3);
      CHECK(opt.hyper(g).lr == mdl.hyper[g].lr);
      CHECK(opt.hyper(g).decay == mdl.hyper[g].decay);
    }
    // Continuing gives what the reference gives (its norm order depends on the chunk size).
    for (int k = 3; k < 6; ++k) {
      mdl.set_grads(grads[k]);
      double norm = 0;
      REQUIRE(mdl.reference_step(grads[k], o.chunk_elements, 0, 1, norm));
      REQUIRE(opt.step().applied);
    }
    mdl.check_state(opt);
    mdl.check_device_params();
  }
}

TEST_CASE("truncated, corrupted and mismatched checkpoints are refused, state untouched",
          "[adam][checkpoint]") {
  auto gen = test::rng(721);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  test::scratch_dir dir;
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "w", param_dtype::bf16, test::nonzero_normals(3000, 1.0f, gen));
  mdl.add(0, "b", param_dtype::f32, test::nonzero_normals(77, 1.0f, gen));
  mdl.hyper[0] = test::random_hyper(gen);
  adam_options o;
  o.mode = adam_mode::cpu;
  o.chunk_elements = 512;
  offload_adam opt(*dev, mdl.describe(), o, policy);
  auto grads = mdl.random_grads(gen, 0.3f);
  mdl.set_grads(grads);
  double norm = 0;
  REQUIRE(mdl.reference_step(grads, 512, 0, 1, norm));
  REQUIRE(opt.step().applied);
  const auto good = dir.path() / "good.tfck";
  opt.save(good);
  // Step once more so the live state differs from the file.
  grads = mdl.random_grads(gen, 0.3f);
  mdl.set_grads(grads);
  REQUIRE(mdl.reference_step(grads, 512, 0, 1, norm));
  REQUIRE(opt.step().applied);

  std::vector<char> bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto write = [&](const std::string& name, const std::vector<char>& content) {
    const auto p = dir.path() / name;
    std::ofstream out(p, std::ios::binary);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    return p;
  };
  const auto refused = [&](const std::filesystem::path& p, const std::string& words) {
    INFO(p.filename().string() << ": expecting '" << words << "'");
    try {
      opt.load(p);
      FAIL("loaded");
    } catch (const input_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(words));
      CHECK(e.source() == p.string());
    }
    mdl.check_state(opt);
    mdl.check_device_params();
    CHECK(opt.step_count(0) == 2);
  };
  for (int i = 0; i < 5; ++i) {
    const std::size_t cut = pick(gen, 0, bytes.size() - 1);
    refused(
        write("cut" + std::to_string(i), {bytes.begin(), bytes.begin() + static_cast<long>(cut)}),
        "truncated");
  }
  for (int i = 0; i < 8; ++i) {
    auto spoiled = bytes;
    const std::size_t at = pick(gen, 0, spoiled.size() - 1);
    spoiled[at] = static_cast<char>(spoiled[at] ^ (1 << pick(gen, 0, 7)));
    // Any flipped bit is caught: by the magic, the version, the lengths or a CRC.
    const auto p = write("flip" + std::to_string(i), spoiled);
    INFO("flipped byte " << at << " of " << spoiled.size());
    CHECK_THROWS_AS(opt.load(p), input_error);
    mdl.check_state(opt);
  }
  auto versioned = bytes;
  versioned[8] = 9;
  refused(write("v9", versioned), "format version 9 is not supported");
  auto longer = bytes;
  longer.push_back('x');
  refused(write("long", longer), "trailing bytes");
  refused(dir.path() / "missing.tfck", "cannot read the checkpoint");
  refused(write("text", {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!', '!', '!', '!',
                         '!', '!'}),
          "bad magic");

  // A checkpoint of another shape.
  model other(*dev);
  other.add(0, "w", param_dtype::bf16, test::nonzero_normals(3001, 1.0f, gen));
  other.add(0, "b", param_dtype::f32, test::nonzero_normals(77, 1.0f, gen));
  offload_adam other_opt(*dev, other.describe(), o, policy);
  const auto mismatched = dir.path() / "other.tfck";
  other_opt.save(mismatched);
  refused(mismatched, "× 3001 in the checkpoint");

  // Saving to a directory that does not exist fails with the path, and leaves nothing behind.
  CHECK_THROWS_WITH(opt.save(dir.path() / "no" / "such" / "x.tfck"), Catch::Contains("no/such"));
}

TEST_CASE("params in host memory are updated in place, with no H2D", "[adam]") {
  auto gen = test::rng(715);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  auto dev = adam_device();
  model mdl(*dev);
  random_model(mdl, gen, 3000);
  auto groups = mdl.describe();
  for (auto& g : groups) {
    for (auto& p : g.params) {
      p.param_on_host = true;  // emulated device memory is host memory, so the test can say so
    }
  }
  adam_options o;
  o.mode = adam_mode::streamed;
  CHECK_THROWS_WITH(offload_adam(*dev, groups, o, policy), Catch::Contains("needs cpu mode"));
  o.mode = adam_mode::automatic;
  o.chunk_elements = pick(gen, 64, 1024);
  offload_adam opt(*dev, groups, o, policy);
  CHECK(opt.mode() == adam_mode::cpu);
  CHECK_THAT(opt.mode_reason(), Catch::Contains("host memory"));
  for (int k = 0; k < 3; ++k) {
    const auto grads = mdl.random_grads(gen, 0.3f);
    mdl.set_grads(grads);
    double norm = 0;
    REQUIRE(mdl.reference_step(grads, o.chunk_elements, 0, 1, norm));
    REQUIRE(opt.step().applied);
    mdl.check_device_params();
  }
  mdl.check_state(opt);
  CHECK(opt.metrics().bytes_h2d == 0);
  CHECK(opt.metrics().bytes_d2h > 0);
}

TEST_CASE("a param without a grad is left alone and keeps its own step count", "[adam]") {
  auto gen = test::rng(1201);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    auto dev = adam_device();
    model mdl(*dev);
    random_model(mdl, gen, 3000);
    adam_options o;
    o.mode = mode;
    o.chunk_elements = pick(gen, 64, 1024);
    o.max_grad_norm = 2.0;
    INFO("mode " << to_string(mode) << ", chunk " << o.chunk_elements);
    offload_adam opt(*dev, mdl.describe(), o, policy);
    std::vector<std::vector<std::uint64_t>> steps(mdl.groups.size());
    for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
      steps[g].assign(mdl.groups[g].size(), 0);
    }
    const auto path = std::filesystem::temp_directory_path() /
                      ("tierflow_masked_" + std::to_string(gen()) + ".tfck");
    for (int step = 0; step < 8; ++step) {
      const auto grads = mdl.random_grads(gen, 0.5f);
      mdl.set_grads(grads);
      // Each param has a grad with probability 1/2; a skipped param's grad holds NaN, so
      // reading it would poison the norm.
      double total = 0;
      std::vector<std::vector<std::vector<float>>> decoded(mdl.groups.size());
      std::vector<std::vector<char>> has(mdl.groups.size());
      for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
        for (std::size_t i = 0; i < mdl.groups[g].size(); ++i) {
          auto& t = mdl.groups[g][i];
          const bool active = pick(gen, 0, 1) == 1;
          has[g].push_back(active ? 1 : 0);
          const auto raw = test::encode_values(grads[g][i], t.dtype);
          decoded[g].push_back(decode(raw.data(), t.n, t.dtype));
          if (!active) {
            std::memset(t.grad, 0xff, t.n * dtype_bytes(t.dtype));  // NaN in every dtype
            opt.set_grad(g, i, nullptr);
            continue;
          }
          opt.set_grad(g, i, t.grad);
          for (std::size_t off = 0; off < t.n; off += o.chunk_elements) {
            total +=
                sum_squares_reference(decoded[g][i], off, std::min(o.chunk_elements, t.n - off));
          }
        }
      }
      const double norm = std::sqrt(total);
      const double clip = std::min(1.0, o.max_grad_norm / (norm + 1e-6));
      for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
        for (std::size_t i = 0; i < mdl.groups[g].size(); ++i) {
          if (has[g][i] == 0) {
            continue;
          }
          auto& t = mdl.groups[g][i];
          const auto s = scalars_of(mdl.hyper[g], ++steps[g][i], clip);
          for (std::size_t e = 0; e < t.n; ++e) {
            formula(t.p[e], t.m[e], t.v[e], decoded[g][i][e], s);
          }
        }
      }
      const auto r = opt.step();
      REQUIRE(r.applied);
      CHECK(r.grad_norm == norm);
      mdl.check_state(opt);
      mdl.check_device_params();  // a skipped param's device values were not rewritten
      for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
        for (std::size_t i = 0; i < mdl.groups[g].size(); ++i) {
          CHECK(opt.step_count(g, i) == steps[g][i]);
        }
      }
      if (step == 4) {
        opt.save(path);
      }
    }
    // The per-param step counts survive a checkpoint.
    model again(*dev);
    for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
      for (const auto& t : mdl.groups[g]) {
        again.add(g, t.name, t.dtype, test::nonzero_normals(t.n, 1.0f, gen));
      }
      again.hyper[g] = mdl.hyper[g];
    }
    offload_adam other(*dev, again.describe(), o, policy);
    opt.save(path);
    other.load(path);
    std::filesystem::remove(path);
    for (std::size_t g = 0; g < mdl.groups.size(); ++g) {
      CHECK(other.step_count(g) == opt.step_count(g));
      for (std::size_t i = 0; i < mdl.groups[g].size(); ++i) {
        CHECK(other.step_count(g, i) == steps[g][i]);
        CHECK(other.exp_avg_sq(g, i) == mdl.groups[g][i].v);
      }
    }
  }
}

TEST_CASE("set_state replaces a param's state and refresh_master re-reads its device values",
          "[adam]") {
  auto gen = test::rng(1202);
  const topology topo = topology::discover();
  auto policy = host_placement(topo);
  auto dev = adam_device();
  model mdl(*dev);
  mdl.add(0, "a", param_dtype::bf16, test::nonzero_normals(700, 1.0f, gen));
  mdl.add(0, "b", param_dtype::f32, test::nonzero_normals(300, 1.0f, gen));
  mdl.hyper[0] = test::random_hyper(gen);
  adam_options o;
  o.mode = adam_mode::cpu;
  o.chunk_elements = 256;
  offload_adam opt(*dev, mdl.describe(), o, policy);
  auto& a = mdl.groups[0][0];
  a.p = test::nonzero_normals(a.n, 1.0f, gen);
  a.m = test::nonzero_normals(a.n, 0.1f, gen);
  a.v = test::nonzero_normals(a.n, 0.1f, gen);
  for (auto& x : a.v) {
    x = x * x;
  }
  opt.set_state(0, 0, a.p.data(), a.m.data(), a.v.data(), a.n, 7);
  CHECK(opt.step_count(0, 0) == 7);
  CHECK(opt.step_count(0, 1) == 0);
  CHECK_FALSE(opt.params_current());  // the new master is sent by the next step or sync
  opt.sync_params();
  CHECK(opt.params_current());
  mdl.check_state(opt);
  mdl.check_device_params();
  // Refused values change nothing.
  auto bad = a.v;
  bad[pick(gen, 0, a.n - 1)] = -1.0f;
  CHECK_THROWS_WITH(opt.set_state(0, 0, nullptr, nullptr, bad.data(), a.n, 8),
                    Catch::Contains("exp_avg_sq[") && Catch::Contains("must be finite and >= 0"));
  CHECK_THROWS_WITH(opt.set_state(0, 0, a.p.data(), nullptr, nullptr, a.n - 1, 8),
                    Catch::Contains("has 700 elements, 699 given"));
  CHECK(opt.step_count(0, 0) == 7);
  mdl.check_state(opt);
  // The framework writes new values into param b; refresh_master takes them.
  auto& b = mdl.groups[0][1];
  b.p = test::nonzero_normals(b.n, 1.0f, gen);
  std::memcpy(b.param, b.p.data(), b.n * sizeof(float));
  CHECK(opt.master_weights(0, 1) != b.p);
  opt.refresh_master(0, 1);
  CHECK(opt.master_weights(0, 1) == b.p);
  // A step then continues from the state set, at each param's own step count.
  const auto grads = mdl.random_grads(gen, 0.3f);
  mdl.set_grads(grads);
  for (std::size_t i = 0; i < 2; ++i) {
    auto& t = mdl.groups[0][i];
    const auto raw = test::encode_values(grads[0][i], t.dtype);
    const auto g = decode(raw.data(), t.n, t.dtype);
    const auto s = scalars_of(mdl.hyper[0], i == 0 ? 8 : 1, 1.0);
    for (std::size_t e = 0; e < t.n; ++e) {
      formula(t.p[e], t.m[e], t.v[e], g[e], s);
    }
  }
  REQUIRE(opt.step().applied);
  mdl.check_state(opt);
  mdl.check_device_params();
  CHECK(opt.step_count(0) == 8);
}
