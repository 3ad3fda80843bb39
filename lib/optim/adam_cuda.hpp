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

/** The update over compressed moments (@p state_dtype 1 bf16, 2 int8: adam_state_dtype's
 *  order): m, v (and for int8 the scales of its blocks of 256, from the chunk's first) in
 *  device memory; decode, the update, encode, in one pass: the cpu step's bytes. */
int launch_update_compressed(void* stream, float* master, int state_dtype, void* m, void* v,
                             float* m_scale, float* v_scale, const void* grad, void* param,
                             int dtype, std::size_t n, const adam_scalars& s);

/** Writes sum_blocks partial sums of g² to @p out (device memory). */
int launch_sum_squares(void* stream, const void* grad, int dtype, std::size_t n, double* out);

}  // namespace tierflow::detail::cuda_adam
