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

std::string_view to_string(adam_state_dtype dtype) noexcept {
  switch (dtype) {
    case adam_state_dtype::f32:
      return "fp32";
    case adam_state_dtype::bf16:
      return "bf16";
    case adam_state_dtype::int8:
      return "int8";
  }
  return "unknown";
}

std::optional<adam_state_dtype> parse_adam_state_dtype(std::string_view text) noexcept {
  if (text == "f32") {
    return adam_state_dtype::f32;
  }
  for (adam_state_dtype dtype :
       {adam_state_dtype::f32, adam_state_dtype::bf16, adam_state_dtype::int8}) {
    if (text == to_string(dtype)) {
      return dtype;
    }
  }
  return std::nullopt;
}

std::string_view to_string(adam_master master) noexcept {
  switch (master) {
    case adam_master::fp32:
      return "fp32";
    case adam_master::remainder:
      return "remainder";
  }
  return "unknown";
}

std::optional<adam_master> parse_adam_master(std::string_view text) noexcept {
  for (adam_master master : {adam_master::fp32, adam_master::remainder}) {
    if (text == to_string(master)) {
      return master;
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
