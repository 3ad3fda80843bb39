// One optimizer, two threads (docs/errors.md, tierflow.h "Threads"): a call made while another
// thread's call on the same optimizer is in progress is refused (busy_error, TF_ERR_BUSY)
// before it changes anything; never a deadlock or a crash. Tagged [busy]: the TSan build runs
// these.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "adam_harness.hpp"
#include "capi/capi_support.hpp"
#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/tierflow.h"

namespace tierflow {
namespace {

using test::adam_plan;
using test::adam_rig;
using namespace std::chrono_literals;

// --- through the C ABI -----------------------------------------------------------------------

// An optimizer over one random param on an emulated device, made through the C ABI. Two of
// one seed start from the same values and see the same (constant) grads.
class c_optimizer {
 public:
  c_optimizer(tf_device* dev, tf_adam_mode mode, std::uint64_t seed) : dev_(dev) {
    auto gen = std::mt19937_64(seed);
    dtype_ = test::uniform(gen, 0, 1) == 0 ? TF_DTYPE_F32 : TF_DTYPE_BF16;
    elements_ = test::uniform(gen, 700, 4000);
    const param_dtype dt = dtype_ == TF_DTYPE_F32 ? param_dtype::f32 : param_dtype::bf16;
    bytes_ = elements_ * dtype_bytes(dt);
    const auto values = test::encode_values(test::nonzero_normals(elements_, 1.0f, gen), dt);
    const auto grads = test::encode_values(test::nonzero_normals(elements_, 0.3f, gen), dt);
    REQUIRE(tf_device_alloc(dev_, bytes_, &param_) == TF_OK);
    REQUIRE(tf_device_alloc(dev_, bytes_, &grad_) == TF_OK);
    REQUIRE(tf_device_copy(dev_, param_, values.data(), bytes_, TF_COPY_H2D) == TF_OK);
    REQUIRE(tf_device_copy(dev_, grad_, grads.data(), bytes_, TF_COPY_H2D) == TF_OK);
    tf_adam_param p{};
    p.name = "w";
    p.param = param_;
    p.grad = grad_;
    p.dtype = dtype_;
    p.elements = elements_;
    tf_adam_hyper h;
    tf_adam_hyper_default(&h);
    h.lr = 0.01;
    tf_adam_options o;
    tf_adam_options_default(&o);
    o.mode = mode;
    o.chunk_elements = test::uniform(gen, 256, 1024);  // several chunks
    o.threads = 2;
    REQUIRE(tf_adam_create(dev_, &p, 1, &h, 1, &o, &adam_) == TF_OK);
  }
  c_optimizer(const c_optimizer&) = delete;
  c_optimizer& operator=(const c_optimizer&) = delete;
  ~c_optimizer() {
    tf_adam_destroy(adam_);
    (void)tf_device_free(dev_, param_, bytes_);
    (void)tf_device_free(dev_, grad_, bytes_);
  }

  [[nodiscard]] tf_adam* get() const { return adam_; }
  [[nodiscard]] std::string describe() const {
    return std::string(dtype_ == TF_DTYPE_F32 ? "f32" : "bf16") + " x " + std::to_string(elements_);
  }
  /** master, exp_avg and exp_avg_sq, one after the other. */
  [[nodiscard]] std::vector<float> state() const {
    std::vector<float> out(3 * elements_);
    REQUIRE(tf_adam_get_state(adam_, 0, out.data(), out.data() + elements_,
                              out.data() + 2 * elements_, elements_, nullptr) == TF_OK);
    return out;
  }
  [[nodiscard]] unsigned long long steps() const {
    unsigned long long n = 0;
    REQUIRE(tf_adam_step_count(adam_, 0, &n) == TF_OK);
    return n;
  }

 private:
  tf_device* dev_;
  tf_dtype dtype_ = TF_DTYPE_F32;
  std::size_t elements_ = 0;
  std::size_t bytes_ = 0;
  void* param_ = nullptr;
  void* grad_ = nullptr;
  tf_adam* adam_ = nullptr;
};

struct call_counts {
  std::atomic<unsigned> stepped{0};
  std::atomic<unsigned> refused{0};
  std::atomic<unsigned> other{0};  // any other status: a failure
  std::string first_other;         // written once, by the thread that saw it first
  std::atomic<bool> noted{false};

  void count(tf_status s, bool is_step) {
    if (s == TF_OK) {
      stepped += is_step ? 1 : 0;
    } else if (s == TF_ERR_BUSY) {
      ++refused;
      if (std::string(tf_last_error()).find("refused") == std::string::npos) {
        note("TF_ERR_BUSY without a refusal message: " + std::string(tf_last_error()));
      }
    } else {
      note("status " + std::to_string(s) + ": " + tf_last_error());
    }
  }
  void note(const std::string& what) {
    ++other;
    if (!noted.exchange(true)) {
      first_other = what;
    }
  }
};

TEST_CASE(
    "two threads calling one optimizer through the C ABI: each call runs or is refused with "
    "TF_ERR_BUSY, and the state is a reference's after as many steps",
    "[busy][capi]") {
  auto gen = test::rng(2201);
  tf_device* dev = nullptr;
  REQUIRE(tf_device_open("emulated", &dev) == TF_OK);
  for (tf_adam_mode mode : {TF_ADAM_CPU, TF_ADAM_STREAMED}) {
    const std::uint64_t seed = gen();
    c_optimizer shared(dev, mode, seed);
    INFO((mode == TF_ADAM_CPU ? "cpu, " : "streamed, ") << shared.describe());
    call_counts counts;
    constexpr int calls_per_thread = 12;
    // One thread only steps; the other mixes steps with reads and writes of the state.
    std::thread stepper([&] {
      for (int i = 0; i < calls_per_thread; ++i) {
        counts.count(tf_adam_step(shared.get(), nullptr, nullptr), true);
      }
    });
    std::thread mixer([&] {
      for (int i = 0; i < calls_per_thread; ++i) {
        unsigned long long steps = 0;
        char json[16384];
        switch (i % 4) {
          case 0:
            counts.count(tf_adam_step(shared.get(), nullptr, nullptr), true);
            break;
          case 1:
            counts.count(tf_adam_step_count(shared.get(), 0, &steps), false);
            break;
          case 2:
            counts.count(tf_adam_metrics_json(shared.get(), json, sizeof json, nullptr), false);
            break;
          default:
            counts.count(tf_adam_set_lr(shared.get(), 0.01), false);  // the lr it has
            break;
        }
      }
    });
    stepper.join();
    mixer.join();
    INFO("stepped " << counts.stepped << ", refused " << counts.refused << ", other "
                    << counts.other << " " << counts.first_other);
    CHECK(counts.other == 0);
    REQUIRE(counts.stepped > 0);
    CHECK(shared.steps() == counts.stepped);

    c_optimizer reference(dev, mode, seed);
    for (unsigned i = 0; i < counts.stepped; ++i) {
      REQUIRE(tf_adam_step(reference.get(), nullptr, nullptr) == TF_OK);
    }
    const auto got = shared.state();
    for (const float x : got) {
      REQUIRE(std::isfinite(x));
    }
    CHECK(got == reference.state());
  }
  tf_device_destroy(dev);
}

// Runs @p in_progress on another thread with stream @p stalled held up long enough that
// @p probe (called repeatedly from this thread until it reports busy) sees it in progress, then
// @p while_busy; returns once the other thread is done. The other thread retries its call
// while a probe holds the optimizer.
template <typename InProgress, typename Probe, typename WhileBusy>
void while_in_progress(emulated_faults& faults, stream& stalled, InProgress in_progress,
                       Probe probe, WhileBusy while_busy) {
  faults.delay_stream(stalled, 400ms);
  std::atomic<bool> done{false};
  std::thread other([&] {
    in_progress();
    done = true;
  });
  bool seen = false;
  while (!seen && !done) {
    seen = probe();
    if (!seen) {
      std::this_thread::sleep_for(1ms);
    }
  }
  REQUIRE(seen);  // the stall is far longer than the probe's period
  while_busy();
  other.join();
}

TEST_CASE(
    "a step in progress refuses another thread's calls with busy_error naming both calls, "
    "and they change nothing",
    "[busy]") {
  auto gen = test::rng(2202);
  const topology topo = topology::discover();
  auto policy = test::rig_placement(topo);
  for (adam_mode mode : {adam_mode::cpu, adam_mode::streamed}) {
    auto plan = test::device_params_plan(gen, mode, 3000);
    INFO(plan.describe());
    adam_rig rig(plan);
    adam_rig reference(plan);
    rig.build(policy);
    reference.build(policy);
    rig.set_grads(0);
    reference.set_grads(0);
    REQUIRE(reference.opt().step().applied);
    const auto lr = plan.hyper[0].lr;

    bool stepped = false;
    const auto step_once = [&] {
      for (;;) {
        try {
          stepped = rig.opt().step().applied;
          return;
        } catch (const busy_error&) {  // a probe held it: try again
          std::this_thread::sleep_for(1ms);
        }
      }
    };
    const auto probe = [&] {
      try {
        (void)rig.opt().step_count(0);
        return false;
      } catch (const busy_error&) {
        return true;
      }
    };
    const auto refused = [&] {
      try {
        (void)rig.opt().step();
        FAIL("a second step ran beside the first");
      } catch (const busy_error& e) {
        CHECK_THAT(e.what(), Catch::StartsWith("offload_adam::step: refused: offload_adam::step"));
        CHECK(e.call() == "offload_adam::step");
      }
      CHECK_THROWS_AS(rig.opt().set_lr(lr * 2), busy_error);
      CHECK_THROWS_AS(rig.opt().set_grad(0, 0, nullptr), busy_error);
      CHECK_THROWS_AS(rig.opt().load("/nonexistent.tfck"), busy_error);
      CHECK_THROWS_AS(rig.opt().master_weights(0, 0), busy_error);
      // What never changes is never refused.
      CHECK(rig.opt().group_count() == plan.groups.size());
      CHECK(rig.opt().mode() == mode);
    };
    while_in_progress(rig.dev(), rig.dev().compute_stream(), step_once, probe, refused);
    CHECK(stepped);
    CHECK(rig.opt().hyper(0).lr == lr);         // set_lr refused: unchanged
    CHECK(rig.opt().step_count(0) == 1);        // one step, not two
    REQUIRE(rig.state() == reference.state());  // the second step never ran
    REQUIRE(rig.params() == reference.params());
  }
}

TEST_CASE("a step in progress refuses another thread's tf_adam_* calls with TF_ERR_BUSY",
          "[busy][capi]") {
  auto gen = test::rng(2203);
  tf_device* dev = nullptr;
  REQUIRE(tf_device_open("emulated", &dev) == TF_OK);
  auto* faults = dynamic_cast<emulated_faults*>(dev->dev.get());
  REQUIRE(faults != nullptr);
  for (tf_adam_mode mode : {TF_ADAM_CPU, TF_ADAM_STREAMED}) {
    const std::uint64_t seed = gen();
    c_optimizer shared(dev, mode, seed);
    c_optimizer reference(dev, mode, seed);
    INFO((mode == TF_ADAM_CPU ? "cpu, " : "streamed, ") << shared.describe());
    REQUIRE(tf_adam_step(reference.get(), nullptr, nullptr) == TF_OK);
    const auto before = reference.state();

    tf_status first = TF_ERR_INTERNAL;
    const auto step_once = [&] {
      do {
        first = tf_adam_step(shared.get(), nullptr, nullptr);
      } while (first == TF_ERR_BUSY);
    };
    const auto probe = [&] {
      unsigned long long n = 0;
      return tf_adam_step_count(shared.get(), 0, &n) == TF_ERR_BUSY;
    };
    const auto refused = [&] {
      int applied = 7;
      CHECK(tf_adam_step(shared.get(), &applied, nullptr) == TF_ERR_BUSY);
      CHECK(applied == 7);  // the refused call wrote nothing
      CHECK_THAT(tf_last_error(), Catch::StartsWith("tf_adam_step: refused: tf_adam_step"));
      const float one = 1.0f;
      CHECK(tf_adam_set_state(shared.get(), 0, &one, nullptr, nullptr, 1, 0) == TF_ERR_BUSY);
      CHECK(tf_adam_save(shared.get(), "/nonexistent/x.tfck") == TF_ERR_BUSY);
      CHECK(tf_adam_grad_ready(shared.get(), 0, nullptr, nullptr) == TF_ERR_BUSY);
      size_t count = 0;
      CHECK(tf_adam_param_count(shared.get(), &count) == TF_OK);  // never refused
      CHECK(count == 1);
    };
    while_in_progress(*faults, dev->dev->compute_stream(), step_once, probe, refused);
    CHECK(first == TF_OK);
    CHECK(shared.steps() == 1);
    CHECK(shared.state() == before);
  }
  tf_device_destroy(dev);
}

}  // namespace
}  // namespace tierflow
