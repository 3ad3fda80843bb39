#pragma once
// The fault-injection tests' tools (test_adam_faults.cpp, test_adam_faults_streamed.cpp): a fault
// armed at a random point of a rig's next step, a step retried until applied that checks each
// failure is all or nothing, and the device params compared with a reference's.
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "test_support.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow::test::faults {

using test::adam_rig;
using test::uniform;

enum class fault_kind { h2d_copy, d2h_copy, compute };

inline const char* name_of(fault_kind k) {
  switch (k) {
    case fault_kind::h2d_copy:
      return "h2d copy";
    case fault_kind::d2h_copy:
      return "d2h copy";
    case fault_kind::compute:
      return "failed kernel";
  }
  return "?";
}

// Arms @p kind on @p rig for its next step, at a random point of that step's work.
inline void inject(fault_kind kind, adam_rig& rig, std::mt19937_64& gen) {
  auto& dev = rig.dev();
  const auto& plan = rig.plan();
  const bool streamed = plan.options.mode == adam_mode::streamed;
  switch (kind) {
    case fault_kind::h2d_copy: {
      // cpu: one params upload per chunk on the device; streamed: at least master, m and v
      // of every chunk are fetched each step.
      const std::size_t copies = streamed ? 3 * plan.chunk_count(false) : plan.chunk_count(true);
      dev.fail_copy(dev.h2d_stream(), static_cast<unsigned>(uniform(gen, 1, copies)));
      break;
    }
    case fault_kind::d2h_copy: {
      // cpu: one grads copy per chunk; streamed: master, m and v of every chunk written back.
      const std::size_t copies = (streamed ? 3 : 1) * plan.chunk_count(false);
      dev.fail_copy(dev.d2h_stream(), static_cast<unsigned>(uniform(gen, 1, copies)));
      break;
    }
    case fault_kind::compute:
      // The work that made the grads failed (a backward kernel).
      dev.compute_stream().host_callback(
          [] { throw std::runtime_error("backward kernel failed"); });
      break;
  }
}

struct tally {
  int injected = 0;
  std::map<adam_step_error::outcome, int> outcomes;
};

// One step on @p rig, retried while the error says it was not applied (at most 4 tries).
// Each failure must be a typed error with context, and must leave the state as before the
// step or with the step complete. Returns the errors seen.
inline int step_until_applied(adam_rig& rig, const std::vector<unsigned char>& before,
                              const std::vector<unsigned char>& after_reference, tally* counts) {
  int errors = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    try {
      const auto r = rig.opt().step();
      REQUIRE(r.applied);
      return errors;
    } catch (const adam_step_error& e) {
      ++errors;
      INFO("error: " << e.what());
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("offload_adam"));
      CHECK_THAT(what, Catch::Contains(std::string(to_string(rig.plan().options.mode)) + " mode") ||
                           Catch::Contains("pending"));
      CHECK_THAT(what,
                 Catch::Contains("injected fault") || Catch::Contains("backward kernel failed"));
      if (counts != nullptr) {
        ++counts->outcomes[e.result()];
      }
      const auto now = rig.state();
      switch (e.result()) {
        case adam_step_error::outcome::not_applied:
          CHECK_THAT(what, Catch::Contains("not applied"));
          REQUIRE(test::checksum(now) == test::checksum(before));
          REQUIRE(now == before);
          break;
        case adam_step_error::outcome::applied:
          CHECK_THAT(what, Catch::Contains("applied"));
          REQUIRE(now == after_reference);
          return errors;
        case adam_step_error::outcome::pending:
          break;  // the next step() completes it
      }
    }
  }
  FAIL("the step was not applied after 4 tries");
  return errors;
}

// Device params as the reference's, re-sent first when a failure left them behind.
inline void check_params(adam_rig& rig, adam_rig& reference) {
  if (!rig.opt().params_current()) {
    rig.opt().sync_params();
    REQUIRE(rig.opt().params_current());
  }
  REQUIRE(rig.params() == reference.params());
}

}  // namespace tierflow::test::faults
