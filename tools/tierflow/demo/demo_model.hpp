#pragma once
// The demo's model: its math (fp32, fixed order: the same bits wherever the weights came from),
// its data, its initial weights, the Adam of the resident run, and the plan that streams it.
//
// The task: regression onto a fixed random teacher network (two tanh layers) over a fixed set
// of inputs, so the loss really falls. Each iteration is one plan pass: forward layer 0 .. L-1,
// then backward L-1 .. 0, each step reading its layer's weights.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "demo/demo_options.hpp"
#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/session.hpp"

namespace tierflow::cli::demo {

/** @brief z[i][o] = Σ_k h[i][k] w[o][k]: 16 partial sums per dot product, combined in a fixed
 *  order. */
void forward_matmul(const float* h, const float* w, float* z, std::size_t batch, std::size_t width);

/** @brief dW[o][k] = Σ_i dz[i][o] h[i][k]; dh[i][k] = Σ_o dz[i][o] w[o][k] (when dh is not
 *  null). */
void backward_matmul(const float* dz, const float* h, const float* w, float* dw, float* dh,
                     std::size_t batch, std::size_t width);

/** @brief The fixed data set: inputs and the teacher's outputs. */
struct data_set {
  std::vector<float> x;  // samples × width
  std::vector<float> t;  // samples × width
};

/** @brief Draws the teacher and the inputs from @p gen and runs the teacher over them. */
data_set make_data(const demo_options& o, std::mt19937_64& gen);

/** @brief One width × width matrix per layer, drawn from @p gen. */
std::vector<std::vector<float>> init_weights(const demo_options& o, std::mt19937_64& gen);

/** @brief The resident run's Adam (the oracle the offloaded run is checked against): HBM
 *  moments, the step count, and each step's scalars from the library's definition. */
struct resident_adam {
  adam_hyper hyper;
  std::uint64_t steps = 0;
  std::vector<float*> m, v;  // HBM-resident moments, one per layer
  /** @brief The next step's scalars (and the step count moves on). */
  detail::adam_scalars next_step();
};

/** @brief Bytes of one layer's weights. */
std::uint64_t demo_layer_bytes(const demo_options& o);

/** @brief The demo's model as session blocks: a block per layer, its one weight (`layer<l>.w`)
 *  allocated by the session; @p resident: kept in HBM (the reference run). */
std::vector<std::vector<session_weight>> demo_blocks(const demo_options& o, bool resident);

/** @brief The plan the session streams the offloaded run with (session_plan of demo_blocks),
 *  for the model of `tierflow tune`. */
schedule_plan demo_plan(const demo_options& o);

/** @brief The scheduler's HBM budget for the offloaded run by default: default_hbm_budget()
 *  of demo_plan() (the model of `tierflow tune` needs the figure before a scheduler exists). */
std::uint64_t demo_staging_budget(const demo_options& o);

}  // namespace tierflow::cli::demo
