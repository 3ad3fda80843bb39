#pragma once
// How offload_adam picks its mode (private to lib/optim): the one asked for, else cpu mode for
// a param in host memory, else the faster by the measured link and host memory rates.
#include "optim/adam_core.hpp"

namespace tierflow::detail {

/** Sets @p core.mode (never `automatic`) and @p core.mode_reason; needs its chunks. */
void choose_mode(adam_core& core);

}  // namespace tierflow::detail
