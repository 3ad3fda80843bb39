// Spec files of `tierflow plan --spec` (tools/tierflow/plan/plan_spec.cpp, in tierflow_cli),
// and what the command does with a spec it accepts: size it (plan_model.cpp) and write both
// reports (plan_report.hpp; to /dev/null). A spec is refused with tierflow::input_error, or sized
// into finite, non-negative numbers whose step bound is its slowest stage.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fuzz_support.hpp"
#include "plan/plan_model.hpp"
#include "plan/plan_report.hpp"
#include "plan/plan_spec.hpp"

namespace {

std::FILE* null_output() {
  static std::FILE* out = std::fopen("/dev/null", "w");
  return out;
}

void expect(bool condition) {
  if (!condition) {
    std::abort();
  }
}

bool finite_non_negative(double x) {
  return std::isfinite(x) && x >= 0;
}

void check_bytes(const tierflow::cli::plan::rank_bytes& b) {
  for (double x : {b.weights, b.grads, b.master, b.adam_m, b.adam_v, b.staging, b.activations}) {
    expect(finite_non_negative(x));
  }
}

void check_result(const tierflow::cli::plan::plan_result& r) {
  check_bytes(r.hbm);
  check_bytes(r.host);
  expect(r.ranks > 0 && r.grad_accumulation > 0 && !r.stages.empty());
  double slowest = 0;
  bool named = false;
  for (const auto& st : r.stages) {
    expect(finite_non_negative(st.bytes) && finite_non_negative(st.rate) &&
           finite_non_negative(st.time_s));
    slowest = std::max(slowest, st.time_s);
    named = named || st.name == r.bottleneck;
  }
  expect(named && r.step_bound_s == slowest && r.step_serial_s >= r.step_bound_s);
  expect(std::isfinite(r.tokens_per_s) && r.tokens_per_s > 0 && finite_non_negative(r.mfu));
  for (const auto& t : r.tiers) {
    expect(finite_non_negative(t.capacity_bytes) && finite_non_negative(t.used_bytes));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace plan = tierflow::cli::plan;
  tierflow::fuzz::expect_clean([&] {
    const plan::plan_spec s =
        plan::parse_plan_spec(tierflow::fuzz::text_of(data, size), "fuzz.json");
    expect(s.nodes > 0 && s.gpus_per_node > 0 && !s.tiers.empty());
    const plan::plan_result r = plan::size_plan(s);
    check_result(r);
    plan::print_plan(null_output(), s, r, true);
    plan::print_plan(null_output(), s, r, false);
  });
  return 0;
}
