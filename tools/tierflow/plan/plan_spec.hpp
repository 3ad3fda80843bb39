#pragma once
// The spec of `tierflow plan --spec FILE`: a model, a cluster and a training setup, parsed with
// strict validation (every field named in its error). See docs/cli/plan.md.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tierflow/offload_adam.hpp"

namespace tierflow::cli::plan {

/** @brief How the training state is split across the data-parallel ranks. */
enum class sharding { none, zero1, zero2, zero3, fsdp };

/** @brief The name of @p s as the spec spells it. */
const char* to_string(sharding s);

/** @brief Where the fp32 master's bits live: a whole fp32 copy (4 B per param), or its low 16
 *  bits beside a bf16 weight held in a host tier, whose bits are the high 16 (2 B per param). */
enum class master_kind { fp32, remainder };

/** @brief The name of @p m as the spec spells it. */
const char* to_string(master_kind m);

/** @brief One memory tier of a node: capacity and its aggregate bandwidth. */
struct tier_spec {
  std::string name;
  double capacity_bytes = 0;
  double read_gbps = 0;   ///< GB/s = 10^9 B/s, the node's aggregate
  double write_gbps = 0;  ///< GB/s
};

/** @brief A parsed spec; every number checked finite, positive and within its cap. */
struct plan_spec {
  std::string source;  ///< the spec file (every error names it)
  std::string name;
  // model
  double params = 0;
  std::uint64_t layers = 0;
  std::uint64_t hidden = 0;
  std::string param_dtype = "bf16";
  double param_bytes = 2;  ///< per element
  double grad_bytes = 2;
  double state_bytes = 4;  ///< model.state_dtype: the master's and, uncompressed, m's and v's
  // optimizer: how Adam's m and v are stored (compressed: from fp32 state only) and its master
  adam_state_dtype adam_state = adam_state_dtype::f32;
  master_kind master = master_kind::fp32;
  // cluster
  std::uint64_t nodes = 0;
  std::uint64_t gpus_per_node = 0;
  double hbm_bytes = 0;
  double gpu_tflops = 0;
  double host_link_gbps = 0;     ///< per GPU, each direction
  double network_gbps = 0;       ///< per node, each direction (unused with one node)
  std::vector<tier_spec> tiers;  ///< in spill order
  // training
  sharding shard = sharding::none;
  bool offload_optimizer = false;
  bool offload_params = false;
  std::uint64_t micro_batch = 0;
  std::uint64_t seq_len = 0;
  double tokens_per_step = 0;        ///< a multiple of ranks × micro_batch × seq_len
  bool recompute = true;             ///< activation checkpointing
  bool offload_activations = false;  ///< the checkpoints live in the host tiers
  std::uint64_t layer_tiles = 1;     ///< a layer is gathered and reduced in this many tiles
};

/**
 * @brief Parses and checks a spec document.
 * @param text the JSON text
 * @param source where it came from (the path), the start of every error message
 * @throws tierflow::input_error naming @p source, the field and the value: not JSON, a key
 *         given twice, an unknown version, a missing, mistyped or unknown key, a number
 *         negative, zero, non-finite, beyond its cap or (a rate) below 0.001, a name with
 *         control characters, an unknown dtype or sharding; optimizer.state_dtype or
 *         optimizer.master other than fp32 where model.state_dtype is not fp32, a remainder
 *         master without bf16 weights offloaded beside the offloaded state
 */
[[nodiscard]] plan_spec parse_plan_spec(std::string_view text, const std::string& source);

/**
 * @brief Replaces the moments' dtype of @p s (`tierflow plan --state-dtype`) and checks it
 *        against the rest of the spec as the parser does.
 * @param name fp32, bf16 or int8
 * @throws tierflow::input_error naming the spec file and `--state-dtype`: another name, or a
 *         compressed dtype where model.state_dtype is not fp32
 */
void set_state_dtype(plan_spec& s, std::string_view name);

/** @brief Why a remainder master cannot apply to @p s (the words after "optimizer.master: "),
 *  or empty: it needs bf16 weights held in the host tiers beside the offloaded state. */
[[nodiscard]] std::string remainder_refusal(const plan_spec& s);

/** @brief Reads @p path and parses it. @throws tierflow::input_error, also when unreadable */
[[nodiscard]] plan_spec load_plan_spec(const std::string& path);

}  // namespace tierflow::cli::plan
