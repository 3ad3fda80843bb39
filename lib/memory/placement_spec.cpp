// Data classes and placement specs: the defaults and the text form.

#include <algorithm>
#include <array>

#include "tierflow/detail/enum_names.hpp"
#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"
#include "tierflow/placement_policy.hpp"

namespace tierflow {

namespace {

constexpr std::array<std::pair<data_class, std::string_view>, 6> class_names{{
    {data_class::optimizer_state, "optimizer_state"},
    {data_class::master_params, "master_params"},
    {data_class::params, "params"},
    {data_class::grads, "grads"},
    {data_class::activations, "activations"},
    {data_class::staging, "staging"},
}};

std::vector<placement_choice> tiers_of_kinds(const topology& topo,
                                             std::initializer_list<tier_kind> kinds) {
  std::vector<placement_choice> out;
  for (auto kind : kinds) {
    for (const auto& t : topo.tiers()) {
      if (t.kind == kind) {
        out.push_back({{{t.name, 1}}});
      }
    }
  }
  return out;
}

std::vector<placement_choice> host_tiers_largest_first(const topology& topo) {
  std::vector<const tier*> host;
  for (const auto& t : topo.tiers()) {
    if (t.kind != tier_kind::hbm) {
      host.push_back(&t);
    }
  }
  std::stable_sort(host.begin(), host.end(), [](const tier* a, const tier* b) {
    return a->capacity_bytes > b->capacity_bytes;
  });
  std::vector<placement_choice> out;
  for (const auto* t : host) {
    out.push_back({{{t->name, 1}}});
  }
  return out;
}

// Tier names a reference stands for: a tier name, or every tier of a kind (possibly none).
std::vector<std::string> resolve_reference(std::string_view reference, const topology& topo,
                                           const std::string& origin, const std::string& text) {
  if (const auto* t = topo.find_tier(reference)) {
    return {t->name};
  }
  if (const auto kind = parse_tier_kind(reference)) {
    std::vector<std::string> names;
    for (const auto& t : topo.tiers()) {
      if (t.kind == *kind) {
        names.push_back(t.name);
      }
    }
    return names;
  }
  std::string known;
  for (const auto& t : topo.tiers()) {
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw input_error(origin,
                    "unknown tier '" + std::string(reference) + "' (tiers here: " + known +
                        "; kinds: hbm, host_hbm, dram, remote_dram, cxl)",
                    text);
}

}  // namespace

std::string_view to_string(data_class value) noexcept {
  return detail::name_in(class_names, value);
}

std::optional<data_class> parse_data_class(std::string_view name) noexcept {
  return detail::value_in<data_class>(class_names, name);
}

placement_spec placement_spec::defaults(const topology& topo) {
  using k = tier_kind;
  placement_spec spec;
  const auto state = host_tiers_largest_first(topo);
  spec.classes_[data_class::optimizer_state] = state;
  spec.classes_[data_class::master_params] = state;
  const auto near_gpu_first = tiers_of_kinds(topo, {k::dram, k::cxl, k::remote_dram, k::host_hbm});
  spec.classes_[data_class::params] = near_gpu_first;
  spec.classes_[data_class::grads] = near_gpu_first;
  spec.classes_[data_class::activations] =
      tiers_of_kinds(topo, {k::dram, k::remote_dram, k::cxl, k::host_hbm});
  spec.classes_[data_class::staging] = tiers_of_kinds(topo, {k::dram, k::remote_dram});
  for (auto& [cls, choices] : spec.classes_) {
    if (choices.empty()) {
      choices = host_tiers_largest_first(topo);  // a machine with unusual tiers only
    }
  }
  return spec;
}

placement_spec placement_spec::parse(std::string_view text, const std::string& origin,
                                     const topology& topo) {
  const std::string whole(text);
  auto spec = defaults(topo);
  if (detail::trim(text).empty()) {
    throw input_error(origin, "empty placement, expected CLASS=TIER[,TIER...][;CLASS=...]", whole);
  }
  auto entries = detail::split(detail::trim(text), ';');
  if (entries.size() > 1 && detail::trim(entries.back()).empty()) {
    entries.pop_back();
  }
  std::vector<data_class> seen;
  for (auto entry : entries) {
    entry = detail::trim(entry);
    const auto equals = entry.find('=');
    if (entry.empty() || equals == std::string_view::npos) {
      throw input_error(origin, "expected CLASS=TIER[,TIER...] in each ';'-separated entry", whole);
    }
    const auto class_name = detail::trim(entry.substr(0, equals));
    const auto cls = parse_data_class(class_name);
    if (!cls) {
      throw input_error(origin,
                        "unknown data class '" + std::string(class_name) +
                            "' (expected optimizer_state, master_params, params, grads, "
                            "activations or staging)",
                        whole);
    }
    if (std::find(seen.begin(), seen.end(), *cls) != seen.end()) {
      throw input_error(origin, "data class '" + std::string(class_name) + "' given twice", whole);
    }
    seen.push_back(*cls);
    std::vector<placement_choice> choices;
    const auto list = detail::trim(entry.substr(equals + 1));
    if (list.empty()) {
      throw input_error(origin, "empty tier list for " + std::string(class_name), whole);
    }
    for (auto item : detail::split(list, ',')) {
      item = detail::trim(item);
      if (item.empty()) {
        throw input_error(origin, "empty tier in the list for " + std::string(class_name), whole);
      }
      const bool weighted =
          item.find('+') != std::string_view::npos || item.find(':') != std::string_view::npos;
      if (!weighted) {
        for (auto& name : resolve_reference(item, topo, origin, whole)) {
          choices.push_back({{{std::move(name), 1}}});
        }
        continue;
      }
      placement_choice interleave;
      for (auto part : detail::split(item, '+')) {
        part = detail::trim(part);
        const auto colon = part.find(':');
        const auto reference = detail::trim(part.substr(0, colon));
        const auto weight = colon == std::string_view::npos
                                ? std::optional<std::uint64_t>(1)
                                : detail::parse_u64(part.substr(colon + 1));
        if (reference.empty() || !weight) {
          throw input_error(origin, "expected TIER:WEIGHT+TIER:WEIGHT, e.g. dram0:3+cxl0:1", whole);
        }
        if (*weight == 0 || *weight > 1000) {
          throw input_error(origin,
                            "weight " + std::to_string(*weight) + " for '" +
                                std::string(reference) + "' (weights are 1 to 1000)",
                            whole);
        }
        for (auto& name : resolve_reference(reference, topo, origin, whole)) {
          for (const auto& [existing, w] : interleave.tiers) {
            if (existing == name) {
              throw input_error(origin, "tier " + name + " appears twice in one interleave", whole);
            }
          }
          interleave.tiers.emplace_back(std::move(name), static_cast<unsigned>(*weight));
        }
      }
      if (!interleave.tiers.empty()) {
        choices.push_back(std::move(interleave));
      }
    }
    if (choices.empty()) {
      throw input_error(origin,
                        "no tier of this machine is left for " + std::string(class_name) +
                            " (the kinds named have no tier here)",
                        whole);
    }
    spec.classes_[*cls] = std::move(choices);
  }
  return spec;
}

const std::vector<placement_choice>& placement_spec::choices(data_class cls) const {
  return classes_.at(cls);
}

void placement_spec::set(data_class cls, std::vector<placement_choice> choices) {
  TIERFLOW_EXPECTS(!choices.empty(),
                   "placement for " + std::string(to_string(cls)) + " needs at least one tier");
  for (const auto& c : choices) {
    TIERFLOW_EXPECTS(!c.tiers.empty(), "a placement choice needs at least one tier");
    for (const auto& [name, weight] : c.tiers) {
      TIERFLOW_EXPECTS(weight > 0, "placement weight 0 for tier " + name);
    }
  }
  classes_[cls] = std::move(choices);
}

std::string placement_spec::describe(data_class cls) const {
  std::string text;
  for (const auto& choice : choices(cls)) {
    text += text.empty() ? "" : ", ";
    if (choice.tiers.size() == 1) {
      text += choice.tiers.front().first;
      continue;
    }
    for (std::size_t i = 0; i < choice.tiers.size(); ++i) {
      text += (i ? "+" : "") + choice.tiers[i].first + ":" + std::to_string(choice.tiers[i].second);
    }
  }
  return text;
}

}  // namespace tierflow
