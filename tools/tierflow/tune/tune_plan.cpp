#include "tune/tune_plan.hpp"

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/json_checker.hpp"
#include "tierflow/detail/input_file.hpp"
#include "tierflow/error.hpp"

namespace tierflow::cli {

namespace {

using json = nlohmann::json;

// Every check of a plan throws through this: the file, then where in it, then what is wrong.
class plan_checker : public json_checker {
 public:
  using json_checker::json_checker;

  std::string name(const json& object, const std::string& where) const {
    const json& v = member(object, where, "name");
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
      fail(where + ".name", "must be a non-empty string", &v);
    }
    return v.get<std::string>();
  }
};

// The document: a JSON object of version 1 with only the known keys.
json parse_document(std::string_view text, const plan_checker& check) {
  const json doc =
      check.parse_object(text, "a plan is a JSON object with tierflow_plan, buffers and steps");
  check.only_keys(doc, "", {"tierflow_plan", "buffers", "steps"});
  const json& version = check.member(doc, "", "tierflow_plan");
  if (!version.is_number_integer() || version.get<std::int64_t>() != 1) {
    check.fail("tierflow_plan", "unsupported version (this tierflow reads 1)", &version);
  }
  return doc;
}

// doc[key]: a non-empty array of at most tune_plan_max_entries.
const json& entries(const json& doc, const char* key, const plan_checker& check) {
  const json& list = check.member(doc, "", key);
  if (!list.is_array() || list.empty()) {
    check.fail(key, "must be a non-empty array");
  }
  if (list.size() > tune_plan_max_entries) {
    check.fail(key, "more than " + std::to_string(tune_plan_max_entries));
  }
  return list;
}

buffer_desc parse_buffer(const json& b, const std::string& where, const plan_checker& check) {
  if (!b.is_object()) {
    check.fail(where, "must be an object");
  }
  check.only_keys(b, where, {"name", "bytes", "resident"});
  buffer_desc desc;
  desc.name = check.name(b, where);
  const json& bytes = check.member(b, where, "bytes");
  if (!bytes.is_number_integer() || bytes.get<std::int64_t>() <= 0 ||
      bytes.get<std::uint64_t>() > tune_plan_max_buffer_bytes) {
    check.fail(where + ".bytes", "must be an integer from 1 to 68719476736 (64 GiB)", &bytes);
  }
  desc.bytes = bytes.get<std::uint64_t>();
  if (const auto it = b.find("resident"); it != b.end()) {
    if (!it->is_boolean()) {
      check.fail(where + ".resident", "must be true or false", &*it);
    }
    desc.resident = it->get<bool>();
  }
  return desc;
}

// The buffers into @p out; returns their ids by name.
std::map<std::string, buffer_id> parse_buffers(const json& doc, const plan_checker& check,
                                               tune_plan& out) {
  const json& buffers = entries(doc, "buffers", check);
  std::map<std::string, buffer_id> ids;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string where = "buffers[" + std::to_string(i) + "]";
    buffer_desc desc = parse_buffer(buffers[i], where, check);
    out.total_bytes += desc.bytes;  // ≤ 100000 × 64 GiB: no overflow
    if (out.total_bytes > tune_plan_max_total_bytes) {
      check.fail("buffers", "more than 1 TiB in all");
    }
    if (!ids.emplace(desc.name, static_cast<buffer_id>(i)).second) {
      check.fail(where + ".name", "two buffers are named \"" + desc.name + "\"");
    }
    out.plan.add_buffer(std::move(desc));
  }
  return ids;
}

// A step's reads and writes: known buffers, none named twice in the step.
void parse_step_buffers(const json& s, const std::string& where,
                        const std::map<std::string, buffer_id>& ids, const plan_checker& check,
                        step_desc& step) {
  std::set<buffer_id> used;
  for (const char* key : {"reads", "writes"}) {
    const auto it = s.find(key);
    if (it == s.end()) {
      continue;
    }
    const std::string list_where = where + "." + key;
    if (!it->is_array()) {
      check.fail(list_where, "must be an array of buffer names", &*it);
    }
    for (const json& name : *it) {
      if (!name.is_string()) {
        check.fail(list_where, "must be an array of buffer names", &name);
      }
      const auto id = ids.find(name.get_ref<const std::string&>());
      if (id == ids.end()) {
        check.fail(list_where, "unknown buffer \"" + name.get<std::string>() + "\"");
      }
      if (!used.insert(id->second).second) {
        check.fail(list_where, "names buffer \"" + id->first + "\" twice");
      }
      (key[0] == 'r' ? step.reads : step.writes).push_back(id->second);
    }
  }
}

// The steps and their compute times into @p out.
void parse_steps(const json& doc, const std::map<std::string, buffer_id>& ids,
                 const plan_checker& check, tune_plan& out) {
  const json& steps = entries(doc, "steps", check);
  std::set<std::string> step_names;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string where = "steps[" + std::to_string(i) + "]";
    if (!s.is_object()) {
      check.fail(where, "must be an object");
    }
    check.only_keys(s, where, {"name", "reads", "writes", "compute_ms"});
    step_desc step;
    step.name = check.name(s, where);
    if (!step_names.insert(step.name).second) {
      check.fail(where + ".name", "two steps are named \"" + step.name + "\"");
    }
    parse_step_buffers(s, where, ids, check, step);
    const json& ms = check.member(s, where, "compute_ms");
    if (!ms.is_number() || !std::isfinite(ms.get<double>()) || ms.get<double>() < 0 ||
        ms.get<double>() > tune_plan_max_compute_ms) {
      check.fail(where + ".compute_ms", "must be a finite number of milliseconds from 0 to 60000",
                 &ms);
    }
    out.compute_s.push_back(ms.get<double>() / 1e3);
    out.plan.add_step(std::move(step));
  }
}

}  // namespace

tune_plan parse_tune_plan(std::string_view text, const std::string& source) {
  const plan_checker check(source);
  const json doc = parse_document(text, check);
  tune_plan out;
  const auto ids = parse_buffers(doc, check, out);
  parse_steps(doc, ids, check, out);
  return out;
}

tune_plan load_tune_plan(const std::string& path) {
  constexpr std::uint64_t max_plan_bytes = std::uint64_t{64} << 20;
  return parse_tune_plan(detail::read_text_file(path, "plan", max_plan_bytes), path);
}

}  // namespace tierflow::cli
