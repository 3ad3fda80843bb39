#pragma once
// Thin platform layer over Linux memory syscalls: mmap, mbind (including weighted interleave,
// which Debian 12's libnuma has no API for), madvise, mlock, move_pages, CPU affinity and the
// weighted-interleave weights in sysfs. Returns errno values; never throws.

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace tierflow::detail::platform {

/** mbind modes (linux/mempolicy.h); weighted interleave is mode 6 from Linux 6.9. */
enum class mbind_mode : int {
  preferred = 1,
  bind = 2,
  interleave = 3,
  preferred_many = 5,
  weighted_interleave = 6,
};

/** The system's base page size. */
std::size_t page_size() noexcept;

/** The machine's physical memory in bytes (0 when the system does not say). */
std::uint64_t physical_memory_bytes() noexcept;

/** Anonymous private read/write mapping of exactly @p bytes at an address aligned to
 *  @p alignment (a power of two, at least the page size). Returns 0 and sets @p out. */
int map_anonymous(std::size_t bytes, std::size_t alignment, void*& out) noexcept;

/** munmap. */
int unmap(void* address, std::size_t bytes) noexcept;

/** mbind(address, bytes, mode, nodes). */
int bind_memory(void* address, std::size_t bytes, mbind_mode mode,
                const std::vector<int>& nodes) noexcept;

/** madvise(MADV_HUGEPAGE). */
int advise_huge_pages(void* address, std::size_t bytes) noexcept;

/** Faults in every page of the range for writing (MADV_POPULATE_WRITE, else a touch loop). */
int populate_range(void* address, std::size_t bytes) noexcept;

/** mlock / munlock. */
int lock_pages(void* address, std::size_t bytes) noexcept;
int unlock_pages(void* address, std::size_t bytes) noexcept;

/** move_pages in query mode: the node of each page (negative errno for an absent page). */
int query_page_nodes(const std::vector<void*>& pages, std::vector<int>& status) noexcept;

/** Pins the calling thread to the CPUs of @p node (all CPUs when the node has none). */
int run_on_node(int node) noexcept;

/** The kernel's weighted-interleave weights (/sys/kernel/mm/mempolicy/weighted_interleave);
 *  empty when the kernel has none. */
std::map<int, unsigned> weighted_interleave_weights() noexcept;

/** MemFree of @p node from libnuma (bytes), or -1. */
long long node_free_bytes(int node) noexcept;

}  // namespace tierflow::detail::platform
