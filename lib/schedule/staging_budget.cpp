// The scheduler's one default HBM budget (prefetch_scheduler.hpp: default_hbm_budget).
#include "schedule/staging_budget.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"

namespace tierflow {

namespace detail {

// The resident buffers plus room for the window's steps, the step running and the one whose
// slots are being released, each the size of the largest (a byte window: its bytes plus two).
std::uint64_t staging_budget(std::uint64_t resident, std::uint64_t largest,
                             const scheduler_options& o) {
  constexpr auto max = std::numeric_limits<std::uint64_t>::max();
  const bool bytes = o.unit == window_unit::bytes;
  const std::uint64_t extra = bytes ? o.window : 0;
  const bool fits = (bytes || o.window <= max - 2) &&
                    (bytes ? 2 : o.window + 2) <= max / std::max<std::uint64_t>(largest, 1);
  const std::uint64_t staging = fits ? (bytes ? 2 : o.window + 2) * largest : max;
  TIERFLOW_EXPECTS(fits && staging <= max - resident && extra <= max - resident - staging,
                   "prefetch_scheduler: window " + std::to_string(o.window) +
                       " is too large for a default HBM budget");
  return resident + staging + extra;
}

}  // namespace detail

std::uint64_t default_hbm_budget(const schedule_plan& plan, const scheduler_options& options) {
  const std::size_t align = options.alignment > 0 ? options.alignment : 1;
  std::uint64_t resident = 0;
  for (const auto& b : plan.buffers) {
    resident += b.resident ? detail::round_up(b.bytes, align) : 0;
  }
  std::uint64_t largest = 0;
  for (const auto& st : plan.steps) {
    std::set<buffer_id> ids(st.reads.begin(), st.reads.end());
    ids.insert(st.writes.begin(), st.writes.end());
    std::uint64_t bytes = 0;
    for (const auto id : ids) {
      TIERFLOW_EXPECTS(id < plan.buffers.size(), "default_hbm_budget: step '" + st.name +
                                                     "' names buffer " + std::to_string(id));
      bytes += plan.buffers[id].resident ? 0 : detail::round_up(plan.buffers[id].bytes, align);
    }
    largest = std::max(largest, bytes);
  }
  return detail::staging_budget(resident, largest, options);
}

}  // namespace tierflow
