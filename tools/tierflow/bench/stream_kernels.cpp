#include "bench/stream_kernels.hpp"

#include <immintrin.h>

namespace tierflow::cli {

std::string_view case_name(stream_op op) noexcept {
  switch (op) {
    case stream_op::read:
      return "node_read";
    case stream_op::write:
      return "node_write";
    case stream_op::write_nt:
      return "node_write_nt";
    case stream_op::copy:
      return "node_copy";
    case stream_op::triad:
      return "node_triad";
  }
  return "?";
}

int arrays_of(stream_op op) noexcept {
  switch (op) {
    case stream_op::copy:
      return 2;
    case stream_op::triad:
      return 3;
    default:
      return 1;
  }
}

double bytes_per_element(stream_op op) noexcept {
  return 8.0 * arrays_of(op);
}

namespace {

enum class isa { scalar, avx2, avx512 };

isa detect() noexcept {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    return isa::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {  // the triad fuses
    return isa::avx2;
  }
  return isa::scalar;
}

const isa best = detect();

// Scalar versions: the compiler must not turn them into library calls or vectorise them past
// what the ISA promises, so they stay plain loops over doubles.
double scalar_op(stream_op op, double* a, double* b, double* c, std::size_t n, double s) {
  double sum0 = 0, sum1 = 0;
  switch (op) {
    case stream_op::read:
      for (std::size_t i = 0; i < n; i += 2) {
        sum0 += a[i];
        sum1 += a[i + 1];
      }
      return sum0 + sum1;
    case stream_op::write:
    case stream_op::write_nt:
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = s;
      }
      return 0;
    case stream_op::copy:
      for (std::size_t i = 0; i < n; ++i) {
        b[i] = a[i];
      }
      return 0;
    case stream_op::triad:
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = b[i] + s * c[i];
      }
      return 0;
  }
  return 0;
}

__attribute__((target("avx2,fma"))) double avx2_op(stream_op op, double* a, double* b, double* c,
                                                   std::size_t n, double s) {
  const __m256d vs = _mm256_set1_pd(s);
  switch (op) {
    case stream_op::read: {
      __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
      __m256d s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
      for (std::size_t i = 0; i < n; i += 16) {
        s0 = _mm256_add_pd(s0, _mm256_load_pd(a + i));
        s1 = _mm256_add_pd(s1, _mm256_load_pd(a + i + 4));
        s2 = _mm256_add_pd(s2, _mm256_load_pd(a + i + 8));
        s3 = _mm256_add_pd(s3, _mm256_load_pd(a + i + 12));
      }
      alignas(32) double lanes[4];
      _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
      return lanes[0] + lanes[1] + lanes[2] + lanes[3];
    }
    case stream_op::write:
      for (std::size_t i = 0; i < n; i += 4) {
        _mm256_store_pd(a + i, vs);
      }
      return 0;
    case stream_op::write_nt:
      for (std::size_t i = 0; i < n; i += 4) {
        _mm256_stream_pd(a + i, vs);
      }
      _mm_sfence();
      return 0;
    case stream_op::copy:
      for (std::size_t i = 0; i < n; i += 4) {
        _mm256_store_pd(b + i, _mm256_load_pd(a + i));
      }
      return 0;
    case stream_op::triad:
      for (std::size_t i = 0; i < n; i += 4) {
        _mm256_store_pd(a + i, _mm256_fmadd_pd(vs, _mm256_load_pd(c + i), _mm256_load_pd(b + i)));
      }
      return 0;
  }
  return 0;
}

__attribute__((target("avx512f"))) double avx512_op(stream_op op, double* a, double* b, double* c,
                                                    std::size_t n, double s) {
  const __m512d vs = _mm512_set1_pd(s);
  switch (op) {
    case stream_op::read: {
      __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
      for (std::size_t i = 0; i < n; i += 16) {
        s0 = _mm512_add_pd(s0, _mm512_load_pd(a + i));
        s1 = _mm512_add_pd(s1, _mm512_load_pd(a + i + 8));
      }
      return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    }
    case stream_op::write:
      for (std::size_t i = 0; i < n; i += 8) {
        _mm512_store_pd(a + i, vs);
      }
      return 0;
    case stream_op::write_nt:
      for (std::size_t i = 0; i < n; i += 8) {
        _mm512_stream_pd(a + i, vs);
      }
      _mm_sfence();
      return 0;
    case stream_op::copy:
      for (std::size_t i = 0; i < n; i += 8) {
        _mm512_store_pd(b + i, _mm512_load_pd(a + i));
      }
      return 0;
    case stream_op::triad:
      for (std::size_t i = 0; i < n; i += 8) {
        _mm512_store_pd(a + i, _mm512_fmadd_pd(vs, _mm512_load_pd(c + i), _mm512_load_pd(b + i)));
      }
      return 0;
  }
  return 0;
}

}  // namespace

std::string_view stream_isa() noexcept {
  switch (best) {
    case isa::avx512:
      return "avx512";
    case isa::avx2:
      return "avx2";
    case isa::scalar:
      return "scalar";
  }
  return "scalar";
}

double run_stream_op(stream_op op, double* a, double* b, double* c, std::size_t n,
                     double scalar) noexcept {
  switch (best) {
    case isa::avx512:
      return avx512_op(op, a, b, c, n, scalar);
    case isa::avx2:
      return avx2_op(op, a, b, c, n, scalar);
    case isa::scalar:
      break;
  }
  return scalar_op(op, a, b, c, n, scalar);
}

}  // namespace tierflow::cli
