// offload_adam's streamed mode under injected faults: the HBM undo ring that restores chunks
// whose write-back did not surely land, compressed moments (bf16, int8) bit for bit as the cpu
// step and all or nothing under a fault, and the ring holding the moments as they are stored
// (the fault tools are adam_faults_helpers.hpp; the other fault cases test_adam_faults.cpp).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_faults_helpers.hpp"
#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/topology.hpp"

using namespace tierflow;
using namespace tierflow::test::faults;
using test::adam_plan;
using test::adam_rig;
using test::uniform;

TEST_CASE(
    "streamed mode: chunks whose write-back did not surely land are restored from the HBM "
    "undo ring, a fault during the restore leaves the step pending",
    "[adam][faults]") {
  auto gen = test::rng(1109);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (int round = 0; round < 6; ++round) {
    auto plan = test::random_adam_plan(gen, adam_mode::streamed, 3000);
    plan.options.chunk_elements = uniform(gen, 64, 256);
    plan.groups[0][0].elements = 3000;
    const std::size_t chunks = plan.chunk_count(false);
    // Even rounds: the window is below the plan, so write-backs are tracked chunk by chunk.
    // Odd rounds: the window spans the plan; write-backs wait for the end-of-step flush and
    // none is trusted, so every chunk whose snapshot ran is restored.
    const bool tracked = round % 2 == 0;
    plan.options.window = tracked ? uniform(gen, 0, 2) : static_cast<unsigned>(chunks);
    INFO((tracked ? "tracked" : "window spans the plan") << ", " << plan.describe());
    adam_rig reference(plan);
    adam_rig rig(plan);
    reference.build(policy);
    rig.build(policy);
    // No host undo memory: the ring is in HBM, counted in hbm_undo_bytes.
    std::uint64_t host_staging = 0;
    const placement_snapshot held = policy.snapshot();
    if (const auto it = held.class_bytes.find(data_class::staging); it != held.class_bytes.end()) {
      for (const auto& [tier, bytes] : it->second) {
        host_staging += bytes;
      }
    }
    CHECK(host_staging == 0);
    const std::size_t slots =
        tracked ? std::min<std::size_t>(chunks, plan.options.window + 3) : chunks;
    CHECK(rig.opt().metrics().hbm_undo_bytes ==
          slots * 3 * plan.options.chunk_elements * sizeof(float));
    auto& dev = rig.dev();
    const auto expect_failure = [&](adam_step_error::outcome outcome,
                                    const std::vector<std::string>& phrases) {
      try {
        (void)rig.opt().step();
        FAIL("no error");
      } catch (const adam_step_error& e) {
        INFO(e.what());
        CHECK(e.result() == outcome);
        CHECK_THAT(e.what(), Catch::Contains("injected fault"));
        for (const auto& phrase : phrases) {
          CHECK_THAT(e.what(), Catch::Contains(phrase));
        }
      }
    };
    const std::string landed =
        std::to_string(chunks - 2) + " of " + std::to_string(chunks) + " chunks";
    reference.set_grads(0);
    rig.set_grads(0);
    REQUIRE(reference.opt().step().applied);
    if (tracked) {
      // The second write-back copy (m) of the last-but-one chunk fails: its master landed in
      // the tier with the step and its m and v did not, and the last chunk's write-back is
      // skipped. Neither is surely written back; only the undo ring has the former's pre-step
      // master (a completion without the restore would step it twice). Every chunk is
      // released before the failure is seen: 3 write-back copies each.
      REQUIRE(chunks > plan.options.window + 1);
      dev.fail_copy(dev.d2h_stream(), static_cast<unsigned>(3 * (chunks - 2) + 2));
      expect_failure(adam_step_error::outcome::applied, {landed, "completed on the host"});
      CHECK(rig.opt().params_current());
      REQUIRE(rig.state() == reference.state());
      REQUIRE(rig.params() == reference.params());
      // Again, on the last chunk's m write-back (every chunk is then surely released: the
      // step's write-backs are 3 × chunks D2H copies), and one of the restore's 3 copies (its
      // master, m and v) fails too: pending.
      reference.set_grads(1);
      rig.set_grads(1);
      REQUIRE(reference.opt().step().applied);
      const auto before = rig.state();
      dev.fail_copies(dev.d2h_stream(), {static_cast<unsigned>(3 * (chunks - 1) + 2),
                                         static_cast<unsigned>(3 * chunks + uniform(gen, 1, 3))});
      expect_failure(adam_step_error::outcome::pending,
                     {std::to_string(chunks - 1) + " of " + std::to_string(chunks) + " chunks",
                      "restoring the others from the HBM undo copies failed", "pending"});
      CHECK_FALSE(rig.opt().params_current());
      CHECK(rig.state() != before);  // half done, and known to be
      CHECK(rig.state() != reference.state());
      // The retry restores from the same slots, then completes the step on the host.
      const auto r = rig.opt().step();
      CHECK(r.applied);
      CHECK(rig.opt().params_current());
      CHECK(rig.opt().step_count(0) == 2);
      REQUIRE(rig.state() == reference.state());
      REQUIRE(rig.params() == reference.params());
    } else {
      // The last chunk's snapshot fails (3 D2D copies per chunk on the compute stream), so its
      // kernel and write-back do not run, and it is not restored. The others may have been
      // written back by the flush (when it ran before the failure was seen), but none is
      // trusted: every one is restored from the ring, and the step is rolled back.
      REQUIRE(rig.opt().step().applied);
      const auto before = rig.state();
      reference.set_grads(1);
      rig.set_grads(1);
      REQUIRE(reference.opt().step().applied);
      dev.fail_copy(dev.compute_stream(), static_cast<unsigned>(3 * chunks - 2));
      expect_failure(adam_step_error::outcome::not_applied, {"rolled back", "d2d copy"});
      REQUIRE(rig.state() == before);
      CHECK(rig.opt().params_current());
      REQUIRE(rig.opt().step().applied);
      REQUIRE(rig.state() == reference.state());
    }
    for (std::uint64_t s = 2; s < 4; ++s) {
      reference.set_grads(s);
      rig.set_grads(s);
      REQUIRE(reference.opt().step().applied);
      REQUIRE(rig.opt().step().applied);
    }
    REQUIRE(rig.state() == reference.state());
    REQUIRE(rig.params() == reference.params());
  }
}

TEST_CASE(
    "streamed mode with bf16 and int8 moments: bit for bit as the cpu step, the moments over "
    "the link as stored, a device fault all or nothing",
    "[adam][faults][state]") {
  auto gen = test::rng(1108);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (adam_state_dtype dtype : {adam_state_dtype::bf16, adam_state_dtype::int8}) {
    for (fault_kind kind : {fault_kind::h2d_copy, fault_kind::d2h_copy, fault_kind::compute}) {
      auto plan = test::device_params_plan(gen, adam_mode::streamed, 20000);
      plan.options.state_dtype = dtype;
      // Whole int8 blocks per chunk as given (so the fault's copy count is the plan's).
      plan.options.chunk_elements = 256 * uniform(gen, 1, 12);
      auto on_cpu = plan;
      on_cpu.options.mode = adam_mode::cpu;
      const std::size_t steps = 5;
      const std::size_t faulty_step = uniform(gen, 0, steps - 1);
      INFO(to_string(dtype) << ", " << name_of(kind) << " in step " << faulty_step << ", "
                            << plan.describe());
      adam_rig cpu(on_cpu);
      adam_rig streamed(plan);
      adam_rig faulty(plan);
      cpu.build(policy);
      streamed.build(policy);
      faulty.build(policy);
      REQUIRE(streamed.opt().mode() == adam_mode::streamed);
      int errors = 0;
      for (std::size_t s = 0; s < steps; ++s) {
        for (adam_rig* rig : {&cpu, &streamed, &faulty}) {
          rig->set_grads(s);
        }
        REQUIRE(cpu.opt().step().applied);
        REQUIRE(streamed.opt().step().applied);
        REQUIRE(streamed.state() == cpu.state());
        check_params(streamed, cpu);
        const auto before = faulty.state();
        if (s == faulty_step) {
          inject(kind, faulty, gen);
        }
        errors += step_until_applied(faulty, before, streamed.state(), nullptr);
        REQUIRE(faulty.state() == streamed.state());
        check_params(faulty, streamed);
      }
      CHECK(errors == 1);
    }
  }
}

TEST_CASE("streamed mode stages and undoes compressed moments as they are stored",
          "[adam][state]") {
  auto gen = test::rng(1109);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  adam_plan plan;
  plan.seed = gen();
  const std::size_t n = 256 * uniform(gen, 40, 80);
  plan.groups = {{{param_dtype::bf16, n, false}}};
  plan.hyper = {test::random_hyper(gen)};
  plan.options.mode = adam_mode::streamed;
  const std::size_t chunk = 256 * uniform(gen, 4, 16);
  plan.options.chunk_elements = chunk;
  plan.options.window = static_cast<unsigned>(uniform(gen, 0, 3));
  std::map<adam_state_dtype, std::uint64_t> undo;
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    plan.options.state_dtype = dtype;
    adam_rig rig(plan);
    rig.build(policy);
    rig.set_grads(0);
    REQUIRE(rig.opt().step().applied);
    undo[dtype] = rig.opt().metrics().hbm_undo_bytes;
  }
  // A slot holds the largest chunk's master (4 B per element) and its moments as stored (fp32
  // 8 B, bf16 4 B, int8 2 B and a scale each per 256): the staged buffers' own sizes.
  INFO("n " << n << ", chunk " << chunk << ", window " << plan.options.window << ": undo fp32 "
            << undo[adam_state_dtype::f32] << ", bf16 " << undo[adam_state_dtype::bf16] << ", int8 "
            << undo[adam_state_dtype::int8]);
  REQUIRE(undo[adam_state_dtype::f32] % (12 * chunk) == 0);
  const std::uint64_t slots = undo[adam_state_dtype::f32] / (12 * chunk);
  CHECK(slots >= 1);
  CHECK(undo[adam_state_dtype::bf16] == slots * 8 * chunk);
  CHECK(undo[adam_state_dtype::int8] == slots * (6 * chunk + 8 * (chunk / 256)));
}
