#include "tierflow/where.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "platform/numa.hpp"
#include "tierflow/error.hpp"

namespace tierflow {

page_residency where(const void* pointer, std::size_t bytes) {
  page_residency result;
  result.page_bytes = detail::platform::page_size();
  if (pointer == nullptr || bytes == 0) {
    return result;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(pointer);
  if (bytes > std::numeric_limits<std::uintptr_t>::max() - start) {
    // The end would wrap: 0 pages, or a count of 2^52 pages to query one batch at a time.
    char address[32];
    std::snprintf(address, sizeof address, "%p", pointer);
    throw error("where: " + std::to_string(bytes) + " bytes from " + address +
                " wraps the address space");
  }
  const auto page = static_cast<std::uintptr_t>(result.page_bytes);
  const auto first = start & ~(page - 1);
  const auto end = start + bytes;
  result.total_pages = static_cast<std::size_t>((end - first + page - 1) / page);

  constexpr std::size_t batch = 16384;  // pages per move_pages call
  std::vector<void*> pages;
  std::vector<int> status;
  for (std::size_t done = 0; done < result.total_pages; done += batch) {
    const std::size_t count = std::min(batch, result.total_pages - done);
    pages.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      pages[i] = reinterpret_cast<void*>(first + (done + i) * page);
    }
    if (const int code = detail::platform::query_page_nodes(pages, status); code != 0) {
      throw error(std::string("where: move_pages query failed: ") + std::strerror(code));
    }
    for (int s : status) {
      if (s >= 0) {
        result.pages_on_node[s] += 1;
      } else {
        result.untouched_pages += 1;  // -ENOENT: not faulted in; -EFAULT: not mapped
      }
    }
  }
  return result;
}

}  // namespace tierflow
