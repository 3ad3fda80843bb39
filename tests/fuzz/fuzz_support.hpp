#pragma once
// Shared by the libFuzzer targets: the input as text, and the rule every target checks:
// a parser may reject input only with tierflow::input_error; anything else is a bug.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "tierflow/error.hpp"

namespace tierflow::fuzz {

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/** Runs @p parse; input_error is a clean rejection, any other exception aborts (a finding). */
template <typename F>
void expect_clean(F&& parse) {
  try {
    parse();
  } catch (const input_error& e) {
    const std::string_view what = e.what();
    if (what.find('\n') != std::string_view::npos) {
      std::abort();  // errors are one line
    }
  }
}

}  // namespace tierflow::fuzz
