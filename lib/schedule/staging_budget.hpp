#pragma once
// The default HBM budget of a prefetch scheduler, from what its plan stages (private to
// lib/schedule; default_hbm_budget() is the public face).
#include <cstdint>

#include "tierflow/prefetch_scheduler.hpp"

namespace tierflow::detail {

/** @p resident bytes plus room for the window's steps, the step running and the one whose
 *  slots are being released, each @p largest bytes (a byte window: its bytes plus two).
 *  @throws tierflow::error when it overflows */
std::uint64_t staging_budget(std::uint64_t resident, std::uint64_t largest,
                             const scheduler_options& options);

}  // namespace tierflow::detail
