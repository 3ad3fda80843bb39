// The names of offload_adam's enums (dtype, mode, overlap, a failed step's outcome) and their
// parsers, and adam_step_error.
#include <optional>
#include <string>
#include <string_view>

#include "tierflow/offload_adam.hpp"

namespace tierflow {

std::string_view to_string(param_dtype dtype) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      return "f32";
    case param_dtype::bf16:
      return "bf16";
    case param_dtype::f16:
      return "f16";
  }
  return "unknown";
}

std::size_t dtype_bytes(param_dtype dtype) noexcept {
  return dtype == param_dtype::f32 ? 4 : 2;
}

std::string_view to_string(adam_mode mode) noexcept {
  switch (mode) {
    case adam_mode::cpu:
      return "cpu";
    case adam_mode::streamed:
      return "streamed";
    case adam_mode::automatic:
      return "auto";
  }
  return "unknown";
}

adam_step_error::adam_step_error(const std::string& what, outcome result)
    : device_error(what), outcome_(result) {}

std::string_view to_string(adam_step_error::outcome outcome) noexcept {
  switch (outcome) {
    case adam_step_error::outcome::not_applied:
      return "not_applied";
    case adam_step_error::outcome::applied:
      return "applied";
    case adam_step_error::outcome::pending:
      return "pending";
  }
  return "unknown";
}

std::string_view to_string(adam_overlap overlap) noexcept {
  switch (overlap) {
    case adam_overlap::none:
      return "none";
    case adam_overlap::backward:
      return "backward";
    case adam_overlap::backward_publish:
      return "backward_publish";
  }
  return "unknown";
}

std::optional<adam_overlap> parse_adam_overlap(std::string_view text) noexcept {
  for (adam_overlap overlap :
       {adam_overlap::none, adam_overlap::backward, adam_overlap::backward_publish}) {
    if (text == to_string(overlap)) {
      return overlap;
    }
  }
  return std::nullopt;
}

std::optional<adam_mode> parse_adam_mode(std::string_view text) noexcept {
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed, adam_mode::automatic}) {
    if (text == to_string(mode)) {
      return mode;
    }
  }
  return std::nullopt;
}

}  // namespace tierflow
