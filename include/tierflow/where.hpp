#pragma once
/** @file
 * @brief Where are my bytes? The NUMA node of every page of a range, asked of the kernel.
 */

#include <cstddef>
#include <map>

namespace tierflow {

/** @brief Pages of a range by the node that holds them. */
struct page_residency {
  std::size_t page_bytes = 0;                ///< the base page size the counts are in
  std::size_t total_pages = 0;               ///< pages the range touches
  std::map<int, std::size_t> pages_on_node;  ///< resident pages per node id
  std::size_t untouched_pages = 0;           ///< not yet faulted in (or not mapped)

  /** @brief Resident pages on @p node. */
  [[nodiscard]] std::size_t pages_on(int node) const noexcept {
    const auto it = pages_on_node.find(node);
    return it == pages_on_node.end() ? 0 : it->second;
  }
};

/**
 * @brief The node of each page of [@p pointer, @p pointer + @p bytes) (move_pages in query
 * mode; nothing moves). Pages of a huge page are counted one by one.
 * A null @p pointer or 0 @p bytes is an empty range (0 pages).
 * @throws tierflow::error for a range that wraps the address space, or when the kernel
 *         refuses the query (e.g. no NUMA support)
 */
[[nodiscard]] page_residency where(const void* pointer, std::size_t bytes);

}  // namespace tierflow
