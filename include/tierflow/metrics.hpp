#pragma once
/** @file
 * @brief The metrics leaf: counters every layer writes to, and a JSON writer the exporters
 * use. Nothing here knows the layers above.
 */

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tierflow::metrics {

/** @brief Version of the JSON snapshot layout; bumped when a key changes meaning or goes. */
inline constexpr int snapshot_schema_version = 1;

/** @brief A reading of a usage_counter. */
struct usage {
  std::uint64_t current = 0;  ///< held now
  std::uint64_t peak = 0;     ///< most held at once
  std::uint64_t total = 0;    ///< sum of everything ever added
};

/**
 * @brief `{current, peak, total}` of something that is taken and given back (bytes, counts).
 * Lock-free and safe from any thread; a reading is consistent per field.
 */
class usage_counter {
 public:
  /** @brief Records @p amount taken. */
  void add(std::uint64_t amount) noexcept;
  /** @brief Records @p amount given back; more than is held (a caller's size mismatch) stops
   * the current reading at 0 instead of wrapping it. */
  void sub(std::uint64_t amount) noexcept;
  /** @brief The current reading. */
  [[nodiscard]] usage read() const noexcept;

 private:
  std::atomic<std::uint64_t> current_{0};
  std::atomic<std::uint64_t> peak_{0};
  std::atomic<std::uint64_t> total_{0};
};

/** @brief A reading of a link_counter. */
struct link_usage {
  std::uint64_t bytes = 0;      ///< moved in all
  std::uint64_t transfers = 0;  ///< transfers made
  double busy_seconds = 0.0;    ///< time the link spent moving them
  /** @brief bytes / busy time in GB/s (10^9 B/s); 0 when idle. */
  [[nodiscard]] double achieved_gbps() const noexcept {
    return busy_seconds > 0 ? static_cast<double>(bytes) / busy_seconds / 1e9 : 0.0;
  }
};

/** @brief Bytes, transfers and busy time of one link (h2d, d2h, ...). Thread-safe. */
class link_counter {
 public:
  /** @brief Records a finished transfer. */
  void add(std::uint64_t bytes, double busy_seconds) noexcept;
  [[nodiscard]] link_usage read() const noexcept;

 private:
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> transfers_{0};
  std::atomic<std::uint64_t> busy_ns_{0};
};

/**
 * @brief A small streaming JSON writer: objects, arrays, strings, numbers, booleans, null.
 * Misuse (a value where a key is due, unbalanced ends) throws tierflow::error.
 */
class json_writer {
 public:
  json_writer& begin_object();
  json_writer& end_object();
  json_writer& begin_array();
  json_writer& end_array();
  /** @brief The key of the next value inside an object. */
  json_writer& key(std::string_view name);
  json_writer& value(std::string_view text);
  json_writer& value(const char* text) { return value(std::string_view(text)); }
  json_writer& value(double number);
  json_writer& value(std::uint64_t number);
  json_writer& value(std::int64_t number);
  json_writer& value(int number) { return value(static_cast<std::int64_t>(number)); }
  json_writer& value(bool flag);
  json_writer& null();
  /** @brief Splices @p json, a complete JSON value written elsewhere. */
  json_writer& raw(std::string_view json);
  /** @brief The document; throws when objects or arrays are still open. */
  [[nodiscard]] std::string str() const;

 private:
  void before_value();
  json_writer& scalar(std::string_view text);
  std::string out_;
  // One entry per open container: true for an object. expecting_key_: next token is a key.
  std::vector<bool> stack_;
  std::vector<bool> has_items_;
  bool expecting_key_ = false;
  bool done_ = false;
};

/** @brief @p text as a JSON string literal, quotes included. */
[[nodiscard]] std::string json_quote(std::string_view text);

}  // namespace tierflow::metrics
