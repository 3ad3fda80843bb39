#include "platform/numa.hpp"

#include <cerrno>
#include <mutex>
#include <string>

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include "platform/sysfs.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tierflow::detail::platform {

namespace {
constexpr std::size_t max_nodes = 1024;
constexpr std::size_t bits_per_word = 8 * sizeof(unsigned long);
}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

std::uint64_t physical_memory_bytes() noexcept {
  // Read once: the emulated device checks every copy against it.
  static const std::uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    return pages > 0 ? static_cast<std::uint64_t>(pages) * page_size() : std::uint64_t{0};
  }();
  return bytes;
}

int map_anonymous(std::size_t bytes, std::size_t alignment, void*& out) noexcept {
  const std::size_t page = page_size();
  if (alignment < page) {
    alignment = page;
  }
  // Over-map by the alignment, then trim head and tail so exactly [out, out + bytes) stays.
  const std::size_t extra = alignment > page ? alignment : 0;
  if (bytes > SIZE_MAX - extra) {
    return ENOMEM;
  }
  void* raw = ::mmap(nullptr, bytes + extra, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return errno;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const auto aligned = (start + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1);
  const std::size_t head = aligned - start;
  const std::size_t tail = extra - head;
  if (head > 0) {
    ::munmap(raw, head);
  }
  if (tail > 0) {
    ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  }
  out = reinterpret_cast<void*>(aligned);
  return 0;
}

int unmap(void* address, std::size_t bytes) noexcept {
  return ::munmap(address, bytes) == 0 ? 0 : errno;
}

int bind_memory(void* address, std::size_t bytes, mbind_mode mode,
                const std::vector<int>& nodes) noexcept {
  unsigned long mask[max_nodes / bits_per_word] = {};
  for (int node : nodes) {
    if (node < 0 || static_cast<std::size_t>(node) >= max_nodes) {
      return EINVAL;
    }
    mask[static_cast<std::size_t>(node) / bits_per_word] |=
        1UL << (static_cast<std::size_t>(node) % bits_per_word);
  }
  // maxnode counts bits; the kernel reads maxnode - 1 of them.
  if (::mbind(address, bytes, static_cast<int>(mode), mask, max_nodes + 1, 0) != 0) {
    return errno;
  }
  return 0;
}

int advise_huge_pages(void* address, std::size_t bytes) noexcept {
  return ::madvise(address, bytes, MADV_HUGEPAGE) == 0 ? 0 : errno;
}

int populate_range(void* address, std::size_t bytes) noexcept {
  if (bytes == 0) {
    return 0;
  }
  if (::madvise(address, bytes, MADV_POPULATE_WRITE) == 0) {
    return 0;
  }
  if (errno != EINVAL) {
    return errno;  // e.g. ENOMEM: the policy's nodes have no room
  }
  // Kernels before 5.14: touch one byte per page (the range is fresh, so zero stays zero).
  auto* bytes_ptr = static_cast<volatile unsigned char*>(address);
  for (std::size_t offset = 0; offset < bytes; offset += page_size()) {
    bytes_ptr[offset] = 0;
  }
  return 0;
}

int lock_pages(void* address, std::size_t bytes) noexcept {
  return ::mlock(address, bytes) == 0 ? 0 : errno;
}

int unlock_pages(void* address, std::size_t bytes) noexcept {
  return ::munlock(address, bytes) == 0 ? 0 : errno;
}

int query_page_nodes(const std::vector<void*>& pages, std::vector<int>& status) noexcept {
  try {
    status.assign(pages.size(), 0);
  } catch (...) {
    return ENOMEM;
  }
  auto** page_array = const_cast<void**>(pages.data());
  if (::move_pages(0, pages.size(), page_array, nullptr, status.data(), 0) != 0) {
    return errno;
  }
  return 0;
}

int run_on_node(int node) noexcept {
  if (numa_available() < 0) {
    return ENOSYS;
  }
  bitmask* cpus = numa_allocate_cpumask();
  if (cpus == nullptr) {
    return ENOMEM;
  }
  int result = 0;
  // libnuma fills a per-node cache on first use without a lock: two threads asking at once
  // both allocate and one block is lost (LeakSanitizer saw it with the Adam workers).
  static std::mutex cache_mutex;
  std::unique_lock lock(cache_mutex);
  const int found = numa_node_to_cpus(node, cpus);
  lock.unlock();
  if (found != 0 || numa_bitmask_weight(cpus) == 0) {
    numa_bitmask_setall(cpus);  // a CPU-less node: run anywhere
  }
  if (numa_sched_setaffinity(0, cpus) != 0) {
    result = errno;
  }
  numa_free_cpumask(cpus);
  return result;
}

std::map<int, unsigned> weighted_interleave_weights() noexcept {
  std::map<int, unsigned> weights;
  try {
    const std::filesystem::path dir = "/sys/kernel/mm/mempolicy/weighted_interleave";
    for (const auto& name : list_directory(dir)) {
      if (name.rfind("node", 0) != 0) {
        continue;
      }
      std::string text;
      if (read_text_file(dir / name, text) != 0) {
        continue;
      }
      const int node = std::stoi(name.substr(4));
      weights[node] = static_cast<unsigned>(std::stoul(text));
    }
  } catch (...) {
    weights.clear();
  }
  return weights;
}

long long node_free_bytes(int node) noexcept {
  if (numa_available() < 0) {
    return -1;
  }
  long long free_bytes = -1;
  if (numa_node_size64(node, &free_bytes) < 0) {
    return -1;
  }
  return free_bytes;
}

}  // namespace tierflow::detail::platform
