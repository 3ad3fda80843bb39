#pragma once
// What the cases of `tierflow bench` share while they measure: the run's context, pinned
// thread teams, NUMA-bound buffers, sampling and the testcase JSON they append.

#include <barrier>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_run.hpp"
#include "common/bench_util.hpp"
#include "tierflow/device.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/topology.hpp"

namespace tierflow::cli {

inline constexpr std::size_t kib = 1024;
inline constexpr std::size_t mib = kib * kib;

/** @brief What a run knows while it measures; the cases append to @ref testcases. */
struct run_context {
  const bench_config& config;
  const topology& topo;
  const bench_progress& progress;
  std::size_t array_bytes = 0;    ///< per array of the bandwidth and Adam cases
  std::size_t latency_bytes = 0;  ///< of the latency case's buffer
  std::size_t done = 0;
  std::size_t planned = 0;
  nlohmann::ordered_json testcases = nlohmann::ordered_json::array();
  nlohmann::ordered_json device = nullptr;  ///< what the link cases ran on
  std::unique_ptr<tierflow::device> dev{};  ///< opened before anything is measured
  std::string no_device{};                  ///< why there is none

  /** @brief Counts one measurement done and reports progress with @p label. */
  void step(const std::string& label);
};

/**
 * @brief Threads pinned one per CPU (round robin over the CPUs given) that run one job
 *        together; run() times the job from their common start to the last one's end.
 */
class pinned_team {
 public:
  /** @throws std::system_error when a thread cannot start (the started ones are joined) */
  pinned_team(const std::vector<int>& cpus, unsigned count);
  ~pinned_team();
  pinned_team(const pinned_team&) = delete;
  pinned_team& operator=(const pinned_team&) = delete;

  [[nodiscard]] unsigned size() const { return static_cast<unsigned>(threads_.size()); }

  /** @brief Runs job(t) on every thread t; seconds from the first thread's start to the last
   *  thread's end (each thread reads the clock itself: the caller may be descheduled). */
  double run(std::function<void(unsigned)> job);

 private:
  void start(const std::vector<int>& cpus, unsigned count);

  std::barrier<> start_;
  std::barrier<> end_;
  std::function<void(unsigned)> job_;
  bool stop_ = false;  // written before the start barrier, read after it
  std::vector<bench::clock_type::time_point> begins_;  // per thread, read after the end barrier
  std::vector<bench::clock_type::time_point> ends_;
  std::vector<std::thread> threads_;
};

/** @brief [begin, end) of thread @p t's part of @p n elements, in multiples of 16. */
std::pair<std::size_t, std::size_t> part(std::size_t n, unsigned t, unsigned threads);

/** @brief One measurement's samples, taken after one warm-up. */
template <typename F>
std::vector<double> sample(int samples, F&& once) {
  std::vector<double> values;
  for (int s = -1; s < samples; ++s) {
    const double v = once();
    if (s >= 0) {
      values.push_back(v);
    }
  }
  return values;
}

/** @brief A measured testcase: name, group, status ok, unit and the samples' summary. */
nlohmann::ordered_json testcase(const std::string& name, const std::string& group, const char* unit,
                                const std::vector<double>& values);

/** @brief A case this machine cannot run here, in its group, with where it would have run
 *  (an initiator or target below 0 is left out). */
nlohmann::ordered_json waived(const std::string& name, const std::string& reason,
                              int initiator = -1, int target = -1);

/** @brief Whether @p need bytes fit in the free memory of @p node, keeping 64 MiB spare. */
bool fits(const numa_node& node, std::size_t need);

/** @brief The thread counts to run from a node of @p cpus CPUs: --threads, else 1, 2, 4, ...
 *  below the CPU count and the CPU count. */
std::vector<unsigned> thread_counts(const bench_config& config, std::size_t cpus);

/** @brief "node N has too little free memory for COUNT x SIZE MiB" (@p count 1: no "1 x "). */
std::string short_of_memory(const numa_node& node, int count, std::size_t bytes);

/**
 * @brief A mapping of @p bytes bound to a node, freed on destruction. With huge pages,
 *        transparent huge pages are asked for; without, they are refused (MADV_NOHUGEPAGE), as
 *        most programs' memory is when THP is in `madvise` mode.
 */
class node_buffer {
 public:
  node_buffer(int node, std::size_t bytes, bool huge);
  ~node_buffer();
  node_buffer(const node_buffer&) = delete;
  node_buffer& operator=(const node_buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  /** @brief The share of the buffer backed by huge pages now (/proc/self/smaps AnonHugePages
   *  of the mappings it spans); -1 when smaps cannot be read. */
  [[nodiscard]] double huge_page_fraction() const;

 private:
  numa_resource resource_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

}  // namespace tierflow::cli
