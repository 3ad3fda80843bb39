#pragma once
// `tierflow plan`'s report: the tables or the JSON document of a sized plan (plan_command.cpp;
// docs/cli/plan.md gives the keys).

#include <cstdio>
#include <string>

#include "plan/plan_model.hpp"
#include "plan/plan_spec.hpp"

namespace tierflow::cli::plan {

/** @brief Writes the report of @p r (sized from @p s) to @p out: tables, or JSON.
 *  @param machine the `--machine` report the node came from, or empty (the spec's) */
void print_plan(std::FILE* out, const plan_spec& s, const plan_result& r, bool as_json,
                const std::string& machine = {});

}  // namespace tierflow::cli::plan
