// Workload files of `tierflow tune --plan` (tools/tierflow/tune/tune_plan.cpp, in the CLI's
// library tierflow_cli).
#include "fuzz_support.hpp"
#include "tune/tune_plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  tierflow::fuzz::expect_clean([&] {
    const auto p = tierflow::cli::parse_tune_plan(tierflow::fuzz::text_of(data, size), "fuzz.json");
    if (p.compute_s.size() != p.plan.steps.size() || p.plan.buffers.empty()) {
      std::abort();  // a parsed plan has one compute time per step and at least one buffer
    }
  });
  return 0;
}
