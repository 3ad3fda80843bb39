#pragma once
// The Adam-shaped memory bound: the ceiling an Adam step over fp32 state can reach on a memory
// system, measured by the benchmarks in the same run as the step they judge.
#include <cstddef>

#include "tierflow/offload_adam.hpp"

namespace tierflow::detail {

/** @brief Bytes an fp32 Adam step moves per parameter: reads p, g, m, v; writes p, m, v. */
inline constexpr double adam_bytes_per_param = 28.0;

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

}  // namespace tierflow::detail
