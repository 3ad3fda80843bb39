// offload_adam's overlap with the backward pass (adam_options::overlap = backward): grads
// announced one by one with grad_ready() while "backward" goes on, updated speculatively and
// kept or rolled back by step(). Every case runs next to a plain optimizer (overlap none) of
// the same plan and must end bit for bit where it ends: state, device params, step results.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using test::adam_plan;
using test::adam_rig;
using test::uniform;

namespace {

enum class scenario { no_clip, clip_some, nan_last, none_grad, unannounced, two_threads };

const char* name_of(scenario s) {
  switch (s) {
    case scenario::no_clip:
      return "no clipping";
    case scenario::clip_some:
      return "clipping on some steps";
    case scenario::nan_last:
      return "NaN in the last grad to arrive";
    case scenario::none_grad:
      return "a param whose grad never arrives (None)";
    case scenario::unannounced:
      return "a param never announced (step() takes it)";
    case scenario::two_threads:
      return "announced from two threads";
  }
  return "?";
}

// A plan with an f32 and a bf16 param at least, several chunks each. @p host_params (cpu
// mode): those two live in host memory, and the others at random.
adam_plan overlap_plan(std::mt19937_64& gen, adam_mode mode, bool host_params) {
  auto plan = test::device_params_plan(gen, mode, 3000);
  for (auto& g : plan.groups) {
    for (auto& p : g) {
      p.on_host = host_params && uniform(gen, 0, 1) == 1;
    }
  }
  plan.groups[0].insert(plan.groups[0].begin(),
                        {param_dtype::bf16, uniform(gen, 500, 3000), host_params});
  plan.groups[0].insert(plan.groups[0].begin(),
                        {param_dtype::f32, uniform(gen, 500, 3000), host_params});
  plan.options.chunk_elements = uniform(gen, 64, 1024);
  plan.options.max_grad_norm = 0;
  return plan;
}

// The global grad norms of @p steps plain steps without clipping (to pick a clip that fires
// on some of them).
std::vector<double> plain_norms(const adam_plan& plan, placement_policy& policy, int steps) {
  adam_rig probe(plan);
  probe.build(policy);
  std::vector<double> norms;
  for (int s = 0; s < steps; ++s) {
    probe.set_grads(static_cast<std::uint64_t>(s));
    norms.push_back(probe.opt().step().grad_norm);
  }
  return norms;
}

struct param_id {
  std::size_t group;
  std::size_t param;
};

std::vector<param_id> params_of(const adam_plan& plan) {
  std::vector<param_id> out;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    for (std::size_t i = 0; i < plan.groups[g].size(); ++i) {
      out.push_back({g, i});
    }
  }
  return out;
}

void poison(adam_rig& rig, const param_id& p, std::size_t element) {
  const param_dtype dtype = rig.plan().groups[p.group][p.param].dtype;
  auto* at = static_cast<unsigned char*>(rig.grad(p.group, p.param)) + element * dtype_bytes(dtype);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto raw = test::encode_values({nan}, dtype);
  std::memcpy(at, raw.data(), raw.size());
}

}  // namespace

TEST_CASE("overlap backward: grad_ready() then step() is bit for bit the plain step",
          "[adam][overlap]") {
  auto gen = test::rng(2501);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  const int steps = 8;
  // backward_publish writes the params in host memory during the speculation (cpu mode).
  const std::vector<std::pair<adam_mode, adam_overlap>> kinds{
      {adam_mode::cpu, adam_overlap::backward},
      {adam_mode::cpu, adam_overlap::backward_publish},
      {adam_mode::streamed, adam_overlap::backward}};
  for (const auto& [mode, overlap] : kinds) {
    for (scenario sc : {scenario::no_clip, scenario::clip_some, scenario::nan_last,
                        scenario::none_grad, scenario::unannounced, scenario::two_threads}) {
      auto plan = overlap_plan(gen, mode, overlap == adam_overlap::backward_publish);
      if (sc == scenario::clip_some) {
        auto norms = plain_norms(plan, policy, steps);
        std::sort(norms.begin(), norms.end());
        plan.options.max_grad_norm = (norms[steps / 2 - 1] + norms[steps / 2]) / 2;
      }
      INFO(name_of(sc) << ", overlap " << to_string(overlap) << ", " << plan.describe());
      adam_rig reference(plan);
      auto spec_plan = plan;
      spec_plan.options.overlap = overlap;
      adam_rig rig(spec_plan);
      reference.build(policy);
      rig.build(policy);
      const auto ids = params_of(plan);
      const param_id odd = ids[uniform(gen, 0, ids.size() - 1)];  // None, or never announced
      int clipped = 0;
      int skipped = 0;
      for (int s = 0; s < steps; ++s) {
        const auto step = static_cast<std::uint64_t>(s);
        reference.set_grads(step);
        rig.set_grads(step);
        auto order = ids;
        std::shuffle(order.begin(), order.end(), gen);
        const bool poisoned = sc == scenario::nan_last && s % 3 == 1;
        if (poisoned) {
          const auto& last = order.back();
          const std::size_t element =
              uniform(gen, 0, plan.groups[last.group][last.param].elements - 1);
          poison(reference, last, element);
          poison(rig, last, element);
        }
        const bool none = sc == scenario::none_grad && s % 2 == 1;
        for (adam_rig* r : {&reference, &rig}) {
          r->opt().set_grad(odd.group, odd.param, none ? nullptr : r->grad(odd.group, odd.param));
        }
        const auto announce = [&](std::size_t from, std::size_t step_by) {
          for (std::size_t k = from; k < order.size(); k += step_by) {
            const bool left_out =
                (sc == scenario::none_grad && none) || (sc == scenario::unannounced && s % 2 == 0);
            if (left_out && order[k].group == odd.group && order[k].param == odd.param) {
              continue;
            }
            rig.opt().grad_ready(order[k].group, order[k].param);
          }
        };
        if (sc == scenario::two_threads) {
          std::thread other(announce, 1, 2);
          announce(0, 2);
          other.join();
        } else {
          announce(0, 1);
        }
        const auto want = reference.opt().step();
        const auto got = rig.opt().step();
        REQUIRE(got.applied == want.applied);
        CHECK(got.skip_reason == want.skip_reason);
        REQUIRE(std::memcmp(&got.grad_norm, &want.grad_norm, sizeof(double)) == 0);
        REQUIRE(got.clip_coef == want.clip_coef);
        REQUIRE(rig.state() == reference.state());
        REQUIRE(rig.params() == reference.params());
        clipped += want.clip_coef < 1 ? 1 : 0;
        skipped += want.applied ? 0 : 1;
        CHECK(rig.opt().step_count(odd.group, odd.param) ==
              reference.opt().step_count(odd.group, odd.param));
      }
      const adam_metrics m = rig.opt().metrics();
      if (sc == scenario::clip_some) {
        CHECK(clipped > 0);
        CHECK(clipped < steps);
      }
      if (sc == scenario::nan_last) {
        CHECK(skipped == 3);  // steps 1, 4 and 7
      }
      if (mode == adam_mode::cpu) {
        std::uint64_t elements = 0;
        for (const auto& g : plan.groups) {
          for (const auto& p : g) {
            elements += p.elements;
          }
        }
        CHECK(m.overlap == overlap);
        CHECK(m.rollback_bytes == 12 * elements);
        CHECK(m.speculative_steps == static_cast<std::uint64_t>(steps));
        // A clip after a step without one rolls back; after a clipped step the update is not
        // speculated (only the copy and the norm are).
        CHECK(m.rollbacks <= static_cast<std::uint64_t>(clipped + skipped));
        CHECK((m.rollbacks > 0) == (clipped + skipped > 0));
        CHECK((m.rolled_back_chunks > 0) == (m.rollbacks > 0));
      } else {
        CHECK(m.rollback_bytes == 0);  // streamed mode: grad_ready() does nothing
        CHECK(m.speculative_steps == 0);
      }
      CHECK(m.steps == reference.opt().metrics().steps);
    }
  }
}

TEST_CASE("overlap backward: reading the state between grad_ready() and step() restores it",
          "[adam][overlap]") {
  auto gen = test::rng(2502);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (const adam_overlap overlap : {adam_overlap::backward, adam_overlap::backward_publish}) {
    auto plan = overlap_plan(gen, adam_mode::cpu, overlap == adam_overlap::backward_publish);
    INFO("overlap " << to_string(overlap) << ", " << plan.describe());
    adam_rig reference(plan);
    plan.options.overlap = overlap;
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    for (std::uint64_t s = 0; s < 3; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      const auto before = rig.state();  // no speculation yet
      const auto params_before = rig.params();
      for (const auto& p : params_of(plan)) {
        rig.opt().grad_ready(p.group, p.param);
      }
      REQUIRE(rig.state() == before);          // the accessors restored the speculative updates
      REQUIRE(rig.params() == params_before);  // and the params they had published
      for (const auto& p : params_of(plan)) {
        if (s % 2 == 0) {
          rig.opt().grad_ready(p.group, p.param);  // again: the first announcement holds
          continue;
        }
        // The grads stay copied: a framework may free an announced grad (here: NaN over it),
        // and the step reads the copies.
        for (std::size_t e = 0; e < plan.groups[p.group][p.param].elements; ++e) {
          poison(rig, p, e);
        }
      }
      // A param's grad cannot change once announced; the same pointer is fine.
      CHECK_NOTHROW(rig.opt().set_grad(0, 0, rig.grad(0, 0)));
      CHECK_THROWS_WITH(rig.opt().set_grad(0, 0, nullptr), Catch::Contains("grad_ready"));
      REQUIRE(reference.opt().step().applied);
      REQUIRE(rig.opt().step().applied);
      REQUIRE(rig.state() == reference.state());
      REQUIRE(rig.params() == reference.params());
    }
    // discard_grads() (a zero_grad() between backward and step): the step reads the new grads.
    for (const auto& p : params_of(plan)) {
      rig.opt().grad_ready(p.group, p.param);
    }
    rig.opt().discard_grads();
    reference.set_grads(7);
    rig.set_grads(7);
    REQUIRE(reference.opt().step().applied);
    REQUIRE(rig.opt().step().applied);
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
    rig.opt().set_grad(0, 1, nullptr);
    CHECK_THROWS_WITH(rig.opt().grad_ready(0, 1), Catch::Contains("no grad"));
    CHECK_THROWS_WITH(rig.opt().grad_ready(9, 0), Catch::Contains("out of range"));
  }
  CHECK(parse_adam_overlap("backward") == adam_overlap::backward);
  CHECK(parse_adam_overlap("backward_publish") == adam_overlap::backward_publish);
  CHECK(to_string(adam_overlap::backward_publish) == "backward_publish");
  CHECK(parse_adam_overlap("none") == adam_overlap::none);
  CHECK_FALSE(parse_adam_overlap("forward"));
}

TEST_CASE("overlap backward: a device fault during speculation is all or nothing",
          "[adam][overlap][faults]") {
  auto gen = test::rng(2503);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  int not_applied = 0;
  int applied = 0;
  for (int round = 0; round < 9; ++round) {
    const int kind = round % 3;  // 0: a grads copy, 1: the backward kernel, 2: a params upload
    // Rounds 3 to 5 publish the params during the speculation (host and device params; device
    // params only in round 5, whose fault is an upload): the fault must restore them.
    const bool publish = round >= 3 && round <= 5;
    auto plan = overlap_plan(gen, adam_mode::cpu, publish && kind != 2);
    if (round % 2 == 1) {
      plan.options.max_grad_norm = 1e-3;  // clipping fires: every speculative update is redone
    }
    adam_rig reference(plan);
    plan.options.overlap = publish ? adam_overlap::backward_publish : adam_overlap::backward;
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    INFO("fault " << kind << ", " << to_string(plan.options.overlap) << ", " << plan.describe());
    for (std::uint64_t s = 0; s < 4; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      const auto before = rig.state();
      const auto params_before = rig.params();
      if (s == 2) {
        auto& dev = rig.dev();
        if (kind == 0) {
          dev.fail_copy(dev.d2h_stream(),
                        static_cast<unsigned>(uniform(gen, 1, plan.chunk_count(false))));
        } else if (kind == 1) {
          dev.compute_stream().host_callback(
              [] { throw std::runtime_error("backward kernel failed"); });
        } else {
          dev.fail_copy(dev.h2d_stream(),
                        static_cast<unsigned>(uniform(gen, 1, plan.chunk_count(true))));
        }
      }
      auto order = params_of(plan);
      std::shuffle(order.begin(), order.end(), gen);
      for (const auto& p : order) {
        rig.opt().grad_ready(p.group, p.param);
      }
      // Rounds 6 and 7 read the state in between: the failed speculation is restored then,
      // and the step refuses (the grads' memory may be gone), asking for the grads again.
      const bool read_between = s == 2 && kind != 2 && round >= 6;
      if (read_between) {
        REQUIRE(rig.state() == before);
      }
      try {
        const bool stepped = rig.opt().step().applied;  // outside REQUIRE, which catches
        REQUIRE(stepped);
        REQUIRE(s != 2);
      } catch (const adam_step_error& e) {
        INFO(e.what());
        REQUIRE(s == 2);
        CHECK_THAT(e.what(),
                   Catch::Contains("cpu mode") && (Catch::Contains("injected fault") ||
                                                   Catch::Contains("backward kernel failed") ||
                                                   Catch::Contains("give the grads again")));
        CHECK((std::string(e.what()).find("give the grads again") != std::string::npos) ==
              read_between);
        if (e.result() == adam_step_error::outcome::not_applied) {
          REQUIRE(kind != 2);
          REQUIRE(rig.state() == before);
          REQUIRE(rig.params() == params_before);
          ++not_applied;
          REQUIRE(rig.opt().step().applied);  // the retry: a plain step
        } else {
          REQUIRE(kind == 2);
          REQUIRE(e.result() == adam_step_error::outcome::applied);
          ++applied;
          rig.opt().sync_params();
        }
      }
      REQUIRE(rig.state() == reference.state());
      REQUIRE(rig.params() == reference.params());
    }
  }
  CHECK(not_applied == 6);
  CHECK(applied == 3);
}
