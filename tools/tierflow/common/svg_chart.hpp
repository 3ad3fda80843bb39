#pragma once
// Line charts as inline SVG for the HTML reports of `tierflow bench` and `tierflow tune`: no
// script, no external file.

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tierflow::cli {

/** @brief One line: a legend label and its (x, y) points (sorted by x when drawn). */
struct chart_series {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

/** @brief How the axes are drawn. */
struct chart_axes {
  std::string x_label;
  std::string y_label;
  bool log_x = false;                         ///< log2 scale (x > 0)
  std::function<std::string(double)> x_tick;  ///< label of an x value; default: 3 digits
  std::string aria_label;                     ///< what a screen reader says of the chart
};

/** @brief An SVG line chart of @p series, y from 0 to 10 % above the largest value; a tick on
 *  every x that a point has; a tooltip on each point. Labels are HTML-escaped. */
std::string svg_line_chart(std::vector<chart_series> series, const chart_axes& axes);

/** @brief @p text with &, <, >, " and ' escaped for HTML. */
std::string html_escape(const std::string& text);

/** @brief @p v to @p digits significant digits, or "-" when not finite. */
std::string short_number(double v, int digits = 3);

}  // namespace tierflow::cli
