// Compiled at -O3 in every build type (see CMakeLists.txt), as the kernels it bounds are.
#include "tierflow/detail/adam_bound.hpp"

#include <immintrin.h>

namespace tierflow::detail {

namespace {

void bound_scalar(float* p, float* m, float* v, const float* g, std::size_t begin,
                  std::size_t n) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    const float gi = g[i];
    const float pi = p[i];
    const float mi = m[i];
    const float vi = v[i];
    p[i] = pi - gi;
    m[i] = mi + gi;
    v[i] = vi + gi * gi;
  }
}

__attribute__((target("avx2"))) void bound_avx2(float* p, float* m, float* v, const float* g,
                                                std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 mi = _mm256_loadu_ps(m + i);
    const __m256 vi = _mm256_loadu_ps(v + i);
    _mm256_storeu_ps(m + i, _mm256_add_ps(mi, gi));
    _mm256_storeu_ps(v + i, _mm256_add_ps(vi, _mm256_mul_ps(gi, gi)));
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, gi));
  }
  bound_scalar(p, m, v, g, i, n);
}

__attribute__((target("avx512f,avx2"))) void bound_avx512(float* p, float* m, float* v,
                                                          const float* g, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 pi = _mm512_loadu_ps(p + i);
    const __m512 mi = _mm512_loadu_ps(m + i);
    const __m512 vi = _mm512_loadu_ps(v + i);
    _mm512_storeu_ps(m + i, _mm512_add_ps(mi, gi));
    _mm512_storeu_ps(v + i, _mm512_add_ps(vi, _mm512_mul_ps(gi, gi)));
    _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, gi));
  }
  bound_scalar(p, m, v, g, i, n);
}

void narrow_scalar(float* p, unsigned char* m, unsigned char* v, const float* g, std::size_t begin,
                   std::size_t n, std::size_t width) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    p[i] = p[i] - g[i];
  }
  // Stored as loaded (volatile: the load and the store stay), so the moments keep meaning.
  for (std::size_t b = begin * width; b < n * width; ++b) {
    volatile unsigned char* mb = m + b;
    volatile unsigned char* vb = v + b;
    *mb = *mb;
    *vb = *vb;
  }
}

// 32 bytes of each moment a step: 32 / width elements of p and g.
__attribute__((target("avx2"))) void narrow_avx2(float* p, unsigned char* m, unsigned char* v,
                                                 const float* g, std::size_t n,
                                                 std::size_t width) noexcept {
  const std::size_t per_step = 32 / width;
  std::size_t i = 0;
  for (; i + per_step <= n; i += per_step) {
    for (std::size_t k = 0; k < per_step; k += 8) {
      const __m256 gi = _mm256_loadu_ps(g + i + k);
      const __m256 pi = _mm256_loadu_ps(p + i + k);
      _mm256_storeu_ps(p + i + k, _mm256_sub_ps(pi, gi));
    }
    auto* mi = reinterpret_cast<__m256i*>(m + i * width);
    auto* vi = reinterpret_cast<__m256i*>(v + i * width);
    const __m256i ma = _mm256_loadu_si256(mi);
    const __m256i va = _mm256_loadu_si256(vi);
    _mm256_storeu_si256(mi, ma);  // stored as loaded: the moments keep meaning
    _mm256_storeu_si256(vi, va);
  }
  narrow_scalar(p, m, v, g, i, n, width);
}

}  // namespace

double adam_bytes_per_param_for(adam_state_dtype dtype) noexcept {
  switch (dtype) {
    case adam_state_dtype::bf16:
      return 12.0 + 8.0;
    case adam_state_dtype::int8:
      return 12.0 + 4.0 + 16.0 / 256.0;
    case adam_state_dtype::f32:
      break;
  }
  return adam_bytes_per_param;
}

double adam_bytes_per_param_remainder(adam_state_dtype dtype) noexcept {
  return adam_bytes_per_param_for(dtype) - 12.0 + 10.0;
}

void adam_bound_pass_narrow(adam_kernel kernel, float* p, unsigned char* m, unsigned char* v,
                            float* m_scale, float* v_scale, const float* g, std::size_t n,
                            std::size_t width) noexcept {
  if ((kernel == adam_kernel::automatic ? best_kernel() : kernel) == adam_kernel::scalar) {
    narrow_scalar(p, m, v, g, 0, n, width);
  } else {
    narrow_avx2(p, m, v, g, n, width);  // AVX-512 machines run AVX2 too
  }
  if (m_scale != nullptr && v_scale != nullptr) {
    for (std::size_t b = 0; b < (n + 255) / 256; ++b) {
      volatile float* ms = m_scale + b;
      volatile float* vs = v_scale + b;
      *ms = *ms;
      *vs = *vs;
    }
  }
}

void adam_bound_pass(adam_kernel kernel, float* p, float* m, float* v, const float* g,
                     std::size_t n) noexcept {
  switch (kernel == adam_kernel::automatic ? best_kernel() : kernel) {
    case adam_kernel::avx512:
      bound_avx512(p, m, v, g, n);
      return;
    case adam_kernel::avx2:
      bound_avx2(p, m, v, g, n);
      return;
    case adam_kernel::automatic:
    case adam_kernel::scalar:
      bound_scalar(p, m, v, g, 0, n);
      return;
  }
}

}  // namespace tierflow::detail
