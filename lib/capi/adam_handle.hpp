#pragma once
// The C optimizer handle (private to lib/capi): made alone (tf_adam_create: its own topology and
// placement) or in a session (tf_session_adam_create: the session's, which owns the optimizer).
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "core/call_gate.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/session.hpp"
#include "tierflow/tierflow.h"
#include "tierflow/topology.hpp"

struct tf_adam {
  // Declared first, so destroyed last: the optimizer and its placement go before the device,
  // whether or not tf_device_destroy came first; a session's optimizer goes before the session
  // (the destructor drops it), which the handle keeps alive.
  std::shared_ptr<tierflow::device> dev;
  std::shared_ptr<tierflow::session> session;
  std::unique_ptr<tierflow::topology> own_topo;
  std::unique_ptr<tierflow::placement_policy> own_placement;
  std::unique_ptr<tierflow::offload_adam> owned;
  tierflow::offload_adam* opt = nullptr;                   // owned, or the session's
  const tierflow::topology* topo = nullptr;                // own_topo, or the session's
  std::vector<std::pair<std::size_t, std::size_t>> where;  // per param given: group, index
  std::vector<std::vector<std::size_t>> elements;          // per group, per param
  std::vector<int> group_state_dtype;                      // per group, as given (-1: options')
  // One C call at a time (tf_adam_grad_ready shared): calls made of several C++ calls
  // (tf_adam_step_on, tf_adam_get_state) are refused whole, before the first changes anything.
  mutable tierflow::detail::call_gate gate;

  tf_adam() = default;
  tf_adam(const tf_adam&) = delete;
  tf_adam& operator=(const tf_adam&) = delete;
  ~tf_adam() {
    if (session != nullptr && opt != nullptr) {
      session->drop_optimizer(*opt);
    }
  }
};

namespace tierflow::capi {

// The C++ groups of tf_adam_create's arguments (checked); fills @p a's where and elements.
// @p weights (may be null): per param, the session weight it names or TF_NO_WEIGHT.
std::vector<adam_group> adam_groups(const tf_adam_param* params, std::size_t count,
                                    const std::size_t* weights, const tf_adam_hyper* hypers,
                                    std::size_t groups, tf_adam& a);
// The C++ options of @p options (NULL: the defaults). @throws tierflow::error
adam_options adam_options_of(const tf_adam_options* options);

}  // namespace tierflow::capi
