// Issue 22, class 1: numbers that overflow, wrap or mean nothing (docs/bad-input.md). Each
// option is checked against what it multiplies into and what the kernels really use (floats),
// in one place (detail::check_options, detail::check_hyper); rates have a valid range.

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/tierflow.h"
#include "tierflow/topology.hpp"
#include "topology/measured_cache.hpp"

using namespace tierflow;
using test::adam_plan;
using test::adam_rig;
using test::uniform;

namespace {

// A small cpu-mode plan: one group, one or two params of a few hundred elements.
adam_plan small_plan(std::mt19937_64& gen) {
  auto plan = test::device_params_plan(gen, adam_mode::cpu, 600);
  plan.groups.resize(1);
  plan.hyper.resize(1);
  plan.options.max_grad_norm = 0;
  return plan;
}

// Builds @p plan and steps it twice: the state must match the scalar reference (or, with
// clipping, be finite). Returns "" or the refusal's message.
std::string build_and_step(const adam_plan& plan, placement_policy& policy) {
  adam_rig rig(plan);
  try {
    rig.build(policy);
  } catch (const error& e) {
    return e.what();
  }
  for (std::uint64_t s = 0; s < 2; ++s) {
    rig.set_grads(s);
    try {
      const auto r = rig.opt().step();
      INFO(r.skip_reason);
      if (!r.applied) {
        // The rig's grads are 0.3 x loss_scale normals: a huge scale makes them inf in f16 or
        // bf16, and skipping the step is then right.
        REQUIRE(plan.options.loss_scale > 1e4);
        REQUIRE_THAT(r.skip_reason, Catch::StartsWith("non-finite grad"));
        return "skipped: " + r.skip_reason;
      }
    } catch (const adam_step_error& e) {
      // A tiny device_timeout_s may time out for real: a clear error, nothing applied.
      REQUIRE(plan.options.device_timeout_s > 0);
      REQUIRE(plan.options.device_timeout_s < 1e-3);
      REQUIRE(e.result() == adam_step_error::outcome::not_applied);
      return e.what();
    }
  }
  if (plan.options.max_grad_norm == 0) {
    REQUIRE(rig.state() == rig.reference_state(2));
  }
  for (std::size_t i = 0; i < plan.groups[0].size(); ++i) {
    for (float x : rig.opt().master_weights(0, i)) {
      REQUIRE(std::isfinite(x));
    }
  }
  return {};
}

}  // namespace

TEST_CASE("bad input: adam options are checked against what they multiply into",
          "[bad_input][adam][numbers]") {
  auto gen = test::rng(0x22a1);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  const unsigned most_threads =
      std::min(1024u, 4u * std::max(1u, std::thread::hardware_concurrency()));
  struct row {
    const char* what;
    std::function<void(adam_plan&)> change;
    const char* refusal;  // nullptr: accepted, and it steps as the reference
  };
  const std::vector<row> rows = {
      {"a chunk near 2^63 (bf16 param): clamped to the param",
       [](adam_plan& p) {
         p.groups[0][0].dtype = param_dtype::bf16;
         p.options.chunk_elements = (std::size_t{1} << 63) + 12345;
       },
       nullptr},
      {"chunk SIZE_MAX", [](adam_plan& p) { p.options.chunk_elements = SIZE_MAX; }, nullptr},
      {"device_timeout_s 1e10 (wrapped the ns conversion)",
       [](adam_plan& p) { p.options.device_timeout_s = 1e10; }, "device_timeout_s must be"},
      {"device_timeout_s just over the cap",
       [](adam_plan& p) { p.options.device_timeout_s = 1e6 * (1 + 1e-9); }, "at most 1e+06"},
      {"device_timeout_s at the cap", [](adam_plan& p) { p.options.device_timeout_s = 1e6; },
       nullptr},
      {"threads UINT_MAX",
       [](adam_plan& p) { p.options.threads = std::numeric_limits<unsigned>::max(); },
       "threads must be at most"},
      {"threads one over the cap", [&](adam_plan& p) { p.options.threads = most_threads + 1; },
       "threads must be at most"},
      {"eps 1e-50 (0 as a float)", [](adam_plan& p) { p.hyper[0].eps = 1e-50; },
       "eps must be finite as a float"},
      {"eps 1e300 (inf as a float)", [](adam_plan& p) { p.hyper[0].eps = 1e300; },
       "eps must be finite as a float"},
      {"lr 1e39 (inf as a float)", [](adam_plan& p) { p.hyper[0].lr = 1e39; }, "lr / (1 - beta1)"},
      {"lr 1e37 with beta1 0.99 (the step size inf as a float)",
       [](adam_plan& p) {
         p.hyper[0].lr = 1e37;
         p.hyper[0].beta1 = 0.99;
       },
       "lr / (1 - beta1)"},
      {"weight_decay 1e39", [](adam_plan& p) { p.hyper[0].weight_decay = 1e39; },
       "weight_decay and lr * weight_decay"},
      {"loss_scale 1e300 (inf as a float)", [](adam_plan& p) { p.options.loss_scale = 1e300; },
       "loss_scale must be"},
      {"loss_scale 1e-45 (1 / it inf as a float)",
       [](adam_plan& p) { p.options.loss_scale = 1e-45; }, "loss_scale must be"},
      {"max_grad_norm 1e300", [](adam_plan& p) { p.options.max_grad_norm = 1e300; },
       "max_grad_norm must be"},
  };
  for (const auto& r : rows) {
    auto plan = small_plan(gen);
    r.change(plan);
    INFO(r.what << ": " << plan.describe());
    const std::string message = build_and_step(plan, policy);
    if (r.refusal == nullptr) {
      CHECK(message.empty());
    } else {
      CHECK_THAT(message, Catch::StartsWith("offload_adam: ") && Catch::Contains(r.refusal));
    }
  }
}

TEST_CASE("bad input: a chunk larger than every param pins no more than the largest param",
          "[bad_input][adam][numbers]") {
  auto gen = test::rng(0x22a2);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  auto plan = small_plan(gen);
  plan.groups[0].resize(1);
  plan.groups[0][0].elements = uniform(gen, 500, 1500);
  plan.groups[0][0].dtype = param_dtype::bf16;  // the cpu step stages bf16 grads per chunk
  plan.options.chunk_elements = std::size_t{1} << 40;
  adam_rig rig(plan);
  rig.build(policy);
  const auto m = rig.opt().metrics();
  CHECK(m.chunks == 1);
  rig.set_grads(0);
  CHECK(rig.opt().step().applied);
  CHECK(rig.state() == rig.reference_state(1));
}

TEST_CASE("bad input: random adam_options are refused with a reason or step as the reference",
          "[bad_input][adam][numbers][random]") {
  auto gen = test::rng(0x22a3);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  // Values across and beyond every range: hostile ones (inf, nan, huge, tiny, negative) and
  // ordinary ones, each field drawn on its own.
  const double hostile[] = {0.0,
                            -1.0,
                            1e-300,
                            1e-45,
                            1e-39,
                            1e-8,
                            1.0,
                            64.0,
                            1e10,
                            1e38,
                            1e300,
                            std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::max()};
  const auto pick = [&] { return hostile[uniform(gen, 0, std::size(hostile) - 1)]; };
  for (int round = 0; round < 40; ++round) {
    auto plan = small_plan(gen);
    auto& o = plan.options;
    if (uniform(gen, 0, 1) == 0) {
      o.chunk_elements =
          uniform(gen, 0, 2) == 0 ? SIZE_MAX - uniform(gen, 0, 100) : uniform(gen, 0, 4096);
    }
    if (uniform(gen, 0, 1) == 0) {
      o.threads = uniform(gen, 0, 1) == 0 ? static_cast<unsigned>(gen()) : 0u;
    }
    if (uniform(gen, 0, 2) == 0) {
      o.loss_scale = pick();
    }
    if (uniform(gen, 0, 2) == 0) {
      o.max_grad_norm = pick();
    }
    if (uniform(gen, 0, 2) == 0) {
      o.device_timeout_s = pick();
    }
    if (uniform(gen, 0, 3) == 0) {
      plan.hyper[0].eps = pick();
    }
    if (uniform(gen, 0, 3) == 0) {
      plan.hyper[0].lr = pick();
    }
    INFO("round " << round << ": " << plan.describe() << " chunk " << o.chunk_elements
                  << " threads " << o.threads << " loss_scale " << o.loss_scale << " max_grad_norm "
                  << o.max_grad_norm << " timeout " << o.device_timeout_s << " eps "
                  << plan.hyper[0].eps << " lr " << plan.hyper[0].lr);
    const std::string message = build_and_step(plan, policy);
    if (!message.empty()) {
      CHECK_THAT(message, (Catch::StartsWith("offload_adam: ") && Catch::Contains("must")) ||
                              Catch::Contains("device_timeout_s") ||
                              Catch::StartsWith("skipped: non-finite grad"));
    }
  }
}

TEST_CASE("bad input: random tf_adam_options are refused with a status or step",
          "[bad_input][capi][numbers][random]") {
  auto gen = test::rng(0x22a4);
  tf_device* dev = nullptr;
  REQUIRE(tf_device_open("emulated", &dev) == TF_OK);
  const std::size_t n = uniform(gen, 16, 700);
  void* param = nullptr;
  void* grad = nullptr;
  REQUIRE(tf_device_alloc(dev, n * 4, &param) == TF_OK);
  REQUIRE(tf_device_alloc(dev, n * 4, &grad) == TF_OK);
  std::vector<float> values(n);
  for (auto& x : values) {
    x = std::normal_distribution<float>(0.0f, 1.0f)(gen);
  }
  REQUIRE(tf_device_copy(dev, param, values.data(), n * 4, TF_COPY_H2D) == TF_OK);
  for (auto& x : values) {
    x = std::normal_distribution<float>(0.0f, 0.1f)(gen);
  }
  REQUIRE(tf_device_copy(dev, grad, values.data(), n * 4, TF_COPY_H2D) == TF_OK);
  const double hostile[] = {0.0,
                            -1.0,
                            1e-45,
                            1e-8,
                            1.0,
                            1e10,
                            1e300,
                            std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  const auto pick = [&] { return hostile[uniform(gen, 0, std::size(hostile) - 1)]; };
  for (int round = 0; round < 30; ++round) {
    tf_adam_hyper hyper;
    tf_adam_hyper_default(&hyper);
    tf_adam_options o;
    tf_adam_options_default(&o);
    o.mode = uniform(gen, 0, 5) == 0 ? static_cast<tf_adam_mode>(gen() % 7) : TF_ADAM_CPU;
    o.chunk_elements =
        uniform(gen, 0, 1) == 0 ? SIZE_MAX - uniform(gen, 0, 9) : uniform(gen, 0, 999);
    o.threads = uniform(gen, 0, 1) == 0 ? static_cast<unsigned>(gen()) : 1u;
    o.max_grad_norm = uniform(gen, 0, 1) == 0 ? pick() : 0.0;
    o.loss_scale = uniform(gen, 0, 1) == 0 ? pick() : 1.0;
    o.device_timeout_s = uniform(gen, 0, 1) == 0 ? pick() : 0.0;
    hyper.eps = uniform(gen, 0, 2) == 0 ? pick() : hyper.eps;
    INFO("round " << round << ": mode " << o.mode << " chunk " << o.chunk_elements << " threads "
                  << o.threads << " max_grad_norm " << o.max_grad_norm << " loss_scale "
                  << o.loss_scale << " timeout " << o.device_timeout_s << " eps " << hyper.eps);
    tf_adam_param p{"w", param, grad, TF_DTYPE_F32, n, 0, 0};
    tf_adam* adam = nullptr;
    const tf_status status = tf_adam_create(dev, &p, 1, &hyper, 1, &o, &adam);
    if (status != TF_OK) {
      CHECK(status == TF_ERR_INVALID_ARGUMENT);
      CHECK(adam == nullptr);
      CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_create: "));
      continue;
    }
    int applied = 0;
    double norm = 0;
    if (tf_adam_step(adam, &applied, &norm) != TF_OK) {
      // Only a tiny device_timeout_s may fail a step here: timed out, nothing applied.
      CHECK(o.device_timeout_s > 0);
      CHECK(o.device_timeout_s < 1e-3);
      CHECK(applied == 0);
      tf_adam_destroy(adam);
      continue;
    }
    CHECK(applied == 1);
    CHECK(std::isfinite(norm));
    std::vector<float> master(n);
    REQUIRE(tf_adam_master_weights(adam, 0, master.data(), n) == TF_OK);
    for (float x : master) {
      REQUIRE(std::isfinite(x));
    }
    tf_adam_destroy(adam);
  }
  CHECK(tf_device_free(dev, param, n * 4) == TF_OK);
  CHECK(tf_device_free(dev, grad, n * 4) == TF_OK);
  tf_device_destroy(dev);
}

TEST_CASE("bad input: emulated link rates and measured values have a valid range",
          "[bad_input][numbers]") {
  struct row {
    const char* text;
    bool accepted;
  };
  const row rows[] = {
      {"h2d=1MB/s", true},
      {"h2d=0.999MB/s", false},
      {"h2d=0.001MB/s", false},
      {"d2h=1000000GB/s", true},
      {"d2h=1000001GB/s", false},
      {"h2d=0GB/s", false},
      {"h2d=99999999999999999999999999999999999999999GB/s", false},
      {"h2d=25GB/s,d2h=800MB/s", true},
  };
  for (const auto& r : rows) {
    INFO(r.text);
    if (r.accepted) {
      CHECK_NOTHROW(link_model::parse(r.text, "env TIERFLOW_EMU_LINK"));
    } else {
      try {
        (void)link_model::parse(r.text, "env TIERFLOW_EMU_LINK");
        FAIL("accepted");
      } catch (const input_error& e) {
        CHECK(e.source() == "env TIERFLOW_EMU_LINK");
        CHECK_THAT(e.what(), Catch::Contains("from 1MB/s to 1000000GB/s"));
      }
    }
  }
  const auto cache = [](const std::string& value) {
    std::string key;
    return detail::parse_measured_cache(
        "tierflow-measured 1\nkey h|6.1|0\naccess 0 0 read_bandwidth_mbps " + value + "\n", "cache",
        key);
  };
  CHECK(cache("1e9").size() == 1);
  for (const char* value : {"1e308", "1.0000001e9", "inf", "nan", "-5", "0"}) {
    INFO(value);
    CHECK_THROWS_WITH(cache(value), Catch::Contains("at most 1e9") && Catch::Contains(value));
  }
}
