#pragma once
/** @file
 * @brief Everything public in tierflow, in layer order.
 */

#include "tierflow/build_config.hpp"
#include "tierflow/device.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/exporters.hpp"
#include "tierflow/limit_resource.hpp"
#include "tierflow/log.hpp"
#include "tierflow/memory_resource.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/offload_adam.hpp"
#include "tierflow/pinned_resource.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/pool_resource.hpp"
#include "tierflow/prefetch_scheduler.hpp"
#include "tierflow/schedule_model.hpp"
#include "tierflow/session.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/statistics_resource.hpp"
#include "tierflow/topology.hpp"
#include "tierflow/transfer_engine.hpp"
#include "tierflow/where.hpp"
