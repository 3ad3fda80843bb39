#include "tierflow/placement_policy.hpp"

#include <algorithm>
#include <mutex>
#include <set>

#include "tierflow/detail/parse.hpp"
#include "tierflow/error.hpp"
#include "tierflow/log.hpp"
#include "tierflow/metrics.hpp"
#include "tierflow/numa_resource.hpp"
#include "tierflow/settings.hpp"

namespace tierflow {

namespace detail {

struct tier_state {
  std::string name;
  tier_kind kind = tier_kind::dram;
  std::vector<numa_node_id> nodes;
  std::unique_ptr<numa_resource> own;
  memory_resource* resource = nullptr;  // own.get() or attached; null for an hbm tier
  std::optional<std::uint64_t> limit;
  metrics::usage_counter held;
  std::uint64_t allocations = 0;  // the counters below are guarded by placement_state::mutex
  std::uint64_t spills_in = 0;
  std::uint64_t spills_out = 0;
};

struct resolved_choice {
  std::string label;                                    // `cxl0` or `dram0:3+cxl0:1`
  std::vector<std::pair<std::size_t, unsigned>> parts;  // tier index, weight
  std::unique_ptr<numa_resource> interleave;            // for several parts
};

struct placement_state {
  topology topo;
  placement_options options;
  placement_spec spec;
  std::string spec_origin;
  std::vector<std::unique_ptr<tier_state>> tiers;
  std::vector<resolved_choice> choices;
  std::map<data_class, std::vector<std::size_t>> class_choices;
  std::mutex mutex;
  std::map<data_class, std::map<std::string, std::uint64_t>> class_bytes;
  std::set<std::pair<data_class, std::string>> spills_logged;

  placement_state(const topology& t, placement_options o, placement_spec s)
      : topo(t), options(std::move(o)), spec(std::move(s)) {}

  std::size_t tier_index(const std::string& name) const {
    for (std::size_t i = 0; i < tiers.size(); ++i) {
      if (tiers[i]->name == name) {
        return i;
      }
    }
    throw error("placement: unknown tier '" + name + "'");
  }

  memory_resource* resource_of(const resolved_choice& c) const {
    return c.interleave ? c.interleave.get() : tiers[c.parts.front().first]->resource;
  }

  // Each part's share of @p bytes, by weight (the last takes the remainder).
  std::vector<std::uint64_t> shares(const resolved_choice& c, std::uint64_t bytes) const {
    std::uint64_t total_weight = 0;
    for (const auto& p : c.parts) {
      total_weight += p.second;
    }
    std::vector<std::uint64_t> out;
    std::uint64_t given = 0;
    for (std::size_t i = 0; i < c.parts.size(); ++i) {
      const auto share =
          i + 1 == c.parts.size() ? bytes - given : scale(bytes, c.parts[i].second, total_weight);
      out.push_back(share);
      given += share;
    }
    return out;
  }

  // Room left in a tier: its limit, and its nodes' free memory less the reserve.
  std::optional<std::uint64_t> available(const tier_state& t) const {
    std::optional<std::uint64_t> room;
    if (t.limit) {
      const auto held = t.held.read().current;
      room = held >= *t.limit ? 0 : *t.limit - held;
    }
    if (!t.nodes.empty()) {
      std::uint64_t free_total = 0;
      for (const auto& id : t.nodes) {
        const auto* node = topo.find_node(id);
        const auto free = node != nullptr && node->free_bytes ? *node->free_bytes : 0;
        free_total += free > options.reserve_bytes ? free - options.reserve_bytes : 0;
      }
      room = room ? std::min(*room, free_total) : free_total;
    }
    return room;
  }

  // Counts (or stops counting) each part's share as held by its tier.
  void hold(const resolved_choice& c, const std::vector<std::uint64_t>& part_shares,
            bool take) noexcept {
    for (std::size_t i = 0; i < c.parts.size(); ++i) {
      auto& held = tiers[c.parts[i].first]->held;
      take ? held.add(part_shares[i]) : held.sub(part_shares[i]);
    }
  }

  // Whether every part of @p c has room for its share; each tier that has not is a spill
  // (counted, logged once per class and tier, and added to @p tried). Caller holds mutex.
  bool has_room(data_class cls, const resolved_choice& c,
                const std::vector<std::uint64_t>& part_shares,
                std::vector<out_of_capacity::tier_free>& tried) {
    bool fits = resource_of(c) != nullptr;
    for (std::size_t i = 0; i < c.parts.size(); ++i) {
      auto& tier = *tiers[c.parts[i].first];
      const auto room = available(tier);
      if (tier.resource != nullptr && (!room || *room >= part_shares[i])) {
        continue;
      }
      fits = false;
      tier.spills_out += 1;
      tried.push_back({tier.name, room.value_or(0)});
      if (spills_logged.insert({cls, tier.name}).second) {
        detail::log(log_level::info,
                    "placement: " + std::string(to_string(cls)) + ": " + tier.name +
                        (tier.resource == nullptr
                             ? " has no memory resource attached"
                             : " is full (" + format_byte_count(part_shares[i]) + " asked, " +
                                   format_byte_count(room.value_or(0)) + " available)") +
                        "; trying the next tier");
      }
    }
    return fits;
  }

  void release(std::size_t choice, void* pointer, std::size_t bytes, data_class cls) noexcept {
    const auto& c = choices[choice];
    resource_of(c)->deallocate(pointer, bytes);
    hold(c, shares(c, bytes), false);
    const std::lock_guard lock(mutex);
    auto& per_tier = class_bytes[cls];
    auto it = per_tier.find(c.label);
    if (it != per_tier.end()) {
      it->second -= std::min<std::uint64_t>(it->second, bytes);
      if (it->second == 0) {
        per_tier.erase(it);
      }
    }
  }
};

}  // namespace detail

// --- tier_allocation ----------------------------------------------------------------------

tier_allocation::tier_allocation(tier_allocation&& other) noexcept {
  *this = std::move(other);
}

tier_allocation& tier_allocation::operator=(tier_allocation&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
    pointer_ = std::exchange(other.pointer_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    choice_ = other.choice_;
    tier_ = std::move(other.tier_);
    class_ = other.class_;
  }
  return *this;
}

tier_allocation::~tier_allocation() {
  reset();
}

void tier_allocation::reset() noexcept {
  if (pointer_ != nullptr && state_) {
    state_->release(choice_, pointer_, bytes_, class_);
  }
  pointer_ = nullptr;
  bytes_ = 0;
  state_.reset();
}

// --- placement_policy --------------------------------------------------------------------

placement_policy::placement_policy(const topology& topo, placement_options options) {
  std::optional<setting_value> text;
  if (options.spec) {
    text = setting_value{*options.spec, "placement spec"};
  } else {
    text = (options.config != nullptr ? *options.config : settings::from_environment())
               .get("placement");
  }
  auto spec = text ? placement_spec::parse(text->value, text->origin, topo)
                   : placement_spec::defaults(topo);
  state_ = std::make_shared<detail::placement_state>(topo, std::move(options), std::move(spec));
  auto& s = *state_;
  s.spec_origin = text ? text->origin : "";

  for (const auto& t : topo.tiers()) {
    auto state = std::make_unique<detail::tier_state>();
    state->name = t.name;
    state->kind = t.kind;
    state->nodes = t.nodes;
    if (!t.nodes.empty()) {
      numa_resource_options numa;
      numa.nodes = t.nodes;
      numa.huge_pages = s.options.huge_pages;
      numa.populate = s.options.populate;
      state->own = std::make_unique<numa_resource>(numa);
      state->resource = state->own.get();
    }
    s.tiers.push_back(std::move(state));
  }
  for (const auto& [name, limit] : s.options.tier_limits) {
    s.tiers[s.tier_index(name)]->limit = limit;
  }

  for (auto cls : all_data_classes) {
    for (const auto& choice : s.spec.choices(cls)) {
      detail::resolved_choice resolved;
      for (const auto& [name, weight] : choice.tiers) {
        resolved.parts.emplace_back(s.tier_index(name), weight);
      }
      if (resolved.parts.size() > 1) {
        numa_resource_options numa;
        numa.policy = numa_policy::weighted_interleave;
        numa.huge_pages = s.options.huge_pages;
        numa.populate = s.options.populate;
        for (const auto& [index, weight] : resolved.parts) {
          const auto& tier = *s.tiers[index];
          TIERFLOW_EXPECTS(!tier.nodes.empty(), "placement: cannot interleave over " + tier.name +
                                                    ", which has no NUMA node");
          for (const auto& node : tier.nodes) {
            numa.nodes.push_back(node);
            numa.weights.push_back(weight);
          }
        }
        resolved.interleave = std::make_unique<numa_resource>(numa);
        for (std::size_t i = 0; i < resolved.parts.size(); ++i) {
          resolved.label += (i ? "+" : "") + s.tiers[resolved.parts[i].first]->name + ":" +
                            std::to_string(resolved.parts[i].second);
        }
      } else {
        resolved.label = s.tiers[resolved.parts.front().first]->name;
      }
      s.class_choices[cls].push_back(s.choices.size());
      s.choices.push_back(std::move(resolved));
    }
  }
}

placement_policy::~placement_policy() = default;

const placement_spec& placement_policy::spec() const noexcept {
  return state_->spec;
}

const topology& placement_policy::machine() const noexcept {
  return state_->topo;
}

void placement_policy::attach_resource(std::string_view tier_name, memory_resource& resource) {
  auto& s = *state_;
  const std::lock_guard lock(s.mutex);
  auto& tier = *s.tiers[s.tier_index(std::string(tier_name))];
  TIERFLOW_EXPECTS(tier.held.read().current == 0,
                   "placement: attach a resource to " + tier.name + " before allocating from it");
  tier.resource = &resource;
}

tier_allocation placement_policy::allocate(data_class cls, std::size_t bytes) {
  if (bytes == 0) {
    return {};  // as memory_resource::allocate(0): nothing placed, nothing counted
  }
  auto& s = *state_;
  std::vector<out_of_capacity::tier_free> tried;
  {
    const std::lock_guard lock(s.mutex);
    s.topo.refresh_memory();  // free memory moves: read it once per allocation
  }
  const auto& order = s.class_choices.at(cls);
  for (std::size_t position = 0; position < order.size(); ++position) {
    const auto choice_index = order[position];
    const auto& choice = s.choices[choice_index];
    const auto part_shares = s.shares(choice, bytes);
    {
      // Check room and take it under the lock, so concurrent allocations cannot both fit.
      const std::lock_guard lock(s.mutex);
      if (!s.has_room(cls, choice, part_shares, tried)) {
        continue;
      }
      s.hold(choice, part_shares, true);
    }
    void* pointer = nullptr;
    try {
      pointer = s.resource_of(choice)->allocate(bytes);
    } catch (const out_of_capacity& e) {
      s.hold(choice, part_shares, false);
      const std::lock_guard lock(s.mutex);
      for (const auto& part : choice.parts) {
        auto& tier = *s.tiers[part.first];
        tier.spills_out += 1;
        tried.push_back({tier.name, e.tiers().empty() ? 0 : e.tiers().front().free_bytes});
      }
      continue;
    } catch (...) {
      s.hold(choice, part_shares, false);
      throw;
    }
    {
      const std::lock_guard lock(s.mutex);
      for (const auto& part : choice.parts) {
        auto& tier = *s.tiers[part.first];
        tier.allocations += 1;
        if (position > 0) {
          tier.spills_in += 1;
        }
      }
      s.class_bytes[cls][choice.label] += bytes;
    }
    tier_allocation result;
    result.state_ = state_;
    result.pointer_ = pointer;
    result.bytes_ = bytes;
    result.choice_ = choice_index;
    result.tier_ = choice.label;
    result.class_ = cls;
    return result;
  }
  throw out_of_capacity(std::string(to_string(cls)), bytes, std::move(tried));
}

placement_snapshot placement_policy::snapshot() const {
  auto& s = *state_;
  const std::lock_guard lock(s.mutex);
  placement_snapshot snap;
  for (const auto& t : s.tiers) {
    tier_usage u;
    u.tier = t->name;
    u.kind = t->kind;
    u.nodes = t->nodes;
    if (const auto* info = s.topo.find_tier(t->name)) {
      u.capacity_bytes = info->capacity_bytes;
      u.free_bytes = info->free_bytes;
    }
    u.limit_bytes = t->limit;
    const auto held = t->held.read();
    u.held_bytes = held.current;
    u.peak_bytes = held.peak;
    u.allocations = t->allocations;
    u.spills_in = t->spills_in;
    u.spills_out = t->spills_out;
    snap.tiers.push_back(std::move(u));
  }
  snap.class_bytes = s.class_bytes;
  for (auto cls : all_data_classes) {
    snap.spec[cls] = s.spec.describe(cls);
  }
  snap.spec_origin = s.spec_origin;
  return snap;
}

std::string to_json(const placement_snapshot& snapshot) {
  metrics::json_writer w;
  w.begin_object().key("schema_version").value(metrics::snapshot_schema_version);
  w.key("placement").begin_object();
  w.key("spec_origin");
  snapshot.spec_origin.empty() ? w.null() : w.value(snapshot.spec_origin);
  w.key("spec").begin_object();
  for (const auto& [cls, text] : snapshot.spec) {
    w.key(to_string(cls)).value(text);
  }
  w.end_object();
  w.key("tiers").begin_array();
  for (const auto& t : snapshot.tiers) {
    w.begin_object();
    w.key("name").value(t.tier).key("kind").value(to_string(t.kind));
    w.key("nodes").begin_array();
    for (const auto& n : t.nodes) {
      w.value(n.value);
    }
    w.end_array();
    w.key("capacity_bytes").value(t.capacity_bytes);
    w.key("free_bytes");
    t.free_bytes ? w.value(*t.free_bytes) : w.null();
    w.key("limit_bytes");
    t.limit_bytes ? w.value(*t.limit_bytes) : w.null();
    w.key("held_bytes").value(t.held_bytes).key("peak_bytes").value(t.peak_bytes);
    w.key("allocations").value(t.allocations);
    w.key("spills_in").value(t.spills_in).key("spills_out").value(t.spills_out);
    w.end_object();
  }
  w.end_array();
  w.key("classes").begin_object();
  for (const auto& [cls, per_tier] : snapshot.class_bytes) {
    std::uint64_t total = 0;
    for (const auto& [tier, bytes] : per_tier) {
      total += bytes;
    }
    w.key(to_string(cls)).begin_object().key("bytes").value(total).key("tiers").begin_object();
    for (const auto& [tier, bytes] : per_tier) {
      w.key(tier).value(bytes);
    }
    w.end_object().end_object();
  }
  w.end_object();
  w.end_object().end_object();
  return w.str();
}

}  // namespace tierflow
