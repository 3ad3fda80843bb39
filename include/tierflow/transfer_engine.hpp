#pragma once
/** @file
 * @brief Moves large regions between memory spaces in chunks, on the right stream, and
 * accounts every link's bytes, busy time and achieved bandwidth.
 */

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tierflow/device.hpp"
#include "tierflow/metrics.hpp"

namespace tierflow {

/** @brief Where bytes live, as far as moving them goes. */
enum class memory_space {
  host,         ///< pageable host memory (any tier): staged through pinned bounce buffers
  host_pinned,  ///< page-locked host memory registered with the device: DMA directly
  device,       ///< device memory (HBM)
};

/** @brief The stable name of a memory space (`host`, `host_pinned`, `device`). */
[[nodiscard]] std::string_view to_string(memory_space space) noexcept;

/** @brief How a transfer_engine splits and stages. */
struct transfer_options {
  std::size_t chunk_bytes = std::size_t{4} << 20;  ///< bytes per chunk (> 0)
  unsigned chunks_in_flight = 4;  ///< staged paths: bounce buffers in use at once (>= 1)
};

/**
 * @brief Moves a region as chunks, dispatching by (source space, destination space):
 * - host_pinned → device, device → host_pinned: chunks on the h2d / d2h copy stream, queued
 *   back to back; the call returns at once and the returned event fires when all are done;
 * - host → device, device → host: through `chunks_in_flight` pinned bounce buffers, the
 *   calling thread staging each chunk while the previous ones move (returns when the data is
 *   in the bounce buffers (h2d) or at its destination (d2h));
 * - device → device on the compute stream; host → host by memcpy on the calling thread.
 * Other routes can be registered. Pointers must stay valid until the returned event fires.
 * Thread-safe. Does not own the device, which must outlive it.
 */
class transfer_engine {
 public:
  /** @throws tierflow::error for zero chunk size or in-flight count */
  explicit transfer_engine(device& dev, transfer_options options = {});
  ~transfer_engine();
  transfer_engine(const transfer_engine&) = delete;
  transfer_engine& operator=(const transfer_engine&) = delete;

  /**
   * @brief Copies @p bytes from @p src (in @p from) to @p dst (in @p to).
   * @return an event that fires when the bytes are at the destination
   * @throws tierflow::error for null pointers or an unregistered route; device_error when a
   *         staged path's copy fails
   */
  std::unique_ptr<event> copy(void* dst, memory_space to, const void* src, memory_space from,
                              std::size_t bytes);

  /** @brief How a route moves bytes: enqueue (or do) the copy, record completion in @p done. */
  using route = std::function<void(void* dst, const void* src, std::size_t bytes, event& done)>;
  /** @brief Sets the route for (@p from, @p to), replacing any. */
  void register_route(memory_space from, memory_space to, route r);

  /** @brief What a link has carried: `h2d`, `d2h`, `d2d`, `h2h`. Finished transfers only. */
  [[nodiscard]] metrics::link_usage link(std::string_view name);
  /** @brief Every link's usage as JSON: `{"h2d":{"bytes":..,"transfers":..,"busy_seconds":..,
   * "achieved_gbps":..},...}`. */
  [[nodiscard]] std::string links_json();

  [[nodiscard]] device& target() const noexcept { return device_; }
  [[nodiscard]] const transfer_options& options() const noexcept { return options_; }

 private:
  struct pending;
  void chunked(void* dst, const void* src, std::size_t bytes, copy_kind kind, stream& on,
               event& done);
  void staged_h2d(void* dst, const void* src, std::size_t bytes, event& done);
  void staged_d2h(void* dst, const void* src, std::size_t bytes, event& done);
  void track(std::string link, std::size_t bytes, std::unique_ptr<event> start, stream& on);
  void harvest();
  char* bounce(std::size_t slot);

  device& device_;
  transfer_options options_;
  std::map<std::pair<memory_space, memory_space>, route> routes_;
  std::mutex mutex_;          // guards what follows
  std::mutex staging_mutex_;  // one staged transfer at a time uses the bounce buffers
  std::vector<std::unique_ptr<pending>> pending_;
  std::map<std::string, metrics::link_counter, std::less<>> links_;
  void* bounce_ = nullptr;  // chunks_in_flight x chunk_bytes, page-locked for the device
  std::size_t bounce_bytes_ = 0;
  std::vector<std::unique_ptr<event>> slot_done_;  // last DMA of each bounce buffer
};

}  // namespace tierflow
