#pragma once
// Compressed Adam moments (adam_state_dtype bf16 and int8): their layout, their codecs and the
// step over them. A compressed step decodes a block of m and v to fp32, runs the fp32 update
// on it (adam_update: the bits of adam_reference) and encodes the block again. Every kernel
// gives the same bytes as the scalar one: the codecs are integer operations and single IEEE
// roundings in a fixed order (no fused multiply-adds), and a block's scale is its largest
// magnitude, whose value no summation order changes.
//
// int8 (per block of state_block elements, from the param's element 0):
//   m: code = sign (bit 7) | E (bits 6-3) | M (bits 2-0); |value| = 2^(E-15) (1 + M/8) for
//      E >= 1, M 2^-17 for E = 0; the largest code is 1.875. The block's scale is
//      max|m| / 1.875 and m = value * scale.
//   v: the code holds sqrt(v): E (bits 7-4) | M (bits 3-0), 2^(E-15) (1 + M/16) or M 2^-18;
//      largest 1.9375, scale max sqrt(v) / 1.9375, v = (value * scale)^2. A positive v never
//      encodes to 0 (its code is at least 1): a zero denominator would turn a small m into a
//      step of m / eps.
//   Encoding y = |x| * (largest code / block max) rounds to the nearest code (ties to even
//   mantissa). Floating codes keep a relative precision (m 1/16, sqrt(v) 1/32 at worst) over
//   2^17 (m) and 2^18 (sqrt v, so 2^36 in v) below the block's largest value, where a linear
//   code would flush a block's small values to zero next to one large one.
#include <array>
#include <cstddef>
#include <cstdint>

#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/offload_adam.hpp"

namespace tierflow::detail {

/** int8: elements per scale. */
inline constexpr std::size_t state_block = 256;

/** One param's moments, from its element 0. */
struct state_arrays {
  adam_state_dtype dtype = adam_state_dtype::f32;
  void* m = nullptr;  ///< f32: floats; bf16: bf16 bits; int8: one code per element
  void* v = nullptr;
  float* m_scale = nullptr;  ///< int8: one per block
  float* v_scale = nullptr;
};

/** Bytes of one moment's values (m or v) for @p elements. */
std::size_t moment_bytes(adam_state_dtype dtype, std::size_t elements) noexcept;
/** Scales per moment: int8 one per block, else 0. */
std::size_t scale_count(adam_state_dtype dtype, std::size_t elements) noexcept;
/** m, v and their scales: the bytes of state the moments hold. */
std::size_t packed_moments_bytes(adam_state_dtype dtype, std::size_t elements) noexcept;

/** A contiguous piece of a param's moments and its place in a packed copy of them (m, v, m's
 *  scales, v's scales, back to back: packed_moments_bytes in all). */
struct state_piece {
  unsigned char* at = nullptr;
  std::size_t packed_offset = 0;
  std::size_t bytes = 0;
};

/** The pieces in use (fp32 and bf16: m and v; int8: their scales too; and a chunk's master
 *  before them where a caller adds it), iterable. */
struct state_piece_list {
  std::array<state_piece, 5> items{};
  std::size_t count = 0;
  [[nodiscard]] const state_piece* begin() const noexcept { return items.data(); }
  [[nodiscard]] const state_piece* end() const noexcept { return items.data() + count; }
};

/** The pieces that hold elements [offset, offset + n) of a param of @p elements (int8: @p
 *  offset a multiple of state_block). */
state_piece_list state_pieces(const state_arrays& st, std::size_t elements, std::size_t offset,
                              std::size_t n) noexcept;

/** Updates @p n elements: master weights @p p (from element @p offset), the moments from
 *  element @p offset (int8: a multiple of state_block), grads @p grad of @p dtype. f32 state is
 *  adam_update itself. */
void adam_update_state(adam_kernel kernel, float* p, const state_arrays& st, std::size_t offset,
                       const void* grad, param_dtype dtype, std::size_t n,
                       const adam_scalars& s) noexcept;

/** The moments of elements [offset, offset + n) as fp32 (exact: the values the step uses). */
void decode_moments(const state_arrays& st, std::size_t offset, std::size_t n, float* m,
                    float* v) noexcept;

/** Stores fp32 moments into elements [offset, offset + n) (int8: @p offset a multiple of
 *  state_block, and @p n one too unless the range ends the param); a null @p m or @p v leaves
 *  that moment as stored (int8 scales each moment on its own). */
void encode_moments(adam_kernel kernel, const state_arrays& st, std::size_t offset, std::size_t n,
                    const float* m, const float* v) noexcept;

/** The int8 codes of one value already divided by its block's scale (for tests). */
std::uint8_t encode_m8(float m_scaled) noexcept;
std::uint8_t encode_v8(float sqrt_v_scaled) noexcept;
/** A code's value before its block's scale multiplies it (for v: of sqrt(v)). */
float decode_m8(std::uint8_t code) noexcept;
float decode_v8(std::uint8_t code) noexcept;

}  // namespace tierflow::detail
