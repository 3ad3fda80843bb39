// The master in 16 bits (tierflow/detail/adam_master.hpp): a join before the update and a split
// after it, a window at a time, around the same update an fp32 master gets.
#include "tierflow/detail/adam_master.hpp"

#include <algorithm>

#include <immintrin.h>

#include "optim/adam_simd.hpp"

namespace tierflow::detail {

namespace {

// Elements a step joins and splits at a time (16 KiB of masters on the stack; a multiple of
// state_block, so int8 blocks stay whole).
constexpr std::size_t window = 4096;

}  // namespace

void join_master(const std::uint16_t* param, const std::uint16_t* low, float* master,
                 std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const auto difference = static_cast<std::int16_t>(low[i]);
    master[i] = float_of((static_cast<std::uint32_t>(param[i]) << 16) +
                         static_cast<std::uint32_t>(static_cast<std::int32_t>(difference)));
  }
}

void split_master(const float* master, std::uint16_t* param, std::uint16_t* low,
                  std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = bits_of(master[i]);
    // + half a bf16 ulp, then truncate: the magnitude rounds to nearest, ties away from zero
    // (the bits of a sign-magnitude float grow with its magnitude). A finite master's sum
    // does not wrap; one within half an ulp of FLT_MAX rounds to infinity, as it would to even.
    const std::uint32_t high = (u + 0x8000u) >> 16;
    param[i] = static_cast<std::uint16_t>(high);
    low[i] = static_cast<std::uint16_t>(u - (high << 16));
  }
}

namespace {

TIERFLOW_AVX2_TARGET void join_avx2(const std::uint16_t* param, const std::uint16_t* low,
                                    float* master, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i high = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(param + i))), 16);
    const __m256i rest =
        _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(master + i), _mm256_add_epi32(high, rest));
  }
  join_master(param + i, low + i, master + i, n - i);
}

TIERFLOW_AVX2_TARGET void split_avx2(const float* master, std::uint16_t* param, std::uint16_t* low,
                                     std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(master + i));
    const __m256i high = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), 16);
    const __m256i rest = _mm256_sub_epi32(u, _mm256_slli_epi32(high, 16));  // in [-2^15, 2^15)
    // To 16 bits each: high fits unsigned, rest signed, so neither pack saturates.
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(param + i),
        _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(low + i),
        _mm_packs_epi32(_mm256_castsi256_si128(rest), _mm256_extracti128_si256(rest, 1)));
  }
  split_master(master + i, param + i, low + i, n - i);
}

bool vector_kernel(adam_kernel kernel) noexcept {
  const adam_kernel k = kernel == adam_kernel::automatic ? best_kernel() : kernel;
  return k == adam_kernel::avx2 || k == adam_kernel::avx512;
}

}  // namespace

void join_master(adam_kernel kernel, const std::uint16_t* param, const std::uint16_t* low,
                 float* master, std::size_t n) noexcept {
  if (vector_kernel(kernel)) {
    join_avx2(param, low, master, n);
  } else {
    join_master(param, low, master, n);
  }
}

void split_master(adam_kernel kernel, const float* master, std::uint16_t* param, std::uint16_t* low,
                  std::size_t n) noexcept {
  if (vector_kernel(kernel)) {
    split_avx2(master, param, low, n);
  } else {
    split_master(master, param, low, n);
  }
}

void adam_update_split(adam_kernel kernel, std::uint16_t* param, std::uint16_t* low,
                       const state_arrays& st, std::size_t offset, const void* grad,
                       param_dtype dtype, std::size_t n, const adam_scalars& s) noexcept {
  alignas(64) float master[window];
  const std::size_t eb = dtype_bytes(dtype);
  for (std::size_t done = 0; done < n; done += window) {
    const std::size_t count = std::min(window, n - done);
    join_master(kernel, param + done, low + done, master, count);
    adam_update_state(kernel, master, st, offset + done,
                      static_cast<const unsigned char*>(grad) + done * eb, dtype, count, s);
    split_master(kernel, master, param + done, low + done, count);
  }
}

}  // namespace tierflow::detail
