#pragma once
// What the Adam kernels share (private to lib/optim): a float's bits, loading grads of any dtype,
// rounding to bf16, and one element step on eight lanes, the scalar reference's operations in
// its order (adam_kernels.cpp's update; adam_state.cpp's fused steps over compressed moments).
// Both files are compiled with -ffp-contract=off: no multiply-add may fuse.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "tierflow/detail/adam_scalars.hpp"
#include "tierflow/offload_adam.hpp"

#define TIERFLOW_AVX2_TARGET __attribute__((target("avx2,f16c")))

namespace tierflow::detail {

// A float's bits, and back (the scalar codecs' integer views).
inline std::uint32_t bits_of(float value) noexcept {
  std::uint32_t out = 0;
  std::memcpy(&out, &value, sizeof out);
  return out;
}

inline float float_of(std::uint32_t bits) noexcept {
  float out = 0;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Eight values of @p dtype from element @p i of @p src, as fp32 (exact).
TIERFLOW_AVX2_TARGET inline __m256 load8(const void* src, param_dtype dtype,
                                         std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      return _mm256_loadu_ps(static_cast<const float*>(src) + i);
    case param_dtype::bf16: {
      const __m128i raw = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(src) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
    case param_dtype::f16: {
      const __m128i raw = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(src) + i));
      return _mm256_cvtph_ps(raw);
    }
  }
  return _mm256_setzero_ps();
}

// bf16 with round to nearest even; a NaN stays a quiet NaN (as float_to_bf16).
TIERFLOW_AVX2_TARGET inline __m128i to_bf16_8(__m256 x) noexcept {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i out = _mm256_blendv_epi8(rounded, quiet, nan);
  // 32 → 16 bits: pack within each 128-bit lane, then gather the two lanes' halves.
  const __m256i packed = _mm256_packus_epi32(out, out);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// A step's scalars in every lane.
struct avx2_scalars {
  __m256 grad_scale, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt,
      neg_step_size, eps;
};

TIERFLOW_AVX2_TARGET inline avx2_scalars broadcast_avx2(const adam_scalars& s) noexcept {
  return {_mm256_set1_ps(s.grad_scale),      _mm256_set1_ps(s.l2),
          _mm256_set1_ps(s.decay),           _mm256_set1_ps(s.beta1),
          _mm256_set1_ps(s.one_minus_beta1), _mm256_set1_ps(s.beta2),
          _mm256_set1_ps(s.one_minus_beta2), _mm256_set1_ps(s.bc2_sqrt),
          _mm256_set1_ps(s.neg_step_size),   _mm256_set1_ps(s.eps)};
}

// adam_reference on eight lanes: @p grad (unscaled) steps @p p, @p m and @p v in place; returns
// sqrt(v), the new v's root that the update divided by (for a caller that stores it).
TIERFLOW_AVX2_TARGET inline __m256 adam_step8(const avx2_scalars& c, __m256 grad, __m256& p,
                                              __m256& m, __m256& v) noexcept {
  __m256 g = _mm256_mul_ps(grad, c.grad_scale);
  g = _mm256_add_ps(g, _mm256_mul_ps(c.l2, p));
  p = _mm256_mul_ps(p, c.decay);
  m = _mm256_add_ps(_mm256_mul_ps(m, c.beta1), _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(v, c.beta2),
                    _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 root = _mm256_sqrt_ps(v);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(root, c.bc2_sqrt), c.eps);
  p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(c.neg_step_size, m), denom));
  return root;
}

}  // namespace tierflow::detail
