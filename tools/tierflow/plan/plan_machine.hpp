#pragma once
// `tierflow plan --machine FILE`: one node of the cluster as a real machine measured it. FILE is
// that machine's `tierflow topo --json` (whose tier bandwidths are HMAT's or, after `tierflow
// bench` ran there, measured); its host tiers replace the spec's, and its GPUs (when CUDA saw
// any) the spec's GPU count and HBM. See docs/cli/plan.md.

#include <string>
#include <string_view>

#include "plan/plan_spec.hpp"

namespace tierflow::cli::plan {

/**
 * @brief Replaces @p spec's host tiers (and GPUs, when the document has CUDA GPUs) with the
 * machine's.
 * @param text a `tierflow topo --json` document
 * @param source where it came from (the path), the start of every error message
 * @throws tierflow::input_error naming the field: not a topo document, no host tier, more than
 *         16, a host tier without a read or write bandwidth (neither firmware nor measured), a
 *         capacity or bandwidth that is not a positive finite number
 */
void apply_machine(plan_spec& spec, std::string_view text, const std::string& source);

/** @brief Reads @p path and applies it. @throws tierflow::input_error, also when unreadable */
void load_machine(plan_spec& spec, const std::string& path);

}  // namespace tierflow::cli::plan
