#pragma once
// The checks every strict JSON input of the CLI shares (`tune --plan` files, `plan --spec`
// files): one error shape, the file, then where in it, then what is wrong and the value.

#include <cstddef>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

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
  // says what it should be). A key given twice in one object is refused, naming it: the parser
  // alone keeps the last, so a second "capacity_gib" silently replaced the first.
  json parse_object(std::string_view text, const std::string& shape) const {
    json doc;
    duplicate_finder duplicates;
    try {
      doc = json::parse(text.begin(), text.end(),
                        [&duplicates](int, json::parse_event_t event, json& parsed) {
                          duplicates.see(event, parsed);
                          return true;
                        });
    } catch (const json::parse_error& e) {
      fail("", "not valid JSON at byte " + std::to_string(e.byte));
    } catch (const json::exception&) {  // out_of_range: a number beyond double
      fail("", "not valid JSON: a number out of range");
    }
    if (duplicates.found) {
      fail(duplicates.where, "key \"" + duplicates.key + "\" given twice");
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
  // Follows the parser's events: the keys of each open object, the index in each open array,
  // and the first key given twice with the object that holds it.
  struct duplicate_finder {
    struct level {
      bool is_object = false;
      std::set<std::string> keys;
      std::string key;        // the object's current key
      std::size_t index = 0;  // the array's current element
    };
    std::vector<level> open;
    std::string where;  // the object holding the first key given twice
    std::string key;    // that key
    bool found = false;

    // Where the object being parsed is: `cluster.tiers[0]` ("" for the document).
    std::string path() const {
      std::string text;
      for (std::size_t i = 0; i + 1 < open.size(); ++i) {
        if (open[i].is_object) {
          text += (text.empty() ? "" : ".") + open[i].key;
        } else {
          text += "[" + std::to_string(open[i].index) + "]";
        }
      }
      return text;
    }
    // A value, object or array done at the current level: an array moves to its next element.
    void element_done() {
      if (!open.empty() && !open.back().is_object) {
        ++open.back().index;
      }
    }
    void see(json::parse_event_t event, const json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
        case json::parse_event_t::array_start:
          open.push_back({event == json::parse_event_t::object_start, {}, {}, 0});
          break;
        case json::parse_event_t::key: {
          const std::string name = parsed.get<std::string>();
          if (!open.back().keys.insert(name).second && !found) {
            found = true;
            where = path();
            key = name;
          }
          open.back().key = name;
          break;
        }
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          open.pop_back();
          element_done();
          break;
        case json::parse_event_t::value:
          element_done();
          break;
      }
    }
  };

  const std::string& source_;
};

/** @brief Whether @p text holds a control character (below 0x20, or 0x7f): a newline or an
 *  escape sequence in a name would garble or forge the lines it is printed in. */
inline bool has_control_characters(std::string_view text) {
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return true;
    }
  }
  return false;
}

}  // namespace tierflow::cli
