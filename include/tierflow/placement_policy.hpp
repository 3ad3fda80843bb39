#pragma once
/** @file
 * @brief Where each class of training data lives: ordered tiers per data class, spilling to
 * the next tier when one is full, with per-tier and per-class accounting.
 */

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tierflow/memory_resource.hpp"
#include "tierflow/topology.hpp"

namespace tierflow {

class settings;

/** @brief The classes of data a training step holds. */
enum class data_class { optimizer_state, master_params, params, grads, activations, staging };

/** @brief Every data class, in declaration order. */
inline constexpr data_class all_data_classes[] = {
    data_class::optimizer_state, data_class::master_params, data_class::params,
    data_class::grads,           data_class::activations,   data_class::staging};

/** @brief The stable name of a data class (`optimizer_state`, ...). */
[[nodiscard]] std::string_view to_string(data_class value) noexcept;

/** @brief The data class named @p name, or nullopt. */
[[nodiscard]] std::optional<data_class> parse_data_class(std::string_view name) noexcept;

/** @brief One place to try: a single tier, or a weighted interleave over several. */
struct placement_choice {
  std::vector<std::pair<std::string, unsigned>> tiers;  ///< tier name and weight (> 0)
  friend bool operator==(const placement_choice&, const placement_choice&) = default;
};

/**
 * @brief Ordered placement choices per data class.
 *
 * Text form (env `TIERFLOW_PLACEMENT`, config key `placement`):
 * `CLASS=CHOICE[,CHOICE...][;CLASS=...]`, e.g. `optimizer_state=cxl,dram;params=dram0`. A
 * CHOICE is a tier name (`cxl0`), a tier kind (every tier of that kind, in topology order; a
 * kind this machine lacks is skipped), or a weighted interleave `TIER:W+TIER:W` (e.g.
 * `dram0:3+cxl0:1`). Classes not named keep their defaults.
 */
class placement_spec {
 public:
  /**
   * @brief DESIGN.md's rules of thumb: optimizer state and master weights in host tiers
   * largest first; cold parameters and grads in DRAM nearest the GPU, then CXL, then remote
   * DRAM; activations and staging in DRAM.
   */
  [[nodiscard]] static placement_spec defaults(const topology& topo);

  /**
   * @brief Defaults with the classes named in @p text replaced.
   * @throws input_error naming @p origin for an unknown class, tier or kind, an empty list, a
   *         weight of 0 or a class given twice
   */
  [[nodiscard]] static placement_spec parse(std::string_view text, const std::string& origin,
                                            const topology& topo);

  /** @brief The choices for @p cls, in order. */
  [[nodiscard]] const std::vector<placement_choice>& choices(data_class cls) const;
  /** @brief Replaces the choices for @p cls. @throws tierflow::error when empty */
  void set(data_class cls, std::vector<placement_choice> choices);
  /** @brief The choices in text form, e.g. `cxl0, dram0:3+cxl0:1`. */
  [[nodiscard]] std::string describe(data_class cls) const;

 private:
  std::map<data_class, std::vector<placement_choice>> classes_;
};

/** @brief How a placement_policy behaves. */
struct placement_options {
  /** @brief Placement text (wins over env `TIERFLOW_PLACEMENT` and the config file). */
  std::optional<std::string> spec;
  /** @brief Settings to read `placement` from when spec is unset; null:
   * settings::from_environment() (the variable, then the file TIERFLOW_CONFIG names). */
  const settings* config = nullptr;
  /** @brief Caps per tier name (bytes held by this policy); a tier is full at its cap. */
  std::map<std::string, std::uint64_t> tier_limits;
  /** @brief Free memory kept back on every node: a tier is full when an allocation would
   * leave less than this free on its nodes. */
  std::uint64_t reserve_bytes = std::uint64_t{256} << 20;
  /** @brief Fault pages in at allocation (on threads bound to the tier's nodes). */
  bool populate = true;
  /** @brief Transparent huge pages for allocations of 2 MiB or more. */
  bool huge_pages = true;
};

/** @brief Accounting of one tier under a placement_policy. */
struct tier_usage {
  std::string tier;
  tier_kind kind = tier_kind::dram;
  std::vector<numa_node_id> nodes;
  std::uint64_t capacity_bytes = 0;
  std::optional<std::uint64_t> free_bytes;   ///< node free memory now
  std::optional<std::uint64_t> limit_bytes;  ///< its cap, when one was set
  std::uint64_t held_bytes = 0;              ///< held through this policy now
  std::uint64_t peak_bytes = 0;
  std::uint64_t allocations = 0;  ///< made in all
  std::uint64_t spills_in = 0;    ///< allocations it took because an earlier tier was full
  std::uint64_t spills_out = 0;   ///< allocations it refused for lack of room
};

/** @brief A snapshot of a placement_policy's accounting. */
struct placement_snapshot {
  std::vector<tier_usage> tiers;
  /** @brief Bytes held now per class and, within it, per tier. */
  std::map<data_class, std::map<std::string, std::uint64_t>> class_bytes;
  std::map<data_class, std::string> spec;  ///< the choices, in text form
  std::string spec_origin;                 ///< where a placement override came from, or empty
};

/** @brief The snapshot as JSON (`{"schema_version":1,"placement":{...}}`; keys in docs/memory.md).
 */
[[nodiscard]] std::string to_json(const placement_snapshot& snapshot);

namespace detail {
struct placement_state;
}

/**
 * @brief Memory placed by a placement_policy; frees itself when destroyed. Move-only. It keeps
 * what it needs alive, so it may outlive the policy.
 */
class tier_allocation {
 public:
  tier_allocation() = default;
  tier_allocation(tier_allocation&& other) noexcept;
  tier_allocation& operator=(tier_allocation&& other) noexcept;
  tier_allocation(const tier_allocation&) = delete;
  tier_allocation& operator=(const tier_allocation&) = delete;
  ~tier_allocation();

  [[nodiscard]] void* data() const noexcept { return pointer_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /** @brief The choice it landed in, e.g. `cxl0` or `dram0:3+cxl0:1`. */
  [[nodiscard]] const std::string& tier() const noexcept { return tier_; }
  [[nodiscard]] data_class cls() const noexcept { return class_; }
  explicit operator bool() const noexcept { return pointer_ != nullptr; }
  /** @brief Frees now (idempotent). */
  void reset() noexcept;

 private:
  friend class placement_policy;
  std::shared_ptr<detail::placement_state> state_;
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t choice_ = 0;  // index into the state's resolved choices
  std::string tier_;
  data_class class_ = data_class::optimizer_state;
};

/**
 * @brief Allocates by data class: tries the class's choices in order and spills to the next
 * when one is full (at its limit, or when its nodes' free memory less the reserve is short),
 * counting every spill and logging the first of each kind once.
 *
 * Each tier with NUMA nodes gets a numa_resource bound to its nodes; attach_resource() puts
 * another resource in a tier's place (device memory for hbm tiers, or a simulated tier in
 * tests). Thread-safe.
 */
class placement_policy {
 public:
  /**
   * @throws input_error for a bad placement spec (with where it came from)
   * @throws tierflow::error for a tier limit naming an unknown tier
   */
  explicit placement_policy(const topology& topo, placement_options options = {});
  ~placement_policy();
  placement_policy(const placement_policy&) = delete;
  placement_policy& operator=(const placement_policy&) = delete;
  /** @brief Moves; a moved-from policy may only be destroyed or assigned to. */
  placement_policy(placement_policy&&) noexcept = default;
  placement_policy& operator=(placement_policy&&) noexcept = default;

  /**
   * @brief Places @p bytes of @p cls (0 bytes: an empty allocation, nothing counted).
   * @throws out_of_capacity naming the class, the bytes asked and the free bytes of each tier
   *         tried, when every choice is full
   */
  [[nodiscard]] tier_allocation allocate(data_class cls, std::size_t bytes);

  /**
   * @brief Serves tier @p tier_name from @p resource (not owned; it must outlive the policy
   * and its allocations) instead of the default. Call before allocating from that tier.
   * @throws tierflow::error for an unknown tier
   */
  void attach_resource(std::string_view tier_name, memory_resource& resource);

  /** @brief The placement in force. */
  [[nodiscard]] const placement_spec& spec() const noexcept;
  /** @brief The machine it places on (with any measured attributes discovery applied). */
  [[nodiscard]] const tierflow::topology& machine() const noexcept;
  /** @brief Accounting now. */
  [[nodiscard]] placement_snapshot snapshot() const;

 private:
  std::shared_ptr<detail::placement_state> state_;
};

}  // namespace tierflow
