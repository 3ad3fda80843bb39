#pragma once
// The Adam-shaped memory bound: the ceiling an Adam step over fp32 state can reach on a memory
// system, measured by the benchmarks in the same run as the step they judge.
#include <cstddef>

#include "tierflow/offload_adam.hpp"

namespace tierflow::detail {

/** @brief Bytes an fp32 Adam step moves per parameter: reads p, g, m, v; writes p, m, v. */
inline constexpr double adam_bytes_per_param = 28.0;

/** @brief Bytes a cpu-mode step over fp32 params and grads moves per parameter with moments of
 *  @p dtype: p and g 12 B (read g, read and write p), m and v read and written (fp32 16 B, bf16
 *  8 B, int8 4 B and their two scales per 256 elements, 16 / 256 B). */
[[nodiscard]] double adam_bytes_per_param_for(adam_state_dtype dtype) noexcept;

/** @brief The same over bf16 params and grads with the master in 16 bits beside the param
 *  (adam_master::remainder): read g 2 B, read and write p and the remainder 8 B, then the
 *  moments as above (int8: 14 B and the scales' 16 / 256). */
[[nodiscard]] double adam_bytes_per_param_remainder(adam_state_dtype dtype) noexcept;

/**
 * @brief One pass of the Adam step's memory traffic with trivial arithmetic: for each element,
 *        loads p, g, m and v, then stores p - g, m + g and v + g * g.
 *
 * The same seven streams as detail::adam_update over fp32 grads, every load of a vector issued
 * before its stores, and vectorised the same way (the @p kernel's instruction set, 8 or 16
 * floats a step; compiled at -O3 in every build type), so a kernel's time over this one's is a
 * true ratio to the ceiling. v stays positive when it was, so an Adam step may follow.
 * @param kernel `scalar`, `avx2` or `avx512` (as detail::resolve_kernel returns; `automatic`:
 *        the best this CPU runs)
 * @param p,m,v the state, updated in place
 * @param g the grads
 * @param n elements
 */
void adam_bound_pass(adam_kernel kernel, float* p, float* m, float* v, const float* g,
                     std::size_t n) noexcept;

/**
 * @brief adam_bound_pass's traffic with moments of @p width bytes each (2: bf16, 1: int8):
 *        stores p - g, and each moment's bytes as loaded; with @p m_scale and @p v_scale (int8:
 *        one float per 256 elements, from element 0), each scale too. The bound of a
 *        compressed step (adam_bytes_per_param_for); the moments keep their values.
 */
void adam_bound_pass_narrow(adam_kernel kernel, float* p, unsigned char* m, unsigned char* v,
                            float* m_scale, float* v_scale, const float* g, std::size_t n,
                            std::size_t width) noexcept;

}  // namespace tierflow::detail
