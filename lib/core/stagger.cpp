#include "tierflow/detail/stagger.hpp"

namespace tierflow::detail {

std::size_t alias_distance(std::uintptr_t a, std::uintptr_t b) noexcept {
  const std::size_t d = static_cast<std::size_t>(a - b) % alias_span;
  return d <= alias_span / 2 ? d : alias_span - d;
}

std::size_t stagger_offset(const void* base, std::vector<std::uintptr_t>& apart) {
  const auto at = reinterpret_cast<std::uintptr_t>(base);
  std::size_t best = 0;
  std::size_t best_distance = 0;
  for (std::size_t offset = 0; offset < stagger_slack; offset += stagger_step) {
    std::size_t nearest = alias_span;
    for (const std::uintptr_t other : apart) {
      const std::size_t d = alias_distance(at + offset, other);
      nearest = d < nearest ? d : nearest;
    }
    if (nearest >= stagger_step) {
      best = offset;
      break;
    }
    if (nearest > best_distance) {
      best = offset;
      best_distance = nearest;
    }
  }
  apart.push_back(at + best);
  return best;
}

}  // namespace tierflow::detail
