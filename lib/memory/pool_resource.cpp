#include "tierflow/pool_resource.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <thread>

#include "core/threads.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

namespace {

constexpr std::size_t block_granularity = 256;
constexpr std::size_t chunk_alignment = 4096;

}  // namespace

pool_resource::pool_resource(memory_resource& upstream, pool_options options)
    : upstream_(upstream), options_(options) {
  TIERFLOW_EXPECTS(options_.chunk_bytes > 0, "pool_resource: chunk_bytes must be above 0");
  options_.chunk_bytes = detail::round_up(options_.chunk_bytes, chunk_alignment);
  if (options_.dedicated_bytes == 0) {
    options_.dedicated_bytes = std::max<std::size_t>(options_.chunk_bytes / 20, 1);
  }
}

pool_resource::~pool_resource() {
  const std::lock_guard lock(mutex_);
  if (!allocated_.empty()) {
    detail::log(log_level::warning, name() + " destroyed with " +
                                        std::to_string(allocated_.size()) +
                                        " allocation(s) still in use; their memory is freed");
  }
  for (auto& c : chunks_) {
    if (c.base != nullptr) {
      upstream_.deallocate(c.base, c.bytes, chunk_alignment);
    }
  }
}

std::uint64_t pool_resource::upstream_bytes() const {
  const std::lock_guard lock(mutex_);
  return upstream_bytes_;
}

std::uint64_t pool_resource::allocated_bytes() const {
  const std::lock_guard lock(mutex_);
  return allocated_bytes_;
}

void pool_resource::remove_free(std::map<char*, block>::iterator it) {
  auto range = free_by_size_.equal_range(it->second.bytes);
  for (auto s = range.first; s != range.second; ++s) {
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_by_address_.erase(it);
}

void pool_resource::add_free(char* address, std::size_t bytes, std::size_t chunk_index) {
  // Coalesce with the free neighbours of the same chunk (chunks may sit side by side in the
  // address space, but each goes back upstream whole).
  auto next = free_by_address_.lower_bound(address);
  if (next != free_by_address_.end() && next->first == address + bytes &&
      next->second.chunk_index == chunk_index) {
    bytes += next->second.bytes;
    remove_free(next);
  }
  auto after = free_by_address_.lower_bound(address);
  if (after != free_by_address_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second.bytes == address && prev->second.chunk_index == chunk_index) {
      address = prev->first;
      bytes += prev->second.bytes;
      remove_free(prev);
    }
  }
  free_by_address_.emplace(address, block{bytes, chunk_index});
  free_by_size_.emplace(bytes, address);
}

void pool_resource::add_chunk(char* base, std::size_t bytes) {
  chunks_.push_back({base, bytes, 0});
  upstream_bytes_ += bytes;
  add_free(base, bytes, chunks_.size() - 1);
}

void* pool_resource::take_from_free_list(std::size_t bytes, std::size_t alignment) {
  for (auto s = free_by_size_.lower_bound(bytes); s != free_by_size_.end(); ++s) {
    char* start = s->second;
    const auto address = reinterpret_cast<std::uintptr_t>(start);
    const auto aligned = (address + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1);
    const std::size_t head = aligned - address;
    if (head + bytes > s->first) {
      continue;
    }
    auto it = free_by_address_.find(start);
    const auto whole = it->second;
    remove_free(it);
    if (head > 0) {
      add_free(start, head, whole.chunk_index);
    }
    const std::size_t tail = whole.bytes - head - bytes;
    char* result = start + head;
    if (tail > 0) {
      add_free(result + bytes, tail, whole.chunk_index);
    }
    allocated_.emplace(result, allocation{bytes, whole.chunk_index});
    chunks_[whole.chunk_index].in_use += 1;
    allocated_bytes_ += bytes;
    return result;
  }
  return nullptr;
}

void* pool_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t size = detail::round_up(bytes, block_granularity);
  if (size < bytes) {
    throw out_of_capacity(name(), bytes, {});
  }
  alignment = std::max(alignment, block_granularity);
  while (true) {
    {
      const std::lock_guard lock(mutex_);
      if (void* p = take_from_free_list(size, alignment)) {
        return p;
      }
    }
    const std::size_t extra = alignment > chunk_alignment ? alignment : 0;
    const std::size_t exact = detail::round_up(size + extra, chunk_alignment);
    grow(size >= options_.dedicated_bytes ? exact : std::max(options_.chunk_bytes, exact), bytes);
  }
}

void pool_resource::grow(std::size_t chunk_size, std::size_t requested) {
  {
    // Count the chunk against max_bytes before asking upstream, so concurrent growth cannot
    // pass the cap.
    const std::lock_guard lock(mutex_);
    const auto committed = upstream_bytes_ + growing_bytes_;
    if (options_.max_bytes > 0 && committed + chunk_size > options_.max_bytes) {
      throw out_of_capacity(
          name(), requested,
          {{name(), options_.max_bytes > committed ? options_.max_bytes - committed : 0}});
    }
    growing_bytes_ += chunk_size;
  }
  // Outside the lock: upstream may take long (populate, page-lock).
  char* base = nullptr;
  try {
    base = static_cast<char*>(upstream_.allocate(chunk_size, chunk_alignment));
  } catch (...) {
    const std::lock_guard lock(mutex_);
    growing_bytes_ -= chunk_size;
    throw;
  }
  const std::lock_guard lock(mutex_);
  growing_bytes_ -= chunk_size;
  try {
    add_chunk(base, chunk_size);
  } catch (...) {
    upstream_.deallocate(base, chunk_size, chunk_alignment);
    throw;
  }
}

void pool_resource::do_deallocate(void* pointer, std::size_t bytes, std::size_t) noexcept {
  const std::lock_guard lock(mutex_);
  auto it = allocated_.find(static_cast<char*>(pointer));
  if (it == allocated_.end()) {
    detail::log(log_level::error, name() + ": deallocate of a pointer it did not hand out");
    return;
  }
  if (detail::round_up(bytes, block_granularity) != it->second.bytes) {
    detail::log(log_level::error, name() + ": deallocate with " + std::to_string(bytes) +
                                      " bytes for an allocation of " +
                                      std::to_string(it->second.bytes));
  }
  const auto record = it->second;
  allocated_.erase(it);
  allocated_bytes_ -= record.bytes;
  chunks_[record.chunk_index].in_use -= 1;
  try {
    add_free(static_cast<char*>(pointer), record.bytes, record.chunk_index);
  } catch (...) {
    // The free list could not grow: the block is lost to the pool until it is destroyed.
    detail::log(log_level::error, name() + ": out of memory while freeing a block");
  }
}

void pool_resource::release_unused() noexcept {
  const std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    auto& c = chunks_[i];
    if (c.base == nullptr || c.in_use > 0) {
      continue;
    }
    auto it = free_by_address_.find(c.base);
    if (it == free_by_address_.end() || it->second.bytes != c.bytes) {
      continue;  // cannot happen when in_use is 0; keep the chunk rather than guess
    }
    remove_free(it);
    upstream_.deallocate(c.base, c.bytes, chunk_alignment);
    upstream_bytes_ -= c.bytes;
    c.base = nullptr;
  }
}

void pool_resource::reserve(std::uint64_t bytes, unsigned threads) {
  const std::uint64_t chunk_size = options_.chunk_bytes;
  const std::uint64_t count64 = bytes / chunk_size + (bytes % chunk_size != 0 ? 1 : 0);
  {
    // Refused before anything is taken: more than a 64-bit count of chunks can hold (the
    // rounding up would wrap to a small number), or more than max_bytes leaves room for.
    const std::lock_guard lock(mutex_);
    const auto committed = upstream_bytes_ + growing_bytes_;
    const bool wraps = count64 > std::numeric_limits<std::uint64_t>::max() / chunk_size;
    if (wraps ||
        (options_.max_bytes > 0 && (committed > options_.max_bytes ||
                                    count64 * chunk_size > options_.max_bytes - committed))) {
      const std::uint64_t room =
          options_.max_bytes == 0
              ? 0
              : (options_.max_bytes > committed ? options_.max_bytes - committed : 0);
      throw out_of_capacity(name(), bytes, {{name(), room}});
    }
  }
  const auto count = static_cast<std::size_t>(count64);
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(count)));
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        grow(options_.chunk_bytes, options_.chunk_bytes);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!first_error) {
          first_error = std::current_exception();
        }
        next = count;
      }
    }
  };
  std::vector<std::thread> pool;
  (void)detail::start_helpers(pool, threads - 1, name() + ": reserve", work);
  work();
  for (auto& t : pool) {
    t.join();
  }
  if (first_error) {
    std::rethrow_exception(first_error);
  }
}

}  // namespace tierflow
