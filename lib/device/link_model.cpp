#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tierflow/detail/parse.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/settings.hpp"

namespace tierflow {

namespace {

constexpr double min_link_gbps = 1e-3;
constexpr double max_link_gbps = 1e6;

// A decimal number followed by a unit from @p units (value = number x factor).
std::optional<double> number_with_unit(
    std::string_view text, std::initializer_list<std::pair<std::string_view, double>> units) {
  text = detail::trim(text);
  std::size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  if (digits == 0) {
    return std::nullopt;
  }
  const std::string number(text.substr(0, digits));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  const auto unit = detail::trim(text.substr(digits));
  for (const auto& [name, factor] : units) {
    if (unit == name) {
      return value * factor;
    }
  }
  return std::nullopt;
}

}  // namespace

link_model link_model::parse(std::string_view text, const std::string& origin) {
  const std::string whole(text);
  link_model link;
  if (detail::trim(text).empty()) {
    throw input_error(origin,
                      "empty link model, expected e.g. h2d=25GB/s,d2h=25GB/s,latency=10us,"
                      "duplex=full",
                      whole);
  }
  for (auto field : detail::split(text, ',')) {
    field = detail::trim(field);
    const auto equals = field.find('=');
    if (equals == std::string_view::npos) {
      throw input_error(origin, "expected KEY=VALUE (keys: h2d, d2h, latency, duplex)", whole);
    }
    const auto key = detail::trim(field.substr(0, equals));
    const auto value = detail::trim(field.substr(equals + 1));
    if (key == "h2d" || key == "d2h") {
      const auto gbps = number_with_unit(value, {{"GB/s", 1.0}, {"MB/s", 1e-3}});
      // Below 1 MB/s a 4 KiB copy takes seconds and a model's state days (a caller then seems
      // hung); above 1 PB/s it is a typo.
      if (!gbps || *gbps < min_link_gbps || *gbps > max_link_gbps) {
        throw input_error(origin,
                          std::string(key) +
                              ": expected a bandwidth from 1MB/s to 1000000GB/s such as 25GB/s "
                              "or 800MB/s, not '" +
                              std::string(value) + "'",
                          whole);
      }
      (key == "h2d" ? link.h2d_gbps : link.d2h_gbps) = *gbps;
    } else if (key == "latency") {
      const auto ns = number_with_unit(value, {{"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}});
      if (!ns || *ns > 60e9) {
        throw input_error(origin,
                          "latency: expected a duration such as 10us (ns, us, ms, s; at most "
                          "60s), not '" +
                              std::string(value) + "'",
                          whole);
      }
      link.latency = std::chrono::nanoseconds(static_cast<std::int64_t>(*ns));
    } else if (key == "duplex") {
      if (value != "full" && value != "half") {
        throw input_error(origin, "duplex: expected full or half, not '" + std::string(value) + "'",
                          whole);
      }
      link.full_duplex = value == "full";
    } else {
      throw input_error(origin,
                        "unknown key '" + std::string(key) + "' (keys: h2d, d2h, latency, duplex)",
                        whole);
    }
  }
  return link;
}

link_model link_model::from_environment() {
  const auto spec = settings::from_environment().get("emu_link");
  if (!spec) {
    return {};
  }
  return parse(spec->value, spec->origin);
}

std::string link_model::describe() const {
  char text[160];
  std::snprintf(text, sizeof text, "h2d %.3g GB/s, d2h %.3g GB/s, latency %.3g us, %s duplex",
                h2d_gbps, d2h_gbps, static_cast<double>(latency.count()) / 1e3,
                full_duplex ? "full" : "half");
  return text;
}

}  // namespace tierflow
