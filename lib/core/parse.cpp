#include "tierflow/detail/parse.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

namespace tierflow::detail {

std::string_view trim(std::string_view text) noexcept {
  constexpr std::string_view blanks = " \t\r\n";
  const auto first = text.find_first_not_of(blanks);
  if (first == std::string_view::npos) {
    return {};
  }
  const auto last = text.find_last_not_of(blanks);
  return text.substr(first, last - first + 1);
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const auto end = text.find(separator, start);
    if (end == std::string_view::npos) {
      fields.push_back(text.substr(start));
      return fields;
    }
    fields.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

namespace {
template <typename T>
std::optional<T> parse_integer(std::string_view text) noexcept {
  text = trim(text);
  if (text.empty()) {
    return std::nullopt;
  }
  T value{};
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (ec != std::errc{} || ptr != end) {
    return std::nullopt;
  }
  return value;
}
}  // namespace

std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept {
  return parse_integer<std::uint64_t>(text);
}

std::optional<std::int64_t> parse_i64(std::string_view text) noexcept {
  return parse_integer<std::int64_t>(text);
}

std::optional<std::vector<int>> parse_id_list(std::string_view text, int max_id) {
  std::vector<int> ids;
  text = trim(text);
  if (text.empty()) {
    return ids;
  }
  for (auto field : split(text, ',')) {
    const auto dash = field.find('-');
    const auto first = parse_u64(field.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : parse_u64(field.substr(dash + 1));
    if (!first || !last || *first > *last || *last > static_cast<std::uint64_t>(max_id)) {
      return std::nullopt;
    }
    for (auto id = *first; id <= *last; ++id) {
      ids.push_back(static_cast<int>(id));
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::string format_id_list(const std::vector<int>& ids) {
  std::vector<int> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) {
      ++j;
    }
    if (!out.empty()) {
      out += ',';
    }
    out += std::to_string(sorted[i]);
    if (j > i) {
      out += '-' + std::to_string(sorted[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace tierflow::detail
