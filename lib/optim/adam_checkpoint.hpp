#pragma once
// The offload_adam checkpoint file (docs/checkpoint.md has the layout).
#include <cstddef>
#include <filesystem>
#include <vector>

#include "optim/adam_internal.hpp"

namespace tierflow::detail {

/** Writes @p groups' state to @p path atomically, in pieces of @p piece_elements.
 *  @throws tierflow::error naming the path */
void save_checkpoint(const std::filesystem::path& path, const std::vector<group_state>& groups,
                     std::size_t piece_elements);

/** Checks every byte of @p path against @p groups' shapes and its CRCs, then loads it: the
 *  state, hyper-parameters and step counts. @throws input_error naming the path (state
 *  untouched) */
void load_checkpoint(const std::filesystem::path& path, std::vector<group_state>& groups);

}  // namespace tierflow::detail
