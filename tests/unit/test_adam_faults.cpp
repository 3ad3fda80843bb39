// offload_adam under injected faults (docs/reliability.md): failed copies each way, a failed
// kernel before the step, stalled streams, failed and refused allocations in HBM and in each
// host tier. Every failure is a typed error with context; the state is as before the step or
// the step is complete, never in between; nothing leaks; and the run goes on to end bit for
// bit where a fault-free run ends. Streamed mode's undo ring and compressed moments under faults:
// test_adam_faults_streamed.cpp; the tools both use: adam_faults_helpers.hpp.
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "adam_faults_helpers.hpp"
#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using test::adam_plan;
using test::adam_rig;
using test::uniform;

using namespace tierflow::test::faults;

TEST_CASE(
    "a device fault at a random point of a run is all or nothing, and the run ends "
    "bit for bit as a fault-free one",
    "[adam][faults]") {
  auto gen = test::rng(1101);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  const auto threads_before = test::thread_count();
  std::map<std::string, tally> totals;
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    for (fault_kind kind : {fault_kind::h2d_copy, fault_kind::d2h_copy, fault_kind::compute}) {
      auto& counts = totals[std::string(to_string(mode)) + ", " + name_of(kind)];
      for (int round = 0; round < 5; ++round) {
        auto plan = test::random_adam_plan(gen, mode, 3000);
        if (round == 0) {
          plan.options.max_grad_norm = 0;  // checked against the scalar reference too
        }
        if (kind == fault_kind::h2d_copy && plan.chunk_count(true) == 0) {
          plan.groups[0][0].on_host = false;  // something to upload
        }
        const std::size_t steps = 6;
        const std::size_t faulty_step = uniform(gen, 0, steps - 1);
        INFO(name_of(kind) << " in step " << faulty_step << ", " << plan.describe());
        adam_rig reference(plan);
        adam_rig rig(plan);
        const auto free_before = rig.dev().memory_free_bytes();
        reference.build(policy);
        rig.build(policy);
        int errors = 0;
        for (std::size_t s = 0; s < steps; ++s) {
          reference.set_grads(s);
          rig.set_grads(s);
          REQUIRE(reference.opt().step().applied);
          const auto before = rig.state();
          if (s == faulty_step) {
            inject(kind, rig, gen);
          }
          errors += step_until_applied(rig, before, reference.state(), &counts);
          REQUIRE(rig.state() == reference.state());
          check_params(rig, reference);
        }
        CHECK(errors == 1);  // the fault fired once, in its step, and the retry was clean
        counts.injected += errors;
        CHECK(rig.opt().metrics().steps == steps);
        if (plan.options.max_grad_norm == 0) {
          REQUIRE(rig.state() == rig.reference_state(steps));
        }
        rig.destroy();
        CHECK(rig.dev().memory_free_bytes() == free_before);  // no HBM left behind
      }
    }
  }
  CHECK(test::thread_count_after_joins(threads_before) ==
        threads_before);  // no thread left running
  for (auto& [what, t] : totals) {
    std::cout << "adam faults: " << what << ": " << t.injected << " injected, all survived ("
              << t.outcomes[adam_step_error::outcome::not_applied] << " not applied and retried, "
              << t.outcomes[adam_step_error::outcome::applied] << " applied, "
              << t.outcomes[adam_step_error::outcome::pending] << " pending)\n";
    CHECK(t.injected >= 4);
  }
}

TEST_CASE(
    "cpu mode: a failed params upload applies the step, and the params are re-sent "
    "before the next use",
    "[adam][faults]") {
  auto gen = test::rng(1102);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (int round = 0; round < 4; ++round) {
    auto plan = test::device_params_plan(gen, adam_mode::cpu, 4000);
    for (auto& h : plan.hyper) {
      h.lr = 0.05;  // steps that show in bf16 and fp16 params too
    }
    INFO(plan.describe());
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    reference.set_grads(0);
    rig.set_grads(0);
    REQUIRE(reference.opt().step().applied);
    rig.dev().fail_copy(rig.dev().h2d_stream(),
                        static_cast<unsigned>(uniform(gen, 1, plan.chunk_count(true))));
    try {
      (void)rig.opt().step();
      FAIL("no error");
    } catch (const adam_step_error& e) {
      CHECK(e.result() == adam_step_error::outcome::applied);
      CHECK_THAT(e.what(), Catch::Contains("the step was applied") &&
                               Catch::Contains("sending the params to the device failed") &&
                               Catch::Contains("injected fault") &&
                               Catch::Contains("sync_params()"));
    }
    CHECK_FALSE(rig.opt().params_current());
    REQUIRE(rig.state() == reference.state());  // the state stepped
    CHECK(rig.params() != reference.params());  // some params did not arrive
    CHECK(rig.opt().step_count(0) == 1);
    if (round % 2 == 0) {
      rig.opt().sync_params();
      CHECK(rig.opt().params_current());
      REQUIRE(rig.params() == reference.params());
    }
    // The next step re-sends them first (when sync_params was not called) and goes on.
    reference.set_grads(1);
    rig.set_grads(1);
    REQUIRE(reference.opt().step().applied);
    REQUIRE(rig.opt().step().applied);
    CHECK(rig.opt().params_current());
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
  }
}

TEST_CASE(
    "streamed mode: a step with no chunk written back is rolled back, one that had "
    "written some back is completed on the host",
    "[adam][faults]") {
  auto gen = test::rng(1103);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  int rolled_back = 0;
  int completed = 0;
  for (int round = 0; round < 6; ++round) {
    auto plan = test::random_adam_plan(gen, adam_mode::streamed, 4000);
    plan.options.window = uniform(gen, 0, 2);
    plan.options.chunk_elements = uniform(gen, 64, 256);  // many chunks: write-backs are tracked
    plan.groups[0][0].elements = 4000;
    const std::size_t chunks = plan.chunk_count(false);
    const bool early = round % 2 == 0;
    INFO((early ? "first fetch fails" : "last write-back fails") << ", " << plan.describe());
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    reference.set_grads(0);
    rig.set_grads(0);
    REQUIRE(reference.opt().step().applied);
    const auto before = rig.state();
    if (early) {
      rig.dev().fail_copy(rig.dev().h2d_stream(), 1);
    } else {
      rig.dev().fail_copy(rig.dev().d2h_stream(), static_cast<unsigned>(3 * chunks));
    }
    try {
      (void)rig.opt().step();
      FAIL("no error");
    } catch (const adam_step_error& e) {
      INFO(e.what());
      CHECK_THAT(e.what(), Catch::Contains("offload_adam::step (streamed mode)") &&
                               Catch::Contains("injected fault"));
      if (early) {
        CHECK(e.result() == adam_step_error::outcome::not_applied);
        CHECK_THAT(e.what(), Catch::Contains("rolled back"));
        REQUIRE(rig.state() == before);
        ++rolled_back;
      } else {
        REQUIRE(chunks > plan.options.window);
        CHECK(e.result() == adam_step_error::outcome::applied);
        CHECK_THAT(e.what(), Catch::Contains(std::to_string(chunks - 1) + " of " +
                                             std::to_string(chunks) + " chunks") &&
                                 Catch::Contains("completed on the host"));
        REQUIRE(rig.state() == reference.state());
        ++completed;
      }
    }
    // The device params agree with the state either way (re-derived from it).
    CHECK(rig.opt().params_current());
    if (early) {
      REQUIRE(rig.opt().step().applied);  // the retry, same grads
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
    // And the scheduler streams again: more steps match.
    for (std::uint64_t s = 1; s < 4; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      REQUIRE(rig.opt().step().applied);
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
  }
  CHECK(rolled_back == 3);
  CHECK(completed == 3);
}

TEST_CASE("a stalled stream delays the step, which then completes (there is no timeout)",
          "[adam][faults][timing]") {
  using namespace std::chrono_literals;
  auto gen = test::rng(1104);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    for (int which = 0; which < 3; ++which) {
      auto plan = test::device_params_plan(gen, mode, 3000);
      adam_rig reference(plan);
      adam_rig rig(plan);
      reference.build(policy);
      rig.build(policy);
      auto& dev = rig.dev();
      stream& stalled = which == 0   ? dev.compute_stream()
                        : which == 1 ? dev.h2d_stream()
                                     : dev.d2h_stream();
      INFO("stalled " << stalled.name() << ", " << plan.describe());
      reference.set_grads(0);
      rig.set_grads(0);
      REQUIRE(reference.opt().step().applied);
      dev.delay_stream(stalled, 60ms);
      const auto r = rig.opt().step();
      CHECK(r.applied);
      CHECK(r.seconds >= 0.050);
      REQUIRE(rig.state() == reference.state());
      REQUIRE(rig.params() == reference.params());
    }
  }
}

TEST_CASE(
    "a stall past device_timeout_s fails the step as not applied, and the retry runs after it",
    "[adam][faults][timing]") {
  using namespace std::chrono_literals;
  auto gen = test::rng(1108);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  // The timeout covers the work the step depends on before it changes anything: the backward
  // pass (compute), and in cpu mode the grads' copy (d2h).
  const std::vector<std::pair<adam_mode, int>> cases = {
      {adam_mode::cpu, 0}, {adam_mode::cpu, 2}, {adam_mode::streamed, 0}};
  for (const auto& [mode, which] : cases) {
    auto plan = test::device_params_plan(gen, mode, 3000);
    plan.options.device_timeout_s = 0.02 + 0.01 * static_cast<double>(uniform(gen, 0, 3));
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    auto& dev = rig.dev();
    stream& stalled = which == 0 ? dev.compute_stream() : dev.d2h_stream();
    INFO("stalled " << stalled.name() << ", " << plan.describe());
    for (std::uint64_t s = 0; s < 3; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      if (s != 1) {
        REQUIRE(rig.opt().step().applied);
        continue;
      }
      const auto before = rig.state();
      const auto stall = 600ms;
      dev.delay_stream(stalled, stall);
      const auto start = std::chrono::steady_clock::now();
      try {
        (void)rig.opt().step();
        FAIL("a step that waited past its timeout returned");
      } catch (const adam_step_error& e) {
        const auto waited = std::chrono::steady_clock::now() - start;
        INFO(e.what());
        CHECK(e.result() == adam_step_error::outcome::not_applied);
        CHECK_THAT(e.what(), Catch::Contains("timed out") && Catch::Contains("device_timeout_s"));
        // It gave up long before the stall ended.
        CHECK(waited >= std::chrono::duration<double>(plan.options.device_timeout_s));
        CHECK(waited < stall - 150ms);
      }
      REQUIRE(rig.state() == before);
      REQUIRE(rig.opt().step_count(0) == s);
      // Retry (same grads) until the stalled work is done; the copies the timed-out step left
      // queued must not disturb it.
      int timeouts = 1;  // how soon the stall ends is the machine's business: no check on it
      for (;;) {
        try {
          const auto r = rig.opt().step();
          REQUIRE(r.applied);
          break;
        } catch (const adam_step_error& e) {
          INFO(e.what());
          REQUIRE(e.result() == adam_step_error::outcome::not_applied);
          REQUIRE(++timeouts < 200);
          std::this_thread::sleep_for(10ms);
        }
      }
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
  }
}

TEST_CASE("device_timeout_s must be finite and >= 0", "[adam][faults]") {
  auto gen = test::rng(1109);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (double bad : {-1e-3, -static_cast<double>(uniform(gen, 1, 100)), std::nan(""), HUGE_VAL}) {
    auto plan = test::random_adam_plan(gen, adam_mode::cpu, 500);
    plan.options.device_timeout_s = bad;
    adam_rig rig(plan);
    INFO("device_timeout_s " << bad);
    CHECK_THROWS_WITH(rig.build(policy), Catch::Contains("device_timeout_s"));
  }
}

TEST_CASE("a failed or refused HBM allocation fails construction cleanly, cpu mode needs none",
          "[adam][faults]") {
  auto gen = test::rng(1105);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  const auto threads_before = test::thread_count();
  const auto held = [&policy] {
    std::uint64_t total = 0;
    for (const auto& t : policy.snapshot().tiers) {
      total += t.held_bytes;
    }
    return total;
  };
  for (int round = 0; round < 3; ++round) {
    auto plan = test::random_adam_plan(gen, adam_mode::streamed, 3000);
    INFO(plan.describe());
    adam_rig rig(plan);
    const auto free_before = rig.dev().memory_free_bytes();
    const auto held_before = held();
    // An injected allocation failure: the scheduler's staging budget (the first allocation)
    // or the undo ring beside it (the second).
    for (unsigned k : {1U, 2U}) {
      INFO("allocation " << k);
      rig.dev().fail_allocation(k);
      try {
        rig.build(policy);
        FAIL("no error");
      } catch (const out_of_capacity& e) {
        CHECK_THAT(e.what(), Catch::Contains("emulated hbm (injected failure)"));
        CHECK(e.requested_bytes() > 0);
      }
      CHECK(rig.dev().memory_free_bytes() == free_before);
    }
    CHECK(held() == held_before);
    // An HBM that others have filled: refused with what was asked and what was free.
    void* hog = rig.dev().memory().allocate(free_before);
    try {
      rig.build(policy);
      FAIL("no error");
    } catch (const out_of_capacity& e) {
      CHECK_THAT(e.what(), Catch::Contains("hbm"));
      CHECK(e.requested_bytes() > 0);
    }
    rig.dev().memory().deallocate(hog, free_before);
    // A budget below one chunk's staging.
    auto tight = plan;
    tight.options.hbm_budget_bytes = 512;
    adam_rig tight_rig(tight);
    CHECK_THROWS_WITH(tight_rig.build(policy),
                      Catch::Contains("HBM budget") && Catch::Contains("too small"));
    CHECK(held() == held_before);
    // The fault is gone: the same plan builds and steps as a fault-free one.
    adam_rig reference(plan);
    reference.build(policy);
    rig.build(policy);
    for (std::uint64_t s = 0; s < 3; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      REQUIRE(rig.opt().step().applied);
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
    rig.destroy();
    CHECK(rig.dev().memory_free_bytes() == free_before);
  }
  {
    // cpu mode allocates no device memory: the armed failure is still there afterwards.
    auto plan = test::random_adam_plan(gen, adam_mode::cpu, 3000);
    adam_rig rig(plan);
    rig.dev().fail_allocation(1);
    rig.build(policy);
    rig.set_grads(0);
    REQUIRE(rig.opt().step().applied);
    CHECK_THROWS_AS(rig.dev().memory().allocate(64), out_of_capacity);
  }
  CHECK(test::thread_count_after_joins(threads_before) == threads_before);
}

namespace {

topology fixture_topology(const std::string& name) {
  test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  discovery_options o;
  o.sysfs_root = test::sysfs_fixture(name);
  return topology::discover(o);
}

}  // namespace

TEST_CASE("a full host tier fails construction with the class and tier, and leaks nothing",
          "[adam][faults][placement]") {
  auto gen = test::rng(1106);
  const topology topo = fixture_topology("two_socket_cxl");
  numa_resource node0{[] {
    numa_resource_options o;
    o.nodes = {numa_node_id{0}};
    return o;
  }()};
  // Each class in its own tier, with no spill: a full tier is the class's failure.
  const std::map<std::string, data_class> tiers = {{"cxl0", data_class::master_params},
                                                   {"cxl1", data_class::optimizer_state},
                                                   {"dram0", data_class::grads},
                                                   {"remote_dram0", data_class::staging}};
  const auto make_policy = [&](std::map<std::string, std::uint64_t> limits) {
    placement_options o;
    o.spec = "master_params=cxl0;optimizer_state=cxl1;grads=dram0;staging=remote_dram0";
    o.reserve_bytes = 0;
    o.huge_pages = false;
    o.tier_limits = std::move(limits);
    placement_policy p(topo, o);
    for (const auto& t : topo.tiers()) {
      p.attach_resource(t.name, node0);
    }
    return p;
  };
  const auto threads_before = test::thread_count();
  const auto locked_before = test::proc_status_value("VmLck:");
  int refused = 0;
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    for (const auto& [tier, cls] : tiers) {
      auto plan = test::random_adam_plan(gen, mode, 3000);
      plan.groups[0][0].dtype = param_dtype::bf16;  // cpu mode's upload ring is staging
      plan.groups[0][0].on_host = false;
      INFO("tier " << tier << " (" << to_string(cls) << "), " << plan.describe());
      // What the tier holds when the optimizer fits.
      std::uint64_t needed = 0;
      {
        auto policy = make_policy({});
        adam_rig rig(plan);
        rig.build(policy);
        for (const auto& t : policy.snapshot().tiers) {
          needed = t.tier == tier ? t.held_bytes : needed;
        }
      }
      if (mode == adam_mode::streamed && cls == data_class::staging) {
        // The undo ring lives in HBM: streamed mode holds no host staging.
        CHECK(needed == 0);
        continue;
      }
      REQUIRE(needed > 0);
      auto policy = make_policy({{tier, uniform(gen, 0, needed - 1)}});
      adam_rig rig(plan);
      const auto free_before = rig.dev().memory_free_bytes();
      try {
        rig.build(policy);
        FAIL("no error");
      } catch (const out_of_capacity& e) {
        CHECK_THAT(e.what(), Catch::Contains(std::string(to_string(cls))) && Catch::Contains(tier));
        ++refused;
      }
      for (const auto& t : policy.snapshot().tiers) {
        INFO("tier " << t.tier);
        CHECK(t.held_bytes == 0);  // every allocation made before the refusal was given back
      }
      CHECK(rig.dev().memory_free_bytes() == free_before);
      if (!test::under_sanitizer) {
        CHECK(test::proc_status_value("VmLck:") == locked_before);  // registrations undone
      }
      // With room, the same plan runs.
      auto roomy = make_policy({{tier, needed}});
      rig.build(roomy);
      rig.set_grads(0);
      REQUIRE(rig.opt().step().applied);
    }
  }
  CHECK(refused == 7);
  CHECK(test::thread_count_after_joins(threads_before) == threads_before);
}

TEST_CASE("load() whose params upload fails keeps the loaded state and re-sends the params",
          "[adam][faults][checkpoint]") {
  auto gen = test::rng(1107);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  test::scratch_dir dir;
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    auto plan = test::device_params_plan(gen, mode, 3000);
    INFO(plan.describe());
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    for (std::uint64_t s = 0; s < 2; ++s) {
      reference.set_grads(s);
      REQUIRE(reference.opt().step().applied);
    }
    const auto path = dir.path() / (std::string(to_string(mode)) + ".ckpt");
    reference.opt().save(path);
    rig.dev().fail_copy(rig.dev().h2d_stream(), 1);
    try {
      rig.opt().load(path);
      FAIL("no error");
    } catch (const adam_step_error& e) {
      CHECK(e.applied());
      CHECK_THAT(e.what(), Catch::Contains(path.string()) &&
                               Catch::Contains("the state was loaded") &&
                               Catch::Contains("injected fault"));
    }
    CHECK_FALSE(rig.opt().params_current());
    REQUIRE(rig.state() == reference.state());
    rig.opt().sync_params();
    REQUIRE(rig.params() == reference.params());
  }
}

TEST_CASE(
    "streamed mode: a second fault while completing a step leaves it pending, and the "
    "next step() completes it",
    "[adam][faults]") {
  auto gen = test::rng(1108);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  test::scratch_dir dir;
  for (int round = 0; round < 3; ++round) {
    auto plan = test::random_adam_plan(gen, adam_mode::streamed, 3000);
    plan.options.window = uniform(gen, 0, 2);
    plan.options.chunk_elements = uniform(gen, 64, 256);
    plan.groups[0][0].elements = 3000;  // more chunks than the window: write-backs are tracked
    const std::size_t chunks = plan.chunk_count(false);
    INFO(plan.describe());
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    reference.set_grads(0);
    rig.set_grads(0);
    REQUIRE(reference.opt().step().applied);
    const auto before = rig.state();
    // The last chunk's fetch fails (master, m and v of each chunk are fetched in order), after
    // every other chunk was written back (3 copies each, and the last one's 3, skipped, are
    // counted too); then the first copy of the recovery, the last chunk's grads, fails.
    auto& dev = rig.dev();
    dev.fail_copy(dev.h2d_stream(), static_cast<unsigned>(3 * chunks - 2));
    dev.fail_copy(dev.d2h_stream(), static_cast<unsigned>(3 * chunks + 1));
    try {
      (void)rig.opt().step();
      FAIL("no error");
    } catch (const adam_step_error& e) {
      INFO(e.what());
      CHECK(e.result() == adam_step_error::outcome::pending);
      CHECK_FALSE(e.applied());
      CHECK_THAT(e.what(), Catch::Contains(std::to_string(chunks - 1) + " of " +
                                           std::to_string(chunks) + " chunks") &&
                               Catch::Contains("pending") && Catch::Contains("injected fault"));
    }
    CHECK_FALSE(rig.opt().params_current());
    CHECK(rig.state() != before);  // half done, and known to be
    CHECK(rig.state() != reference.state());
    CHECK_THROWS_WITH(rig.opt().save(dir.path() / "pending.ckpt"), Catch::Contains("pending"));
    // The retry completes the step from the same grads instead of taking another.
    const auto r = rig.opt().step();
    CHECK(r.applied);
    CHECK(rig.opt().params_current());
    CHECK(rig.opt().step_count(0) == 1);
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
    for (std::uint64_t s = 1; s < 3; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      REQUIRE(rig.opt().step().applied);
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
  }
}
