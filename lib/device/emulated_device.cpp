// The emulated device: streams are worker threads, events follow CUDA's semantics, copies
// move real bytes at a modelled link's pace.

#include "tierflow/emulated_device.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <latch>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/threads.hpp"
#include "device/device_internal.hpp"
#include "device/emulated_hbm.hpp"
#include "platform/numa.hpp"
#include "platform/stream_copy.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

namespace {

using clock_type = std::chrono::steady_clock;
namespace platform = detail::platform;

// --- parallel memcpy --------------------------------------------------------------------

// One thread's memory bandwidth is below the links being modelled, so a copy's bytes are moved
// by the stream's own thread and a few helpers.
class parallel_copier {
 public:
  explicit parallel_copier(unsigned helpers) {
    (void)detail::start_helpers(threads_, helpers, "emulated device copies", [this] { run(); });
  }
  parallel_copier(const parallel_copier&) = delete;
  parallel_copier& operator=(const parallel_copier&) = delete;
  ~parallel_copier() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      t.join();
    }
  }

  void copy(void* dst, const void* src, std::size_t bytes) {
    constexpr std::size_t min_piece = std::size_t{1} << 20;
    const std::size_t parts =
        std::min<std::size_t>(threads_.size() + 1, std::max<std::size_t>(1, bytes / min_piece));
    if (parts <= 1) {
      platform::stream_copy(dst, src, bytes);
      return;
    }
    // Rounded up from the ceiling: parts × piece covers every byte (bytes / parts rounded
    // down could already be page-aligned and leave the last bytes % parts uncopied).
    const std::size_t piece = detail::round_up((bytes + parts - 1) / parts, 4096);
    std::latch done(static_cast<std::ptrdiff_t>(parts - 1));
    {
      const std::lock_guard lock(mutex_);
      for (std::size_t i = 1; i < parts; ++i) {
        const std::size_t offset = i * piece;
        const std::size_t length = offset >= bytes ? 0 : std::min(piece, bytes - offset);
        jobs_.push_back({static_cast<char*>(dst) + offset, static_cast<const char*>(src) + offset,
                         length, &done});
      }
    }
    cv_.notify_all();
    platform::stream_copy(dst, src, std::min(piece, bytes));
    done.wait();
  }

 private:
  struct job {
    char* dst;
    const char* src;
    std::size_t bytes;
    std::latch* done;
  };
  void run() {
    while (true) {
      job j{};
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) {
          return;
        }
        j = jobs_.front();
        jobs_.pop_front();
      }
      if (j.bytes > 0) {
        platform::stream_copy(j.dst, j.src, j.bytes);
      }
      j.done->count_down();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// --- link -------------------------------------------------------------------------------

// A direction of the link (or both, half duplex): transfers occupy it one after another, each
// for latency + bytes / bandwidth.
class link_channel {
 public:
  /** When this transfer leaves the link. A transfer that follows the last one closely starts
   * where it ended, so a worker's late wake-up is made up by the next transfer rather than
   * lost; after an idle gap it starts now. The gap that still counts as back to back is
   * short: a longer one would let a transfer after a brief idle spell (a compute step of a
   * few hundred µs) reclaim the idle time and beat the link's cap. */
  clock_type::time_point reserve(std::size_t bytes, double gbps, std::chrono::nanoseconds latency) {
    constexpr auto back_to_back = std::chrono::microseconds(150);
    const std::lock_guard lock(mutex_);
    const auto now = clock_type::now();
    const auto start = now > free_at_ + back_to_back ? now : free_at_;
    const auto duration = latency + std::chrono::nanoseconds(static_cast<std::int64_t>(
                                        static_cast<double>(bytes) / gbps));  // bytes / (B/ns)
    free_at_ = start + duration;
    return free_at_;
  }

 private:
  std::mutex mutex_;
  clock_type::time_point free_at_{};
};

// --- events -----------------------------------------------------------------------------

struct event_state {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // versions handed out by record()
  std::uint64_t completed = 0;  // last version done
  clock_type::time_point fired_at{};
  std::uint64_t error_version = 0;  // the version whose work failed, and why
  std::string error;

  void complete(std::uint64_t version, const std::string& failure) {
    {
      const std::lock_guard lock(mutex);
      completed = std::max(completed, version);
      fired_at = clock_type::now();
      if (!failure.empty()) {
        error_version = version;
        error = failure;
      }
    }
    cv.notify_all();
  }
  // Waits for @p version; returns the failure of that version's work, if any.
  std::string wait_for(std::uint64_t version) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return completed >= version; });
    return error_version == version ? error : std::string();
  }
};

class emulated_event final : public event {
 public:
  explicit emulated_event(const void* owner) : owner_(owner) {}
  bool query() override {
    const std::lock_guard lock(state_->mutex);
    return state_->completed >= state_->recorded;
  }
  void synchronize() override {
    std::uint64_t version = 0;
    {
      const std::lock_guard lock(state_->mutex);
      version = state_->recorded;
    }
    if (const auto failure = state_->wait_for(version); !failure.empty()) {
      throw device_error("event: the work it waited for failed: " + failure);
    }
  }
  std::shared_ptr<event_state> state() const { return state_; }
  const void* owner() const { return owner_; }

 private:
  double elapsed_since_ms(event& start_event) override {
    auto* start = dynamic_cast<emulated_event*>(&start_event);
    TIERFLOW_EXPECTS(start != nullptr && start->owner_ == owner_,
                     "elapsed_ms: both events must belong to the same emulated device");
    const auto times = [](event_state& s) {
      const std::lock_guard lock(s.mutex);
      TIERFLOW_EXPECTS(s.recorded > 0 && s.completed >= s.recorded,
                       "elapsed_ms: an event has not been recorded or has not fired yet");
      return s.fired_at;
    };
    const auto begin = times(*start->state_);
    const auto end = times(*state_);
    return std::chrono::duration<double, std::milli>(end - begin).count();
  }

  const void* owner_;
  std::shared_ptr<event_state> state_ = std::make_shared<event_state>();
};

// --- streams ----------------------------------------------------------------------------

class emulated_stream final : public stream {
 public:
  using operation = std::function<void(emulated_stream&)>;

  emulated_stream(std::string name, const void* owner) : name_(std::move(name)), owner_(owner) {
    worker_ = detail::start_thread("emulated stream " + name_, [this] { run(); });
  }
  emulated_stream(const emulated_stream&) = delete;
  emulated_stream& operator=(const emulated_stream&) = delete;
  ~emulated_stream() override {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();  // drains what was enqueued first
    if (failed()) {
      detail::log(log_level::warning,
                  "emulated stream " + name_ + " destroyed with an unreported error: " + error());
    }
  }

  void enqueue(operation op) {
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
      ++pending_;
    }
    work_cv_.notify_one();
  }

  void record(event& e) override {
    auto* ev = checked_event(e);
    auto state = ev->state();
    std::uint64_t version = 0;
    {
      const std::lock_guard lock(state->mutex);
      version = ++state->recorded;
    }
    enqueue([state, version](emulated_stream& s) { state->complete(version, s.error()); });
  }

  void wait(event& e) override {
    auto state = checked_event(e)->state();
    std::uint64_t version = 0;
    {
      const std::lock_guard lock(state->mutex);
      version = state->recorded;
    }
    if (version == 0) {
      return;  // never recorded: complete
    }
    enqueue([state, version](emulated_stream& s) {
      if (const auto failure = state->wait_for(version); !failure.empty()) {
        s.fail("waited on an event whose work failed: " + failure);
      }
    });
  }

  void host_callback(std::function<void()> fn) override {
    TIERFLOW_EXPECTS(fn != nullptr, "host_callback: empty function");
    enqueue([fn = std::move(fn)](emulated_stream& s) {
      if (s.failed()) {
        return;  // skipped: earlier work failed
      }
      try {
        fn();
      } catch (const std::exception& ex) {
        s.fail(std::string("host callback on ") + s.name_ + " threw: " + ex.what());
      } catch (...) {
        s.fail("host callback on " + s.name_ + " threw a non-standard exception");
      }
    });
  }

  bool query() override {
    const std::lock_guard lock(mutex_);
    return pending_ == 0;
  }

  void synchronize() override {
    {
      std::unique_lock lock(mutex_);
      idle_cv_.wait(lock, [&] { return pending_ == 0; });
    }
    std::string failure;
    {
      const std::lock_guard lock(error_mutex_);
      failure.swap(error_);
    }
    if (!failure.empty()) {
      throw device_error("stream " + name_ + ": " + failure);
    }
  }

  std::string_view name() const noexcept override { return name_; }
  const void* owner() const noexcept { return owner_; }

  // Fault hooks (thread-safe).
  void fail_copies(std::vector<unsigned> ks) {
    const std::lock_guard lock(fault_mutex_);
    copy_fail_at_ = std::move(ks);
    copies_since_armed_ = 0;
    copy_fault_armed_.store(!copy_fail_at_.empty());
  }
  void delay_next(std::chrono::nanoseconds d) { delay_ns_.store(d.count()); }
  // Called at enqueue of a copy: whether this copy is the one to fail.
  bool take_copy_failure() {
    if (!copy_fault_armed_.load()) {
      return false;
    }
    const std::lock_guard lock(fault_mutex_);
    ++copies_since_armed_;
    const auto it = std::find(copy_fail_at_.begin(), copy_fail_at_.end(), copies_since_armed_);
    if (it == copy_fail_at_.end()) {
      return false;
    }
    copy_fail_at_.erase(it);
    copy_fault_armed_.store(!copy_fail_at_.empty());
    return true;
  }

  // The stream's pending failure (empty: none). Set by operations, taken by synchronize().
  bool failed() {
    const std::lock_guard lock(error_mutex_);
    return !error_.empty();
  }
  std::string error() {
    const std::lock_guard lock(error_mutex_);
    return error_;
  }
  void fail(std::string why) {
    const std::lock_guard lock(error_mutex_);
    if (error_.empty()) {
      error_ = std::move(why);
    }
  }

 private:
  static emulated_event* checked_event(event& e) {
    auto* ev = dynamic_cast<emulated_event*>(&e);
    TIERFLOW_EXPECTS(ev != nullptr, "event of another backend given to an emulated stream");
    return ev;
  }

  void run() {
    while (true) {
      operation op;
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) {
          return;
        }
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      if (const auto delay = delay_ns_.exchange(0); delay > 0) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
      }
      op(*this);
      {
        const std::lock_guard lock(mutex_);
        --pending_;
        if (pending_ == 0) {
          idle_cv_.notify_all();
        }
      }
    }
  }

  std::string name_;
  const void* owner_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<operation> queue_;
  std::size_t pending_ = 0;
  bool stopping_ = false;
  std::mutex error_mutex_;
  std::string error_;
  std::mutex fault_mutex_;
  std::vector<unsigned> copy_fail_at_;  // copies (1 = the first since armed) that fail
  unsigned copies_since_armed_ = 0;
  std::atomic<bool> copy_fault_armed_{false};
  std::atomic<std::int64_t> delay_ns_{0};
  std::thread worker_;
};

// --- the device -------------------------------------------------------------------------

class emulated_device_impl final : public emulated_device {
 public:
  explicit emulated_device_impl(emulated_device_options options)
      : options_(options),
        hbm_(options.hbm_bytes),
        copier_(options.copy_threads > 0 ? options.copy_threads - 1
                                         : std::max(1u, std::thread::hardware_concurrency()) - 1),
        compute_("compute", this),
        h2d_("h2d", this),
        d2h_("d2h", this) {
    properties_.backend = "emulated";
    properties_.name = "emulated (" + options_.link.describe() + ")";
    properties_.memory_total_bytes = options_.hbm_bytes;
    properties_.copy_engines = options_.link.full_duplex ? 2 : 1;
    properties_.h2d_gbps = options_.link.h2d_gbps;
    properties_.d2h_gbps = options_.link.d2h_gbps;
    properties_.full_duplex = options_.link.full_duplex;
  }
  const device_properties& properties() const noexcept override { return properties_; }
  std::uint64_t memory_free_bytes() override { return hbm_.capacity() - hbm_.used(); }
  memory_resource& memory() override { return hbm_; }
  bool is_device_memory(const void* p) noexcept override { return hbm_.contains(p); }
  page_locker& host_registration() override { return mlock_page_locker(); }
  stream& compute_stream() override { return compute_; }
  stream& h2d_stream() override { return h2d_; }
  stream& d2h_stream() override { return d2h_; }
  std::unique_ptr<event> create_event() override { return std::make_unique<emulated_event>(this); }
  const link_model& link() const noexcept override { return options_.link; }

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind,
                  stream& on) override {
    auto& s = own(on);
    if (bytes == 0) {
      return;
    }
    TIERFLOW_EXPECTS(dst != nullptr && src != nullptr, "copy_async: null pointer");
    check_extent(dst, src, bytes);
    const bool fail = s.take_copy_failure();
    s.enqueue([this, dst, src, bytes, kind, fail](emulated_stream& self) {
      if (self.failed()) {
        return;  // skipped: earlier work failed
      }
      if (fail) {
        self.fail(std::string(to_string(kind)) + " copy of " + format_byte_count(bytes) +
                  " failed (injected fault)");
        return;
      }
      const auto& link = options_.link;
      clock_type::time_point done_at{};
      if (kind == copy_kind::h2d) {
        done_at = h2d_link_.reserve(bytes, link.h2d_gbps, link.latency);
      } else if (kind == copy_kind::d2h) {
        done_at = d2h_channel().reserve(bytes, link.d2h_gbps, link.latency);
      }
      copier_.copy(dst, src, bytes);
      std::this_thread::sleep_until(done_at);
    });
  }

  void synchronize() override {
    std::string failures;
    for (auto* s : {&compute_, &h2d_, &d2h_}) {
      try {
        s->synchronize();
      } catch (const device_error& e) {
        failures += (failures.empty() ? "" : "; ") + std::string(e.what());
      }
    }
    if (!failures.empty()) {
      throw device_error(failures);
    }
  }

  void fail_copy(stream& on, unsigned k) override {
    own(on).fail_copies(k == 0 ? std::vector<unsigned>{} : std::vector<unsigned>{k});
  }
  void fail_copies(stream& on, std::vector<unsigned> ks) override {
    own(on).fail_copies(std::move(ks));
  }
  void fail_allocation(unsigned k) override { hbm_.fail_allocation(k); }
  void delay_stream(stream& on, std::chrono::nanoseconds delay) override {
    own(on).delay_next(delay);
  }

 private:
  // A copy larger than both the device's memory and the machine's (the emulated device also
  // copies from and to host memory of the caller's: CPU tensors), or one running past the end
  // of the address space, is no real copy: refused at enqueue. (Enqueued, SIZE_MAX bytes made
  // the link model sleep for decades: the copy never returned.)
  void check_extent(const void* dst, const void* src, std::size_t bytes) const {
    const std::uint64_t limit = std::max(options_.hbm_bytes, platform::physical_memory_bytes());
    if (bytes > limit) {
      throw error("copy_async: " + std::to_string(bytes) +
                  " bytes is more than the emulated device's memory and the machine's (" +
                  std::to_string(limit) + " bytes): no buffer is that large");
    }
    constexpr auto top = std::numeric_limits<std::uintptr_t>::max();
    for (const auto& [what, p] : {std::pair{"dst", dst}, std::pair{"src", src}}) {
      if (reinterpret_cast<std::uintptr_t>(p) > top - (bytes - 1)) {
        throw error("copy_async: " + std::string(what) + " + " + std::to_string(bytes) +
                    " bytes wraps the address space");
      }
    }
  }
  emulated_stream& own(stream& on) {
    auto* s = dynamic_cast<emulated_stream*>(&on);
    TIERFLOW_EXPECTS(s != nullptr && s->owner() == this,
                     "a stream of another device was given to this emulated device");
    return *s;
  }
  // Half duplex: D2H shares the H2D channel.
  link_channel& d2h_channel() { return options_.link.full_duplex ? d2h_link_ : h2d_link_; }

  emulated_device_options options_;
  device_properties properties_;
  detail::emulated_hbm hbm_;
  link_channel h2d_link_;
  link_channel d2h_link_;
  parallel_copier copier_;
  // Streams last: they are destroyed (and drained) first, while everything they use lives.
  emulated_stream compute_;
  emulated_stream h2d_;
  emulated_stream d2h_;
};

}  // namespace

std::unique_ptr<emulated_device> emulated_device::create(emulated_device_options options) {
  TIERFLOW_EXPECTS(options.link.h2d_gbps > 0 && options.link.d2h_gbps > 0,
                   "emulated device: link bandwidths must be above 0");
  TIERFLOW_EXPECTS(options.link.latency.count() >= 0, "emulated device: negative latency");
  TIERFLOW_EXPECTS(options.hbm_bytes > 0, "emulated device: hbm_bytes must be above 0");
  return std::make_unique<emulated_device_impl>(options);
}

}  // namespace tierflow
