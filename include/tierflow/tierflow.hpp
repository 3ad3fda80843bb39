#pragma once
/** @file
 * @brief Everything public in tierflow, in layer order.
 */

#include "tierflow/build_config.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/topology.hpp"
