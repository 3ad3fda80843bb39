#pragma once
/** @file
 * @brief Offloaded Adam/AdamW (layer `optim`): fp32 master weights and the Adam moments live in
 * tier memory; each step reads the grads from the device, updates the state in the tier (mode
 * `cpu`) or in HBM as it streams through (mode `streamed`), and writes the params back.
 *
 * The update is torch.optim.AdamW (decoupled weight decay) or torch.optim.Adam (L2 decay), in
 * fp32 with no fused multiply-adds, so every kernel (scalar, AVX2, AVX-512, the GPU's) gives
 * the same bits as the scalar reference (tierflow::detail::adam_reference):
 *
 *     g  = grad * (clip / loss_scale)          (L2: g += weight_decay * p)
 *     p  = p * (1 - lr * weight_decay)         (decoupled only)
 *     m  = m * beta1 + (1 - beta1) * g
 *     v  = v * beta2 + (1 - beta2) * g * g
 *     p  = p + (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 *
 * with bc1 = 1 - beta1^t and bc2 = 1 - beta2^t (1 when bias correction is off), t the group's
 * step count. Scalars are computed in double and rounded to float once, as PyTorch does.
 * A step whose grads hold an inf or a NaN anywhere is skipped for every parameter: no state
 * changes and no step counts.
 *
 * Reliability (docs/reliability.md): a step is all or nothing. When a device operation fails
 * during step(), it throws adam_step_error, whose result() says which of three outcomes
 * happened: `not_applied` (the master weights, moments and step counts are bit for bit as
 * before the step; call step() again once the fault is gone), `applied` (the step is complete
 * in the state, exactly as a fault-free step; do not repeat it) or `pending` (streamed mode
 * only, when even the recovery's copies fail: the step is half done, and the next step()
 * completes it from the grads still on the device instead of starting a new one; save()
 * refuses and load() drops it meanwhile). The device params then may lag the master weights
 * (params_current() false): the next step(), load() or sync_params() re-sends them. Nothing
 * leaks and no thread is left running in any case.
 */
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tierflow/device.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/where.hpp"

namespace tierflow {

/** @brief Element type of a parameter and its grad on the device. */
enum class param_dtype { f32, bf16, f16 };

/** @brief `f32`, `bf16`, `f16`. */
[[nodiscard]] std::string_view to_string(param_dtype dtype) noexcept;
/** @brief Bytes per element: 4 or 2. */
[[nodiscard]] std::size_t dtype_bytes(param_dtype dtype) noexcept;

/** @brief Where the Adam step runs. */
enum class adam_mode {
  cpu,       ///< grads D2H, SIMD step in the tier on threads near the state, params H2D
  streamed,  ///< state streamed through HBM by the prefetch scheduler, step on the device
  automatic  ///< chosen from measured rates (see offload_adam::mode_reason())
};

/** @brief `cpu`, `streamed`, `auto`. */
[[nodiscard]] std::string_view to_string(adam_mode mode) noexcept;
/** @brief The mode named @p text (`cpu`, `streamed`, `auto`), or nullopt. */
[[nodiscard]] std::optional<adam_mode> parse_adam_mode(std::string_view text) noexcept;

/** @brief What the optimizer's step may overlap with (see offload_adam::grad_ready()). */
enum class adam_overlap {
  none,      ///< the step starts in step(), after the backward pass
  backward,  ///< grad_ready() starts a param's update (speculatively) during the backward pass
  /** as backward, and a param takes its new values as soon as its speculative update is done,
   *  before step() (stored into a param in host memory, sent up on the H2D stream for a device
   *  param): the caller must neither read nor write a param from its grad_ready() until step()
   *  returns (step() restores it when it rolls the update back) */
  backward_publish
};

/** @brief `none`, `backward`, `backward_publish`. */
[[nodiscard]] std::string_view to_string(adam_overlap overlap) noexcept;
/** @brief The overlap named @p text (`none`, `backward`, `backward_publish`), or nullopt. */
[[nodiscard]] std::optional<adam_overlap> parse_adam_overlap(std::string_view text) noexcept;

/** @brief How weight decay is applied. */
enum class weight_decay_mode {
  decoupled,  ///< AdamW: p *= 1 - lr * weight_decay before the update
  l2          ///< Adam: g += weight_decay * p
};

/** @brief A group's hyper-parameters; they may change before any step. */
struct adam_hyper {
  double lr = 1e-3;           ///< ≥ 0, finite; lr / (1 - beta1) finite as a float
  double beta1 = 0.9;         ///< in [0, 1)
  double beta2 = 0.999;       ///< in [0, 1)
  double eps = 1e-8;          ///< > 0, finite, not 0 as a float (>= ~1e-38)
  double weight_decay = 0.0;  ///< ≥ 0, finite
  weight_decay_mode decay = weight_decay_mode::decoupled;
  bool bias_correction = true;
};

/** @brief One parameter tensor on the device. */
struct adam_param {
  std::string name;       ///< for errors and metrics; unique in the optimizer
  void* param = nullptr;  ///< device pointer to `elements` values of `dtype`
  /// device pointer to its grad, same dtype and count; nullptr: none yet (the param is left
  /// alone until set_grad() or grad_ready() gives one)
  const void* grad = nullptr;
  param_dtype dtype = param_dtype::f32;
  std::size_t elements = 0;  ///< > 0
  /** `param` is host memory (e.g. a cold parameter's tier copy that a prefetch_scheduler
   * streams in): the step writes the update there directly, with no H2D. cpu mode only; the
   * grad may be the device's (copied down) or host memory (read in place). cpu mode treats a
   * param that is not the device's memory (device::is_device_memory) so too, and an fp32 one
   * of those (the caller's own host memory, not marked param_on_host: a CPU tensor) stepped
   * without an overlap is its own master (8 B of state per param): a write to it is what the
   * next step starts from. Any other param in host memory (cpu mode) has a master of its own,
   * and each step compares it with the param first: a value written to the param outside the
   * optimizer (no call needed) is taken into the master where it differs from the master
   * stored as the param's dtype (metrics: param_writes_adopted); with an overlap, a write
   * before the backward pass or between it and step(), not during it. A device param's outside
   * write needs refresh_master(). */
  bool param_on_host = false;
  /** The index of a weight of the session that makes the optimizer (session::make_optimizer):
   * `param` is then that weight's tier copy and `param_on_host` true. An optimizer made
   * without a session refuses a param that names one. */
  std::optional<std::size_t> weight{};
};

/** @brief How the Adam moments m and v are stored (docs/offload-adam.md, "Compressed state").
 * Every kind updates in fp32: the moments are decoded, stepped exactly as fp32 state, and
 * encoded again, the same bits in every kernel (the scalar reference defines them). */
enum class adam_state_dtype {
  f32,   ///< 4 + 4 B per param (the default: torch's AdamW's numbers)
  bf16,  ///< 2 + 2 B: m and v rounded to bf16 (nearest even)
  /** ~1 + 1 B (+ 8 B per 256): per block of 256 elements, 8-bit floating-point codes scaled
   * by the block's largest value: m as sign + 4-bit exponent + 3-bit mantissa, sqrt(v) as
   * 4-bit exponent + 4-bit mantissa (a positive v never encodes to 0). Params under
   * int8_min_elements keep fp32 moments. */
  int8
};

/** @brief `fp32`, `bf16`, `int8`. */
[[nodiscard]] std::string_view to_string(adam_state_dtype dtype) noexcept;
/** @brief The state dtype named @p text (`fp32` or `f32`, `bf16`, `int8`), or nullopt. */
[[nodiscard]] std::optional<adam_state_dtype> parse_adam_state_dtype(
    std::string_view text) noexcept;

/** @brief Where a param's fp32 master weights are kept (docs/offload-adam.md, "The master in 16
 * bits"). */
enum class adam_master {
  fp32,  ///< a separate fp32 copy (4 B per param), or the param itself when it is fp32 host memory
  /** The low 16 bits of the fp32 master beside a bf16 param in host memory (2 B per param): the
   * master is the param's bits (high half) and these, exactly, so it steps bit for bit as a
   * separate fp32 master does. The param is the master rounded to nearest, ties away from zero (16
   * bits cannot hold a ties-to-even rounding: at an exact tie that one is one bf16 ulp above, 1
   * value in 65536). Applies in cpu mode without an overlap to bf16 params in host memory, a
   * caller's or a session's tier copy (fp32 ones there keep an fp32 master); any other param is
   * refused. An outside write to such a param changes the master's high half only: call
   * refresh_master() before anything reads or steps the master (joined with the old remainder, a
   * param written to +-0 can read as NaN). */
  remainder
};

/** @brief `fp32`, `remainder`. */
[[nodiscard]] std::string_view to_string(adam_master master) noexcept;
/** @brief The master kind named @p text, or nullopt. */
[[nodiscard]] std::optional<adam_master> parse_adam_master(std::string_view text) noexcept;

/** @brief Params with fewer elements keep fp32 moments under int8 (as bitsandbytes does below
 * 4096): a block's scale costs as much as a small param saves, and biases and norms are few. */
inline constexpr std::size_t int8_min_elements = 4096;

/** @brief Parameters sharing hyper-parameters and a step count. */
struct adam_group {
  std::vector<adam_param> params;
  adam_hyper hyper;
  /** How this group's moments are stored; nullopt: adam_options::state_dtype. */
  std::optional<adam_state_dtype> state_dtype{};
};

/** @brief The step's kernel: `scalar`, `avx2`, `avx512`; chosen by CPU feature detection. */
enum class adam_kernel { automatic, scalar, avx2, avx512 };

/** @brief `auto`, `scalar`, `avx2`, `avx512`. */
[[nodiscard]] std::string_view to_string(adam_kernel kernel) noexcept;
/** @brief Whether this CPU can run @p kernel (`automatic` and `scalar`: always). */
[[nodiscard]] bool kernel_supported(adam_kernel kernel) noexcept;
/** @brief The best kernel this CPU runs. */
[[nodiscard]] adam_kernel best_kernel() noexcept;

/** @brief How an offload_adam works. */
struct adam_options {
  adam_mode mode = adam_mode::automatic;
  /** Elements per chunk: the unit of transfer, of thread work and of checkpoint CRCs; > 0. A
   * chunk longer than the largest param is clamped to it (it would only pin memory). */
  std::size_t chunk_elements = std::size_t{1} << 20;
  /** Worker threads for the CPU step (0: the CPUs of the nodes that hold the state, at most
   * the CPUs this process may use); at most 4 x the hardware threads, and at most 1024. */
  unsigned threads = 0;
  adam_kernel kernel = adam_kernel::automatic;  ///< a kernel this CPU lacks is an error
  /** Global grad-norm clipping: grads are scaled by min(1, max / (norm + 1e-6)); 0: off. */
  double max_grad_norm = 0.0;
  /** Grads are divided by this before anything else (mixed-precision loss scaling); > 0, and
   * it and its inverse finite as floats (the kernels' precision). */
  double loss_scale = 1.0;
  /** Streamed mode: HBM for staging the state (0: room for `window` + 2 chunks). The undo ring
   * (`min(chunks, window + 3)` chunks' master, m and v; every chunk when the window spans the
   * plan) is allocated beside it, see adam_metrics::hbm_undo_bytes. */
  std::uint64_t hbm_budget_bytes = 0;
  std::uint64_t window = 2;  ///< streamed mode: chunks prefetched ahead
  /** Measured link and memory rates for `automatic`, GB/s; 0: the device's figure, or a
   * short measurement. */
  double h2d_gbps = 0.0;
  double d2h_gbps = 0.0;
  double host_memory_gbps = 0.0;
  /** How long step() waits, in seconds, for the device work it depends on before it changes
   * any state: the work that made the grads (the caller's backward pass), their copy to the
   * host (cpu mode) or the device norm pass (streamed mode), and the previous step's params
   * uploads. When that work has not finished in time, step() throws adam_step_error
   * (not_applied, the state as before); the work stays queued, and the next step() waits for
   * it first. Once the step has started changing the state it runs to its end. 0: wait
   * forever. Finite, >= 0 and at most 1e6 (about 11.6 days). */
  double device_timeout_s = 0.0;
  /** `backward` (cpu mode): grad_ready() starts each param's update while the backward pass
   * goes on, at the price of a pre-update copy of the state (adam_metrics::rollback_bytes,
   * 12 B per element, in the placement's optimizer_state tiers). In streamed mode grad_ready()
   * is accepted and does nothing (the step streams the state in step()). Default `none`: the
   * copy doubles the state's memory, and only a caller that calls grad_ready() gains.
   * `backward_publish` also writes (or sends up) each param as soon as its update is done, so
   * that step() has only the last updates and their params left. */
  adam_overlap overlap = adam_overlap::none;
  /** How the moments are stored (a group may choose its own, adam_group::state_dtype). A
   * compressed kind (bf16, int8) runs in either mode (streamed mode stages and sends the
   * moments as stored: int8 moves half fp32's bytes over the link); `automatic` picks cpu. */
  adam_state_dtype state_dtype = adam_state_dtype::f32;
  /** Where the master weights are kept (adam_master): `remainder` needs mode cpu (or auto with
   * host params), overlap none, and every param bf16 or fp32 in host memory (the caller's, or
   * a session's tier copy). */
  adam_master master = adam_master::fp32;
};

/**
 * @brief What the owner of params' memory checks before the optimizer writes it (a session,
 * whose scheduler may still read a weight's tier copy). The optimizer calls it inside the
 * call it guards (so it must not call the optimizer); an exception it throws refuses that
 * call, nothing changed.
 */
class param_write_guard {
 public:
  virtual ~param_write_guard() = default;
  /** @brief Before a call that may write any param in host memory: step(), sync_params(),
   * load(), save() and the state accessors (which restore what grad_ready() updated). */
  virtual void before_writes() = 0;
  /** @brief Whether grad_ready()'s update of @p param (host memory) may write it now, before
   * step() (overlap backward_publish); false: the new values wait for step(). May run on any
   * thread, concurrently with the owner's own calls. */
  virtual bool may_write_now(const void* param) = 0;
};

/** @brief A step() that a device failure interrupted, and what became of the step. */
class adam_step_error : public device_error {
 public:
  /** @brief What the failed step left in the state. */
  enum class outcome {
    not_applied,  ///< the state is as before the step (bit for bit); retry step()
    applied,      ///< the step is complete in the state; do not repeat it
    pending       ///< half done; the next step() completes it (grads must stay as they are)
  };
  /** @param what the message, with the failure and how to recover */
  adam_step_error(const std::string& what, outcome result);
  [[nodiscard]] outcome result() const noexcept { return outcome_; }
  /** @brief Whether the state holds the step (outcome applied). */
  [[nodiscard]] bool applied() const noexcept { return outcome_ == outcome::applied; }

 private:
  outcome outcome_;
};

/** @brief `not_applied`, `applied`, `pending`. */
[[nodiscard]] std::string_view to_string(adam_step_error::outcome outcome) noexcept;

/** @brief What one step did. */
struct adam_step_result {
  bool applied = false;     ///< false: skipped (non-finite grads); nothing changed
  std::string skip_reason;  ///< e.g. `non-finite grad in 'layer3.w' (chunk 2)`
  double grad_norm = 0.0;   ///< global L2 norm of the unscaled grads (inf/nan when skipped)
  double clip_coef = 1.0;   ///< the factor clipping applied (1: none)
  double seconds = 0.0;     ///< wall time of the step
};

/** @brief Running totals of an offload_adam. */
struct adam_metrics {
  adam_mode mode = adam_mode::cpu;
  std::string mode_reason;
  adam_kernel kernel = adam_kernel::scalar;
  unsigned threads = 0;
  std::uint64_t params = 0;  ///< elements over every group
  std::uint64_t chunks = 0;
  std::uint64_t steps = 0;  ///< applied
  std::uint64_t skipped_steps = 0;
  double step_seconds_total = 0;  ///< wall time over every step
  double last_step_seconds = 0;
  double grad_seconds = 0;      ///< cpu mode: waiting for grads and computing the norm
  double update_seconds = 0;    ///< cpu mode: the Adam kernel
  std::uint64_t bytes_d2h = 0;  ///< over every step
  std::uint64_t bytes_h2d = 0;
  std::uint64_t state_bytes = 0;             ///< master weights + moments in tiers
  std::uint64_t hbm_staging_peak_bytes = 0;  ///< streamed mode: most HBM its chunks held; cpu: 0
  /** @brief streamed mode: HBM held by the undo ring, beside the staging budget; cpu: 0 */
  std::uint64_t hbm_undo_bytes = 0;
  adam_overlap overlap = adam_overlap::none;
  /** @brief overlap backward: the pre-update copy of the state (in tiers), else 0 */
  std::uint64_t rollback_bytes = 0;
  std::uint64_t speculative_steps = 0;   ///< steps that found work started by grad_ready()
  std::uint64_t rollbacks = 0;           ///< steps that restored a speculative update
  std::uint64_t rolled_back_chunks = 0;  ///< chunks restored, over every step
  /** @brief cpu mode: param values written outside the optimizer (through no version: a
   *  tensor's .data) that a step found and took into the master, over every step */
  std::uint64_t param_writes_adopted = 0;
  /** @brief `{"schema_version":1,"adam":{...}}` (keys in docs/offload-adam.md). */
  [[nodiscard]] std::string to_json() const;
};

/**
 * @brief Adam/AdamW over device parameters with its state in tier memory.
 *
 * Construction copies the device params once (D2H) into the fp32 master weights, with zero
 * moments. step() returns when the device params hold the update; it orders itself after the
 * work enqueued on the device's compute stream so far (the backward pass that made the grads).
 *
 * Threads: one call at a time. A member called while another thread's call on the same
 * optimizer is in progress throws busy_error at once, before it reads or changes anything (the
 * call in progress is unharmed; the refused one may be retried). grad_ready() calls may run at
 * the same time as each other, not with the other members. group_count(), param_count(),
 * mode(), mode_reason(), kernel() and params_current() are never refused (the first five read
 * what never changes; params_current() is a hint, not ordered with a step in progress). The
 * destructor must not race any call. Different optimizers, also on one device, may be used
 * from different threads at once.
 */
class offload_adam {
 public:
  /**
   * @param dev the device holding the params and grads
   * @param groups at least one group; each with at least one parameter
   * @param options see adam_options
   * @param placement allocates the state (classes master_params and optimizer_state); it must
   *        outlive the optimizer
   * @throws tierflow::error naming the bad argument (null pointer, zero elements, lr < 0,
   *         beta outside [0, 1), eps ≤ 0, duplicate name, unsupported kernel, ...);
   *         out_of_capacity when the tiers cannot hold the state; device_error on a failed copy
   */
  offload_adam(device& dev, std::vector<adam_group> groups, adam_options options,
               placement_policy& placement);
  ~offload_adam();
  offload_adam(const offload_adam&) = delete;
  offload_adam& operator=(const offload_adam&) = delete;

  /** @brief Installs @p guard (nullptr: none), which must outlive the optimizer or be removed
   * first; the session installs itself. Not to be called while another call is in progress. */
  void set_write_guard(param_write_guard* guard) noexcept;

  /**
   * @brief One optimizer step over every group.
   *
   * A pending step is completed first, the params then re-sent, and that step's result
   * returned without starting another; otherwise the device params are first re-sent if a
   * failed call left them behind.
   * @throws adam_step_error when a copy or the device kernel fails, saying what became of the
   *         step (see the file comment): cpu mode reports a failed grads copy as not applied
   *         and a failed params upload as applied (the state stepped; the params are re-sent
   *         later); streamed mode rolls a step back when no chunk's write-back had landed, and
   *         else restores the other chunks from their pre-step copies and completes the step
   *         for them on the host; a second fault during that leaves the step pending
   */
  adam_step_result step();

  /**
   * @brief Says that param @p param of group @p group has its final grad for the next step()
   * (overlap backward): its grads copy, its share of the norm and its update, scaled as if
   * no clipping applied, start on the workers while the caller's backward pass goes on
   * (after the work enqueued on the compute stream so far). step() keeps the update when no
   * clip applies and every grad is finite, and else restores the param's state from a copy
   * made before the update and redoes it (or skips the step): the result is bit for bit the
   * plain step's. A param not announced is handled by step() as usual; a second announcement
   * in one step is ignored. A no-op with overlap none or in streamed mode. Thread-safe
   * against other grad_ready() calls (a framework's autograd threads), not against the
   * other members; between grad_ready() and step(), the calls that read or replace the state
   * (master_weights(), set_state(), save(), ...) restore it first and the step redoes the
   * updates. In cpu mode an announced grad is copied to the host, and step() reads that copy,
   * never the grad's memory again: the caller may free it after the copy (on the device's D2H
   * stream), unless a failure during a state-reading call lost the copy (step() then throws
   * not_applied, asking for the grads again).
   * @throws tierflow::error out of range, for a param without a grad (set_grad(nullptr)), or
   *         while a failed step is pending
   */
  void grad_ready(std::size_t group, std::size_t param);
  /** @brief set_grad(@p group, @p param, @p grad) (non-null), then grad_ready(). */
  void grad_ready(std::size_t group, std::size_t param, const void* grad);
  /** @brief Forgets the grads announced since the last step() (restoring what their updates
   *  changed), as a framework's zero_grad() between the backward pass and the step does: the
   *  next step() reads the grads set then. A no-op when none was announced.
   *  @throws busy_error while another call on this optimizer runs */
  void discard_grads();
  /** @brief Whether grad_ready() copies each announced grad to the host (cpu mode with an
   *  overlap): step() then reads that copy, never the grad's memory again. */
  [[nodiscard]] bool copies_announced_grads() const noexcept;

  /**
   * @brief Re-sends the params from the master weights when a failed call left the device
   * params behind them (no-op otherwise). Call it before a forward pass that must not see
   * stale params; step() does it by itself.
   * @throws adam_step_error (not_applied) when the upload fails again; retry later
   */
  void sync_params();
  /** @brief Whether the device params hold the master weights (false after a failed upload). */
  [[nodiscard]] bool params_current() const noexcept;

  /** @brief The hyper-parameters of group @p group. @throws tierflow::error out of range */
  [[nodiscard]] const adam_hyper& hyper(std::size_t group) const;
  /** @brief Replaces group @p group's hyper-parameters (checked as at construction). */
  void set_hyper(std::size_t group, const adam_hyper& hyper);
  /** @brief Sets the lr of every group. @throws tierflow::error for a bad lr */
  void set_lr(double lr);
  /** @brief Steps applied to group @p group (to any of its params). */
  [[nodiscard]] std::uint64_t step_count(std::size_t group) const;
  /** @brief Steps applied to param @p param of group @p group: the t of its bias correction.
   * It differs from the group's when a step left the param alone (set_grad(nullptr)). */
  [[nodiscard]] std::uint64_t step_count(std::size_t group, std::size_t param) const;
  [[nodiscard]] std::size_t group_count() const noexcept;
  /** @brief Params in group @p group. @throws tierflow::error out of range */
  [[nodiscard]] std::size_t param_count(std::size_t group) const;

  /**
   * @brief The grad param @p param of group @p group has from the next step() on (frameworks
   * reallocate grads between steps): a pointer as adam_param::grad, or nullptr: the
   * param has no grad, and steps leave it alone (its master weights, moments, step count and
   * device param), as torch.optim does for a param whose grad is None. In cpu mode a grad in
   * host memory (not device::is_device_memory) is read where it is, with no copy; a param in
   * the caller's host memory that is not `param_on_host` (a CPU tensor) stepped without an
   * overlap has no room for a copy, so its grad must be host memory too.
   * @throws tierflow::error out of range, while a failed step is pending (it completes
   *         from the grads it started with), or for a param announced by grad_ready() this
   *         step when @p grad is another pointer
   */
  void set_grad(std::size_t group, std::size_t param, const void* grad);

  /** @brief One param's grad for set_grads(). */
  struct grad_binding {
    std::size_t group = 0;
    std::size_t param = 0;
    const void* grad = nullptr;
  };
  /** @brief set_grad() for several params, all checked before any changes: a refusal leaves
   *  every grad as it was. @throws tierflow::error as set_grad() */
  void set_grads(const std::vector<grad_binding>& grads);

  /**
   * @brief Replaces a param's state, as a framework's load_state_dict does: @p master, @p
   * exp_avg and @p exp_avg_sq (each @p elements floats; nullptr: that part kept) and its step
   * count. A new master reaches the device param with the next step() or sync_params()
   * (params_current() is false until then); refresh_master() goes the other way.
   * @throws tierflow::error, changing nothing, for a wrong element count, a non-finite value,
   *         a negative exp_avg_sq, or while a failed step is pending
   */
  void set_state(std::size_t group, std::size_t param, const float* master, const float* exp_avg,
                 const float* exp_avg_sq, std::size_t elements, std::uint64_t steps);
  /**
   * @brief Reads the param's values into its master weights (widened to fp32) where they
   * differ from the master stored as the param's dtype (an unchanged value keeps the master's
   * extra bits), for a framework that changed them outside the optimizer (loaded a model
   * checkpoint, say). A master split into the param and its remainder becomes the param's
   * value exactly.
   * @throws device_error when the copy fails (the master then as before); tierflow::error out
   *         of range or while a failed step is pending
   */
  void refresh_master(std::size_t group, std::size_t param);

  /** @brief The mode in force (never `automatic`) and why it was chosen. */
  [[nodiscard]] adam_mode mode() const noexcept;
  [[nodiscard]] const std::string& mode_reason() const noexcept;
  [[nodiscard]] adam_kernel kernel() const noexcept;

  /**
   * @brief Writes the state to @p path atomically (temp file, fsync, rename): a header with
   * the format version, groups, names, shapes, dtypes, hyper-parameters and step counts, and
   * payload chunks with CRC32C. @throws environment_error naming the path and the errno when
   * the system refuses (no room, no permission, a read-only file system); tierflow::error for
   * a path that is a folder or not a regular file, or while a step is pending. The file at
   * @p path, if any, is left as it was.
   */
  void save(const std::filesystem::path& path) const;
  /**
   * @brief Reads a checkpoint written by save() (by any mode) and, only when every byte of it
   * checks out, replaces the state and the device params with it.
   * A pending step is dropped (the file replaces it).
   * @throws input_error naming the path for a truncated, corrupted or mismatched file, or one
   *         of another format version; the live state is then untouched.
   *         adam_step_error (applied) when the state was loaded but sending the params failed
   *         (re-sent by the next step() or sync_params())
   */
  void load(const std::filesystem::path& path);

  /** @brief Running totals. */
  [[nodiscard]] adam_metrics metrics() const;

  /** @brief Where the state's pages are, by where(): @p cls is data_class::master_params (the
   * fp32 master weights) or data_class::optimizer_state (m and v), summed over every param.
   * @throws tierflow::error for another class */
  [[nodiscard]] page_residency state_residency(data_class cls) const;

  /** @brief Copies of parameter @p param of group @p group's state (for tests and tools). */
  [[nodiscard]] std::vector<float> master_weights(std::size_t group, std::size_t param) const;
  [[nodiscard]] std::vector<float> exp_avg(std::size_t group, std::size_t param) const;
  [[nodiscard]] std::vector<float> exp_avg_sq(std::size_t group, std::size_t param) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tierflow
