// Compiled with -ffp-contract=off, as adam_kernels.cpp: the codecs' multiplies must round as
// the scalar reference's do (see tierflow/detail/adam_state.hpp for the codes).
#include "tierflow/detail/adam_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "optim/adam_simd.hpp"
#include "tierflow/detail/adam_kernels.hpp"

namespace tierflow::detail {

namespace {

// The largest magnitude of each code (before the block's scale).
constexpr float m_top = 1.875f;   // E 15, M 7
constexpr float v_top = 1.9375f;  // E 15, M 15
// Below 2^-14 a code's exponent field is 0 (its subnormal range).
constexpr float normal_floor = 0x1p-14f;
// fp32's exponent bias (127) less the codes' (15), in place.
constexpr std::uint32_t rebias = 112u << 23;

// The magnitude code of y >= 0 with K mantissa bits: nearest, ties to even, at most the top.
template <int K>
std::uint32_t magnitude_code(float y) noexcept {
  std::uint32_t code = 0;
  if (y < normal_floor) {
    code = static_cast<std::uint32_t>(std::nearbyint(y * (K == 3 ? 0x1p17f : 0x1p18f)));
  } else {
    constexpr int shift = 23 - K;
    const std::uint32_t b = bits_of(y) - rebias;
    code = (b + ((1u << (shift - 1)) - 1u) + ((b >> shift) & 1u)) >> shift;
  }
  return std::min(code, (16u << K) - 1u);
}

template <int K>
float magnitude_value(std::uint32_t code) noexcept {
  if (code < (1u << K)) {
    return static_cast<float>(code) * (K == 3 ? 0x1p-17f : 0x1p-18f);
  }
  return float_of((code << (23 - K)) + rebias);
}

struct block_scale {
  float scale = 0.0f;  // stored: value = code's value * scale
  float inv = 0.0f;    // the encoder's multiplier: top / block max (0 for an all-zero block)
};

block_scale scale_for(float block_max, float top) noexcept {
  if (!(block_max > 0.0f)) {
    return {};
  }
  return {block_max / top, top / block_max};
}

std::uint8_t* codes(void* base, std::size_t offset) noexcept {
  return static_cast<std::uint8_t*>(base) + offset;
}

std::uint16_t* halves(void* base, std::size_t offset) noexcept {
  return static_cast<std::uint16_t*>(base) + offset;
}

// ---- int8 blocks: scalar ------------------------------------------------------------------

void decode_int8_scalar(const std::uint8_t* mc, const std::uint8_t* vc, float ms, float vs,
                        std::size_t begin, std::size_t n, float* m, float* v) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    m[i] = decode_m8(mc[i]) * ms;
    const float s = decode_v8(vc[i]) * vs;
    v[i] = s * s;
  }
}

float m_max_scalar(const float* m, std::size_t begin, std::size_t n, float max) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    max = std::max(max, std::fabs(m[i]));
  }
  return max;
}

// sqrt(v), held in v's place from here on, and its largest value.
float root_max_scalar(float* v, std::size_t begin, std::size_t n, float max) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    v[i] = std::sqrt(v[i]);
    max = std::max(max, v[i]);
  }
  return max;
}

void encode_m_scalar(const float* m, float inv, std::size_t begin, std::size_t n,
                     std::uint8_t* mc) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    mc[i] = encode_m8(m[i] * inv);
  }
}

void encode_v_scalar(const float* root, float inv, std::size_t begin, std::size_t n,
                     std::uint8_t* vc) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    vc[i] = encode_v8(root[i] * inv);
  }
}

// ---- int8 blocks: AVX2 (also what the AVX-512 kernel's blocks use) -------------------------

#define TIERFLOW_AVX2 TIERFLOW_AVX2_TARGET

template <int K>
TIERFLOW_AVX2 __m256 magnitude_values8(__m256i code) noexcept {
  const __m256 sub =
      _mm256_mul_ps(_mm256_cvtepi32_ps(code), _mm256_set1_ps(K == 3 ? 0x1p-17f : 0x1p-18f));
  const __m256 normal = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(code, 23 - K), _mm256_set1_epi32(int(rebias))));
  const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << K), code);
  return _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(small));
}

template <int K>
TIERFLOW_AVX2 __m256i magnitude_codes8(__m256 y) noexcept {
  constexpr int shift = 23 - K;
  const __m256i sub =
      _mm256_cvtps_epi32(_mm256_mul_ps(y, _mm256_set1_ps(K == 3 ? 0x1p17f : 0x1p18f)));
  const __m256i b = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(int(rebias)));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, shift), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32((1 << (shift - 1)) - 1), odd)), shift);
  const __m256 small = _mm256_cmp_ps(y, _mm256_set1_ps(normal_floor), _CMP_LT_OQ);
  const __m256i code = _mm256_blendv_epi8(normal, sub, _mm256_castps_si256(small));
  return _mm256_min_epi32(code, _mm256_set1_epi32((16 << K) - 1));
}

TIERFLOW_AVX2 __m256i load_codes8(const std::uint8_t* at) noexcept {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
}

TIERFLOW_AVX2 void store_codes8(__m256i code, std::uint8_t* at) noexcept {
  const __m128i words =
      _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(at), _mm_packus_epi16(words, words));
}

TIERFLOW_AVX2 void decode_int8_avx2(const std::uint8_t* mc, const std::uint8_t* vc, float ms,
                                    float vs, std::size_t n, float* m, float* v) noexcept {
  const __m256 m_scale = _mm256_set1_ps(ms);
  const __m256 v_scale = _mm256_set1_ps(vs);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i mcode = load_codes8(mc + i);
    const __m256 magnitude = _mm256_mul_ps(
        magnitude_values8<3>(_mm256_and_si256(mcode, _mm256_set1_epi32(0x7f))), m_scale);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(mcode, _mm256_set1_epi32(0x80)), 24);
    _mm256_storeu_ps(m + i, _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign)));
    const __m256 s = _mm256_mul_ps(magnitude_values8<4>(load_codes8(vc + i)), v_scale);
    _mm256_storeu_ps(v + i, _mm256_mul_ps(s, s));
  }
  decode_int8_scalar(mc, vc, ms, vs, i, n, m, v);
}

TIERFLOW_AVX2 float lanes_max(__m256 x, float max) noexcept {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, x);
  for (float lane : lanes) {
    max = std::max(max, lane);
  }
  return max;
}

TIERFLOW_AVX2 float m_max_avx2(const float* m, std::size_t n) noexcept {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mm = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    mm = _mm256_max_ps(mm, _mm256_and_ps(_mm256_loadu_ps(m + i), abs_mask));
  }
  return m_max_scalar(m, i, n, lanes_max(mm, 0.0f));
}

TIERFLOW_AVX2 float root_max_avx2(float* v, std::size_t n) noexcept {
  __m256 vm = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = _mm256_sqrt_ps(_mm256_loadu_ps(v + i));
    _mm256_storeu_ps(v + i, s);
    vm = _mm256_max_ps(vm, s);
  }
  return root_max_scalar(v, i, n, lanes_max(vm, 0.0f));
}

TIERFLOW_AVX2 void encode_m_avx2(const float* m, float inv, std::size_t n,
                                 std::uint8_t* mc) noexcept {
  const __m256 m_inv = _mm256_set1_ps(inv);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 mi = _mm256_loadu_ps(m + i);
    const __m256i code = magnitude_codes8<3>(_mm256_mul_ps(_mm256_and_ps(mi, abs_mask), m_inv));
    const __m256 negative = _mm256_cmp_ps(mi, _mm256_setzero_ps(), _CMP_LT_OQ);
    store_codes8(_mm256_or_si256(code, _mm256_and_si256(_mm256_castps_si256(negative),
                                                        _mm256_set1_epi32(0x80))),
                 mc + i);
  }
  encode_m_scalar(m, inv, i, n, mc);
}

TIERFLOW_AVX2 void encode_v_avx2(const float* root, float inv, std::size_t n,
                                 std::uint8_t* vc) noexcept {
  const __m256 v_inv = _mm256_set1_ps(inv);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 si = _mm256_loadu_ps(root + i);
    const __m256i code = magnitude_codes8<4>(_mm256_mul_ps(si, v_inv));
    // A positive v never encodes to 0.
    const __m256 positive = _mm256_cmp_ps(si, _mm256_setzero_ps(), _CMP_GT_OQ);
    store_codes8(_mm256_max_epi32(
                     code, _mm256_and_si256(_mm256_castps_si256(positive), _mm256_set1_epi32(1))),
                 vc + i);
  }
  encode_v_scalar(root, inv, i, n, vc);
}

// ---- bf16 -----------------------------------------------------------------------------------

TIERFLOW_AVX2 void decode_bf16_avx2(const std::uint16_t* src, std::size_t n, float* out) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(out + i,
                     _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
  }
  for (; i < n; ++i) {
    out[i] = bf16_to_float(src[i]);
  }
}

bool simd(adam_kernel kernel) noexcept {
  return kernel != adam_kernel::scalar;
}

// ---- fused steps: decode, update and encode in one pass over the moments ------------------
// The same operations as decode_block, adam_update and encode_block in turn (so the same
// bytes), with the update's sqrt(v) kept for v's code instead of taken again.

float grad_at(const void* grad, param_dtype dtype, std::size_t i) noexcept {
  float out = 0.0f;
  load_as_f32(static_cast<const unsigned char*>(grad) + i * dtype_bytes(dtype), dtype, &out, 1);
  return out;
}

TIERFLOW_AVX2 void step_int8_avx2(float* p, const state_arrays& st, std::size_t offset,
                                  const void* grad, param_dtype dtype, std::size_t n,
                                  const adam_scalars& s) noexcept {
  const avx2_scalars c = broadcast_avx2(s);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  alignas(64) float m_new[state_block];
  alignas(64) float root[state_block];
  for (std::size_t done = 0; done < n; done += state_block) {
    const std::size_t count = std::min(state_block, n - done);
    const std::size_t b = (offset + done) / state_block;
    std::uint8_t* mc = codes(st.m, offset + done);
    std::uint8_t* vc = codes(st.v, offset + done);
    float* pb = p + done;
    const void* gb = static_cast<const unsigned char*>(grad) + done * dtype_bytes(dtype);
    const __m256 m_scale = _mm256_set1_ps(st.m_scale[b]);
    const __m256 v_scale = _mm256_set1_ps(st.v_scale[b]);
    __m256 m_max = _mm256_setzero_ps();
    __m256 v_max = _mm256_setzero_ps();
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
      const __m256i mcode = load_codes8(mc + i);
      const __m256 magnitude = _mm256_mul_ps(
          magnitude_values8<3>(_mm256_and_si256(mcode, _mm256_set1_epi32(0x7f))), m_scale);
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(mcode, _mm256_set1_epi32(0x80)), 24);
      __m256 mi = _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
      const __m256 si = _mm256_mul_ps(magnitude_values8<4>(load_codes8(vc + i)), v_scale);
      __m256 vi = _mm256_mul_ps(si, si);
      __m256 pi = _mm256_loadu_ps(pb + i);
      const __m256 r = adam_step8(c, load8(gb, dtype, i), pi, mi, vi);
      _mm256_storeu_ps(pb + i, pi);
      _mm256_store_ps(m_new + i, mi);
      _mm256_store_ps(root + i, r);
      m_max = _mm256_max_ps(m_max, _mm256_and_ps(mi, abs_mask));
      v_max = _mm256_max_ps(v_max, r);
    }
    float m_largest = lanes_max(m_max, 0.0f);
    float v_largest = lanes_max(v_max, 0.0f);
    for (; i < count; ++i) {  // the tail, as the scalar kernel steps it
      float mi = decode_m8(mc[i]) * st.m_scale[b];
      const float si = decode_v8(vc[i]) * st.v_scale[b];
      float vi = si * si;
      adam_reference(pb[i], mi, vi, grad_at(gb, dtype, i), s);
      m_new[i] = mi;
      root[i] = std::sqrt(vi);
      m_largest = std::max(m_largest, std::fabs(mi));
      v_largest = std::max(v_largest, root[i]);
    }
    const block_scale ms = scale_for(m_largest, m_top);
    const block_scale vs = scale_for(v_largest, v_top);
    st.m_scale[b] = ms.scale;
    st.v_scale[b] = vs.scale;
    encode_m_avx2(m_new, ms.inv, count, mc);
    encode_v_avx2(root, vs.inv, count, vc);
  }
}

TIERFLOW_AVX2 void step_bf16_avx2(float* p, const state_arrays& st, std::size_t offset,
                                  const void* grad, param_dtype dtype, std::size_t n,
                                  const adam_scalars& s) noexcept {
  const avx2_scalars c = broadcast_avx2(s);
  std::uint16_t* m16 = halves(st.m, offset);
  std::uint16_t* v16 = halves(st.v, offset);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi = load8(m16, param_dtype::bf16, i);
    __m256 vi = load8(v16, param_dtype::bf16, i);
    __m256 pi = _mm256_loadu_ps(p + i);
    (void)adam_step8(c, load8(grad, dtype, i), pi, mi, vi);
    _mm256_storeu_ps(p + i, pi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(m16 + i), to_bf16_8(mi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(v16 + i), to_bf16_8(vi));
  }
  for (; i < n; ++i) {
    float mi = bf16_to_float(m16[i]);
    float vi = bf16_to_float(v16[i]);
    adam_reference(p[i], mi, vi, grad_at(grad, dtype, i), s);
    m16[i] = float_to_bf16(mi);
    v16[i] = float_to_bf16(vi);
  }
}

// ---- one block (at most state_block elements, from a block start for int8) ------------------

void decode_block(adam_kernel kernel, const state_arrays& st, std::size_t offset, std::size_t n,
                  float* m, float* v) noexcept {
  if (st.dtype == adam_state_dtype::bf16) {
    if (simd(kernel)) {
      decode_bf16_avx2(halves(st.m, offset), n, m);
      decode_bf16_avx2(halves(st.v, offset), n, v);
    } else {
      load_as_f32(halves(st.m, offset), param_dtype::bf16, m, n);
      load_as_f32(halves(st.v, offset), param_dtype::bf16, v, n);
    }
    return;
  }
  const std::size_t b = offset / state_block;
  if (simd(kernel)) {
    decode_int8_avx2(codes(st.m, offset), codes(st.v, offset), st.m_scale[b], st.v_scale[b], n, m,
                     v);
  } else {
    decode_int8_scalar(codes(st.m, offset), codes(st.v, offset), st.m_scale[b], st.v_scale[b], 0, n,
                       m, v);
  }
}

// Encodes a block's m and v (either may be null: left as stored); for int8 it overwrites @p v
// with sqrt(v).
void encode_block(adam_kernel kernel, const state_arrays& st, std::size_t offset, std::size_t n,
                  const float* m, float* v) noexcept {
  if (st.dtype == adam_state_dtype::bf16) {
    if (m != nullptr) {
      store_params(kernel, m, halves(st.m, offset), param_dtype::bf16, n);
    }
    if (v != nullptr) {
      store_params(kernel, v, halves(st.v, offset), param_dtype::bf16, n);
    }
    return;
  }
  const std::size_t b = offset / state_block;
  if (m != nullptr) {
    const block_scale ms =
        scale_for(simd(kernel) ? m_max_avx2(m, n) : m_max_scalar(m, 0, n, 0.0f), m_top);
    st.m_scale[b] = ms.scale;
    if (simd(kernel)) {
      encode_m_avx2(m, ms.inv, n, codes(st.m, offset));
    } else {
      encode_m_scalar(m, ms.inv, 0, n, codes(st.m, offset));
    }
  }
  if (v != nullptr) {
    const block_scale vs =
        scale_for(simd(kernel) ? root_max_avx2(v, n) : root_max_scalar(v, 0, n, 0.0f), v_top);
    st.v_scale[b] = vs.scale;
    if (simd(kernel)) {
      encode_v_avx2(v, vs.inv, n, codes(st.v, offset));
    } else {
      encode_v_scalar(v, vs.inv, 0, n, codes(st.v, offset));
    }
  }
}

}  // namespace

std::uint8_t encode_m8(float m_scaled) noexcept {
  const std::uint32_t magnitude = magnitude_code<3>(std::fabs(m_scaled));
  return static_cast<std::uint8_t>(magnitude | (m_scaled < 0.0f ? 0x80u : 0u));
}

std::uint8_t encode_v8(float sqrt_v_scaled) noexcept {
  const std::uint32_t code = magnitude_code<4>(sqrt_v_scaled);
  return static_cast<std::uint8_t>(sqrt_v_scaled > 0.0f ? std::max(code, 1u) : code);
}

float decode_m8(std::uint8_t code) noexcept {
  const float magnitude = magnitude_value<3>(code & 0x7fu);
  return (code & 0x80u) != 0 ? -magnitude : magnitude;
}

float decode_v8(std::uint8_t code) noexcept {
  return magnitude_value<4>(code);
}

std::size_t moment_bytes(adam_state_dtype dtype, std::size_t elements) noexcept {
  switch (dtype) {
    case adam_state_dtype::f32:
      return elements * sizeof(float);
    case adam_state_dtype::bf16:
      return elements * sizeof(std::uint16_t);
    case adam_state_dtype::int8:
      return elements;
  }
  return 0;
}

std::size_t scale_count(adam_state_dtype dtype, std::size_t elements) noexcept {
  return dtype == adam_state_dtype::int8 ? (elements + state_block - 1) / state_block : 0;
}

std::size_t packed_moments_bytes(adam_state_dtype dtype, std::size_t elements) noexcept {
  return 2 * (moment_bytes(dtype, elements) + scale_count(dtype, elements) * sizeof(float));
}

state_piece_list state_pieces(const state_arrays& st, std::size_t elements, std::size_t offset,
                              std::size_t n) noexcept {
  const std::size_t values = moment_bytes(st.dtype, elements);
  const std::size_t first = moment_bytes(st.dtype, offset);
  const std::size_t bytes = moment_bytes(st.dtype, n);
  state_piece_list list;
  auto& out = list.items;
  out[0] = {static_cast<unsigned char*>(st.m) + first, first, bytes};
  out[1] = {static_cast<unsigned char*>(st.v) + first, values + first, bytes};
  list.count = 2;
  if (st.dtype == adam_state_dtype::int8) {
    const std::size_t scales = scale_count(st.dtype, elements) * sizeof(float);
    const std::size_t b = offset / state_block;
    const std::size_t count = scale_count(st.dtype, n) * sizeof(float);
    out[2] = {reinterpret_cast<unsigned char*>(st.m_scale + b), 2 * values + b * sizeof(float),
              count};
    out[3] = {reinterpret_cast<unsigned char*>(st.v_scale + b),
              2 * values + scales + b * sizeof(float), count};
    list.count = 4;
  }
  return list;
}

void adam_update_state(adam_kernel kernel, float* p, const state_arrays& st, std::size_t offset,
                       const void* grad, param_dtype dtype, std::size_t n,
                       const adam_scalars& s) noexcept {
  if (st.dtype == adam_state_dtype::f32) {
    adam_update(kernel, p, static_cast<float*>(st.m) + offset, static_cast<float*>(st.v) + offset,
                grad, dtype, n, s);
    return;
  }
  if (simd(kernel)) {  // AVX2 (AVX-512 machines too): one pass, the same bytes as below
    if (st.dtype == adam_state_dtype::int8) {
      step_int8_avx2(p, st, offset, grad, dtype, n, s);
    } else {
      step_bf16_avx2(p, st, offset, grad, dtype, n, s);
    }
    return;
  }
  alignas(64) float m[state_block];
  alignas(64) float v[state_block];
  const std::size_t eb = dtype_bytes(dtype);
  for (std::size_t done = 0; done < n; done += state_block) {
    const std::size_t count = std::min(state_block, n - done);
    decode_block(kernel, st, offset + done, count, m, v);
    adam_update(kernel, p + done, m, v, static_cast<const unsigned char*>(grad) + done * eb, dtype,
                count, s);
    encode_block(kernel, st, offset + done, count, m, v);
  }
}

void decode_moments(const state_arrays& st, std::size_t offset, std::size_t n, float* m,
                    float* v) noexcept {
  if (st.dtype == adam_state_dtype::f32) {
    std::memcpy(m, static_cast<const float*>(st.m) + offset, n * sizeof(float));
    std::memcpy(v, static_cast<const float*>(st.v) + offset, n * sizeof(float));
    return;
  }
  for (std::size_t done = 0; done < n; done += state_block) {
    decode_block(adam_kernel::scalar, st, offset + done, std::min(state_block, n - done), m + done,
                 v + done);
  }
}

void encode_moments(adam_kernel kernel, const state_arrays& st, std::size_t offset, std::size_t n,
                    const float* m, const float* v) noexcept {
  if (st.dtype == adam_state_dtype::f32) {
    if (m != nullptr) {
      std::memcpy(static_cast<float*>(st.m) + offset, m, n * sizeof(float));
    }
    if (v != nullptr) {
      std::memcpy(static_cast<float*>(st.v) + offset, v, n * sizeof(float));
    }
    return;
  }
  alignas(64) float v_block[state_block];
  for (std::size_t done = 0; done < n; done += state_block) {
    const std::size_t count = std::min(state_block, n - done);
    if (v != nullptr) {
      std::memcpy(v_block, v + done, count * sizeof(float));
    }
    encode_block(kernel, st, offset + done, count, m == nullptr ? nullptr : m + done,
                 v == nullptr ? nullptr : v_block);
  }
}

}  // namespace tierflow::detail
