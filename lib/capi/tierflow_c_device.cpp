// The C ABI of the device: open, allocate, free and copy, with what tf_device_alloc gave out
// tracked so that tf_device_free refuses anything else.
#include <array>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "capi/capi_support.hpp"
#include "tierflow/device.hpp"
#include "tierflow/tierflow.h"

namespace {

using namespace tierflow::capi;

// What tf_device_alloc gave out, per handle, with the bytes asked for: tf_device_free frees
// only that, with that size, and refuses anything else with a status, on every backend (below
// the C ABI, memory_resource::deallocate cannot fail: a backend can at most log a misuse, and
// the emulated device used to act on it: a wrong size unmapped a neighbour's pages, a second
// free or a foreign pointer wrapped its count of used bytes, "free: 0 B" for good).
// Thread-safe: tf_device_* calls come from any thread. Never destroyed, so that a handle
// destroyed during static destruction still finds it.
class device_allocations {
 public:
  static device_allocations& instance() {
    static auto* const all = new device_allocations;
    return *all;
  }

  void add(const tf_device* device, const void* pointer, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    blocks_[device].emplace(pointer, bytes);
  }
  // Forgets @p pointer if @p device's tf_device_alloc gave it for @p bytes; else throws,
  // forgetting nothing.
  void take(const tf_device* device, const void* pointer, std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    const auto handle = blocks_.find(device);
    if (handle == blocks_.end() || !handle->second.contains(pointer)) {
      throw tierflow::error(
          address(pointer) +
          " was not allocated by tf_device_alloc on this device, or was freed already; nothing "
          "was freed");
    }
    const auto it = handle->second.find(pointer);
    if (it->second != bytes) {
      throw tierflow::error(address(pointer) + " was allocated with " + std::to_string(it->second) +
                            " bytes, not " + std::to_string(bytes) +
                            "; nothing was freed (free it with the size it was allocated with)");
    }
    handle->second.erase(it);
  }
  // The handle is gone: what it allocated can no longer be freed through it.
  void forget(const tf_device* device) noexcept {
    const std::lock_guard lock(mutex_);
    blocks_.erase(device);
  }

 private:
  static std::string address(const void* pointer) {
    std::array<char, 32> text{};
    std::snprintf(text.data(), text.size(), "%p", pointer);
    return "pointer " + std::string(text.data());
  }

  std::mutex mutex_;
  std::unordered_map<const tf_device*, std::unordered_map<const void*, std::size_t>> blocks_;
};

}  // namespace

extern "C" {

tf_status tf_device_open(const char* spec, tf_device** out) {
  return guarded("tf_device_open", [&] {
    need(out, "out");
    *out = nullptr;
    auto d = std::make_unique<tf_device>();
    d->dev = tierflow::open_device(spec != nullptr ? spec : "auto");
    *out = d.release();
  });
}

void tf_device_destroy(tf_device* device) {
  device_allocations::instance().forget(device);
  delete device;  // the device's destructor waits for its work and never throws
}

const char* tf_device_backend(const tf_device* device) {
  return device != nullptr ? device->dev->properties().backend.c_str() : "";
}

tf_status tf_device_alloc(tf_device* device, size_t bytes, void** out) {
  return guarded("tf_device_alloc", [&] {
    need(device, "device");
    need(out, "out");
    tierflow::memory_resource& memory = device->dev->memory();
    void* p = memory.allocate(bytes);
    if (p != nullptr) {
      try {
        device_allocations::instance().add(device, p, bytes);
      } catch (...) {
        memory.deallocate(p, bytes);
        throw;
      }
    }
    *out = p;
  });
}

tf_status tf_device_free(tf_device* device, void* pointer, size_t bytes) {
  return guarded("tf_device_free", [&] {
    need(device, "device");
    if (pointer == nullptr) {
      return;  // nothing to free (a 0-byte tf_device_alloc gives NULL)
    }
    device_allocations::instance().take(device, pointer, bytes);
    device->dev->memory().deallocate(pointer, bytes);
  });
}

tf_status tf_device_copy(tf_device* device, void* dst, const void* src, size_t bytes,
                         tf_copy_kind kind) {
  return guarded("tf_device_copy", [&] {
    need(device, "device");
    if (kind != TF_COPY_H2D && kind != TF_COPY_D2H) {
      throw tierflow::error("kind must be TF_COPY_H2D or TF_COPY_D2H");
    }
    auto& dev = *device->dev;
    tierflow::stream& s = kind == TF_COPY_H2D ? dev.h2d_stream() : dev.d2h_stream();
    dev.copy_async(dst, src, bytes,
                   kind == TF_COPY_H2D ? tierflow::copy_kind::h2d : tierflow::copy_kind::d2h, s);
    s.synchronize();
  });
}

}  // extern "C"
