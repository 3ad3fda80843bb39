#include "tierflow/device.hpp"

#include <charconv>

#include "device/device_internal.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/log.hpp"

namespace tierflow {

cuda_error::cuda_error(std::string call, std::string location, int code, std::string cuda_message)
    : device_error(call + " failed at " + location + ": " + cuda_message + " (error " +
                   std::to_string(code) + ")"),
      call_(std::move(call)),
      location_(std::move(location)),
      code_(code) {}

std::string_view to_string(copy_kind kind) noexcept {
  switch (kind) {
    case copy_kind::h2d:
      return "h2d";
    case copy_kind::d2h:
      return "d2h";
    case copy_kind::d2d:
      return "d2d";
  }
  return "unknown";
}

double event::elapsed_ms(event& start, event& end) {
  return end.elapsed_since_ms(start);
}

std::unique_ptr<device> open_device(std::string_view spec) {
  const std::string text(spec);
  const auto emulated = [] {
    emulated_device_options options;
    options.link = link_model::from_environment();
    return std::unique_ptr<device>(emulated_device::create(options));
  };
  if (spec == "emulated") {
    return emulated();
  }
  if (spec == "auto") {
    std::string why;
    if (auto cuda = detail::open_cuda_device(0, why)) {
      return cuda;
    }
    detail::log(log_level::info,
                "device: no usable CUDA device (" + why + "); using the emulated backend");
    return emulated();
  }
  int index = 0;
  if (spec != "cuda") {
    const auto colon = spec.find(':');
    const auto number =
        colon == std::string_view::npos ? std::nullopt : detail::parse_u64(spec.substr(colon + 1));
    if (spec.substr(0, colon) != "cuda" || !number || *number > 1024) {
      throw input_error("device spec", "expected auto, emulated, cuda or cuda:N", text);
    }
    index = static_cast<int>(*number);
  }
  std::string why;
  if (auto cuda = detail::open_cuda_device(index, why)) {
    return cuda;
  }
  throw device_error("device " + text + " is not available: " + why);
}

}  // namespace tierflow
