#pragma once
// `tierflow bench --html`: one self-contained page (inline SVG and CSS, no script, no network)
// drawn from the report run_bench() returns.

#include <string>

#include <nlohmann/json.hpp>

namespace tierflow::cli {

/**
 * @brief Renders @p report (the JSON of run_bench()) as an HTML page: a heat map per
 *  bandwidth matrix, latency bars, link bandwidth against chunk size, measured values next to
 *  the firmware's (HMAT) with their ratio, every testcase, and the waived ones with reasons.
 */
std::string render_bench_html(const nlohmann::ordered_json& report);

}  // namespace tierflow::cli
