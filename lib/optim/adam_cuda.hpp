#pragma once
// Launchers of the CUDA Adam kernels (adam_cuda.cu). Plain types only: nvcc compiles this.
#include <cstddef>

#include "tierflow/detail/adam_scalars.hpp"

namespace tierflow::detail::cuda_adam {

/** Blocks the sum of squares of one chunk is split into (its partial sums are added on the
 *  host in block order, so the result does not depend on timing). */
constexpr int sum_blocks = 64;

/** dtype: 0 f32, 1 bf16, 2 f16 (param_dtype's order). Return a cudaError_t. */
int launch_update(void* stream, float* master, float* m, float* v, const void* grad, void* param,
                  int dtype, std::size_t n, const adam_scalars& s);

/** Writes sum_blocks partial sums of g² to @p out (device memory). */
int launch_sum_squares(void* stream, const void* grad, int dtype, std::size_t n, double* out);

}  // namespace tierflow::detail::cuda_adam
