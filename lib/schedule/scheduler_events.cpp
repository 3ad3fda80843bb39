#include "schedule/scheduler_events.hpp"

#include <algorithm>

#include <unistd.h>

#include "tierflow/detail/parse.hpp"

namespace tierflow::detail {

// Disjoint page spans covering a set of host ranges (registering a page twice fails on CUDA).
std::vector<std::pair<char*, std::size_t>> page_spans(
    std::vector<std::pair<char*, std::size_t>> ranges) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char*, std::size_t>> spans;
  for (const auto& [p, n] : ranges) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const auto begin = address / page * page;
    const auto end = detail::round_up(address + n, page);
    if (!spans.empty()) {
      auto& last = spans.back();
      const auto last_end = reinterpret_cast<std::uintptr_t>(last.first) + last.second;
      if (begin <= last_end) {
        last.second = std::max(last_end, end) - reinterpret_cast<std::uintptr_t>(last.first);
        continue;
      }
    }
    spans.emplace_back(reinterpret_cast<char*>(begin), end - begin);
  }
  return spans;
}

}  // namespace tierflow::detail
