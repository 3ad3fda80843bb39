#include "tierflow/numa_resource.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <set>
#include <thread>

#include "core/threads.hpp"
#include "platform/numa.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

namespace platform = detail::platform;

namespace {

// A failed mmap, mbind or page fault-in: EINVAL is an argument the kernel refused (a node this
// machine lacks, a bad policy), anything else the machine's state (limits, permissions, memory
// it cannot give): environment_error.
[[noreturn]] void throw_memory_failure(const std::string& context, const std::string& resource,
                                       int code) {
  if (code == EINVAL) {
    throw error(context + ": " + std::strerror(code));
  }
  throw environment_error(context, resource, code);
}

constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;
constexpr std::size_t populate_piece_bytes = std::size_t{32} << 20;

std::string node_list(const std::vector<int>& nodes) {
  return detail::format_id_list(nodes);
}

std::vector<out_of_capacity::tier_free> free_by_node(const std::vector<int>& nodes) {
  std::vector<out_of_capacity::tier_free> free;
  for (int node : nodes) {
    const auto bytes_free = platform::node_free_bytes(node);
    free.push_back({"node" + std::to_string(node),
                    bytes_free < 0 ? 0 : static_cast<std::uint64_t>(bytes_free)});
  }
  return free;
}

}  // namespace

std::string_view to_string(numa_policy policy) noexcept {
  switch (policy) {
    case numa_policy::bind:
      return "bind";
    case numa_policy::preferred:
      return "preferred";
    case numa_policy::interleave:
      return "interleave";
    case numa_policy::weighted_interleave:
      return "weighted_interleave";
  }
  return "unknown";
}

numa_resource::numa_resource(numa_resource_options options) : options_(std::move(options)) {
  TIERFLOW_EXPECTS(!options_.nodes.empty(), "numa_resource needs at least one node");
  std::set<int> seen;
  for (const auto& node : options_.nodes) {
    TIERFLOW_EXPECTS(node.value >= 0 && node.value < 1024,
                     "numa_resource: node id " + std::to_string(node.value) + " is out of range");
    TIERFLOW_EXPECTS(seen.insert(node.value).second,
                     "numa_resource: node " + std::to_string(node.value) + " is listed twice");
    node_ids_.push_back(node.value);
  }
  if (options_.policy == numa_policy::weighted_interleave) {
    TIERFLOW_EXPECTS(options_.weights.empty() || options_.weights.size() == options_.nodes.size(),
                     "numa_resource: " + std::to_string(options_.weights.size()) + " weights for " +
                         std::to_string(options_.nodes.size()) + " nodes");
    for (unsigned w : options_.weights) {
      TIERFLOW_EXPECTS(w > 0, "numa_resource: weight 0 (each node needs a weight of 1 or more)");
    }
  } else {
    TIERFLOW_EXPECTS(options_.weights.empty(),
                     "numa_resource: weights are only for weighted_interleave");
  }
  effective_policy_ = std::string(to_string(options_.policy));
}

std::string numa_resource::name() const {
  std::string text = "numa(" + std::string(to_string(options_.policy)) + " ";
  for (std::size_t i = 0; i < node_ids_.size(); ++i) {
    if (i > 0) {
      text += ',';
    }
    text += std::to_string(node_ids_[i]);
    if (!options_.weights.empty()) {
      text += ':';
      text += std::to_string(options_.weights[i]);
    }
  }
  return text + ")";
}

std::string numa_resource::effective_policy() const {
  const std::lock_guard lock(policy_mutex_);
  return effective_policy_;
}

std::size_t numa_resource::mapping_bytes(std::size_t bytes) const noexcept {
  return detail::round_up(bytes, platform::page_size());
}

void* numa_resource::do_allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t length = mapping_bytes(bytes);
  if (length < bytes) {
    throw out_of_capacity(name(), bytes, {});
  }
  const bool huge = options_.huge_pages && length >= huge_page_bytes;
  const std::size_t map_alignment = std::max(alignment, huge ? huge_page_bytes : std::size_t{0});
  void* address = nullptr;
  if (const int code = platform::map_anonymous(length, map_alignment, address); code != 0) {
    if (code == ENOMEM) {
      throw out_of_capacity(name(), bytes, free_by_node(node_ids_));
    }
    throw_memory_failure(name() + ": mmap of " + format_byte_count(length) + " failed", name(),
                         code);
  }
  try {
    if (huge) {
      platform::advise_huge_pages(address, length);  // advisory: THP may be off
    }
    const auto segments = place(address, length);
    if (options_.populate) {
      populate(address, segments);
    }
  } catch (...) {
    platform::unmap(address, length);
    throw;
  }
  return address;
}

void numa_resource::do_deallocate(void* pointer, std::size_t bytes, std::size_t) noexcept {
  if (const int code = platform::unmap(pointer, mapping_bytes(bytes)); code != 0) {
    detail::log(log_level::error,
                name() + ": munmap failed: " + std::strerror(code) + " (memory not released)");
  }
}

std::vector<numa_resource::segment> numa_resource::place(void* address, std::size_t bytes) {
  auto bind = [&](void* start, std::size_t length, platform::mbind_mode mode,
                  const std::vector<int>& nodes) {
    if (const int code = platform::bind_memory(start, length, mode, nodes); code != 0) {
      throw_memory_failure(name() + ": mbind(" + std::to_string(static_cast<int>(mode)) +
                               ", nodes " + node_list(nodes) + ") failed",
                           name(), code);
    }
  };
  const int single = node_ids_.size() == 1 ? node_ids_.front() : -1;
  switch (options_.policy) {
    case numa_policy::bind:
      bind(address, bytes, platform::mbind_mode::bind, node_ids_);
      return {{0, bytes, single}};
    case numa_policy::preferred:
      bind(address, bytes,
           node_ids_.size() == 1 ? platform::mbind_mode::preferred
                                 : platform::mbind_mode::preferred_many,
           node_ids_);
      return {{0, bytes, single}};
    case numa_policy::interleave:
      bind(address, bytes, platform::mbind_mode::interleave, node_ids_);
      return {{0, bytes, single}};
    case numa_policy::weighted_interleave:
      break;
  }

  // Weighted interleave: the kernel's mode 6 uses the system-wide weights, so it serves when
  // the caller asked for those (or for none); other weights get a user-space split.
  const auto kernel_weights = platform::weighted_interleave_weights();
  bool kernel_matches = options_.weights.empty();
  if (!kernel_matches) {
    kernel_matches = true;
    for (std::size_t i = 0; i < node_ids_.size(); ++i) {
      const auto it = kernel_weights.find(node_ids_[i]);
      kernel_matches =
          kernel_matches && it != kernel_weights.end() && it->second == options_.weights[i];
    }
  }
  if (kernel_matches && !kernel_weighted_refused_.load()) {
    const int code =
        platform::bind_memory(address, bytes, platform::mbind_mode::weighted_interleave, node_ids_);
    if (code == 0) {
      const std::lock_guard lock(policy_mutex_);
      effective_policy_ = "weighted_interleave (kernel)";
      return {{0, bytes, single}};
    }
    if (code != EINVAL) {
      throw_memory_failure(
          name() + ": mbind(weighted interleave, nodes " + node_list(node_ids_) + ") failed",
          name(), code);
    }
    kernel_weighted_refused_.store(true);
    detail::log(log_level::info, name() +
                                     ": the kernel refuses MPOL_WEIGHTED_INTERLEAVE (before "
                                     "Linux 6.9?); splitting ranges by weight instead");
  }
  std::vector<unsigned> weights = options_.weights;
  if (weights.empty()) {
    for (int node : node_ids_) {
      const auto it = kernel_weights.find(node);
      weights.push_back(it != kernel_weights.end() && it->second > 0 ? it->second : 1);
    }
  }
  {
    const std::lock_guard lock(policy_mutex_);
    effective_policy_ = "weighted_interleave (user-space split)";
  }
  return split_by_weights(address, bytes, weights);
}

std::vector<numa_resource::segment> numa_resource::split_by_weights(
    void* address, std::size_t bytes, const std::vector<unsigned>& weights) {
  // Ranges in whole huge pages when the mapping is large enough, so no huge page straddles
  // two nodes; else whole base pages.
  const std::size_t unit = options_.huge_pages && bytes >= huge_page_bytes * node_ids_.size()
                               ? huge_page_bytes
                               : platform::page_size();
  const std::size_t units = bytes / unit + (bytes % unit ? 1 : 0);
  const auto total_weight = std::accumulate(weights.begin(), weights.end(), std::uint64_t{0});
  std::vector<segment> segments;
  std::size_t offset = 0;
  std::uint64_t weight_so_far = 0;
  for (std::size_t i = 0; i < node_ids_.size(); ++i) {
    weight_so_far += weights[i];
    // Cumulative rounding keeps the total exact and each share within one unit of its due.
    const std::size_t end_unit = detail::scale(units, weight_so_far, total_weight);
    const std::size_t end = std::min(bytes, end_unit * unit);
    if (end > offset) {
      segments.push_back({offset, end - offset, node_ids_[i]});
      offset = end;
    }
  }
  if (offset < bytes) {
    segments.back().bytes += bytes - offset;
  }
  for (const auto& s : segments) {
    auto* start = static_cast<char*>(address) + s.offset;
    if (const int code =
            platform::bind_memory(start, s.bytes, platform::mbind_mode::bind, {s.node});
        code != 0) {
      throw_memory_failure(name() + ": mbind(bind, node " + std::to_string(s.node) + ") for a " +
                               format_byte_count(s.bytes) + " range failed",
                           name(), code);
    }
  }
  return segments;
}

void numa_resource::populate(void* address, const std::vector<segment>& segments) const {
  struct piece {
    char* start;
    std::size_t bytes;
    int node;
  };
  std::vector<piece> pieces;
  for (const auto& s : segments) {
    for (std::size_t offset = 0; offset < s.bytes; offset += populate_piece_bytes) {
      pieces.push_back({static_cast<char*>(address) + s.offset + offset,
                        std::min(populate_piece_bytes, s.bytes - offset), s.node});
    }
  }
  unsigned threads = options_.populate_threads;
  if (threads == 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
  }
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, pieces.size()));

  std::atomic<std::size_t> next{0};
  std::atomic<int> failure{0};
  auto work = [&](bool pin) {
    int pinned_node = -2;
    for (std::size_t i = next++; i < pieces.size() && failure.load() == 0; i = next++) {
      if (pin && pieces[i].node != pinned_node && pieces[i].node >= 0) {
        platform::run_on_node(pieces[i].node);  // best effort: placement follows the policy
        pinned_node = pieces[i].node;
      }
      if (const int code = platform::populate_range(pieces[i].start, pieces[i].bytes); code != 0) {
        int expected = 0;
        failure.compare_exchange_strong(expected, code);
      }
    }
  };
  if (threads <= 1) {
    work(false);  // the caller's own thread keeps its affinity
  } else {
    std::vector<std::thread> pool;
    const auto pinned_work = [&work] { work(true); };
    if (detail::start_helpers(pool, threads, name() + ": populate", pinned_work) == 0) {
      work(false);  // no helper at all: the caller's thread does it, keeping its affinity
    }
    for (auto& t : pool) {
      t.join();
    }
  }
  if (const int code = failure.load(); code != 0) {
    std::uint64_t total = 0;
    for (const auto& s : segments) {
      total += s.bytes;
    }
    if (code == ENOMEM) {
      throw out_of_capacity(name(), total, free_by_node(node_ids_));
    }
    throw_memory_failure(name() + ": populating " + format_byte_count(total) + " failed", name(),
                         code);
  }
}

}  // namespace tierflow
