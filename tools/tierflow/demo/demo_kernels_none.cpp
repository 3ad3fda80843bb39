// Built without CUDA: the demo's kernels do not exist (a CUDA device cannot be opened either).
#include "demo/demo_kernels.hpp"

namespace tierflow::cli::demo_cuda {

namespace {
constexpr int not_built = 1;
}  // namespace

bool available() noexcept {
  return false;
}
const char* error_string(int) noexcept {
  return "tierflow was built without CUDA";
}
int device_index(const char*, int*) {
  return not_built;
}
int set_device(int) {
  return not_built;
}
int forward(void*, const float*, const float*, float*, std::size_t, std::size_t, bool) {
  return not_built;
}
int loss(void*, const float*, const float*, float*, std::size_t, float, double*) {
  return not_built;
}
int backward(void*, float*, const float*, const float*, const float*, float*, float*, std::size_t,
             std::size_t) {
  return not_built;
}
int zero(void*, float*, std::size_t) {
  return not_built;
}

}  // namespace tierflow::cli::demo_cuda
