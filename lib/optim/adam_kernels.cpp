// Compiled with -ffp-contract=off (see CMakeLists.txt): a fused multiply-add would round once
// where the reference rounds twice, and the kernels would stop matching it.
#include "tierflow/detail/adam_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <cpuid.h>
#include <immintrin.h>

#include "optim/adam_simd.hpp"
#include "tierflow/error.hpp"

namespace tierflow::detail {

namespace {

float load_one(const void* src, param_dtype dtype, std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      return static_cast<const float*>(src)[i];
    case param_dtype::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case param_dtype::f16:
      return f16_to_float(static_cast<const std::uint16_t*>(src)[i]);
  }
  return 0.0f;
}

void store_one(float value, void* dst, param_dtype dtype, std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      static_cast<float*>(dst)[i] = value;
      return;
    case param_dtype::bf16:
      static_cast<std::uint16_t*>(dst)[i] = float_to_bf16(value);
      return;
    case param_dtype::f16:
      static_cast<std::uint16_t*>(dst)[i] = float_to_f16(value);
      return;
  }
}

// ---- scalar -------------------------------------------------------------------------------

void update_scalar(float* p, float* m, float* v, const void* grad, param_dtype dtype,
                   std::size_t begin, std::size_t n, const adam_scalars& s) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    adam_reference(p[i], m[i], v[i], load_one(grad, dtype, i), s);
  }
}

void store_scalar(const float* src, void* dst, param_dtype dtype, std::size_t begin,
                  std::size_t n) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    store_one(src[i], dst, dtype, i);
  }
}

// The sum of squares' lanes: element i goes to lane i % sum_lanes. Enough independent add
// chains that the sum runs at the speed memory delivers the grads (8 lanes, two chains of
// AVX2 adds, ran at half of it on one core), in an order every kernel keeps.
constexpr std::size_t sum_lanes = 32;

// Lane i % sum_lanes of @p lanes gets g_i², from element @p begin (a multiple of sum_lanes) on.
void sum_squares_scalar(const void* grad, param_dtype dtype, std::size_t begin, std::size_t n,
                        double* lanes) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    const double g = load_one(grad, dtype, i);
    lanes[i % sum_lanes] += g * g;
  }
}

// The lanes combined pairwise: lane k + w into lane k for w = 16, 8, 4, 2, 1.
double combine_lanes(double* lanes) noexcept {
  for (std::size_t w = sum_lanes / 2; w > 0; w /= 2) {
    for (std::size_t k = 0; k < w; ++k) {
      lanes[k] += lanes[k + w];
    }
  }
  return lanes[0];
}

// ---- AVX2 (+F16C) ---------------------------------------------------------------------------

#define TIERFLOW_AVX2 TIERFLOW_AVX2_TARGET

TIERFLOW_AVX2 void store8(__m256 x, void* dst, param_dtype dtype, std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      _mm256_storeu_ps(static_cast<float*>(dst) + i, x);
      return;
    case param_dtype::bf16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(dst) + i),
                       to_bf16_8(x));
      return;
    case param_dtype::f16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(dst) + i),
                       _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
  }
}

TIERFLOW_AVX2 void update_avx2(float* p, float* m, float* v, const void* grad, param_dtype dtype,
                               std::size_t n, const adam_scalars& s) noexcept {
  const avx2_scalars c = broadcast_avx2(s);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i);
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    (void)adam_step8(c, load8(grad, dtype, i), pi, mi, vi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
  }
  update_scalar(p, m, v, grad, dtype, i, n, s);
}

TIERFLOW_AVX2 void store_avx2(const float* src, void* dst, param_dtype dtype,
                              std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(_mm256_loadu_ps(src + i), dst, dtype, i);
  }
  store_scalar(src, dst, dtype, i, n);
}

// How many of the first @p n elements (a multiple of 8 at most) match: eight at a time, the
// reference stored as store8 stores it against the params' bits; stops at the first group of
// eight with a difference, returned as its start.
TIERFLOW_AVX2 std::size_t same_prefix_avx2(const float* reference, const void* param,
                                           param_dtype dtype, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(reference + i);
    bool same = false;
    switch (dtype) {
      case param_dtype::f32: {
        const __m256i p = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const float*>(param) + i));
        same = _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_castps_si256(x), p)) == -1;
        break;
      }
      case param_dtype::bf16:
      case param_dtype::f16: {
        const __m128i p = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(param) + i));
        const __m128i stored =
            dtype == param_dtype::bf16
                ? to_bf16_8(x)
                : _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        same = _mm_movemask_epi8(_mm_cmpeq_epi16(stored, p)) == 0xffff;
        break;
      }
    }
    if (!same) {
      break;
    }
  }
  return i;
}

TIERFLOW_AVX2 double sum_squares_avx2(const void* grad, param_dtype dtype, std::size_t n) noexcept {
  __m256d acc[sum_lanes / 4];  // acc[k]: lanes 4k .. 4k+3
  for (auto& a : acc) {
    a = _mm256_setzero_pd();
  }
  std::size_t i = 0;
  for (; i + sum_lanes <= n; i += sum_lanes) {
    for (std::size_t q = 0; q < sum_lanes / 8; ++q) {
      const __m256 g = load8(grad, dtype, i + 8 * q);
      const __m256d g_low = _mm256_cvtps_pd(_mm256_castps256_ps128(g));
      const __m256d g_high = _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1));
      acc[2 * q] = _mm256_add_pd(acc[2 * q], _mm256_mul_pd(g_low, g_low));
      acc[2 * q + 1] = _mm256_add_pd(acc[2 * q + 1], _mm256_mul_pd(g_high, g_high));
    }
  }
  alignas(32) double lanes[sum_lanes];
  for (std::size_t k = 0; k < sum_lanes / 4; ++k) {
    _mm256_store_pd(lanes + 4 * k, acc[k]);
  }
  sum_squares_scalar(grad, dtype, i, n, lanes);
  return combine_lanes(lanes);
}

// ---- AVX-512 --------------------------------------------------------------------------------

#define TIERFLOW_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

TIERFLOW_AVX512 __m512 load16(const void* src, param_dtype dtype, std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      return _mm512_loadu_ps(static_cast<const float*>(src) + i);
    case param_dtype::bf16: {
      const __m256i raw = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(src) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    case param_dtype::f16: {
      const __m256i raw = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(src) + i));
      return _mm512_cvtph_ps(raw);
    }
  }
  return _mm512_setzero_ps();
}

TIERFLOW_AVX512 void store16(__m512 x, void* dst, param_dtype dtype, std::size_t i) noexcept {
  switch (dtype) {
    case param_dtype::f32:
      _mm512_storeu_ps(static_cast<float*>(dst) + i, x);
      return;
    case param_dtype::bf16: {
      const __m512i bits = _mm512_castps_si512(x);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i out = _mm512_srli_epi32(
          _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
      const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      out = _mm512_mask_or_epi32(out, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(dst) + i),
                          _mm512_cvtepi32_epi16(out));
      return;
    }
    case param_dtype::f16:
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(dst) + i),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
  }
}

TIERFLOW_AVX512 void update_avx512(float* p, float* m, float* v, const void* grad,
                                   param_dtype dtype, std::size_t n,
                                   const adam_scalars& s) noexcept {
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
  const __m512 l2 = _mm512_set1_ps(s.l2);
  const __m512 decay = _mm512_set1_ps(s.decay);
  const __m512 beta1 = _mm512_set1_ps(s.beta1);
  const __m512 omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2);
  const __m512 omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(s.bc2_sqrt);
  const __m512 step = _mm512_set1_ps(s.neg_step_size);
  const __m512 eps = _mm512_set1_ps(s.eps);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 g = _mm512_mul_ps(load16(grad, dtype, i), grad_scale);
    __m512 pi = _mm512_loadu_ps(p + i);
    g = _mm512_add_ps(g, _mm512_mul_ps(l2, pi));
    pi = _mm512_mul_ps(pi, decay);
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), beta1), _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), beta2),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    pi = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
  }
  update_scalar(p, m, v, grad, dtype, i, n, s);
}

TIERFLOW_AVX512 void store_avx512(const float* src, void* dst, param_dtype dtype,
                                  std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store16(_mm512_loadu_ps(src + i), dst, dtype, i);
  }
  store_scalar(src, dst, dtype, i, n);
}

TIERFLOW_AVX512 double sum_squares_avx512(const void* grad, param_dtype dtype,
                                          std::size_t n) noexcept {
  __m512d acc[sum_lanes / 8];  // acc[k]: lanes 8k .. 8k+7
  for (auto& a : acc) {
    a = _mm512_setzero_pd();
  }
  std::size_t i = 0;
  for (; i + sum_lanes <= n; i += sum_lanes) {
    for (std::size_t q = 0; q < sum_lanes / 16; ++q) {
      const __m512 g = load16(grad, dtype, i + 16 * q);
      const __m512d first = _mm512_cvtps_pd(_mm512_castps512_ps256(g));
      const __m512d second =
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(g), 1)));
      acc[2 * q] = _mm512_add_pd(acc[2 * q], _mm512_mul_pd(first, first));
      acc[2 * q + 1] = _mm512_add_pd(acc[2 * q + 1], _mm512_mul_pd(second, second));
    }
  }
  alignas(64) double lanes[sum_lanes];
  for (std::size_t k = 0; k < sum_lanes / 8; ++k) {
    _mm512_store_pd(lanes + 8 * k, acc[k]);
  }
  sum_squares_scalar(grad, dtype, i, n, lanes);
  return combine_lanes(lanes);
}

}  // namespace

void adam_reference(float& p, float& m, float& v, float grad, const adam_scalars& s) noexcept {
  float g = grad * s.grad_scale;
  g = g + s.l2 * p;
  p = p * s.decay;
  m = m * s.beta1 + s.one_minus_beta1 * g;
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  p = p + s.neg_step_size * m / denom;
}

adam_scalars make_adam_scalars(const adam_hyper& hyper, std::uint64_t step,
                               double grad_scale) noexcept {
  adam_scalars s;
  const bool decoupled = hyper.decay == weight_decay_mode::decoupled;
  s.grad_scale = static_cast<float>(grad_scale);
  s.l2 = decoupled ? 0.0f : static_cast<float>(hyper.weight_decay);
  s.decay = decoupled ? static_cast<float>(1.0 - hyper.lr * hyper.weight_decay) : 1.0f;
  s.beta1 = static_cast<float>(hyper.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
  s.beta2 = static_cast<float>(hyper.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
  s.eps = static_cast<float>(hyper.eps);
  const double t = static_cast<double>(step);
  if (hyper.bias_correction) {
    const double bc1 = 1.0 - std::pow(hyper.beta1, t);
    const double bc2 = 1.0 - std::pow(hyper.beta2, t);
    s.neg_step_size = static_cast<float>(-(hyper.lr / bc1));
    s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  } else {
    s.neg_step_size = static_cast<float>(-hyper.lr);
    s.bc2_sqrt = 1.0f;
  }
  return s;
}

std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = bits_of(value);
  if (std::isnan(value)) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  }
  const std::uint32_t odd = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + odd) >> 16);
}

float bf16_to_float(std::uint16_t value) noexcept {
  return float_of(static_cast<std::uint32_t>(value) << 16);
}

std::uint16_t float_to_f16(float value) noexcept {
  std::uint32_t bits = bits_of(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) {  // NaN: quiet, top payload bits kept (as vcvtps2ph does)
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
  }
  if (bits >= 0x477ff000u) {  // ≥ 65520 rounds to infinity (and infinity stays)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (bits < 0x38800000u) {
    // Below 2^-14: a subnormal half (or zero). Adding 0.5 puts the float's last mantissa bit
    // at 2^-24, the subnormal half's unit, so the float add does the rounding to nearest even.
    const float shifted = float_of(bits) + 0.5f;
    return static_cast<std::uint16_t>(sign | (bits_of(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 → 15) and round the 13 dropped bits to nearest even.
  const std::uint32_t odd = (bits >> 13) & 1u;
  bits += 0xc8000fffu + odd;
  return static_cast<std::uint16_t>(sign | (bits >> 13));
}

float f16_to_float(std::uint16_t value) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  const std::uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa × 2^-24, exact in float
    return float_of(sign | bits_of(static_cast<float>(mantissa) * 0x1p-24f));
  }
  if (exponent == 31) {
    return float_of(sign | 0x7f800000u | (mantissa << 13));
  }
  return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

void adam_update(adam_kernel kernel, float* p, float* m, float* v, const void* grad,
                 param_dtype dtype, std::size_t n, const adam_scalars& s) noexcept {
  switch (kernel) {
    case adam_kernel::avx512:
      update_avx512(p, m, v, grad, dtype, n, s);
      return;
    case adam_kernel::avx2:
      update_avx2(p, m, v, grad, dtype, n, s);
      return;
    default:
      update_scalar(p, m, v, grad, dtype, 0, n, s);
      return;
  }
}

void store_params(adam_kernel kernel, const float* src, void* dst, param_dtype dtype,
                  std::size_t n) noexcept {
  switch (kernel) {
    case adam_kernel::avx512:
      store_avx512(src, dst, dtype, n);
      return;
    case adam_kernel::avx2:
      store_avx2(src, dst, dtype, n);
      return;
    default:
      store_scalar(src, dst, dtype, 0, n);
      return;
  }
}

std::size_t adopt_param_writes(adam_kernel kernel, const float* reference, float* out,
                               const void* param, param_dtype dtype, std::size_t n) noexcept {
  // Blocks of the reference: with AVX2, the equal groups of eight at the block's start are
  // compared in registers; from the first that differs (scalar: from the start) the rest of the
  // block is stored as params and compared whole, then an element at a time if it differs.
  constexpr std::size_t block = 512;
  alignas(64) unsigned char stored[block * sizeof(float)];
  const std::size_t eb = dtype_bytes(dtype);
  const auto* in = static_cast<const unsigned char*>(param);
  const bool simd = kernel == adam_kernel::avx2 || kernel == adam_kernel::avx512;
  std::size_t differ = 0;
  for (std::size_t start = 0; start < n; start += block) {
    const std::size_t end = std::min(start + block, n);
    const std::size_t i =
        start +
        (simd ? same_prefix_avx2(reference + start, in + start * eb, dtype, end - start) : 0);
    const std::size_t k = end - i;
    if (k == 0) {
      continue;
    }
    store_params(kernel, reference + i, stored, dtype, k);
    if (std::memcmp(stored, in + i * eb, k * eb) == 0) {
      continue;
    }
    for (std::size_t j = 0; j < k; ++j) {
      if (std::memcmp(stored + j * eb, in + (i + j) * eb, eb) != 0) {
        ++differ;
        if (out != nullptr) {
          out[i + j] = load_one(param, dtype, i + j);
        }
      }
    }
  }
  return differ;
}

void load_as_f32(const void* src, param_dtype dtype, float* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = load_one(src, dtype, i);
  }
}

double grad_sum_squares(adam_kernel kernel, const void* grad, param_dtype dtype,
                        std::size_t n) noexcept {
  switch (kernel) {
    case adam_kernel::avx512:
      return sum_squares_avx512(grad, dtype, n);
    case adam_kernel::avx2:
      return sum_squares_avx2(grad, dtype, n);
    default: {
      double lanes[sum_lanes] = {};
      sum_squares_scalar(grad, dtype, 0, n, lanes);
      return combine_lanes(lanes);
    }
  }
}

adam_kernel resolve_kernel(adam_kernel wanted) {
  if (wanted == adam_kernel::automatic) {
    return best_kernel();
  }
  TIERFLOW_EXPECTS(kernel_supported(wanted),
                   "this CPU cannot run the " + std::string(to_string(wanted)) + " Adam kernel");
  return wanted;
}

}  // namespace tierflow::detail

namespace tierflow {

std::string_view to_string(adam_kernel kernel) noexcept {
  switch (kernel) {
    case adam_kernel::automatic:
      return "auto";
    case adam_kernel::scalar:
      return "scalar";
    case adam_kernel::avx2:
      return "avx2";
    case adam_kernel::avx512:
      return "avx512";
  }
  return "unknown";
}

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know it.
bool has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}

}  // namespace

bool kernel_supported(adam_kernel kernel) noexcept {
  switch (kernel) {
    case adam_kernel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && has_f16c();
    case adam_kernel::avx2:
      return __builtin_cpu_supports("avx2") && has_f16c();
    default:
      return true;
  }
}

adam_kernel best_kernel() noexcept {
  if (kernel_supported(adam_kernel::avx512)) {
    return adam_kernel::avx512;
  }
  if (kernel_supported(adam_kernel::avx2)) {
    return adam_kernel::avx2;
  }
  return adam_kernel::scalar;
}

}  // namespace tierflow
