#pragma once
/** @file
 * @brief The emulated device: a real concurrent device made of host threads, for machines
 * without a GPU.
 *
 * "HBM" is host memory with a capacity cap. Each stream is a worker thread running its queue in
 * order; events have CUDA's semantics. Copy streams model a link: a bandwidth cap, a
 * per-transfer latency, and full or half duplex (H2D and D2H at once, or sharing the link).
 * Copies really move the bytes (bit-exact). Host callbacks on the compute stream are its
 * "kernels".
 */

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tierflow/device.hpp"

namespace tierflow {

/** @brief The emulated host-device link. */
struct link_model {
  double h2d_gbps = 25.0;  ///< GB/s = 10^9 B/s; > 0
  double d2h_gbps = 25.0;
  std::chrono::nanoseconds latency{10000};  ///< added to every transfer
  bool full_duplex = true;                  ///< false: H2D and D2H share one link

  /**
   * @brief Parses `h2d=25GB/s,d2h=25GB/s,latency=10us,duplex=full` (any subset, any order;
   * units GB/s, MB/s; ns, us, ms, s; duplex full or half). @p origin names the source in errors.
   * @throws input_error for an unknown key, a bad number or unit, or a non-positive bandwidth
   */
  [[nodiscard]] static link_model parse(std::string_view text, const std::string& origin);
  /** @brief From the `emu_link` setting (env `TIERFLOW_EMU_LINK`, then the file TIERFLOW_CONFIG
   *  names) when set, else the defaults. @throws input_error */
  [[nodiscard]] static link_model from_environment();
  /** @brief `h2d 25 GB/s, d2h 25 GB/s, latency 10 us, full duplex`. */
  [[nodiscard]] std::string describe() const;
};

/** @brief How an emulated device is made. */
struct emulated_device_options {
  link_model link;
  std::uint64_t hbm_bytes = std::uint64_t{4} << 30;  ///< capacity of the emulated HBM
  /** @brief Threads that help each copy move its bytes (memory bandwidth of one thread is
   * below the caps a real link has); 0: one per available CPU. */
  unsigned copy_threads = 0;
};

/** @brief Fault injection: the reliability tests' hooks. All are one-shot and thread-safe. */
class emulated_faults {
 public:
  virtual ~emulated_faults() = default;
  /** @brief The @p k-th copy (1 = the next) enqueued on @p on from now fails when it runs,
   * without touching its destination. Replaces what was armed on @p on. */
  virtual void fail_copy(stream& on, unsigned k) = 0;
  /** @brief Like fail_copy(), for each @p k of @p ks (counted from now): a second fault on
   * the same stream, e.g. during the recovery from the first. Replaces what was armed. */
  virtual void fail_copies(stream& on, std::vector<unsigned> ks) = 0;
  /** @brief The @p k-th device allocation from now throws out_of_capacity. */
  virtual void fail_allocation(unsigned k) = 0;
  /** @brief The next operation that runs on @p on first sleeps @p delay (a stalled stream). */
  virtual void delay_stream(stream& on, std::chrono::nanoseconds delay) = 0;
};

/** @brief An emulated device, and its fault hooks. */
class emulated_device : public device, public emulated_faults {
 public:
  /** @brief Makes an emulated device. @throws tierflow::error for bad options */
  [[nodiscard]] static std::unique_ptr<emulated_device> create(
      emulated_device_options options = {});
  /** @brief The link it models. */
  [[nodiscard]] virtual const link_model& link() const noexcept = 0;
};

}  // namespace tierflow
