#pragma once
// Checking CUDA runtime calls: TIERFLOW_CUDA_TRY throws tierflow::cuda_error with the call,
// file:line and CUDA's error string; TIERFLOW_CUDA_LOG logs instead (for destructors).

#include <cuda_runtime_api.h>

namespace tierflow::detail {

[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line,
                                   cudaError_t status);
void log_cuda_error(const char* call, const char* file, int line, cudaError_t status) noexcept;

}  // namespace tierflow::detail

#define TIERFLOW_CUDA_TRY(call)                                                               \
  do {                                                                                        \
    const cudaError_t tierflow_cuda_status_ = (call);                                         \
    if (tierflow_cuda_status_ != cudaSuccess) {                                               \
      ::tierflow::detail::throw_cuda_error(#call, __FILE__, __LINE__, tierflow_cuda_status_); \
    }                                                                                         \
  } while (false)

#define TIERFLOW_CUDA_LOG(call)                                                             \
  do {                                                                                      \
    const cudaError_t tierflow_cuda_status_ = (call);                                       \
    if (tierflow_cuda_status_ != cudaSuccess) {                                             \
      ::tierflow::detail::log_cuda_error(#call, __FILE__, __LINE__, tierflow_cuda_status_); \
    }                                                                                       \
  } while (false)
