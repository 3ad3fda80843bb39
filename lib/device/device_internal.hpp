#pragma once
// Between the device front door (open_device) and the backends.

#include <memory>
#include <string>

#include "tierflow/device.hpp"

namespace tierflow::detail {

/** Opens CUDA device @p index, or returns null with the reason in @p why (no driver, no
 *  device, built without CUDA). Throws only for a failure after the device was found. */
std::unique_ptr<device> open_cuda_device(int index, std::string& why);

/** The cudaStream_t behind @p s, or null when @p s is not a CUDA stream. */
void* cuda_stream_handle(stream& s) noexcept;

}  // namespace tierflow::detail
