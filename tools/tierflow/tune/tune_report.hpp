#pragma once
// The report of `tierflow tune`: Pareto front, recommendation, then the table, the JSON and the
// page (--html).

#include "tune/tune_sweep.hpp"

namespace tierflow::cli::tune {

/**
 * @brief Marks the Pareto front of @p s, recommends a setting and prints the report.
 * @return the exit code
 * @throws input_error when no mode ran or no setting fits --hbm-budget; error when the page
 *         cannot be written
 */
int report_tune(const tune_options& t, tune_sweep& s);

}  // namespace tierflow::cli::tune
