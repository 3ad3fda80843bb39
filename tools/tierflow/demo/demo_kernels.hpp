#pragma once
// Launchers of the demo's CUDA kernels (demo_kernels.cu; demo_kernels_none.cpp when tierflow is
// built without CUDA). Plain types only: nvcc compiles this. Each launcher enqueues its work on
// @p stream (a cudaStream_t, from tierflow::stream::native_handle()) on the current device and
// returns a cudaError_t (0: enqueued). Every kernel sums in a fixed order without atomics, so a
// run gives the same bits each time.
#include <cstddef>

namespace tierflow::cli::demo_cuda {

/** Whether these launchers are real (false in a build without CUDA). */
bool available() noexcept;

/** The message of an error code returned below. */
const char* error_string(int code) noexcept;

/** The CUDA index of the device at @p pci_bus_id, in @p index. */
int device_index(const char* pci_bus_id, int* index);

/** Makes device @p index current on the calling thread. */
int set_device(int index);

/** z[i][o] = sum_k h[i][k] w[o][k], then tanh in place when @p apply_tanh. */
int forward(void* stream, const float* h, const float* w, float* z, std::size_t batch,
            std::size_t width, bool apply_tanh);

/** dy = scale (y - t); *loss = sum (y - t)^2 / count (device memory). */
int loss(void* stream, const float* y, const float* target, float* dy, std::size_t count,
         float scale, double* loss);

/** dz *= 1 - h_out^2 when @p h_out is not null; dw = dz^T h_in; dh = dz w when @p dh is not
 *  null. */
int backward(void* stream, float* dz, const float* h_out, const float* h_in, const float* w,
             float* dw, float* dh, std::size_t batch, std::size_t width);

/** p[0 .. n) = 0. */
int zero(void* stream, float* p, std::size_t n);

}  // namespace tierflow::cli::demo_cuda
