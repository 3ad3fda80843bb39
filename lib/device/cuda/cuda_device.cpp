// The CUDA backend: the CUDA runtime's streams, events, cudaMemcpyAsync, cudaMalloc and
// cudaHostRegister, every call checked; NVTX ranges around transfers and callbacks.

#include <cctype>
#include <mutex>
#include <string>

#include <nvtx3/nvToolsExt.h>

#include "device/cuda/cuda_try.hpp"
#include "device/device_internal.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"

namespace tierflow::detail {

void throw_cuda_error(const char* call, const char* file, int line, cudaError_t status) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw cuda_error(call, std::string(file) + ":" + std::to_string(line), static_cast<int>(status),
                   std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
}

void log_cuda_error(const char* call, const char* file, int line, cudaError_t status) noexcept {
  cudaGetLastError();
  detail::log(log_level::error, std::string(call) + " failed at " + file + ":" +
                                    std::to_string(line) + ": " + cudaGetErrorString(status));
}

namespace {

// Makes a device current for a scope and restores the previous one.
class current_device_guard {
 public:
  explicit current_device_guard(int index) {
    TIERFLOW_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != index) {
      TIERFLOW_CUDA_TRY(cudaSetDevice(index));
    }
    index_ = index;
  }
  current_device_guard(const current_device_guard&) = delete;
  current_device_guard& operator=(const current_device_guard&) = delete;
  ~current_device_guard() {
    if (previous_ != index_) {
      TIERFLOW_CUDA_LOG(cudaSetDevice(previous_));
    }
  }

 private:
  int previous_ = 0;
  int index_ = 0;
};

class nvtx_range {
 public:
  explicit nvtx_range(const char* name) { nvtxRangePushA(name); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
  ~nvtx_range() { nvtxRangePop(); }
};

class cuda_event final : public event {
 public:
  explicit cuda_event(int device) : device_(device) {
    current_device_guard guard(device_);
    TIERFLOW_CUDA_TRY(cudaEventCreate(&event_));
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() override { TIERFLOW_CUDA_LOG(cudaEventDestroy(event_)); }

  bool query() override {
    const auto status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    TIERFLOW_CUDA_TRY(status);
    return true;
  }
  void synchronize() override { TIERFLOW_CUDA_TRY(cudaEventSynchronize(event_)); }
  cudaEvent_t handle() const noexcept { return event_; }
  int device_index() const noexcept { return device_; }

 private:
  double elapsed_since_ms(event& start) override {
    auto* begin = dynamic_cast<cuda_event*>(&start);
    TIERFLOW_EXPECTS(begin != nullptr, "elapsed_ms: both events must be CUDA events");
    float ms = 0;
    TIERFLOW_CUDA_TRY(cudaEventElapsedTime(&ms, begin->event_, event_));
    return ms;
  }
  int device_;
  cudaEvent_t event_ = nullptr;
};

class cuda_stream final : public stream {
 public:
  cuda_stream(int device, std::string name) : device_(device), name_(std::move(name)) {
    current_device_guard guard(device_);
    TIERFLOW_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() override {
    TIERFLOW_CUDA_LOG(cudaStreamSynchronize(stream_));
    TIERFLOW_CUDA_LOG(cudaStreamDestroy(stream_));
  }

  void record(event& e) override {
    TIERFLOW_CUDA_TRY(cudaEventRecord(checked(e).handle(), stream_));
  }
  void wait(event& e) override {
    TIERFLOW_CUDA_TRY(cudaStreamWaitEvent(stream_, checked(e).handle(), 0));
  }
  void host_callback(std::function<void()> fn) override {
    TIERFLOW_EXPECTS(fn != nullptr, "host_callback: empty function");
    auto* job = new callback_job{std::move(fn), this};
    const auto status = cudaLaunchHostFunc(stream_, &cuda_stream::run_callback, job);
    if (status != cudaSuccess) {
      delete job;
      TIERFLOW_CUDA_TRY(status);
    }
  }
  bool query() override {
    const auto status = cudaStreamQuery(stream_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    TIERFLOW_CUDA_TRY(status);
    return true;
  }
  void synchronize() override {
    TIERFLOW_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::string failure;
    {
      const std::lock_guard lock(mutex_);
      failure.swap(callback_error_);
    }
    if (!failure.empty()) {
      throw device_error("stream " + name_ + ": " + failure);
    }
  }
  std::string_view name() const noexcept override { return name_; }
  void* native_handle() const noexcept override { return stream_; }
  cudaStream_t handle() const noexcept { return stream_; }

 private:
  struct callback_job {
    std::function<void()> fn;
    cuda_stream* owner;
  };
  static void CUDART_CB run_callback(void* data) {
    auto* job = static_cast<callback_job*>(data);
    nvtx_range range("tierflow host callback");
    try {
      job->fn();
    } catch (const std::exception& e) {
      const std::lock_guard lock(job->owner->mutex_);
      if (job->owner->callback_error_.empty()) {
        job->owner->callback_error_ = std::string("host callback threw: ") + e.what();
      }
    } catch (...) {
      const std::lock_guard lock(job->owner->mutex_);
      job->owner->callback_error_ = "host callback threw a non-standard exception";
    }
    delete job;
  }
  cuda_event& checked(event& e) const {
    auto* ev = dynamic_cast<cuda_event*>(&e);
    TIERFLOW_EXPECTS(ev != nullptr && ev->device_index() == device_,
                     "an event of another device was given to a CUDA stream");
    return *ev;
  }

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::string callback_error_;
};

class cuda_memory final : public memory_resource {
 public:
  explicit cuda_memory(int device) : device_(device) {}
  std::string name() const override { return "cuda hbm (device " + std::to_string(device_) + ")"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    // cudaMalloc returns 256-byte aligned memory; larger alignments are not offered.
    TIERFLOW_EXPECTS(alignment <= 256, "cuda memory: alignment above 256 bytes is not supported");
    current_device_guard guard(device_);
    void* p = nullptr;
    const auto status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw out_of_capacity(name(), bytes, {{"hbm" + std::to_string(device_), free}});
    }
    TIERFLOW_CUDA_TRY(status);
    return p;
  }
  void do_deallocate(void* p, std::size_t, std::size_t) noexcept override {
    TIERFLOW_CUDA_LOG(cudaFree(p));
  }
  int device_;
};

class cuda_host_registration final : public page_locker {
 public:
  void lock(void* address, std::size_t bytes) override {
    nvtx_range range("tierflow cudaHostRegister");
    TIERFLOW_CUDA_TRY(cudaHostRegister(address, bytes, cudaHostRegisterDefault));
  }
  void unlock(void* address, std::size_t) noexcept override {
    TIERFLOW_CUDA_LOG(cudaHostUnregister(address));
  }
  std::string_view name() const noexcept override { return "cudaHostRegister"; }
};

class cuda_device final : public device {
 public:
  explicit cuda_device(int index)
      : index_(index),
        memory_(index),
        compute_(index, "compute"),
        h2d_(index, "h2d"),
        d2h_(index, "d2h") {
    cudaDeviceProp props{};
    TIERFLOW_CUDA_TRY(cudaGetDeviceProperties(&props, index_));
    properties_.backend = "cuda";
    properties_.name = props.name;
    properties_.memory_total_bytes = props.totalGlobalMem;
    properties_.copy_engines = props.asyncEngineCount;
    properties_.full_duplex = props.asyncEngineCount >= 2;
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, index_) == cudaSuccess) {
      properties_.pci_bus_id = bus_id;
      for (auto& c : properties_.pci_bus_id) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
    }
  }

  const device_properties& properties() const noexcept override { return properties_; }
  std::uint64_t memory_free_bytes() override {
    current_device_guard guard(index_);
    std::size_t free = 0, total = 0;
    TIERFLOW_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
  }
  memory_resource& memory() override { return memory_; }
  bool is_device_memory(const void* p) noexcept override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      (void)cudaGetLastError();  // pageable host memory on old runtimes: not the device's
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }
  page_locker& host_registration() override { return registration_; }
  stream& compute_stream() override { return compute_; }
  stream& h2d_stream() override { return h2d_; }
  stream& d2h_stream() override { return d2h_; }
  std::unique_ptr<event> create_event() override { return std::make_unique<cuda_event>(index_); }

  void copy_async(void* dst, const void* src, std::size_t bytes, copy_kind kind,
                  stream& on) override {
    if (bytes == 0) {
      return;
    }
    TIERFLOW_EXPECTS(dst != nullptr && src != nullptr, "copy_async: null pointer");
    auto* s = dynamic_cast<cuda_stream*>(&on);
    TIERFLOW_EXPECTS(s != nullptr, "a stream of another backend was given to a CUDA device");
    const auto direction = kind == copy_kind::h2d   ? cudaMemcpyHostToDevice
                           : kind == copy_kind::d2h ? cudaMemcpyDeviceToHost
                                                    : cudaMemcpyDeviceToDevice;
    nvtx_range range(kind == copy_kind::h2d   ? "tierflow h2d"
                     : kind == copy_kind::d2h ? "tierflow d2h"
                                              : "tierflow d2d");
    current_device_guard guard(index_);
    TIERFLOW_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, direction, s->handle()));
  }

  void stream_after_native(stream& on, void* native) override {
    current_device_guard guard(index_);
    cuda_event caller(index_);
    TIERFLOW_CUDA_TRY(cudaEventRecord(caller.handle(), static_cast<cudaStream_t>(native)));
    on.wait(caller);  // the event may be destroyed once the wait is enqueued
  }

  void native_after_stream(void* native, stream& on) override {
    current_device_guard guard(index_);
    cuda_event done(index_);
    on.record(done);
    TIERFLOW_CUDA_TRY(cudaStreamWaitEvent(static_cast<cudaStream_t>(native), done.handle(), 0));
  }

  void synchronize() override {
    {
      current_device_guard guard(index_);
      TIERFLOW_CUDA_TRY(cudaDeviceSynchronize());
    }
    for (auto* s : {&compute_, &h2d_, &d2h_}) {
      s->synchronize();  // reports host-callback failures
    }
  }

 private:
  int index_;
  device_properties properties_;
  cuda_memory memory_;
  cuda_host_registration registration_;
  cuda_stream compute_;
  cuda_stream h2d_;
  cuda_stream d2h_;
};

}  // namespace

void* cuda_stream_handle(stream& s) noexcept {
  auto* cuda = dynamic_cast<cuda_stream*>(&s);
  return cuda != nullptr ? static_cast<void*>(cuda->handle()) : nullptr;
}

std::unique_ptr<device> open_cuda_device(int index, std::string& why) {
  int count = 0;
  const auto status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    return nullptr;
  }
  if (index >= count) {
    why = "CUDA device " + std::to_string(index) + " not found (" + std::to_string(count) +
          " visible)";
    return nullptr;
  }
  return std::make_unique<cuda_device>(index);
}

}  // namespace tierflow::detail
