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

}  // namespace tierflow::cli::demo
