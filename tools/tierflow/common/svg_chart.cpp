// Inline-SVG line charts (see svg_chart.hpp).

#include "common/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <set>
#include <sstream>

namespace tierflow::cli {

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string short_number(double v, int digits) {
  if (!std::isfinite(v)) {
    return "-";
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.*g", digits, v);
  return text;
}

std::string svg_line_chart(std::vector<chart_series> series, const chart_axes& axes) {
  static const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c",
                                        "#9467bd", "#ff7f0e", "#8c564b"};
  const auto tick = axes.x_tick ? axes.x_tick : [](double x) { return short_number(x); };
  const auto xpos = [&](double x) { return axes.log_x ? std::log2(x) : x; };
  double xlo = INFINITY;
  double xhi = -INFINITY;
  double yhi = 0;
  std::set<double> ticks;
  for (auto& s : series) {
    std::sort(s.points.begin(), s.points.end());
    for (const auto& [x, y] : s.points) {
      xlo = std::min(xlo, xpos(x));
      xhi = std::max(xhi, xpos(x));
      yhi = std::max(yhi, y);
      ticks.insert(x);
    }
  }
  const int left = 70;
  const int top = 20;
  const int w = 560;
  const int h = 280;
  const auto px = [&](double x) {
    const double t = xhi > xlo ? (xpos(x) - xlo) / (xhi - xlo) : 0.5;
    return left + static_cast<int>(std::lround(t * w));
  };
  const auto py = [&](double y) {
    return top + h - (yhi > 0 ? static_cast<int>(std::lround(h * y / (yhi * 1.1))) : 0);
  };
  std::ostringstream o;
  o << "<svg class=\"chart\" width=\"" << left + w + 230 << "\" height=\"" << top + h + 50
    << "\" role=\"img\" aria-label=\"" << html_escape(axes.aria_label) << "\">\n<line x1=\"" << left
    << "\" y1=\"" << top + h << "\" x2=\"" << left + w << "\" y2=\"" << top + h
    << "\" stroke=\"#000\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left
    << "\" y2=\"" << top + h << "\" stroke=\"#000\"/>\n";
  for (const double x : ticks) {
    o << "<text x=\"" << px(x) << "\" y=\"" << top + h + 18 << "\" text-anchor=\"middle\">"
      << html_escape(tick(x)) << "</text>\n";
  }
  for (int k = 0; k <= 4; ++k) {
    const double y = yhi * 1.1 * k / 4;
    o << "<text x=\"" << left - 6 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">"
      << short_number(y) << "</text>\n<line x1=\"" << left << "\" x2=\"" << left + w << "\" y1=\""
      << py(y) << "\" y2=\"" << py(y) << "\" stroke=\"#ddd\"/>\n";
  }
  o << "<text x=\"" << left + w / 2 << "\" y=\"" << top + h + 40 << "\" text-anchor=\"middle\">"
    << html_escape(axes.x_label) << "</text>\n<text x=\"14\" y=\"" << top + h / 2
    << "\" transform=\"rotate(-90 14 " << top + h / 2 << ")\" text-anchor=\"middle\">"
    << html_escape(axes.y_label) << "</text>\n";
  int k = 0;
  for (const auto& s : series) {
    const char* color = palette[k % std::size(palette)];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (const auto& [x, y] : s.points) {
      o << px(x) << ',' << py(y) << ' ';
    }
    o << "\"/>\n";
    for (const auto& [x, y] : s.points) {
      o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"" << color
        << "\"><title>" << html_escape(s.label) << ", " << html_escape(tick(x)) << ": "
        << short_number(y, 4) << ' ' << html_escape(axes.y_label) << "</title></circle>\n";
    }
    o << "<text x=\"" << left + w + 14 << "\" y=\"" << top + 14 + 18 * k << "\" fill=\"" << color
      << "\">" << html_escape(s.label) << "</text>\n";
    ++k;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace tierflow::cli
