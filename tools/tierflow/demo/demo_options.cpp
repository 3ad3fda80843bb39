// The options `demo` and `tune` share (demo_options.hpp).
#include "demo/demo_options.hpp"

#include "common/flags.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli::demo {

void add_model_shape_options(CLI::App& cmd, demo_options& o) {
  cmd.add_option("--layers", o.layers, "Dense layers")
      ->check(count_in(1, max_layers))
      ->capture_default_str();
  cmd.add_option("--width", o.width, "Units per layer")
      ->check(count_in(1, max_width))
      ->capture_default_str();
  cmd.add_option("--batch", o.batch, "Samples per step")
      ->check(count_in(1, max_width))
      ->capture_default_str();
}

adam_mode checked_adam_mode(const std::string& text) {
  const auto mode = parse_adam_mode(text);
  if (!mode) {
    throw input_error("--adam-mode", "expected cpu, streamed or auto", text);
  }
  return *mode;
}

adam_overlap checked_adam_overlap(const std::string& text) {
  const auto overlap = parse_adam_overlap(text);
  if (!overlap) {
    throw input_error("--overlap", "expected none, backward or backward_publish", text);
  }
  return *overlap;
}

adam_state_dtype checked_state_dtype(const std::string& text, const std::string& adam_mode) {
  const auto dtype = parse_adam_state_dtype(text);
  if (!dtype) {
    throw input_error("--state-dtype", "expected fp32, bf16 or int8", text);
  }
  if (*dtype != adam_state_dtype::f32 && adam_mode == "streamed") {
    throw input_error("--state-dtype",
                      "compressed moments run in cpu mode: use --adam-mode cpu or auto", text);
  }
  return *dtype;
}

}  // namespace tierflow::cli::demo
