// The master in 16 bits (adam_master::remainder, issue 37): the split and join against their
// definition over every kind of float, offload_adam's bf16 params stepped bit for bit as with a
// separate fp32 master (every state dtype, clipping, a skipped step, set_state, refresh_master,
// checkpoints both ways), 2 B of master per param, and the refusals where it cannot apply.
#include <algorithm>
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
#include "tierflow/detail/adam_master.hpp"
#include "tierflow/detail/stagger.hpp"
#include "tierflow/error.hpp"
#include "tierflow/offload_adam.hpp"

using namespace tierflow;
using namespace tierflow::test::host_fixture;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(std::uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

// The bf16 nearest @p x, ties away from zero, from its value: the two bf16 neighbours of x
// (truncation and the next one away from zero) compared by their distance in double.
std::uint16_t nearest_ties_away(float x) {
  const std::uint32_t u = bits_of(x);
  const auto below = static_cast<std::uint16_t>(u >> 16);  // toward zero
  const auto above = static_cast<std::uint16_t>(below + 1);
  const double to_below = std::fabs(static_cast<double>(x) - float_of(std::uint32_t{below} << 16));
  // Past the largest finite bf16 the next value is 2^128 (IEEE rounding overflows to
  // infinity from half an ulp above the largest).
  const double above_value = (above & 0x7fffu) == 0x7f80u
                                 ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(x))
                                 : static_cast<double>(float_of(std::uint32_t{above} << 16));
  const double to_above = std::fabs(above_value - static_cast<double>(x));
  return to_above <= to_below ? above : below;
}

// Random finite floats of every kind: normal over the whole range, subnormal, zeros of both
// signs, ties (low half 0x8000), neighbours of ties, the largest finite ones.
std::vector<float> every_kind(std::size_t n, std::mt19937_64& gen) {
  std::vector<float> out;
  std::uniform_int_distribution<std::uint32_t> any;
  while (out.size() < n) {
    std::uint32_t u = any(gen);
    switch (out.size() % 6) {
      case 1:
        u &= 0x807fffffu;  // subnormal (or zero)
        break;
      case 2:
        u = (u & 0xffff0000u) | 0x8000u;  // a tie
        break;
      case 3:
        u = (u & 0xffff0000u) | (0x7fffu + (u & 2));  // beside a tie
        break;
      case 4:
        u = (u & 0x80000000u) | (0x7f7f0000u + (u & 0xffffu));  // the top of the range
        break;
      default:
        break;
    }
    if (std::isfinite(float_of(u))) {
      out.push_back(float_of(u));
    }
  }
  out[0] = 0.f;
  out[1] = -0.f;
  return out;
}

// Two host-memory optimizers over the same bf16 and fp32 params: master fp32 and remainder.
struct twin_run {
  std::vector<host_param> plain, split;  // the same values, each run's own memory
  adam_options options;
  adam_hyper hyper;

  twin_run(std::mt19937_64& gen, adam_state_dtype dtype, std::size_t n16, std::size_t n32) {
    plain.emplace_back(param_dtype::bf16, n16, gen);
    plain.emplace_back(param_dtype::f32, n32, gen);
    plain.emplace_back(param_dtype::bf16, 300 + gen() % 700, gen);  // small: fp32 moments (int8)
    split = plain;
    options.mode = gen() % 2 == 0 ? adam_mode::cpu : adam_mode::automatic;
    options.state_dtype = dtype;
    options.threads = 1 + static_cast<unsigned>(gen() % 2);
    options.chunk_elements = 2000 + gen() % 30000;
    hyper.lr = 1e-2;
    hyper.weight_decay = 0.03;
  }
  [[nodiscard]] adam_options with(adam_master master) const {
    adam_options o = options;
    o.master = master;
    return o;
  }
  void draw_grads(std::mt19937_64& gen) {
    for (std::size_t i = 0; i < plain.size(); ++i) {
      plain[i].draw_grads(gen);
      split[i].g = plain[i].g;
      split[i].g16 = plain[i].g16;
    }
  }
};

// Both optimizers' state, param by param: masters and moments bit for bit; the bf16 params
// each their master's rounding (to even for the fp32 master, ties away for the split one).
void check_twins(twin_run& t, offload_adam& plain, offload_adam& split) {
  for (std::size_t i = 0; i < t.plain.size(); ++i) {
    INFO("param " << i << " (" << t.plain[i].size() << " elements)");
    const std::vector<float> master = plain.master_weights(0, i);
    REQUIRE(same_bits(split.master_weights(0, i), master));
    CHECK(same_bits(split.exp_avg(0, i), plain.exp_avg(0, i)));
    CHECK(same_bits(split.exp_avg_sq(0, i), plain.exp_avg_sq(0, i)));
    if (t.plain[i].dtype == param_dtype::f32) {
      CHECK(same_bits(t.split[i].p32, t.plain[i].p32));
      continue;
    }
    std::size_t wrong = 0;
    std::size_t ties = 0;
    for (std::size_t k = 0; k < master.size(); ++k) {
      wrong += t.split[i].p16[k] != nearest_ties_away(master[k]) ? 1 : 0;
      const bool tie = (bits_of(master[k]) & 0xffffu) == 0x8000u;
      ties += tie ? 1 : 0;
      // Away from a tie both roundings agree: the params are the same bits.
      wrong += !tie && t.split[i].p16[k] != t.plain[i].p16[k] ? 1 : 0;
    }
    CHECK(wrong == 0);
    INFO("exact ties in the masters: " << ties);
  }
}

}  // namespace

TEST_CASE(
    "master remainder: the split gives every finite float back, the param rounded to "
    "nearest with ties away from zero",
    "[adam][master]") {
  auto gen = tierflow::test::rng(3710);
  const std::vector<float> x = every_kind(200000, gen);
  std::vector<std::uint16_t> param(x.size());
  std::vector<std::uint16_t> low(x.size());
  std::vector<float> back(x.size());
  detail::split_master(x.data(), param.data(), low.data(), x.size());
  detail::join_master(param.data(), low.data(), back.data(), x.size());
  REQUIRE(same_bits(back, x));
  std::size_t ties = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i] << " (0x" << std::hex << bits_of(x[i]) << ")");
    REQUIRE(param[i] == nearest_ties_away(x[i]));
    ties += (bits_of(x[i]) & 0xffffu) == 0x8000u ? 1 : 0;
  }
  CHECK(ties > x.size() / 10);  // the ties were there to test
  // Every kernel's split and join give the scalar definition's bits (odd lengths: the tails).
  for (adam_kernel kernel : tierflow::test::kernels_here()) {
    INFO("kernel " << to_string(kernel));
    const std::size_t n = x.size() - gen() % 8;
    std::vector<std::uint16_t> p2(n), l2(n);
    std::vector<float> b2(n);
    detail::split_master(kernel, x.data(), p2.data(), l2.data(), n);
    CHECK(std::equal(p2.begin(), p2.end(), param.begin()));
    CHECK(std::equal(l2.begin(), l2.end(), low.begin()));
    detail::join_master(kernel, p2.data(), l2.data(), b2.data(), n);
    CHECK(std::memcmp(b2.data(), x.data(), n * sizeof(float)) == 0);
  }
  // The signed remainder lies within half a bf16 ulp.
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto d = static_cast<std::int16_t>(low[i]);
    REQUIRE(d >= -0x8000);
    REQUIRE(d <= 0x7fff);
  }
}

TEST_CASE(
    "master remainder: bf16 params step bit for bit as with a separate fp32 master, in "
    "2 B per param",
    "[adam][master]") {
  auto gen = tierflow::test::rng(3711);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    INFO("state " << to_string(dtype));
    twin_run t(gen, dtype, 20000 + gen() % 40000, 5000 + gen() % 5000);
    const bool clip = gen() % 2 == 0;
    t.options.max_grad_norm = clip ? 0.5 : 0.0;  // the grads' norm is ~0.1 * sqrt(n) > 0.5
    INFO("clip " << clip << ", threads " << t.options.threads << ", chunk "
                 << t.options.chunk_elements);
    offload_adam plain(*dev, {group_of(t.plain, "p", t.hyper)}, t.with(adam_master::fp32), policy);
    offload_adam split(*dev, {group_of(t.split, "p", t.hyper)}, t.with(adam_master::remainder),
                       policy);
    REQUIRE(split.mode() == adam_mode::cpu);
    for (int step = 1; step <= 5; ++step) {
      INFO("step " << step);
      t.draw_grads(gen);
      if (step == 3) {  // a non-finite grad: skipped, every bit kept
        t.plain[0].g16[7] = t.split[0].g16[7] = 0x7fc0;  // NaN
      }
      const auto a = plain.step();
      const auto b = split.step();
      REQUIRE(a.applied == (step != 3));
      REQUIRE(b.applied == a.applied);
      check_twins(t, plain, split);
    }
    // 4 B of master per bf16 element -> 2 B (the fp32 params are their own master in both).
    const double bf16_elements = static_cast<double>(t.plain[0].size() + t.plain[2].size());
    const auto saved = static_cast<double>(plain.metrics().state_bytes) -
                       static_cast<double>(split.metrics().state_bytes);
    INFO("state bytes: fp32 master " << plain.metrics().state_bytes << ", remainder "
                                     << split.metrics().state_bytes);
    CHECK(saved >= 2 * bf16_elements - 64);
    CHECK(saved <= 2 * bf16_elements + 2 * detail::stagger_slack);
  }
}

TEST_CASE("master remainder: set_state, refresh_master and checkpoints keep the master exact",
          "[adam][master]") {
  auto gen = tierflow::test::rng(3712);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  tierflow::test::scratch_dir dir;
  const adam_state_dtype dtype = gen() % 2 == 0 ? adam_state_dtype::int8 : adam_state_dtype::f32;
  INFO("state " << to_string(dtype));
  twin_run t(gen, dtype, 9000 + gen() % 9000, 4100 + gen() % 900);
  offload_adam plain(*dev, {group_of(t.plain, "p", t.hyper)}, t.with(adam_master::fp32), policy);
  offload_adam split(*dev, {group_of(t.split, "p", t.hyper)}, t.with(adam_master::remainder),
                     policy);
  for (int step = 0; step < 3; ++step) {
    t.draw_grads(gen);
    REQUIRE(plain.step().applied);
    REQUIRE(split.step().applied);
  }
  // A master given by set_state comes back exactly; the param takes it at once.
  std::vector<float> finite_small(t.plain[0].size());
  std::normal_distribution<float> d(0.f, 2.f);
  for (auto& x : finite_small) {
    x = d(gen);
  }
  split.set_state(0, 0, finite_small.data(), nullptr, nullptr, finite_small.size(), 3);
  REQUIRE(same_bits(split.master_weights(0, 0), finite_small));
  for (std::size_t k = 0; k < finite_small.size(); ++k) {
    REQUIRE(t.split[0].p16[k] == nearest_ties_away(finite_small[k]));
  }
  plain.set_state(0, 0, finite_small.data(), nullptr, nullptr, finite_small.size(), 3);
  // Checkpoints: the split run's file loads into an fp32-master optimizer and back, exactly.
  const auto from_split = dir.path() / "split.tfck";
  const auto from_plain = dir.path() / "plain.tfck";
  split.save(from_split);
  plain.save(from_plain);
  twin_run u = t;  // fresh memory for two more optimizers, the same shapes
  offload_adam plain2(*dev, {group_of(u.plain, "p", u.hyper)}, u.with(adam_master::fp32), policy);
  offload_adam split2(*dev, {group_of(u.split, "p", u.hyper)}, u.with(adam_master::remainder),
                      policy);
  plain2.load(from_split);
  split2.load(from_plain);
  for (std::size_t i = 0; i < t.plain.size(); ++i) {
    INFO("param " << i);
    const std::vector<float> master = split.master_weights(0, i);
    CHECK(same_bits(plain.master_weights(0, i), master));
    CHECK(same_bits(plain2.master_weights(0, i), master));
    CHECK(same_bits(split2.master_weights(0, i), master));
    CHECK(same_bits(split2.exp_avg_sq(0, i), split.exp_avg_sq(0, i)));
  }
  // The next step from the loaded states: the four optimizers agree.
  t.draw_grads(gen);
  u.draw_grads(gen);
  for (std::size_t i = 0; i < t.plain.size(); ++i) {  // the same grads for all four
    u.plain[i].g = u.split[i].g = t.plain[i].g;
    u.plain[i].g16 = u.split[i].g16 = t.plain[i].g16;
  }
  REQUIRE(plain.step().applied);
  REQUIRE(split.step().applied);
  REQUIRE(plain2.step().applied);
  REQUIRE(split2.step().applied);
  for (std::size_t i = 0; i < t.plain.size(); ++i) {
    const std::vector<float> master = split.master_weights(0, i);
    CHECK(same_bits(plain.master_weights(0, i), master));
    CHECK(same_bits(plain2.master_weights(0, i), master));
    CHECK(same_bits(split2.master_weights(0, i), master));
  }
  check_twins(t, plain, split);
  // A param written from outside, then refresh_master: the master is the param's value, no
  // remainder left.
  for (auto& x : t.split[0].p16) {
    x = static_cast<std::uint16_t>(x ^ 0x0001u);
  }
  split.refresh_master(0, 0);
  const std::vector<float> refreshed = split.master_weights(0, 0);
  for (std::size_t k = 0; k < refreshed.size(); ++k) {
    REQUIRE(bits_of(refreshed[k]) == std::uint32_t{t.split[0].p16[k]} << 16);
  }
}

TEST_CASE("master remainder is refused where it cannot apply, by name and reason",
          "[adam][master]") {
  auto gen = tierflow::test::rng(3713);
  const topology topo = topology::discover();
  auto policy = test_placement(topo);
  auto dev = host_test_device();
  std::vector<host_param> params;
  params.emplace_back(param_dtype::bf16, 5000, gen);
  adam_options o;
  o.mode = adam_mode::cpu;
  o.master = adam_master::remainder;
  const auto refused = [&](const std::vector<adam_group>& groups, const adam_options& opts,
                           const std::string& words) {
    REQUIRE_THROWS_WITH(offload_adam(*dev, groups, opts, policy),
                        Catch::Contains("remainder") && Catch::Contains(words));
  };
  adam_options overlap = o;
  overlap.overlap = adam_overlap::backward;
  refused({group_of(params, "w")}, overlap, "overlap backward");
  adam_options streamed = o;
  streamed.mode = adam_mode::streamed;
  refused({group_of(params, "w")}, streamed, "mode streamed");
  std::vector<host_param> halves;
  halves.emplace_back(param_dtype::f16, 5000, gen);
  refused({group_of(halves, "h")}, o, "param 'h'");
  refused({group_of(halves, "h")}, o, "fp16");
  // A param in device memory.
  const std::size_t bytes = 5000 * 2;
  void* on_device = dev->memory().allocate(bytes);
  void* grad_on_device = dev->memory().allocate(bytes);
  adam_group g;
  adam_param d;
  d.name = "d";
  d.param = on_device;
  d.grad = grad_on_device;
  d.dtype = param_dtype::bf16;
  d.elements = 5000;
  g.params.push_back(d);
  adam_options automatic = o;
  automatic.mode = adam_mode::automatic;
  refused({g}, automatic, "param 'd'");
  refused({g}, o, "not in host memory");
  dev->memory().deallocate(on_device, bytes);
  dev->memory().deallocate(grad_on_device, bytes);
  // fp32 and bf16 host params together are accepted (fp32 ones are their own master).
  std::vector<host_param> mixed;
  mixed.emplace_back(param_dtype::f32, 3000, gen);
  mixed.emplace_back(param_dtype::bf16, 3000, gen);
  CHECK_NOTHROW(offload_adam(*dev, {group_of(mixed, "m")}, o, policy));
  CHECK(parse_adam_master("remainder") == adam_master::remainder);
  CHECK(parse_adam_master("fp32") == adam_master::fp32);
  CHECK_FALSE(parse_adam_master("fp16").has_value());
}
