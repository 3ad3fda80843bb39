// The C ABI's build facts: what a wheel or a package was built with, for its users to ask.
#include <cstdio>

#include "platform/cuda_probe.hpp"
#include "tierflow/build_config.hpp"
#include "tierflow/tierflow.h"

namespace {

// The JSON text, written once into a fixed buffer (no allocation: nothing can throw).
class build_info_text {
 public:
  build_info_text() noexcept {
    const int cuda = tierflow::detail::platform::cuda_runtime_version_built();
    char runtime[32] = "null";
    if (cuda > 0) {
      std::snprintf(runtime, sizeof runtime, "\"%d.%d\"", cuda / 1000, cuda % 1000 / 10);
    }
    std::snprintf(text_, sizeof text_, R"({"version":"%s","cuda":%s,"cuda_runtime":%s})",
                  TIERFLOW_VERSION_STRING, cuda > 0 ? "true" : "false", runtime);
  }
  const char* c_str() const noexcept { return text_; }

 private:
  char text_[128] = {};
};

}  // namespace

extern "C" const char* tf_build_info_json(void) {
  static const build_info_text text;
  return text.c_str();
}
