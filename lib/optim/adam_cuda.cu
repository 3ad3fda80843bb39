// The fused AdamW update and the grads' sum of squares on the GPU. The update performs the
// scalar reference's operations in its order with explicitly rounded intrinsics (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn: nvcc may not fuse or approximate them), so it gives the
// CPU kernels' bits.
#include <cstdint>

#include <cuda_runtime.h>

#include "optim/adam_cuda.hpp"

namespace tierflow::detail::cuda_adam {

namespace {

__device__ float f16_bits_to_float(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16;
  const unsigned exponent = (h >> 10) & 0x1fu;
  const unsigned mantissa = h & 0x3ffu;
  if (exponent == 0) {
    return __uint_as_float(
        sign | __float_as_uint(__fmul_rn(static_cast<float>(mantissa), 5.9604644775390625e-8f)));
  }
  if (exponent == 31) {
    return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  }
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

__device__ unsigned short float_to_f16_bits(float value) {
  unsigned bits = __float_as_uint(value);
  const unsigned sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) {
    return static_cast<unsigned short>(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
  }
  if (bits >= 0x477ff000u) {
    return static_cast<unsigned short>(sign | 0x7c00u);
  }
  if (bits < 0x38800000u) {
    const float shifted = __fadd_rn(__uint_as_float(bits), 0.5f);
    return static_cast<unsigned short>(sign | (__float_as_uint(shifted) - 0x3f000000u));
  }
  const unsigned odd = (bits >> 13) & 1u;
  bits += 0xc8000fffu + odd;
  return static_cast<unsigned short>(sign | (bits >> 13));
}

__device__ unsigned short float_to_bf16_bits(float value) {
  const unsigned bits = __float_as_uint(value);
  if (value != value) {
    return static_cast<unsigned short>((bits >> 16) | 0x40u);
  }
  return static_cast<unsigned short>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ float load(const void* src, int dtype, std::size_t i) {
  if (dtype == 0) {
    return static_cast<const float*>(src)[i];
  }
  const unsigned raw = static_cast<const unsigned short*>(src)[i];
  return dtype == 1 ? __uint_as_float(raw << 16) : f16_bits_to_float(raw);
}

__device__ void store(float value, void* dst, int dtype, std::size_t i) {
  if (dtype == 0) {
    static_cast<float*>(dst)[i] = value;
  } else {
    static_cast<unsigned short*>(dst)[i] =
        dtype == 1 ? float_to_bf16_bits(value) : float_to_f16_bits(value);
  }
}

// One element's AdamW step: the scalar reference's operations in its order.
__device__ void step_one(float& p, float& m, float& v, float grad, const adam_scalars& s) {
  float g = __fmul_rn(grad, s.grad_scale);
  g = __fadd_rn(g, __fmul_rn(s.l2, p));
  p = __fmul_rn(p, s.decay);
  m = __fadd_rn(__fmul_rn(m, s.beta1), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
}

__global__ void update_kernel(float* master, float* m, float* v, const void* grad, void* param,
                              int dtype, std::size_t n, adam_scalars s) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float p = master[i];
    float mi = m[i];
    float vi = v[i];
    step_one(p, mi, vi, load(grad, dtype, i), s);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    store(p, param, dtype, i);
  }
}

// bf16 moments: widened, stepped, rounded to nearest even (as the cpu step stores them).
__global__ void update_bf16_kernel(float* master, unsigned short* m, unsigned short* v,
                                   const void* grad, void* param, int dtype, std::size_t n,
                                   adam_scalars s) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float p = master[i];
    float mi = __uint_as_float(static_cast<unsigned>(m[i]) << 16);
    float vi = __uint_as_float(static_cast<unsigned>(v[i]) << 16);
    step_one(p, mi, vi, load(grad, dtype, i), s);
    m[i] = float_to_bf16_bits(mi);
    v[i] = float_to_bf16_bits(vi);
    master[i] = p;
    store(p, param, dtype, i);
  }
}

// ---- int8 moments: the codes of tierflow/detail/adam_state.hpp (lib/optim/adam_state.cpp) ----

constexpr int state_block = 256;  // elements per scale; one thread block steps one
constexpr float m_top = 1.875f;
constexpr float v_top = 1.9375f;
constexpr float normal_floor = 0x1p-14f;
constexpr unsigned rebias = 112u << 23;

template <int K>
__device__ float magnitude_value(unsigned code) {
  if (code < (1u << K)) {
    return __fmul_rn(static_cast<float>(code), K == 3 ? 0x1p-17f : 0x1p-18f);
  }
  return __uint_as_float((code << (23 - K)) + rebias);
}

// Nearest code (ties to the even code), at most the top one.
template <int K>
__device__ unsigned magnitude_code(float y) {
  unsigned code = 0;
  if (y < normal_floor) {
    code = static_cast<unsigned>(__float2int_rn(__fmul_rn(y, K == 3 ? 0x1p17f : 0x1p18f)));
  } else {
    constexpr int shift = 23 - K;
    const unsigned b = __float_as_uint(y) - rebias;
    code = (b + ((1u << (shift - 1)) - 1u) + ((b >> shift) & 1u)) >> shift;
  }
  return min(code, (16u << K) - 1u);
}

// The block's largest value among its threads' @p x (every thread of the block calls it).
__device__ float block_max(float x, float* room) {
  room[threadIdx.x] = x;
  __syncthreads();
  for (int width = state_block / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      room[threadIdx.x] = fmaxf(room[threadIdx.x], room[threadIdx.x + width]);
    }
    __syncthreads();
  }
  const float max = room[0];
  __syncthreads();
  return max;
}

__global__ void update_int8_kernel(float* master, unsigned char* m, unsigned char* v,
                                   float* m_scale, float* v_scale, const void* grad, void* param,
                                   int dtype, std::size_t n, adam_scalars s) {
  __shared__ float room[state_block];
  const std::size_t blocks = (n + state_block - 1) / state_block;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t i = b * state_block + threadIdx.x;
    const bool here = i < n;
    float mi = 0.0f;
    float root = 0.0f;
    if (here) {
      const unsigned mc = m[i];
      const float magnitude = magnitude_value<3>(mc & 0x7fu);
      mi = __fmul_rn((mc & 0x80u) != 0 ? -magnitude : magnitude, m_scale[b]);
      const float sv = __fmul_rn(magnitude_value<4>(v[i]), v_scale[b]);
      float vi = __fmul_rn(sv, sv);
      float p = master[i];
      step_one(p, mi, vi, load(grad, dtype, i), s);
      master[i] = p;
      store(p, param, dtype, i);
      root = __fsqrt_rn(vi);
    }
    // Every scale is read above before any is written below.
    const float m_max = block_max(here ? fabsf(mi) : 0.0f, room);
    const float v_max = block_max(root, room);
    const float m_inv = m_max > 0.0f ? __fdiv_rn(m_top, m_max) : 0.0f;
    const float v_inv = v_max > 0.0f ? __fdiv_rn(v_top, v_max) : 0.0f;
    if (threadIdx.x == 0) {
      m_scale[b] = m_max > 0.0f ? __fdiv_rn(m_max, m_top) : 0.0f;
      v_scale[b] = v_max > 0.0f ? __fdiv_rn(v_max, v_top) : 0.0f;
    }
    if (here) {
      const float ym = __fmul_rn(mi, m_inv);
      m[i] = static_cast<unsigned char>(magnitude_code<3>(fabsf(ym)) | (ym < 0.0f ? 0x80u : 0u));
      const float yv = __fmul_rn(root, v_inv);
      const unsigned code = magnitude_code<4>(yv);
      v[i] = static_cast<unsigned char>(yv > 0.0f ? max(code, 1u) : code);
    }
  }
}

constexpr int sum_threads = 256;

// Block b sums elements b*T + t, stepping by blocks*T, then a fixed tree within the block.
__global__ void sum_squares_kernel(const void* grad, int dtype, std::size_t n, double* out) {
  __shared__ double partial[sum_threads];
  double acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double g = load(grad, dtype, i);
    acc = __dadd_rn(acc, __dmul_rn(g, g));
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = sum_threads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) {
      partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + width]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = partial[0];
  }
}

}  // namespace

int launch_update(void* stream, float* master, float* m, float* v, const void* grad, void* param,
                  int dtype, std::size_t n, const adam_scalars& s) {
  constexpr int threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  update_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(master, m, v, grad,
                                                                           param, dtype, n, s);
  return static_cast<int>(cudaGetLastError());
}

int launch_update_compressed(void* stream, float* master, int state_dtype, void* m, void* v,
                             float* m_scale, float* v_scale, const void* grad, void* param,
                             int dtype, std::size_t n, const adam_scalars& s) {
  auto* on = static_cast<cudaStream_t>(stream);
  if (state_dtype == 1) {
    constexpr int threads = 256;
    const std::size_t wanted = (n + threads - 1) / threads;
    const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
    update_bf16_kernel<<<blocks, threads, 0, on>>>(master, static_cast<unsigned short*>(m),
                                                   static_cast<unsigned short*>(v), grad, param,
                                                   dtype, n, s);
  } else if (state_dtype == 2) {
    const std::size_t wanted = (n + state_block - 1) / state_block;
    const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
    update_int8_kernel<<<blocks, state_block, 0, on>>>(master, static_cast<unsigned char*>(m),
                                                       static_cast<unsigned char*>(v), m_scale,
                                                       v_scale, grad, param, dtype, n, s);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_sum_squares(void* stream, const void* grad, int dtype, std::size_t n, double* out) {
  sum_squares_kernel<<<sum_blocks, sum_threads, 0, static_cast<cudaStream_t>(stream)>>>(grad, dtype,
                                                                                        n, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tierflow::detail::cuda_adam
