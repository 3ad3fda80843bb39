// The demo's layer math on the GPU. Determinism: every sum runs in a fixed order (a warp's lanes
// over strided k, then a fixed shuffle tree; one block's threads, then a fixed shared-memory
// tree), no atomics, so the offloaded run and the --verify resident run give the same bits. The
// resident Adam uses explicitly rounded intrinsics (nvcc may not fuse them) in the host
// reference's order, so it matches offload_adam's CPU update bit for bit.
#include <cstddef>

#include <cuda_runtime.h>

#include "demo/demo_kernels.hpp"

namespace tierflow::cli::demo_cuda {

namespace {

constexpr int warp = 32;
constexpr int threads = 256;
constexpr int loss_threads = 1024;

unsigned blocks_for(std::size_t work, int per_block) {
  const std::size_t blocks = (work + static_cast<std::size_t>(per_block) - 1) / per_block;
  // Grid-stride loops cover the rest.
  return static_cast<unsigned>(blocks < 65535 * 16 ? (blocks == 0 ? 1 : blocks) : 65535 * 16);
}

// One warp per output unit o; for each sample i the lanes sum over k = lane, lane + 32, ... and
// a fixed shuffle tree combines them.
__global__ void forward_kernel(const float* h, const float* w, float* z, std::size_t batch,
                               std::size_t width, bool apply_tanh) {
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / warp);
  const unsigned lane = threadIdx.x % warp;
  for (std::size_t o =
           static_cast<std::size_t>(blockIdx.x) * (blockDim.x / warp) + threadIdx.x / warp;
       o < width; o += warps) {
    const float* wo = w + o * width;
    for (std::size_t i = 0; i < batch; ++i) {
      const float* hi = h + i * width;
      float acc = 0.0f;
      for (std::size_t k = lane; k < width; k += warp) {
        acc = __fadd_rn(acc, __fmul_rn(hi[k], wo[k]));
      }
      for (int offset = warp / 2; offset > 0; offset /= 2) {
        acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, offset));
      }
      if (lane == 0) {
        z[i * width + o] = apply_tanh ? tanhf(acc) : acc;
      }
    }
  }
}

// One block: each thread sums its strided elements in order, then a fixed tree.
__global__ void loss_kernel(const float* y, const float* target, float* dy, std::size_t count,
                            float scale, double* loss) {
  __shared__ double partial[loss_threads];
  double sum = 0;
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) {
    const float d = __fsub_rn(y[i], target[i]);
    sum += static_cast<double>(d) * d;
    dy[i] = __fmul_rn(scale, d);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) {
      partial[threadIdx.x] += partial[threadIdx.x + step];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = partial[0] / static_cast<double>(count);
  }
}

__global__ void tanh_grad_kernel(float* dz, const float* h_out, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float h = h_out[i];
    dz[i] = __fmul_rn(dz[i], __fsub_rn(1.0f, __fmul_rn(h, h)));
  }
}

// dw[o][k] = sum over i in order of dz[i][o] h[i][k]: one thread per (o, k).
__global__ void weight_grad_kernel(const float* dz, const float* h, float* dw, std::size_t batch,
                                   std::size_t width) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < width * width; idx += stride) {
    const std::size_t o = idx / width;
    const std::size_t k = idx % width;
    float acc = 0.0f;
    for (std::size_t i = 0; i < batch; ++i) {
      acc = __fadd_rn(acc, __fmul_rn(dz[i * width + o], h[i * width + k]));
    }
    dw[idx] = acc;
  }
}

// dh[i][k] = sum over o in order of dz[i][o] w[o][k]: one thread per (i, k).
__global__ void input_grad_kernel(const float* dz, const float* w, float* dh, std::size_t batch,
                                  std::size_t width) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < batch * width; idx += stride) {
    const std::size_t i = idx / width;
    const std::size_t k = idx % width;
    const float* dzi = dz + i * width;
    float acc = 0.0f;
    for (std::size_t o = 0; o < width; ++o) {
      acc = __fadd_rn(acc, __fmul_rn(dzi[o], w[o * width + k]));
    }
    dh[idx] = acc;
  }
}

int launched() {
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

bool available() noexcept {
  return true;
}

const char* error_string(int code) noexcept {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int device_index(const char* pci_bus_id, int* index) {
  return static_cast<int>(cudaDeviceGetByPCIBusId(index, pci_bus_id));
}

int set_device(int index) {
  return static_cast<int>(cudaSetDevice(index));
}

int forward(void* stream, const float* h, const float* w, float* z, std::size_t batch,
            std::size_t width, bool apply_tanh) {
  forward_kernel<<<blocks_for(width, threads / warp), threads, 0,
                   static_cast<cudaStream_t>(stream)>>>(h, w, z, batch, width, apply_tanh);
  return launched();
}

int loss(void* stream, const float* y, const float* target, float* dy, std::size_t count,
         float scale, double* loss) {
  loss_kernel<<<1, loss_threads, 0, static_cast<cudaStream_t>(stream)>>>(y, target, dy, count,
                                                                         scale, loss);
  return launched();
}

int backward(void* stream, float* dz, const float* h_out, const float* h_in, const float* w,
             float* dw, float* dh, std::size_t batch, std::size_t width) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (h_out != nullptr) {
    tanh_grad_kernel<<<blocks_for(batch * width, threads), threads, 0, s>>>(dz, h_out,
                                                                            batch * width);
  }
  weight_grad_kernel<<<blocks_for(width * width, threads), threads, 0, s>>>(dz, h_in, dw, batch,
                                                                            width);
  if (dh != nullptr) {
    input_grad_kernel<<<blocks_for(batch * width, threads), threads, 0, s>>>(dz, w, dh, batch,
                                                                             width);
  }
  return launched();
}

int zero(void* stream, float* p, std::size_t n) {
  return static_cast<int>(
      cudaMemsetAsync(p, 0, n * sizeof(float), static_cast<cudaStream_t>(stream)));
}

}  // namespace tierflow::cli::demo_cuda
