#pragma once
// What every part of the C ABI shares (private to lib/capi): the device handle, the calling
// thread's last error, and the wrapper that turns every exception into a tf_status.
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <system_error>

#include "tierflow/device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/tierflow.h"

// Shared: an optimizer or scheduler made on the device keeps it alive, so destroying the
// handle first (the ordinary wrong cleanup order) leaves them working and their destroy safe.
struct tf_device {
  std::shared_ptr<tierflow::device> dev;
};

namespace tierflow::capi {

inline thread_local std::string last_error;

inline tf_status fail(tf_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

// Runs @p fn, turning every exception into a status and a message.
template <typename F>
tf_status guarded(const char* call, F&& fn) noexcept {
  try {
    last_error.clear();
    fn();
    return TF_OK;
  } catch (const tierflow::busy_error& e) {
    // The C layer's gate names the C call already; a refusal from below gets it in front.
    return fail(TF_ERR_BUSY,
                e.call() == call ? std::string(e.what()) : std::string(call) + ": " + e.what());
  } catch (const tierflow::environment_error& e) {
    return fail(TF_ERR_ENVIRONMENT, std::string(call) + ": " + e.what());
  } catch (const tierflow::input_error& e) {
    return fail(TF_ERR_INPUT, std::string(call) + ": " + e.what());
  } catch (const tierflow::out_of_capacity& e) {
    return fail(TF_ERR_OUT_OF_MEMORY, std::string(call) + ": " + e.what());
  } catch (const tierflow::device_error& e) {
    return fail(TF_ERR_DEVICE, std::string(call) + ": " + e.what());
  } catch (const tierflow::error& e) {
    return fail(TF_ERR_INVALID_ARGUMENT, std::string(call) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(TF_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory");
  } catch (const std::system_error& e) {  // a thread or a file the system refused
    return fail(TF_ERR_ENVIRONMENT, std::string(call) + ": " + e.what() + " (errno " +
                                        std::to_string(e.code().value()) + ")");
  } catch (const std::exception& e) {
    return fail(TF_ERR_INTERNAL, std::string(call) + ": " + e.what());
  } catch (...) {
    return fail(TF_ERR_INTERNAL, std::string(call) + ": unknown failure");
  }
}

// The int a caller stored in an enum field of a struct. Read as the enum, a value outside its
// enumerators' range (a negative one: the range is 0 .. *_ENUM_MAX) is undefined behaviour, so
// it is read as the int it is and checked as one.
template <typename E>
int enum_value(const E& field) noexcept {
  static_assert(sizeof(E) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

inline void need(const void* p, const char* what) {
  if (p == nullptr) {
    throw tierflow::error(std::string(what) + " is NULL");
  }
}

// Copies @p json into the caller's buffer (tf_*_json calls).
inline tf_status json_out(const char* call, const std::string& json, char* buffer, size_t capacity,
                          size_t* needed) {
  if (needed != nullptr) {
    *needed = json.size() + 1;
  }
  if (buffer == nullptr || capacity < json.size() + 1) {
    return fail(TF_ERR_BUFFER_TOO_SMALL, std::string(call) + ": the JSON needs " +
                                             std::to_string(json.size() + 1) + " bytes, " +
                                             std::to_string(capacity) + " given");
  }
  std::memcpy(buffer, json.c_str(), json.size() + 1);
  return TF_OK;
}

}  // namespace tierflow::capi
