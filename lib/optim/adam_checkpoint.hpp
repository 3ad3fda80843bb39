#pragma once
// The offload_adam checkpoint file (docs/checkpoint.md has the layout).
#include <cstddef>
#include <filesystem>
#include <vector>

#include "optim/adam_internal.hpp"

namespace tierflow::detail {

/** Writes @p groups' state to @p path atomically (format version 3: the moments as stored),
 *  in pieces of @p piece_elements (a multiple of state_block when an int8 param has more than
 *  one piece). @throws tierflow::error naming the path */
void save_checkpoint(const std::filesystem::path& path, const std::vector<group_state>& groups,
                     std::size_t piece_elements);

/** Checks every byte of @p path against @p groups' shapes and its CRCs, and its moments
 *  (finite, exp_avg_sq >= 0), then loads it: the state (moments of another state dtype, or of
 *  a version 1 or 2 file, converted through fp32), hyper-parameters and step counts.
 *  @throws input_error naming the path (state untouched) */
void load_checkpoint(const std::filesystem::path& path, std::vector<group_state>& groups);

}  // namespace tierflow::detail
