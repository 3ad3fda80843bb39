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

__global__ void update_kernel(float* master, float* m, float* v, const void* grad, void* param,
                              int dtype, std::size_t n, adam_scalars s) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float p = master[i];
    float g = __fmul_rn(load(grad, dtype, i), s.grad_scale);
    g = __fadd_rn(g, __fmul_rn(s.l2, p));
    p = __fmul_rn(p, s.decay);
    const float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(s.one_minus_beta1, g));
    const float vi =
        __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    store(p, param, dtype, i);
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

int launch_sum_squares(void* stream, const void* grad, int dtype, std::size_t n, double* out) {
  sum_squares_kernel<<<sum_blocks, sum_threads, 0, static_cast<cudaStream_t>(stream)>>>(grad, dtype,
                                                                                        n, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tierflow::detail::cuda_adam
