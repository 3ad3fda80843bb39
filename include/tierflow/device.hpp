#pragma once
/** @file
 * @brief Device backends: HBM, streams, events and asynchronous copies behind one interface,
 * with a `cuda` backend (a real GPU) and an `emulated` one (host threads and a link model).
 *
 * Contracts every backend keeps:
 * - **Streams** run their operations in the order they were enqueued; different streams run
 *   concurrently. Enqueueing never blocks on the device (only on a full emulated queue).
 * - **Pointers**: device pointers (from memory()) are valid in operations on any stream of
 *   this device, and are not host-dereferenceable on a real GPU. Host pointers given to
 *   copy_async must stay valid until the copy completes (an event recorded after it fires);
 *   pinned host memory (registered with page_locker()) is required for truly asynchronous
 *   H2D/D2H on CUDA.
 * - **Events**: record() captures all work enqueued on the stream so far; the event fires when
 *   that work is done. wait() makes a stream wait for the most recent record at the time of
 *   the call (a never-recorded event is complete). query() never blocks; synchronize() blocks.
 *   elapsed_ms() is the time between two fired events.
 * - **Failure**: a failed asynchronous operation does not throw where it was enqueued; the
 *   stream (and events recorded after it, and streams that wait on those) carry the error,
 *   and the next synchronizing call (stream/event/device synchronize) throws device_error
 *   naming the operation. Reporting clears the error; later work runs normally.
 * - Destroying a device, stream or event with work in flight waits for that work; destructors
 *   never throw (they log).
 */

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tierflow/error.hpp"
#include "tierflow/memory_resource.hpp"
#include "tierflow/pinned_resource.hpp"

namespace tierflow {

/** @brief A device operation failed (enqueued work, or the backend itself). */
class device_error : public error {
 public:
  using error::error;
};

/** @brief A CUDA call failed: carries the call, where it was made and CUDA's error string. */
class cuda_error : public device_error {
 public:
  cuda_error(std::string call, std::string location, int code, std::string cuda_message);
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& location() const noexcept { return location_; }
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  std::string call_;
  std::string location_;
  int code_ = 0;
};

/** @brief Direction of a copy. */
enum class copy_kind { h2d, d2h, d2d };

/** @brief The stable name of a copy kind (`h2d`, `d2h`, `d2d`). */
[[nodiscard]] std::string_view to_string(copy_kind kind) noexcept;

/** @brief What a device is. */
struct device_properties {
  std::string backend;     ///< `cuda` or `emulated`
  std::string name;        ///< e.g. `NVIDIA H200`, `emulated (h2d 25 GB/s, ...)`
  std::string pci_bus_id;  ///< empty for the emulated device
  std::uint64_t memory_total_bytes = 0;
  int copy_engines = 0;            ///< concurrent copy engines (async engine count)
  std::optional<double> h2d_gbps;  ///< link bandwidth if known (GB/s = 10^9 B/s)
  std::optional<double> d2h_gbps;
  bool full_duplex = true;  ///< H2D and D2H can run at full speed at once
};

class stream;

/** @brief Marks a point in a stream's work. Made by device::create_event(). */
class event {
 public:
  virtual ~event() = default;
  /** @brief Whether the last recorded work is done (true if never recorded). Never blocks. */
  [[nodiscard]] virtual bool query() = 0;
  /** @brief Waits until the last recorded work is done. @throws device_error if it failed */
  virtual void synchronize() = 0;
  /** @brief Milliseconds from @p start firing to @p end firing (both recorded and fired, on
   * the same device). @throws device_error otherwise */
  [[nodiscard]] static double elapsed_ms(event& start, event& end);

 private:
  [[nodiscard]] virtual double elapsed_since_ms(event& start) = 0;
};

/** @brief An ordered queue of device work. Streams belong to their device. */
class stream {
 public:
  virtual ~stream() = default;
  /** @brief Captures the work enqueued so far in @p e. */
  virtual void record(event& e) = 0;
  /** @brief Later work on this stream waits until @p e (as recorded now) fires. */
  virtual void wait(event& e) = 0;
  /** @brief Runs @p fn on a host thread once earlier work is done; later work waits for it.
   * An exception from @p fn becomes the stream's error. */
  virtual void host_callback(std::function<void()> fn) = 0;
  /** @brief Whether all enqueued work is done. Never blocks. */
  [[nodiscard]] virtual bool query() = 0;
  /** @brief Waits for all enqueued work. @throws device_error for a failed operation */
  virtual void synchronize() = 0;
  /** @brief e.g. `compute`, `h2d`, `d2h`. */
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /**
   * @brief The backend's own handle of this stream, for launching one's own work in its order:
   * the `cudaStream_t` of a CUDA stream (valid while the stream lives; the caller makes its
   * device current), nullptr on the emulated device (use host_callback() there).
   */
  [[nodiscard]] virtual void* native_handle() const noexcept { return nullptr; }
};

/** @brief A device backend. Thread-safe: any thread may enqueue on any stream. */
class device {
 public:
  virtual ~device() = default;

  [[nodiscard]] virtual const device_properties& properties() const noexcept = 0;
  /** @brief Free device memory now, in bytes. */
  [[nodiscard]] virtual std::uint64_t memory_free_bytes() = 0;
  /** @brief Device memory (HBM). Its pointers are device pointers. */
  [[nodiscard]] virtual memory_resource& memory() = 0;
  /** @brief Whether @p p lies in device memory (this device's HBM, or memory the backend
   *  manages for it), as opposed to host memory of the caller's that its copies also reach
   *  (CPU tensors on the emulated device, pinned or pageable buffers). False when unknown. */
  [[nodiscard]] virtual bool is_device_memory(const void* p) noexcept = 0;
  /** @brief Page-locks host memory so this device can DMA it (cudaHostRegister on CUDA). */
  [[nodiscard]] virtual page_locker& host_registration() = 0;

  /** @brief The stream compute runs on. */
  [[nodiscard]] virtual stream& compute_stream() = 0;
  /** @brief The copy stream for host-to-device copies. */
  [[nodiscard]] virtual stream& h2d_stream() = 0;
  /** @brief The copy stream for device-to-host copies. */
  [[nodiscard]] virtual stream& d2h_stream() = 0;

  /** @brief A new event of this device. */
  [[nodiscard]] virtual std::unique_ptr<event> create_event() = 0;

  /**
   * @brief Copies @p bytes from @p src to @p dst on @p on, in its order.
   * @throws tierflow::error for null pointers or a stream of another device (at enqueue); on
   *         the emulated device also for more bytes than its memory and the machine's hold, or a
   *         range past the end of the address space
   */
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind,
                          stream& on) = 0;

  /** @brief Waits for all work on all streams. @throws device_error for a failed operation */
  virtual void synchronize() = 0;

  /**
   * @brief Orders this device's work after a caller's: later work on @p on (a stream of this
   * device) waits, on the device (the host does not block), for the work enqueued so far on
   * @p native, the backend's handle of the caller's stream (a `cudaStream_t`; nullptr is
   * CUDA's default stream). The emulated device has no foreign streams: a caller's work on it
   * is done when it calls, so this is a no-op there.
   * @throws device_error when the backend refuses
   */
  virtual void stream_after_native(stream& on, void* native) {
    static_cast<void>(on);
    static_cast<void>(native);
  }
  /**
   * @brief The other way: later work on @p native waits, on the device, for the work enqueued
   * so far on @p on. A no-op on the emulated device (the caller synchronizes @p on instead
   * when its host must read what @p on produced).
   * @throws device_error when the backend refuses
   */
  virtual void native_after_stream(void* native, stream& on) {
    static_cast<void>(native);
    static_cast<void>(on);
  }
};

/**
 * @brief Opens a device: `auto` (CUDA device 0 when one is usable, else emulated, logging one
 * line saying why), `cuda`, `cuda:N`, or `emulated`. The emulated device's link comes from env
 * `TIERFLOW_EMU_LINK` when set.
 * @throws device_error when the asked-for backend is unavailable, input_error for a bad spec
 */
[[nodiscard]] std::unique_ptr<device> open_device(std::string_view spec = "auto");

}  // namespace tierflow
