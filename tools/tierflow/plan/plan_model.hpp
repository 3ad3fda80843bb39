#pragma once
// `tierflow plan`'s sizing model: bytes per rank and tier, bytes over each link per step, the
// time bound of each stage and what would remove the bottleneck. Pure functions of a spec
// (docs/cli/plan.md gives every formula).

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan_spec.hpp"

namespace tierflow::cli::plan {

/** @brief @p bytes (>= 0) as a whole count for display, saturating at 2^64 - 1: a spec within
 *  its caps can size activations beyond 2^64 B (a cast of those was undefined behaviour). */
[[nodiscard]] inline std::uint64_t byte_count(double bytes) {
  constexpr double limit = 18446744073709551616.0;  // 2^64
  return bytes >= limit ? ~std::uint64_t{0} : static_cast<std::uint64_t>(bytes > 0 ? bytes : 0);
}

/** @brief The state of one rank by kind, in bytes, in HBM and in the node's host tiers. */
struct rank_bytes {
  double weights = 0, grads = 0, master = 0, adam_m = 0, adam_v = 0, staging = 0, activations = 0;
  [[nodiscard]] double total() const {
    return weights + grads + master + adam_m + adam_v + staging + activations;
  }
};

/** @brief A node tier's share of the host state after spilling, in order. */
struct tier_use {
  std::string name;
  double capacity_bytes = 0;
  double used_bytes = 0;
};

/** @brief One stage of a step: its bytes (or FLOPs for compute), rate and time bound. */
struct stage_bound {
  std::string name;   ///< compute, h2d, d2h, tier:<name>, network
  std::string scope;  ///< "per GPU" or "per node"
  double bytes = 0;   ///< bytes moved (0 for compute)
  double rate = 0;    ///< GB/s (TFLOPS for compute)
  double time_s = 0;
};

/** @brief One way of storing the optimizer state (moments' dtype, master), its bytes per param
 *  and the largest model each memory holds with it, the rest of the spec unchanged. */
struct state_capacity {
  adam_state_dtype state_dtype = adam_state_dtype::f32;
  master_kind master = master_kind::fp32;
  double state_bytes_per_param = 0;  ///< master + m + v (int8: with its scales)
  double step_bytes_per_param = 0;   ///< the update's reads and writes (one gradient copy)
  double max_params_hbm = 0;         ///< largest Ψ whose HBM bytes fit; inf: no bound
  double max_params_host = 0;        ///< largest Ψ whose host bytes fit the tiers; inf: none
  /** The largest Ψ the memory holding the optimizer state holds (the host tiers when it is
   *  offloaded, else HBM), over the same with fp32 state and an fp32 master. */
  double vs_fp32 = 0;
  [[nodiscard]] double max_params() const {
    return max_params_hbm < max_params_host ? max_params_hbm : max_params_host;
  }
};

/** @brief Everything `tierflow plan` reports. */
struct plan_result {
  std::uint64_t ranks = 0;
  std::uint64_t grad_accumulation = 0;
  double tokens_per_step = 0;
  rank_bytes hbm;                 ///< per rank
  rank_bytes host;                ///< per rank, in the node's tiers
  double hbm_capacity_bytes = 0;  ///< per GPU
  bool hbm_fits = false;
  std::vector<tier_use> tiers;  ///< per node
  bool host_fits = false;
  std::vector<std::string> spill;  ///< tiers holding state, in order
  std::vector<stage_bound> stages;
  double step_bound_s = 0;   ///< the slowest stage (perfect overlap)
  double step_serial_s = 0;  ///< every stage one after another
  std::string bottleneck;
  double tokens_per_s = 0;
  double mfu = 0;  ///< 6·Ψ·tokens / (step_bound · ranks · peak)
  std::vector<std::string> advice;
  state_capacity state;  ///< the spec's optimizer state
  /** fp32, bf16, int8 moments with an fp32 master (fp32 first: the baseline), then with a
   *  remainder master where one applies; only the spec's where model.state_dtype is not fp32. */
  std::vector<state_capacity> state_options;
  [[nodiscard]] bool fits() const { return hbm_fits && host_fits; }
};

/**
 * @brief Sizes @p s.
 * @throws tierflow::input_error naming the spec file (plan_spec::source) when tokens_per_step
 *         is not a multiple of one micro-step
 *         (ranks × micro_batch × seq_len), or a derived quantity is not finite
 */
[[nodiscard]] plan_result size_plan(const plan_spec& s);

}  // namespace tierflow::cli::plan
