/* tierflow's C ABI: open a device, and create, step, tune, checkpoint and inspect an offloaded
 * Adam optimizer over raw device pointers. For callers in C, Python (ctypes) and Rust.
 *
 * Conventions:
 * - Every call that can fail returns a tf_status; TF_OK is 0. On failure, tf_last_error()
 *   returns a message for the calling thread (valid until that thread's next tierflow call).
 * - Objects are opaque and freed by their destroy call, which accepts NULL.
 * - No call exits the process or lets a C++ exception escape.
 *
 * Threads:
 * - tf_last_error() is per thread (thread-local): a thread sees the message of its own last
 *   call only.
 * - Different objects may be used from different threads at the same time, also when they are
 *   made on one tf_device (each optimizer has its own workers and state; the device's streams
 *   and its memory are thread-safe).
 * - One tf_adam takes one call at a time. A call made while another thread's call on the same
 *   optimizer is in progress is refused with TF_ERR_BUSY before it reads or changes anything
 *   (the call in progress goes on unharmed); the caller may retry it. The exceptions:
 *   tf_adam_grad_ready calls may run at the same time as each other (a framework's autograd
 *   threads), but not with the optimizer's other calls; tf_adam_param_count,
 *   tf_adam_param_elements and tf_adam_mode_in_force read what never changes and are never
 *   refused. tf_adam_destroy must not race any call on the optimizer (it frees it).
 * - A tf_scheduler is not checked this way: drive it from one thread at a time.
 */
#ifndef TIERFLOW_TIERFLOW_H
#define TIERFLOW_TIERFLOW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tf_status {
  TF_OK = 0,
  TF_ERR_INVALID_ARGUMENT = 1, /* a bad argument: null pointer, lr < 0, beta >= 1, ... */
  TF_ERR_OUT_OF_MEMORY = 2,    /* a tier or the device has no room */
  TF_ERR_DEVICE = 3,           /* a device operation failed */
  TF_ERR_INPUT = 4,            /* bad input from outside: a file, an env var, a spec */
  TF_ERR_BUFFER_TOO_SMALL = 5, /* the output buffer cannot hold the result (see *needed) */
  TF_ERR_INTERNAL = 6,         /* anything else */
  TF_ERR_BUSY = 7,             /* another thread's call on the same object is in progress; this
                                * call was refused and changed nothing (see Threads below) */
  TF_ERR_ENVIRONMENT = 8       /* the machine refused, not the caller's arguments: a full disk, a
                                * read-only or permission-denied folder, the mlock limit, a
                                * thread that could not start; the message names the path or
                                * resource and the errno text (docs/errors.md) */
} tf_status;

/* The *_ENUM_MAX values are not values to pass: they make each enum as wide as an int, so
 * that any int a caller passes is a value the library can check and refuse
 * (TF_ERR_INVALID_ARGUMENT), not undefined behaviour. */
typedef enum tf_dtype {
  TF_DTYPE_F32 = 0,
  TF_DTYPE_BF16 = 1,
  TF_DTYPE_F16 = 2,
  TF_DTYPE_ENUM_MAX = 0x7fffffff
} tf_dtype;

typedef enum tf_adam_mode {
  TF_ADAM_CPU = 0,
  TF_ADAM_STREAMED = 1,
  TF_ADAM_AUTO = 2,
  TF_ADAM_MODE_ENUM_MAX = 0x7fffffff
} tf_adam_mode;

typedef enum tf_copy_kind {
  TF_COPY_H2D = 0,
  TF_COPY_D2H = 1,
  TF_COPY_KIND_ENUM_MAX = 0x7fffffff
} tf_copy_kind;

/* A group's hyper-parameters (tf_adam_hyper_default fills PyTorch's AdamW defaults). */
typedef struct tf_adam_hyper {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int decoupled;       /* 1: AdamW (decoupled weight decay); 0: Adam with L2 */
  int bias_correction; /* 1: on */
  /* How this group's moments are stored: -1 (tf_adam_hyper_default): the options' state_dtype;
   * else a tf_adam_options state_dtype value. Fixed at creation: tf_adam_set_hyper takes -1 or
   * the group's own value. */
  int state_dtype;
} tf_adam_hyper;

/* One parameter tensor on the device and the group it belongs to. */
typedef struct tf_adam_param {
  const char* name; /* may be NULL: a name is made up */
  void* param;      /* device pointer */
  const void* grad; /* same dtype and count; NULL: none yet (grads come with each
                     * tf_adam_step_on; tf_adam_step leaves the param alone). A device pointer,
                     * or host memory, which TF_ADAM_CPU mode reads in place; a param in host
                     * memory with param_on_host 0 (a CPU tensor) stepped without an overlap
                     * needs a host grad (it is its own master if fp32: 8 B of state) */
  tf_dtype dtype;
  size_t elements;
  size_t group; /* index into the hyper array given to tf_adam_create */
  /* 1: param is host memory (a cold weight's tier copy, e.g. a tf_scheduler buffer): the step
   * writes the update there directly, with no H2D (mode TF_ADAM_CPU only); 0: device memory. */
  int param_on_host;
} tf_adam_param;

typedef struct tf_adam_options {
  tf_adam_mode mode;
  /* 0: the default (1 Mi elements); clamped to the largest param's element count. */
  size_t chunk_elements;
  /* 0: the CPUs near the state; at most 4 x the hardware threads and at most 1024. */
  unsigned threads;
  double max_grad_norm; /* 0: no clipping; finite as a float */
  double loss_scale;    /* grads are divided by it; 1: none; it and 1/it finite as floats */
  /* Seconds a step waits for the work its grads come from before it gives up, the state as
   * before (see tf_adam_step); 0: forever; at most 1e6 (about 11.6 days). Start from
   * tf_adam_options_default, so that fields added later get their defaults. */
  double device_timeout_s;
  /* A placement spec, as TIERFLOW_PLACEMENT takes (e.g.
   * "optimizer_state=cxl,dram;master_params=dram"); NULL: TIERFLOW_PLACEMENT, else the defaults. */
  const char* placement;
  /* 0: none; 1: backward, tf_adam_grad_ready starts each param's update during the backward
   * pass (cpu mode; it costs a pre-update copy of the state, 12 B per element); 2:
   * backward_publish, as 1, and a param takes its new values as soon as its update is done
   * (stored, or sent up for a device param; the caller must not read or write it from
   * tf_adam_grad_ready until the step returns). */
  int overlap;
  /* How the Adam moments m and v are stored: 0 fp32 (the default, 8 B per param), 1 bf16
   * (4 B), 2 int8 (8-bit codes with a scale per block of 256: ~2 B; params under 4096 elements
   * keep fp32). The update runs in fp32 either way, in either mode (TF_ADAM_STREAMED sends the
   * moments over the link as stored; TF_ADAM_AUTO picks cpu). See docs/offload-adam.md. */
  int state_dtype;
  /* Where the fp32 master weights are kept: 0 a separate fp32 copy (the default; an fp32 param
   * in host memory is its own master); 1 remainder: a bf16 param in host memory holds the
   * master's high 16 bits (rounded to nearest, ties away from zero) and 16 bits beside it the
   * rest, exactly (2 B per param instead of 4). Needs the cpu step without an overlap and every
   * param bf16 or fp32 in host memory (fp32 ones keep an fp32 master); anything else is
   * refused at creation. */
  int master;
} tf_adam_options;

typedef struct tf_device tf_device;
typedef struct tf_adam tf_adam;

/* The calling thread's last error message ("" if none). */
const char* tf_last_error(void);
/* The library version, e.g. "0.1.0". */
const char* tf_version(void);
/* How this library was built, as one JSON object (static text, valid for the process):
 * {"version":"0.1.0","cuda":true,"cuda_runtime":"13.0"}; "cuda" is false and "cuda_runtime"
 * null in a build without the CUDA backend (tf_device_open("cuda") then fails). */
const char* tf_build_info_json(void);

void tf_adam_hyper_default(tf_adam_hyper* hyper);
void tf_adam_options_default(tf_adam_options* options);

/* Checks one group's hyper-parameters (named "group <group>" in the message; NULL: none) and
 * options (NULL: none) as tf_adam_create does, without making an optimizer: for a framework's
 * constructor, which refuses them before any param is known. TF_ERR_INVALID_ARGUMENT names the
 * first bad value ("group 1: invalid betas: beta2 must be in [0, 1), not 1"). */
tf_status tf_adam_check(const tf_adam_hyper* hyper, size_t group, const tf_adam_options* options);

/* spec: "auto", "cuda", "cuda:N" or "emulated" (NULL: "auto"). */
tf_status tf_device_open(const char* spec, tf_device** out);
/* Releases the handle. Optimizers and schedulers made on the device keep it alive until they
 * are destroyed, so the two may be destroyed in either order. */
void tf_device_destroy(tf_device* device);
/* The backend name: "cuda" or "emulated" (valid while the device lives). */
const char* tf_device_backend(const tf_device* device);
/* Device memory (0 bytes: *out NULL). Free it with tf_device_free on the same handle. */
tf_status tf_device_alloc(tf_device* device, size_t bytes, void** out);
/* Frees what tf_device_alloc on this handle gave, with the bytes it was given (NULL: nothing to
 * free). Anything else is refused with TF_ERR_INVALID_ARGUMENT and changes nothing, on every
 * backend: a pointer this handle did not allocate or that was freed already (the message says
 * so), or a size other than the one allocated (the message names both). */
tf_status tf_device_free(tf_device* device, void* pointer, size_t bytes);
/* A copy that has finished when the call returns. On the emulated device, a size larger than
 * the device's memory and the machine's, or a range past the end of the address space, is
 * refused (TF_ERR_INVALID_ARGUMENT) and nothing is copied. */
tf_status tf_device_copy(tf_device* device, void* dst, const void* src, size_t bytes,
                         tf_copy_kind kind);

/* params[i].group indexes hypers[0 .. groups-1]; every group needs a parameter. The device
 * must outlive the optimizer. The state is placed by TIERFLOW_PLACEMENT (or the defaults). */
tf_status tf_adam_create(tf_device* device, const tf_adam_param* params, size_t count,
                         const tf_adam_hyper* hypers, size_t groups, const tf_adam_options* options,
                         tf_adam** out);
void tf_adam_destroy(tf_adam* adam);
/* One step. applied (may be NULL): 1, or 0 when non-finite grads skipped it. grad_norm (may be
 * NULL): the global norm of the unscaled grads.
 * When a device operation fails (or times out) during the step it returns TF_ERR_DEVICE, and
 * *applied says what the state holds: 0, as before the step (call tf_adam_step again once the
 * fault is gone); 1, the step complete (do not repeat it); 2, half done (call tf_adam_step
 * again with the same grads: it completes that step). See docs/reliability.md. */
tf_status tf_adam_step(tf_adam* adam, int* applied, double* grad_norm);
/* Re-sends the device params when a failed call left them behind the master weights (no-op
 * otherwise); tf_adam_step does it by itself. *current (may be NULL): 1 when the device params
 * hold the master weights afterwards. */
tf_status tf_adam_sync_params(tf_adam* adam, int* current);
/* Sets the lr of every group. */
tf_status tf_adam_set_lr(tf_adam* adam, double lr);
tf_status tf_adam_set_hyper(tf_adam* adam, size_t group, const tf_adam_hyper* hyper);
tf_status tf_adam_step_count(const tf_adam* adam, size_t group, unsigned long long* out);
/* The mode in force: TF_ADAM_CPU or TF_ADAM_STREAMED. */
tf_status tf_adam_mode_in_force(const tf_adam* adam, tf_adam_mode* out);
/* The metrics as JSON into buffer (capacity bytes, NUL included); *needed (may be NULL) gets the
 * size it takes. TF_ERR_BUFFER_TOO_SMALL when it does not fit (buffer untouched). */
tf_status tf_adam_metrics_json(const tf_adam* adam, char* buffer, size_t capacity, size_t* needed);
tf_status tf_adam_save(const tf_adam* adam, const char* path);
/* Refuses (TF_ERR_INPUT) a truncated, corrupted or mismatched file; the state is then
 * untouched. */
tf_status tf_adam_load(tf_adam* adam, const char* path);
/* Copies parameter `index` (in the order given to tf_adam_create) of the fp32 master weights
 * into out (elements floats). */
tf_status tf_adam_master_weights(const tf_adam* adam, size_t index, float* out, size_t elements);

/* --- For frameworks (PyTorch's tierflow.torch binds these) ----------------------------------
 * Params are indexed in the order given to tf_adam_create. */

/* The number of params, and param `index`'s element count. */
tf_status tf_adam_param_count(const tf_adam* adam, size_t* out);
tf_status tf_adam_param_elements(const tf_adam* adam, size_t index, size_t* out);

/* A step ordered with the caller's own stream, over this step's grads.
 * grads: `count` pointers (count = the number of params): grads[i] is param i's grad for this
 *   step (a device pointer, same dtype and count as the param; frameworks reallocate grads
 *   between steps, so they are given anew each step), or NULL when param i has no grad this
 *   step: it is then left alone (its state, its step count and its device param unchanged, its
 *   grad not read), as torch.optim does for a param whose .grad is None. grads itself may be
 *   NULL: every param keeps the grad pointer it had.
 * stream: the caller's stream, as the backend names it: a cudaStream_t on a CUDA device (NULL
 *   is CUDA's default stream). The step's device work waits, on the device, for the work
 *   enqueued on it so far (the backward pass), and later work on it waits for the updated
 *   params; nothing synchronizes the whole device. On the emulated device it is ignored: the
 *   calling thread's work is done when it calls.
 * applied and grad_norm as for tf_adam_step. Refused (TF_ERR_INVALID_ARGUMENT, nothing
 * changed) when count is not the number of params; the grad pointers given are kept then. */
tf_status tf_adam_step_on(tf_adam* adam, const void* const* grads, size_t count, void* stream,
                          int* applied, double* grad_norm);

/* With options.overlap = 1 or 2: param `index`'s grad is final for the next step (a framework's
 * post-accumulate-grad hook calls it during the backward pass). grad: its device pointer (NULL:
 * the one it has). stream: the caller's stream, as in tf_adam_step_on: the grad's copy waits for
 * the work enqueued on it so far. Returns at once; the grad's copy, its share of the norm and its
 * update (as if no clipping applied) run on the optimizer's threads, and the next tf_adam_step*
 * finishes them and keeps each update or rolls it back: the result is bit for bit the plain
 * step's. A param not announced is handled by the step as usual. A no-op with overlap 0 or in
 * streamed mode. Thread-safe against other tf_adam_grad_ready calls on the optimizer, not
 * against its other calls. */
tf_status tf_adam_grad_ready(tf_adam* adam, size_t index, const void* grad, void* stream);
/* Forgets the grads announced by tf_adam_grad_ready since the last step (restoring what their
 * updates changed): the next step reads the grads it is given. For a framework's zero_grad
 * between the backward pass and the step; a no-op when none was announced. */
tf_status tf_adam_discard_grads(tf_adam* adam);
/* Where tf_adam_grad_ready's copies of the grads run. *copies: 1 when tf_adam_grad_ready copies
 * each announced grad into the optimizer's host memory (cpu mode, overlap 1 or 2), else 0 (the
 * step reads the grads itself). When 1, the next step reads an announced grad from that copy,
 * never from its memory again, so a framework may free the grad once the copy is done: *stream
 * gets the copy's stream, as the backend names it (a cudaStream_t: order the free after it, as
 * torch's Tensor.record_stream does), or NULL on the emulated device, whose copies run on its own
 * threads: keep the memory until the next tf_adam_step* returns. A step that fails forgets the
 * announcements: the step after it reads the grad pointers it is given, so give NULL (or a new
 * grad) for a freed one. */
tf_status tf_adam_grad_copy_stream(const tf_adam* adam, void** stream, int* copies);
/* Copies param `index`'s state into the caller's buffers (each `elements` floats; any may be
 * NULL: not copied): the fp32 master weights, exp_avg (m) and exp_avg_sq (v); *step (may be
 * NULL) gets the steps applied to this param. */
tf_status tf_adam_get_state(const tf_adam* adam, size_t index, float* master, float* exp_avg,
                            float* exp_avg_sq, size_t elements, unsigned long long* step);
/* Replaces param `index`'s state from the caller's buffers (any may be NULL: that part kept)
 * and its step count, as a framework's load_state_dict does. The device param is not written:
 * the next step writes it from the master weights (call tf_adam_sync_params to send it now).
 * Every value is checked first (elements must match; the moments finite, exp_avg_sq >= 0; step
 * at most 2^63 - 1, so that later steps cannot wrap the counter): a refused call changes
 * nothing. */
tf_status tf_adam_set_state(tf_adam* adam, size_t index, const float* master, const float* exp_avg,
                            const float* exp_avg_sq, size_t elements, unsigned long long step);
/* Re-reads param `index`'s master weights from its param (widening bf16/f16) where its values
 * differ from the master stored as its dtype, e.g. after the framework changed the param's
 * values outside the optimizer. A param in host memory stepped in cpu mode needs no call: each
 * step compares it with its master so (metrics: param_writes_adopted). */
tf_status tf_adam_refresh_master(tf_adam* adam, size_t index);
/* Where the state's pages are, as JSON into buffer (as tf_adam_metrics_json):
 * {"page_bytes":4096,"master_params":{"total_pages":N,"untouched_pages":N,"nodes":{"0":N,...}},
 *  "optimizer_state":{...}}, with "tier" names per node in "node_tiers":{"0":"dram",...}. */
tf_status tf_adam_where_json(const tf_adam* adam, char* buffer, size_t capacity, size_t* needed);

/* --- Streaming buffers through HBM: the prefetch scheduler ----------------------------------
 * A plan of steps, each using some buffers whose home is host tier memory; steps run in plan
 * order, the plan repeats, and each step's buffers are staged into HBM `window` steps ahead
 * (see prefetch_scheduler.hpp). A framework streams a model's cold weights with it: one step
 * per block in the forward pass, then one per block in reverse for the backward pass. */
typedef struct tf_scheduler tf_scheduler;

typedef struct tf_sched_buffer {
  const char* name; /* unique, for traces and errors (NULL: made up) */
  size_t bytes;     /* > 0 */
  /* Its tier copy: host memory that outlives the scheduler, or NULL: the scheduler allocates
   * it in a host tier (class `params` of the placement policy) and frees it at destroy; see
   * tf_scheduler_host_pointer. */
  void* data;
} tf_sched_buffer;

typedef struct tf_sched_step {
  const char* name;      /* NULL: made up */
  const size_t* buffers; /* indices into the buffers array: what the step uses */
  size_t count;          /* > 0 */
  int writes;            /* 1: it may change its buffers (written back after a dirty release) */
} tf_sched_step;

typedef struct tf_sched_options {
  unsigned long long hbm_budget_bytes; /* 0: the scheduler's default (default_hbm_budget) */
  unsigned long long window;           /* steps prefetched ahead (0: fetched at acquire) */
  int adaptive;                        /* 1: the window adapts to stalls, within the budget */
  int trace;                           /* 1: record a Perfetto trace (tf_scheduler_trace_json) */
  const char* placement;               /* as in tf_adam_options, for the buffers it allocates */
  /* 1 (default): the last steps of the plan prefetch the first ones of the next iteration; 0:
   * nothing of the next iteration is staged before its first acquire (for a caller that
   * changes the host copies between iterations, e.g. an optimizer step, or restarts). */
  int prefetch_across_iterations;
} tf_sched_options;

void tf_sched_options_default(tf_sched_options* options);

/* The device must outlive the scheduler. Refused (TF_ERR_INVALID_ARGUMENT) for an empty plan,
 * a buffer index out of range, a zero size, a budget below the largest step;
 * TF_ERR_OUT_OF_MEMORY when the tiers or the device cannot hold it. */
tf_status tf_scheduler_create(tf_device* device, const tf_sched_buffer* buffers,
                              size_t buffer_count, const tf_sched_step* steps, size_t step_count,
                              const tf_sched_options* options, tf_scheduler** out);
/* Waits for its device work, writes dirty buffers back, frees its HBM and what it allocated. */
void tf_scheduler_destroy(tf_scheduler* scheduler);
/* Buffer `buffer`'s tier copy (host memory; change it only between a flush and the next
 * acquire). */
tf_status tf_scheduler_host_pointer(const tf_scheduler* scheduler, size_t buffer, void** out);
/* Stages step `step` (steps go in plan order, wrapping; the first after create or restart may
 * be any) and gives its buffers' HBM pointers, in the step's order, into pointers[0 .. count-1]
 * (count = the step's buffer count). stream as in tf_adam_step_on: on CUDA the caller's stream
 * waits for the staging on the device; on the emulated device the call returns once the
 * buffers have landed, for the caller's thread reads them next. */
tf_status tf_scheduler_acquire(tf_scheduler* scheduler, size_t step, void* stream, void** pointers,
                               size_t count);
/* Ends step `step` once the work the caller enqueued on `stream` that uses its buffers is
 * done (on CUDA ordered on the device, not waited for); dirty: 1 when it wrote them. */
tf_status tf_scheduler_release(tf_scheduler* scheduler, size_t step, int dirty, void* stream);
/* Writes dirty buffers back, waits, and drops what was staged ahead: the tier copies are then
 * current, and the caller may change them before the next acquire. */
tf_status tf_scheduler_flush(tf_scheduler* scheduler);
/* tf_scheduler_flush, then the next acquire may name any step (a pass that ended early). */
tf_status tf_scheduler_restart(tf_scheduler* scheduler);
/* {"schema_version":N,"scheduler":{...}} (keys in docs/scheduler.md), and the trace. */
tf_status tf_scheduler_metrics_json(tf_scheduler* scheduler, char* buffer, size_t capacity,
                                    size_t* needed);
tf_status tf_scheduler_trace_json(tf_scheduler* scheduler, char* buffer, size_t capacity,
                                  size_t* needed);
/* Where its buffers' tier copies live: {"tiers":{"dram0":BYTES,...},"caller_bytes":N} (the
 * tier each allocation landed in, e.g. `cxl0` or `dram0:3+cxl0:1`; caller_bytes: the buffers
 * whose memory the caller gave). */
tf_status tf_scheduler_where_json(const tf_scheduler* scheduler, char* buffer, size_t capacity,
                                  size_t* needed);

/* --- The session: one object a trainer holds ------------------------------------------------
 * It discovers the topology and builds the placement once, holds the cold weights of a model in
 * blocks (their tier copies in a host tier) and streams them through HBM, forward over the
 * blocks and then backward over them in reverse, and makes the optimizer that updates them in
 * their tier copies. The optimizer never writes a tier copy the scheduler may still read: any
 * call on it that writes (tf_adam_step*, tf_adam_set_state, tf_adam_load, ...) first ends an
 * open pass; a grad announced during the backward pass is published early only once the pass
 * has reached its block. Drive a session from one thread (tf_adam_grad_ready on its optimizer
 * may come from others). See include/tierflow/session.hpp. */
typedef struct tf_session tf_session;

typedef struct tf_session_weight {
  const char* name; /* unique (NULL: made up) */
  size_t bytes;     /* > 0 */
  void* data;       /* its tier copy (host memory that outlives the session), or NULL: the session
                     * allocates it in a host tier (tf_session_weight_host) */
} tf_session_weight;

typedef struct tf_session_options {
  unsigned long long hbm_budget_bytes; /* 0: the scheduler's default */
  unsigned long long window;           /* blocks staged ahead */
  int adaptive;                        /* 1: the window adapts to stalls, within the budget */
  int trace;                           /* 1: record a Perfetto trace (tf_session_trace_json) */
  const char* placement;               /* as in tf_adam_options; NULL: TIERFLOW_PLACEMENT */
} tf_session_options;

void tf_session_options_default(tf_session_options* options);
/* Discovers the topology and builds the placement. The device lives as long as the session. */
tf_status tf_session_create(tf_device* device, const tf_session_options* options, tf_session** out);
/* Ends an open pass and frees what it holds; optimizers made in it keep it alive until they
 * are destroyed. */
void tf_session_destroy(tf_session* session);
/* The weight plan, once: weights[] lists the blocks' weights block after block; block_sizes[b]
 * is block b's count (> 0). Weight indices are positions in weights[]. */
tf_status tf_session_set_blocks(tf_session* session, const tf_session_weight* weights,
                                const size_t* block_sizes, size_t block_count);
/* Weight `weight`'s tier copy (host memory; read or write it only while no pass is open). */
tf_status tf_session_weight_host(const tf_session* session, size_t weight, void** out);
/* Stages block `block` (backward 0: the forward pass; 1: the backward pass), releasing the block
 * held, and gives its weights' HBM pointers in pointers[0 .. count-1] (count = its weights).
 * Blocks skipped go by in order; a block behind the pass starts a new one. stream as in
 * tf_scheduler_acquire. */
tf_status tf_session_acquire(tf_session* session, size_t block, int backward, void* stream,
                             void** pointers, size_t count);
/* Ends the block held once the work enqueued on `stream` is done (a no-op when none is held);
 * block 0's backward ends the pass. */
tf_status tf_session_release(tf_session* session, void* stream);
/* Ends the pass (a forward pass without backward, an exception halfway): nothing stays staged or
 * in flight. A no-op when no pass is open. */
tf_status tf_session_end_pass(tf_session* session);
/* {"schema_version":N,"scheduler":{...},"passes":N,"pass_open":0|1}. */
tf_status tf_session_metrics_json(tf_session* session, char* buffer, size_t capacity,
                                  size_t* needed);
tf_status tf_session_trace_json(tf_session* session, char* buffer, size_t capacity, size_t* needed);
/* Where the weights' tier copies live, as tf_scheduler_where_json. */
tf_status tf_session_where_json(const tf_session* session, char* buffer, size_t capacity,
                                size_t* needed);
/* weights[i] of tf_session_adam_create for a param that is not a session weight. */
#define TF_NO_WEIGHT ((size_t)-1)
/* An optimizer in the session: as tf_adam_create on the session's device and placement (the
 * options' placement is refused: the session's holds). weights (may be NULL: none) has `count`
 * entries: weights[i] is the session weight param i is (its tier copy is updated in place:
 * params[i].param and param_on_host are ignored), or TF_NO_WEIGHT. Destroy it with
 * tf_adam_destroy; it keeps the session alive. */
tf_status tf_session_adam_create(tf_session* session, const tf_adam_param* params, size_t count,
                                 const size_t* weights, const tf_adam_hyper* hypers, size_t groups,
                                 const tf_adam_options* options, tf_adam** out);

/* The machine's memory topology as JSON, discovered now: the document of `tierflow topo --json`
 * (docs/topology.md: tiers, nodes with has_cpu and kind, the initiator, gpus with cuda_index,
 * pci_bus_id and nearest_nodes). sysfs_root: NULL for the live machine (sysfs, hwloc, CUDA);
 * else the root of a sysfs tree to read instead (a captured one; no hwloc, no CUDA). */
tf_status tf_topology_json(const char* sysfs_root, char* buffer, size_t capacity, size_t* needed);

#ifdef __cplusplus
}
#endif

#endif /* TIERFLOW_TIERFLOW_H */
