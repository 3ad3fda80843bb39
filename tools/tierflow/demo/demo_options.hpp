#pragma once
// The options of `tierflow demo`, which `tierflow tune` also fills to run the demo's model.

#include <cstddef>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "tierflow/offload_adam.hpp"

namespace tierflow::cli::demo {

/** @brief The demo's model, its training and where it runs (one field per `demo` flag). */
/** The largest --layers and --window, and the largest --width and --batch: beyond them the model
 *  cannot fit any machine, and their products stay far from wrapping 64 bits. */
inline constexpr std::uint64_t max_layers = std::uint64_t{1} << 20;
inline constexpr std::uint64_t max_width = std::uint64_t{1} << 20;
/** The largest --hbm-budget, MiB (1 PiB). */
inline constexpr double max_budget_mib = 1073741824.0;

struct demo_options {
  std::size_t layers = 8;
  std::size_t width = 512;
  std::size_t batch = 32;
  std::size_t samples = 256;  // the fixed data set
  std::size_t steps = 300;
  std::uint64_t window = 2;
  double hbm_budget_mib = 0;  // 0: room for window + 2 layers
  std::string adam_mode = "auto";
  std::string overlap = "none";      // none | backward (grad_ready() per layer, see demo.md)
  std::string state_dtype = "fp32";  // fp32 | bf16 | int8: the Adam moments' storage
  std::string placement;
  std::string emu_link;
  std::string device = "auto";
  double lr = 1e-3;
  std::size_t adam_chunk = std::size_t{1} << 18;  // elements
  std::uint64_t seed = 1;
  std::size_t log_every = 25;
  std::string out = "tierflow-demo";
  bool verify = false;
  bool as_json = false;
};

/** @brief Registers the model's shape (--layers, --width, --batch) on @p cmd, into @p o: the
 *  flags `demo` and `tune` share. */
void add_model_shape_options(CLI::App& cmd, demo_options& o);

/** @brief The mode of --adam-mode. @throws input_error unless cpu, streamed or auto */
adam_mode checked_adam_mode(const std::string& text);

/** @brief The overlap of --overlap. @throws input_error unless none or backward */
adam_overlap checked_adam_overlap(const std::string& text);

/** @brief The moments' dtype of --state-dtype. @throws input_error unless fp32, bf16 or int8,
 *  or a compressed one with --adam-mode streamed */
adam_state_dtype checked_state_dtype(const std::string& text, const std::string& adam_mode);

}  // namespace tierflow::cli::demo
