#pragma once
// The checks every strict JSON input of the CLI shares (`tune --plan` files, `plan --spec`
// files): one error shape, the file, then where in it, then what is wrong and the value.

#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tierflow/error.hpp"

namespace tierflow::cli {

class json_checker {
 public:
  using json = nlohmann::json;

  explicit json_checker(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& where, const std::string& problem,
                         const json* value = nullptr) const {
    std::string text;
    if (value != nullptr) {
      text = value->dump(-1, ' ', true, json::error_handler_t::replace);
    }
    throw input_error(source_, where.empty() ? problem : where + ": " + problem, text);
  }

  // @p text as a JSON object (a clear error where it is not JSON, or not an object: @p shape
  // says what it should be).
  json parse_object(std::string_view text, const std::string& shape) const {
    json doc;
    try {
      doc = json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
      fail("", "not valid JSON at byte " + std::to_string(e.byte));
    } catch (const json::exception&) {  // out_of_range: a number beyond double
      fail("", "not valid JSON: a number out of range");
    }
    if (!doc.is_object()) {
      fail("", shape);
    }
    return doc;
  }

  // The object at @p where has only keys out of @p allowed.
  void only_keys(const json& object, const std::string& where,
                 std::initializer_list<const char*> allowed) const {
    for (const auto& [key, value] : object.items()) {
      bool known = false;
      for (const char* a : allowed) {
        known = known || key == a;
      }
      if (!known) {
        fail(where, "unknown key \"" + key + "\"");
      }
    }
  }

  const json& member(const json& object, const std::string& where, const char* key) const {
    const auto it = object.find(key);
    if (it == object.end()) {
      fail(where, std::string("missing key \"") + key + "\"");
    }
    return *it;
  }

 private:
  const std::string& source_;
};

}  // namespace tierflow::cli
