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

}  // namespace

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
