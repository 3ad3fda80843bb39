#pragma once
// The Adam step's element kernels: the scalar reference, and AVX2 and AVX-512 versions chosen
// at run time by CPU feature detection. Every version performs the same fp32 operations in the
// same order with no fused multiply-add (the file is compiled with -ffp-contract=off), so all
// of them give the same bits. The same holds for the dtype conversions (bf16 and fp16 round to
// nearest even) and for the grads' sum of squares, whose summation order is fixed: 32
// double lanes, element i into lane i % 32, lane k + w added into lane k for w = 16, 8, 4, 2, 1.
#include <cstddef>
#include <cstdint>

#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow::detail {

/** The scalars for step @p step (1-based) of a group with @p hyper, grads scaled by
 *  @p grad_scale (clip coefficient / loss scale). */
adam_scalars make_adam_scalars(const adam_hyper& hyper, std::uint64_t step,
                               double grad_scale) noexcept;

/** The scalar reference of one element: the definition every kernel matches bit for bit. */
void adam_reference(float& p, float& m, float& v, float grad, const adam_scalars& s) noexcept;

/** Updates @p n elements in place: master weights @p p, moments @p m and @p v, from grads
 *  @p grad of @p dtype. */
void adam_update(adam_kernel kernel, float* p, float* m, float* v, const void* grad,
                 param_dtype dtype, std::size_t n, const adam_scalars& s) noexcept;

/** Writes @p n master weights as @p dtype into @p dst (round to nearest even). */
void store_params(adam_kernel kernel, const float* src, void* dst, param_dtype dtype,
                  std::size_t n) noexcept;

/** Compares @p n params of @p dtype with @p reference as store_params would write it: counts
 *  the params that differ (bit for bit), and where @p out is not null writes each such param,
 *  as fp32 (exact), into @p out at its index. With @p out the master itself it adopts a write
 *  to the params that the master did not see (one through a tensor's .data, which no version
 *  counter records); @p out may be @p reference. */
std::size_t adopt_param_writes(adam_kernel kernel, const float* reference, float* out,
                               const void* param, param_dtype dtype, std::size_t n) noexcept;

/** Reads @p n values of @p dtype as fp32 (exact). */
void load_as_f32(const void* src, param_dtype dtype, float* dst, std::size_t n) noexcept;

/** Σ g² over @p n grads of @p dtype, in double, in the fixed lane order; inf or NaN when any
 *  grad is. */
double grad_sum_squares(adam_kernel kernel, const void* grad, param_dtype dtype,
                        std::size_t n) noexcept;

/** Element conversions (scalar; the SIMD versions match them bit for bit). */
std::uint16_t float_to_bf16(float value) noexcept;
float bf16_to_float(std::uint16_t value) noexcept;
std::uint16_t float_to_f16(float value) noexcept;
float f16_to_float(std::uint16_t value) noexcept;

/** The kernel to use for @p wanted (automatic: the best this CPU runs).
 *  @throws tierflow::error when this CPU cannot run @p wanted */
adam_kernel resolve_kernel(adam_kernel wanted);

}  // namespace tierflow::detail
