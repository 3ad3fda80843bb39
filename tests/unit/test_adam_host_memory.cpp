// offload_adam over params and grads in host memory (CPU tensors, pinned buffers): cpu mode
// reads the grads where they are, steps an fp32 param in place as its own master, and keeps
// every array it streams apart modulo the aliasing span (issue 35).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "adam_host_fixture.hpp"
#include "test_support.hpp"
#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"

using namespace tierflow;
using namespace tierflow::test::host_fixture;

TEST_CASE("stagger: arrays placed 256 MiB apart end up apart modulo the aliasing span",
          "[adam][stagger]") {
  auto gen = tierflow::test::rng(3501);
  // Bases exactly alias_span apart (as consecutive 256 MiB mmaps land), at a random start.
  const std::uintptr_t start = (gen() % (std::uintptr_t{1} << 40)) / 4096 * 4096;
  std::vector<std::uintptr_t> apart;
  std::vector<std::uintptr_t> placed;
  for (int k = 0; k < 8; ++k) {
    const std::uintptr_t base = start + static_cast<std::uintptr_t>(k) * detail::alias_span;
    const std::size_t off = detail::stagger_offset(reinterpret_cast<const void*>(base), apart);
    CHECK(off % detail::stagger_step == 0);
    CHECK(off < detail::stagger_slack);
    placed.push_back(base + off);
  }
  REQUIRE(apart == placed);
  for (std::size_t i = 0; i < placed.size(); ++i) {
    for (std::size_t j = i + 1; j < placed.size(); ++j) {
      CHECK(detail::alias_distance(placed[i], placed[j]) >= detail::stagger_step);
    }
  }
  // Already apart: nothing moves.
  std::vector<std::uintptr_t> far{start};
  CHECK(detail::stagger_offset(reinterpret_cast<const void*>(start + detail::alias_span / 2),
                               far) == 0);
  CHECK(detail::alias_distance(start, start + detail::alias_span + 4096) == 4096);
  CHECK(detail::alias_distance(start + 4096, start + detail::alias_span) == 4096);
}

TEST_CASE("cpu mode reads host grads in place and steps an fp32 host param as its own master",
          "[adam]") {
  auto gen = tierflow::test::rng(3502);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  // One param above the stagger threshold, small ones, and a bf16 one (its own master).
  std::vector<host_param> params;
  params.emplace_back(
      param_dtype::f32,
      detail::stagger_min_bytes / 4 + std::uniform_int_distribution<std::size_t>(1, 40000)(gen),
      gen);
  params.emplace_back(param_dtype::f32, std::uniform_int_distribution<std::size_t>(1, 3000)(gen),
                      gen);
  params.emplace_back(param_dtype::bf16, std::uniform_int_distribution<std::size_t>(1, 3000)(gen),
                      gen);
  adam_hyper hyper;
  hyper.lr = 1e-2;
  hyper.weight_decay = 0.05;
  std::size_t f32_elements = 0, bf16_elements = 0;
  for (auto& p : params) {
    p.draw_grads(gen);
    (p.dtype == param_dtype::f32 ? f32_elements : bf16_elements) += p.size();
  }
  const adam_group group = group_of(params, "p", hyper);
  adam_options o;
  o.mode = adam_mode::automatic;  // picks cpu: the params are host memory
  o.threads = static_cast<unsigned>(std::uniform_int_distribution<int>(1, 3)(gen));
  o.chunk_elements = std::uniform_int_distribution<std::size_t>(256, 65536)(gen);
  offload_adam opt(*dev, {group}, o, policy);
  REQUIRE(opt.mode() == adam_mode::cpu);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : params) {
      p.draw_grads(gen);
      p.reference_step(hyper);
    }
    const auto r = opt.step();
    REQUIRE(r.applied);
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("param " << i << " (" << params[i].size() << " elements), step " << step);
      CHECK(same_bits(opt.master_weights(0, i), params[i].master));
      CHECK(same_bits(opt.exp_avg(0, i), params[i].m));
      CHECK(same_bits(opt.exp_avg_sq(0, i), params[i].v));
      std::vector<float> expect = params[i].master;
      if (params[i].dtype != param_dtype::f32) {
        std::vector<std::uint16_t> narrow(expect.size());
        detail::store_params(adam_kernel::scalar, expect.data(), narrow.data(), params[i].dtype,
                             narrow.size());
        detail::load_as_f32(narrow.data(), params[i].dtype, expect.data(), expect.size());
      }
      CHECK(same_bits(params[i].param_as_f32(), expect));
    }
  }
  const adam_metrics m = opt.metrics();
  CHECK(m.bytes_d2h == 0);  // the grads were read where they are
  CHECK(m.bytes_h2d == 0);  // and the params written there
  // fp32: m and v only (8 B); bf16: the master too (12 B); plus the big param's stagger slack.
  const std::uint64_t exact = 8 * f32_elements + 12 * bf16_elements;
  CHECK(m.state_bytes >= exact);
  CHECK(m.state_bytes <= exact + 2 * detail::stagger_slack);
  // Written in place, the param is the master: a write to it is what the next step starts from.
  params[1].p32[0] = 3.5f;
  CHECK(opt.master_weights(0, 1)[0] == 3.5f);
}

TEST_CASE("a non-finite grad read in place leaves every byte of params and state as before",
          "[adam]") {
  auto gen = tierflow::test::rng(3503);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  for (const double clip : {0.0, 1.0}) {
    auto dev = host_test_device();
    std::vector<host_param> params;
    for (int i = 0; i < 3; ++i) {
      params.emplace_back(i == 2 ? param_dtype::bf16 : param_dtype::f32,
                          std::uniform_int_distribution<std::size_t>(1, 50000)(gen), gen);
    }
    const adam_group group = group_of(params, "w");
    adam_options o;
    o.mode = adam_mode::cpu;
    o.max_grad_norm = clip;
    o.chunk_elements = std::uniform_int_distribution<std::size_t>(64, 8192)(gen);
    offload_adam opt(*dev, {group}, o, policy);
    for (int step = 0; step < 2; ++step) {
      for (auto& p : params) {
        p.draw_grads(gen);
      }
      REQUIRE(opt.step().applied);
    }
    for (auto& p : params) {
      p.draw_grads(gen);
    }
    const std::size_t bad = std::uniform_int_distribution<std::size_t>(0, 2)(gen);
    const std::size_t at =
        std::uniform_int_distribution<std::size_t>(0, params[bad].size() - 1)(gen);
    const float poison = gen() % 2 == 0 ? std::numeric_limits<float>::infinity()
                                        : std::numeric_limits<float>::quiet_NaN();
    if (params[bad].dtype == param_dtype::f32) {
      params[bad].g[at] = poison;
    } else {
      detail::store_params(adam_kernel::scalar, &poison, &params[bad].g16[at], param_dtype::bf16,
                           1);
    }
    std::vector<std::vector<float>> before[4];
    for (std::size_t i = 0; i < params.size(); ++i) {
      before[0].push_back(params[i].param_as_f32());
      before[1].push_back(opt.master_weights(0, i));
      before[2].push_back(opt.exp_avg(0, i));
      before[3].push_back(opt.exp_avg_sq(0, i));
    }
    const auto r = opt.step();
    INFO("clip " << clip << ", poison in w" << bad << "[" << at << "]");
    CHECK_FALSE(r.applied);
    CHECK_THAT(r.skip_reason, Catch::Contains("'w" + std::to_string(bad) + "'") &&
                                  Catch::Contains("element " + std::to_string(at)));
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(same_bits(params[i].param_as_f32(), before[0][i]));
      CHECK(same_bits(opt.master_weights(0, i), before[1][i]));
      CHECK(same_bits(opt.exp_avg(0, i), before[2][i]));
      CHECK(same_bits(opt.exp_avg_sq(0, i), before[3][i]));
      CHECK(opt.step_count(0, i) == 2);
    }
  }
}

TEST_CASE("a device grad for a param in host memory is refused, naming the param", "[adam]") {
  auto gen = tierflow::test::rng(3504);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  std::vector<host_param> one;
  one.emplace_back(param_dtype::f32, std::uniform_int_distribution<std::size_t>(1, 5000)(gen), gen);
  host_param& hp = one.front();
  hp.draw_grads(gen);
  const adam_group group = group_of(one, "host_w");
  adam_options o;
  o.mode = adam_mode::cpu;
  offload_adam opt(*dev, {group}, o, policy);
  REQUIRE(opt.step().applied);
  const auto state = opt.exp_avg(0, 0);
  auto on_device = dev->memory().allocate(hp.size() * sizeof(float));
  CHECK_THROWS_WITH(opt.set_grad(0, 0, on_device),
                    Catch::Contains("'host_w'") && Catch::Contains("host memory"));
  CHECK(same_bits(opt.exp_avg(0, 0), state));
  REQUIRE(opt.step().applied);  // its own grad still
  dev->memory().deallocate(on_device, hp.size() * sizeof(float));
}

TEST_CASE("a timeout waiting for grads read in place is the step's error, the state untouched",
          "[adam]") {
  auto gen = tierflow::test::rng(3505);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  std::vector<host_param> one;
  one.emplace_back(param_dtype::f32, std::uniform_int_distribution<std::size_t>(1, 5000)(gen), gen);
  host_param& hp = one.front();
  hp.draw_grads(gen);
  const adam_group group = group_of(one, "late");
  adam_options o;
  o.mode = adam_mode::cpu;
  o.device_timeout_s = 0.05;
  offload_adam opt(*dev, {group}, o, policy);
  REQUIRE(opt.step().applied);
  const auto p_before = hp.param_as_f32();
  const auto m_before = opt.exp_avg(0, 0);
  // The work that makes the grads (the compute stream) outlasts the step's deadline.
  dev->delay_stream(dev->compute_stream(), std::chrono::milliseconds(400));
  try {
    (void)opt.step();
    FAIL("the step did not time out");
  } catch (const adam_step_error& e) {
    CHECK_FALSE(e.applied());
    CHECK_THAT(e.what(), Catch::Contains("timed out") && Catch::Contains("not applied"));
  }
  dev->synchronize();
  CHECK(same_bits(hp.param_as_f32(), p_before));
  CHECK(same_bits(opt.exp_avg(0, 0), m_before));
  CHECK(opt.step_count(0, 0) == 1);
  REQUIRE(opt.step().applied);  // once the work is done, the step runs
  CHECK(opt.step_count(0, 0) == 2);
}

TEST_CASE("set_grads checks every grad before setting any", "[adam]") {
  auto gen = tierflow::test::rng(3506);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  std::vector<host_param> params;
  for (int i = 0; i < 2; ++i) {
    params.emplace_back(param_dtype::f32, std::uniform_int_distribution<std::size_t>(1, 5000)(gen),
                        gen);
    params.back().draw_grads(gen);
  }
  const adam_group group = group_of(params, "w");
  adam_options o;
  o.mode = adam_mode::cpu;
  offload_adam opt(*dev, {group}, o, policy);
  // w0 gets a poisoned grad, w1 a device grad (refused): w0's must not be taken either.
  std::vector<float> poisoned(params[0].size(), std::numeric_limits<float>::quiet_NaN());
  auto* on_device = dev->memory().allocate(params[1].size() * sizeof(float));
  CHECK_THROWS_WITH(opt.set_grads({{0, 0, poisoned.data()}, {0, 1, on_device}}),
                    Catch::Contains("'w1'"));
  const auto r = opt.step();
  CHECK(r.applied);  // with the grads given at creation, finite
  dev->memory().deallocate(on_device, params[1].size() * sizeof(float));
}

namespace {

// The rule adopt_param_writes() implements, an element at a time: where the param differs
// from the master stored as its dtype, the master takes the param's value.
std::size_t adopt_by_hand(std::vector<float>& master, const void* param, param_dtype dtype) {
  const std::size_t eb = dtype_bytes(dtype);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    unsigned char stored[4];
    detail::store_params(adam_kernel::scalar, &master[i], stored, dtype, 1);
    const auto* at = static_cast<const unsigned char*>(param) + i * eb;
    if (std::memcmp(stored, at, eb) != 0) {
      detail::load_as_f32(at, dtype, &master[i], 1);
      ++differ;
    }
  }
  return differ;
}

}  // namespace

TEST_CASE("adopt_param_writes: every kernel finds the params written outside the master",
          "[adam]") {
  auto gen = tierflow::test::rng(3504);
  for (adam_kernel kernel : tierflow::test::kernels_here()) {
    for (param_dtype dtype : {param_dtype::f32, param_dtype::bf16, param_dtype::f16}) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 5000)(gen);
      host_param p(dtype, n, gen);
      std::vector<float> master = p.master;  // the param is the master stored as its dtype
      auto* param = static_cast<unsigned char*>(p.param());
      const std::size_t eb = dtype_bytes(dtype);
      // Random elements written: new values, and some the same value again (not a change).
      std::normal_distribution<float> d(0.f, 2.f);
      for (std::size_t k = std::uniform_int_distribution<std::size_t>(0, n / 3)(gen); k > 0; --k) {
        const std::size_t i = gen() % n;
        const float value = gen() % 4 == 0 ? master[i] : d(gen);
        unsigned char bits[4];
        detail::store_params(adam_kernel::scalar, &value, bits, dtype, 1);
        std::memcpy(param + i * eb, bits, eb);
      }
      std::vector<float> expect = master;
      const std::size_t want = adopt_by_hand(expect, param, dtype);
      INFO("kernel " << to_string(kernel) << ", " << to_string(dtype) << ", " << n << " elements, "
                     << want << " written");
      CHECK(detail::adopt_param_writes(kernel, master.data(), nullptr, param, dtype, n) == want);
      CHECK(same_bits(master, p.master));  // counted only
      CHECK(detail::adopt_param_writes(kernel, master.data(), master.data(), param, dtype, n) ==
            want);
      CHECK(same_bits(master, expect));
      CHECK(detail::adopt_param_writes(kernel, master.data(), nullptr, param, dtype, n) == 0);
    }
  }
}

TEST_CASE(
    "cpu mode: a host param's write outside the optimizer (no call) is what the next step "
    "starts from, in each overlap mode",
    "[adam]") {
  auto gen = tierflow::test::rng(3505);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  for (const adam_overlap overlap :
       {adam_overlap::none, adam_overlap::backward, adam_overlap::backward_publish}) {
    // bf16 and fp16 params have a master of their own; with an overlap fp32 ones do too.
    std::vector<host_param> params;
    params.emplace_back(param_dtype::bf16, std::uniform_int_distribution<std::size_t>(1, 9000)(gen),
                        gen);
    params.emplace_back(param_dtype::f32, std::uniform_int_distribution<std::size_t>(1, 9000)(gen),
                        gen);
    params.emplace_back(param_dtype::f16, std::uniform_int_distribution<std::size_t>(1, 3000)(gen),
                        gen);
    adam_hyper hyper;
    hyper.lr = 1e-2;
    hyper.weight_decay = 0.05;
    for (auto& p : params) {
      p.draw_grads(gen);
    }
    const adam_group group = group_of(params, "p", hyper);
    adam_options o;
    o.mode = adam_mode::cpu;
    o.overlap = overlap;
    o.threads = static_cast<unsigned>(std::uniform_int_distribution<int>(1, 3)(gen));
    o.chunk_elements = std::uniform_int_distribution<std::size_t>(256, 4096)(gen);
    INFO("overlap " << to_string(o.overlap) << ", chunks of " << o.chunk_elements);
    offload_adam opt(*dev, {group}, o, policy);
    std::uint64_t written = 0;  // values the reference adopted: those a master of its own sees
    for (int step = 0; step < 5; ++step) {
      for (auto& p : params) {
        p.draw_grads(gen);
        if (step % 2 == 1) {  // writes between two steps, before the next backward pass
          std::normal_distribution<float> d(0.f, 1.f);
          auto* param = static_cast<unsigned char*>(p.param());
          const std::size_t eb = dtype_bytes(p.dtype);
          for (std::size_t k = 1 + gen() % (p.size() / 2 + 1); k > 0; --k) {
            const float value = d(gen);
            detail::store_params(adam_kernel::scalar, &value, param + (gen() % p.size()) * eb,
                                 p.dtype, 1);
          }
          const std::size_t adopted = adopt_by_hand(p.master, p.param(), p.dtype);
          // An fp32 param stepped without an overlap is its own master: nothing to adopt.
          const bool own = p.dtype == param_dtype::f32 && o.overlap == adam_overlap::none;
          written += own ? 0 : adopted;
        }
        p.reference_step(hyper);
      }
      if (o.overlap != adam_overlap::none) {
        for (std::size_t i = 0; i < params.size(); ++i) {
          opt.grad_ready(0, i);
        }
      }
      REQUIRE(opt.step().applied);
      for (std::size_t i = 0; i < params.size(); ++i) {
        INFO("param " << i << " (" << to_string(params[i].dtype) << ", " << params[i].size()
                      << " elements), step " << step);
        CHECK(same_bits(opt.master_weights(0, i), params[i].master));
        CHECK(same_bits(opt.exp_avg(0, i), params[i].m));
        CHECK(same_bits(opt.exp_avg_sq(0, i), params[i].v));
        std::vector<float> expect(params[i].size());
        std::vector<unsigned char> narrow(params[i].size() * 4);
        detail::store_params(adam_kernel::scalar, params[i].master.data(), narrow.data(),
                             params[i].dtype, expect.size());
        detail::load_as_f32(narrow.data(), params[i].dtype, expect.data(), expect.size());
        CHECK(same_bits(params[i].param_as_f32(), expect));
      }
    }
    REQUIRE(written > 0);
    CHECK(opt.metrics().param_writes_adopted == written);
  }
}
