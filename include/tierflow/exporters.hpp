#pragma once
/** @file
 * @brief Exporters of the metrics leaf: Prometheus text exposition and a Chrome/Perfetto
 * trace. They only format what the layers above hand them.
 */

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tierflow::metrics {

/**
 * @brief Builds a Prometheus text exposition (format 0.0.4). Every name gets the `tierflow_`
 * prefix; units belong in the name (`_bytes`, `_seconds`) and counters end in `_total`.
 * Invalid metric or label names, a counter without `_total`, or one metric given two types
 * throw tierflow::error. Label values are escaped.
 */
class prometheus_writer {
 public:
  using labels = std::vector<std::pair<std::string, std::string>>;

  /** @brief A value that goes up and down (held bytes, a ratio). */
  void gauge(std::string_view name, std::string_view help, double value,
             const labels& label_values = {});
  /** @brief A monotonic total (bytes moved, spills); @p name must end in `_total`. */
  void counter(std::string_view name, std::string_view help, double value,
               const labels& label_values = {});
  /** @brief The exposition text, families in the order first given. */
  [[nodiscard]] std::string str() const;

 private:
  struct family {
    std::string type;
    std::string help;
    std::vector<std::string> samples;
  };
  void add(std::string_view type, std::string_view name, std::string_view help, double value,
           const labels& label_values);
  std::vector<std::string> order_;
  std::map<std::string, family> families_;
};

/**
 * @brief Records spans (a transfer, a compute step) on named tracks and writes them as a
 * Chrome trace (JSON trace events), which ui.perfetto.dev and chrome://tracing open. One track
 * per stream or thread. Thread-safe. Times are microseconds since the recorder was made.
 */
class trace_recorder {
 public:
  using clock = std::chrono::steady_clock;
  using arg_value = std::variant<std::int64_t, double, std::string>;
  using args = std::vector<std::pair<std::string, arg_value>>;

  trace_recorder();

  /** @brief A complete span on @p track from @p start to @p end. @throws error if end < start */
  void span(std::string_view track, std::string_view name, clock::time_point start,
            clock::time_point end, args arguments = {}, std::string_view category = "tierflow");
  /** @brief A zero-length marker. */
  void instant(std::string_view track, std::string_view name, clock::time_point at,
               args arguments = {});
  /** @brief Spans recorded so far. */
  [[nodiscard]] std::size_t size() const;
  /** @brief The trace: `{"traceEvents":[...],"displayTimeUnit":"ms"}` with thread-name
   * metadata for every track. */
  [[nodiscard]] std::string json() const;

 private:
  struct entry {
    char phase;  // 'X' complete, 'i' instant
    int track;
    std::string name;
    std::string category;
    double start_us;
    double duration_us;
    args arguments;
  };
  int track_id(std::string_view track);  // caller holds mutex_
  double micros(clock::time_point t) const;

  clock::time_point origin_;
  mutable std::mutex mutex_;
  std::map<std::string, int, std::less<>> tracks_;
  std::vector<entry> entries_;
};

}  // namespace tierflow::metrics
