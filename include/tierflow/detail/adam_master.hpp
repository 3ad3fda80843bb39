#pragma once
/**
 * @file
 * @brief The fp32 master weights of a bf16 param kept in 16 extra bits (adam_master::remainder,
 * docs/offload-adam.md "The master in 16 bits"): the param holds the master rounded to bf16
 * (nearest, ties away from zero) and `low` the rest, the master's bits minus the param's
 * shifted up, as a signed 16-bit number (it lies in [-0x8000, 0x7fff] by that rounding). The
 * two give the master back exactly.
 */
#include <cstddef>
#include <cstdint>

#include "tierflow/detail/adam_kernels.hpp"
#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/detail/adam_state.hpp"

namespace tierflow::detail {

/** @p n masters from their params' bf16 bits and remainders. */
void join_master(const std::uint16_t* param, const std::uint16_t* low, float* master,
                 std::size_t n) noexcept;

/** @p n masters into their params' bf16 bits and remainders. */
void split_master(const float* master, std::uint16_t* param, std::uint16_t* low,
                  std::size_t n) noexcept;

/** The two above in @p kernel's instruction set (AVX2 for avx2 and avx512): the same bits. */
void join_master(adam_kernel kernel, const std::uint16_t* param, const std::uint16_t* low,
                 float* master, std::size_t n) noexcept;
void split_master(adam_kernel kernel, const float* master, std::uint16_t* param, std::uint16_t* low,
                  std::size_t n) noexcept;

/** adam_update_state on a split master: elements [offset, offset + n) of the param @p param
 *  and remainders @p low (both already at @p offset), the moments from @p offset. The master
 *  steps bit for bit as an fp32 master given to adam_update_state does. */
void adam_update_split(adam_kernel kernel, std::uint16_t* param, std::uint16_t* low,
                       const state_arrays& st, std::size_t offset, const void* grad,
                       param_dtype dtype, std::size_t n, const adam_scalars& s) noexcept;

}  // namespace tierflow::detail
