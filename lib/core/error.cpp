#include "tierflow/error.hpp"

#include <string>
#include <utility>

namespace tierflow {
namespace {

// Long or multi-line offending text would break the one-line error contract: show the start
// of it, with control characters made visible.
std::string printable_excerpt(const std::string& text) {
  constexpr std::size_t max_chars = 80;
  std::string out;
  for (char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_input_error(const std::string& source, const std::string& problem,
                               const std::string& excerpt) {
  std::string message = source + ": " + problem;
  if (!excerpt.empty()) {
    message += ": '" + excerpt + "'";
  }
  return message;
}

}  // namespace

input_error::input_error(std::string source, std::string problem, std::string offending_text)
    : error(format_input_error(source, problem, printable_excerpt(offending_text))),
      source_(std::move(source)),
      problem_(std::move(problem)),
      offending_text_(printable_excerpt(offending_text)) {}

namespace detail {
void throw_expects_failure(const char* condition, const std::string& message, const char* file,
                           int line) {
  throw error(std::string(file) + ":" + std::to_string(line) + ": expected " + condition + ": " +
              message);
}
}  // namespace detail

}  // namespace tierflow
