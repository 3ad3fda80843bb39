// The C ABI's optimizer options and steps (tf_adam_create + tf_adam_step / tf_adam_step_on):
// the input decodes into a tf_adam_options (every field, out-of-range, NaN and inf included),
// one or two groups' hyper-parameters, 1 to 3 small params (fp32 / bf16, at most 4096 elements,
// values from a seed in the input) and 1 to 3 steps' grads (non-finite values at chosen
// elements). The rules checked:
// - a refusal is a documented status (never TF_ERR_INTERNAL) with a one-line tf_last_error;
// - a step given a non-finite grad is skipped, and a skipped step leaves the master weights
//   as they were; a param given no grad (tf_adam_step_on) keeps its value;
// - an applied step leaves every param and master weight finite when the values cannot
//   overflow a float (lr and weight_decay <= 1, eps >= 1e-8, |param| <= 1e4, |grad| <= 1e6,
//   loss_scale >= 1e-3), and each device param holds its master weight in the param's dtype;
// - nothing crashes, leaks or trips a sanitizer.
// No input makes an optimizer with more than 2 threads: threads is decoded as 0, 1, 2 or a value
// above 1024 (always refused), so one input never spawns hundreds of threads.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "tierflow/tierflow.h"

namespace {

constexpr std::size_t max_elements = 4096;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

tf_device* the_device() {
  static tf_device* device = [] {
    tf_device* d = nullptr;
    if (tf_device_open("emulated", &d) != TF_OK) {
      std::abort();
    }
    return d;
  }();
  return device;
}

std::uint16_t to_bf16(float f) {  // round to nearest even (finite inputs only)
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t{h} << 16;
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A double from the input: mostly in [lo, hi] (also what an exhausted input gives), else one of
// the values that break naive checks.
double pick_double(FuzzedDataProvider& in, double lo, double hi) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 1:
      return nan;
    case 2:
      return inf;
    case 3:
      return -inf;
    case 4:
      return 0.0;
    case 5:
      return -1.0;
    case 6:
      return 1e-300;  // finite in double, 0 as a float
    case 7:
      return 1e39;  // finite in double, inf as a float
    case 8:
      return 1e300;
    case 9: {
      const auto bits = in.ConsumeIntegral<std::uint64_t>();
      double d = 0;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    case 10:
      return hi;
    case 11:
      return std::nextafter(hi, inf);
    default:
      return in.ConsumeFloatingPointInRange<double>(lo, hi);
  }
}

struct rng {  // splitmix64: the values of params and grads, from a seed in the input
  std::uint64_t s;
  double uniform() {  // in [-1, 1)
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
  }
};

tf_adam_options decode_options(FuzzedDataProvider& in, bool& sane) {
  tf_adam_options o;
  tf_adam_options_default(&o);
  const int mode = in.ConsumeIntegralInRange<int>(0, 4);
  o.mode = static_cast<tf_adam_mode>(mode <= 2 ? mode : mode == 3 ? -1 : in.ConsumeIntegral<int>());
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 1:
      o.chunk_elements = in.ConsumeIntegralInRange<std::size_t>(1, max_elements);
      break;
    case 2:
      o.chunk_elements = std::numeric_limits<std::size_t>::max();
      break;
    case 3:
      o.chunk_elements = (std::size_t{1} << 62) + in.ConsumeIntegral<std::uint8_t>();
      break;
    case 4:
      o.chunk_elements = in.ConsumeIntegral<std::size_t>();
      break;
    case 5:
      o.chunk_elements = 1;
      break;
    default:
      o.chunk_elements = 0;  // the default
  }
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 1:
      o.threads = 2;
      break;
    case 2:
      o.threads = 0;  // the CPUs near the state
      break;
    case 3:
      o.threads = std::numeric_limits<unsigned>::max();
      break;
    case 4:  // above every cap (at most 1024): refused, never started
      o.threads = in.ConsumeIntegralInRange<unsigned>(1025, std::numeric_limits<unsigned>::max());
      break;
    default:
      o.threads = 1;
  }
  o.max_grad_norm = pick_double(in, 0, 10);
  o.loss_scale = pick_double(in, 1, 65536);
  sane = sane && o.loss_scale >= 1e-3;
  o.device_timeout_s = pick_double(in, 0, 100);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 1:
      o.placement = "optimizer_state=dram;master_params=dram";
      break;
    case 2:
      o.placement = "optimizer_state=cxl,dram";
      break;
    case 3:
      o.placement = "optimizer_state=nowhere";
      break;
    default:
      o.placement = nullptr;
  }
  const int overlap = in.ConsumeIntegralInRange<int>(0, 3);
  o.overlap = overlap <= 1 ? overlap : overlap == 2 ? -1 : in.ConsumeIntegral<int>();
  return o;
}

tf_adam_hyper decode_hyper(FuzzedDataProvider& in, bool& sane) {
  tf_adam_hyper h;
  tf_adam_hyper_default(&h);
  h.lr = pick_double(in, 0, 1);
  h.beta1 = pick_double(in, 0, 0.999);
  h.beta2 = pick_double(in, 0, 0.9999);
  h.eps = pick_double(in, 1e-8, 1e-3);
  h.weight_decay = pick_double(in, 0, 1);
  h.decoupled = in.ConsumeIntegralInRange<int>(0, 7) == 7 ? in.ConsumeIntegral<int>() : 1;
  h.bias_correction = in.ConsumeBool() ? 0 : 1;
  sane = sane && h.lr <= 1 && h.eps >= 1e-8 && h.weight_decay <= 1;
  return h;
}

struct param_buffers {
  tf_dtype dtype = TF_DTYPE_F32;
  std::size_t elements = 0;
  void* param = nullptr;
  void* grad_alloc = nullptr;  // its grad buffer
  void* grad = nullptr;        // the grad the optimizer holds now: grad_alloc or NULL
  std::size_t bytes() const { return elements * (dtype == TF_DTYPE_BF16 ? 2 : 4); }
  float value(const void* base, std::size_t i) const {
    if (dtype == TF_DTYPE_BF16) {
      return from_bf16(static_cast<const std::uint16_t*>(base)[i]);
    }
    return static_cast<const float*>(base)[i];
  }
  void set(void* base, std::size_t i, float v) const {
    if (dtype == TF_DTYPE_BF16) {
      static_cast<std::uint16_t*>(base)[i] =
          std::isfinite(v) ? to_bf16(v) : (std::isnan(v) ? 0x7fc0 : (v > 0 ? 0x7f80 : 0xff80));
    } else {
      static_cast<float*>(base)[i] = v;
    }
  }
};

// One step's grads: seeded values at a scale, then up to 3 chosen elements set to a special
// value. Returns whether every grad is finite; @p sane becomes false for grads beyond 1e6.
bool fill_grads(FuzzedDataProvider& in, std::vector<param_buffers>& ps, bool& sane) {
  static constexpr double scales[] = {1.0, 1e-3, 1e6, 1e-40, 1e30, 3e38};
  const double scale = scales[in.ConsumeIntegralInRange<int>(0, 5)];
  sane = sane && scale <= 1e6;
  rng r{in.ConsumeIntegral<std::uint64_t>()};
  for (auto& p : ps) {
    if (p.grad == nullptr) {
      continue;
    }
    for (std::size_t i = 0; i < p.elements; ++i) {
      const float v = static_cast<float>(scale * r.uniform());
      p.set(p.grad, i, v);
    }
  }
  static constexpr float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       1e38f,
                                       -0.0f,
                                       std::numeric_limits<float>::denorm_min()};
  for (int k = in.ConsumeIntegralInRange<int>(0, 3); k > 0; --k) {
    auto& p = ps[in.ConsumeIntegralInRange<std::size_t>(0, ps.size() - 1)];
    const std::size_t at = in.ConsumeIntegralInRange<std::size_t>(0, p.elements - 1);
    const float v = specials[in.ConsumeIntegralInRange<int>(0, 5)];
    if (p.grad != nullptr) {
      p.set(p.grad, at, v);
      sane = sane && std::fabs(v) <= 1e6f;
    }
  }
  // Judged once every value is written: a later special may overwrite an earlier one.
  bool finite = true;
  for (const auto& p : ps) {
    for (std::size_t i = 0; p.grad != nullptr && i < p.elements; ++i) {
      finite = finite && std::isfinite(p.value(p.grad, i));
    }
  }
  return finite;
}

void check_refusal(tf_status status) {
  const char* message = tf_last_error();
  if (status == TF_ERR_INTERNAL || status < TF_OK || status > TF_ERR_INTERNAL ||
      message == nullptr || message[0] == '\0' || std::strchr(message, '\n') != nullptr) {
    std::abort();  // an undocumented failure, or no clear one-line message
  }
}

std::vector<float> masters(tf_adam* adam, const std::vector<param_buffers>& ps) {
  std::vector<float> all;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    std::vector<float> m(ps[i].elements);
    if (tf_adam_master_weights(adam, i, m.data(), m.size()) != TF_OK) {
      std::abort();
    }
    all.insert(all.end(), m.begin(), m.end());
  }
  return all;
}

// After an applied step: params and master weights finite, and each device param is its master
// weight in the param's dtype.
void check_applied(tf_adam* adam, const std::vector<param_buffers>& ps) {
  std::size_t at = 0;
  const std::vector<float> m = masters(adam, ps);
  for (const auto& p : ps) {
    for (std::size_t i = 0; i < p.elements; ++i, ++at) {
      const float v = p.value(p.param, i);
      const float want = p.dtype == TF_DTYPE_BF16 ? from_bf16(to_bf16(m[at])) : m[at];
      if (!std::isfinite(v) || !std::isfinite(m[at]) || v != want) {
        std::abort();
      }
    }
  }
}

// Steps @p adam up to 3 times with grads from the input, checking each result.
void run_steps(FuzzedDataProvider& in, tf_adam* adam, std::vector<param_buffers>& ps, bool sane) {
  const int steps = in.ConsumeIntegralInRange<int>(1, 3);
  for (int s = 0; s < steps; ++s) {
    // A step with grads beyond 1e6 can leave the moments inf (g^2 overflows a float): every
    // later step is judged as not sane either.
    // tf_adam_step_on gives each param's grad anew (some NULL: none this step, nor later).
    const bool on = in.ConsumeIntegralInRange<int>(0, 3) == 3;
    std::vector<const void*> grads(ps.size());
    std::vector<std::vector<unsigned char>> before(ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (on) {
        ps[i].grad = in.ConsumeBool() ? nullptr : ps[i].grad_alloc;
      }
      grads[i] = ps[i].grad;
      const auto* bytes = static_cast<const unsigned char*>(ps[i].param);
      before[i].assign(bytes, bytes + ps[i].bytes());
    }
    const bool finite = fill_grads(in, ps, sane);
    const std::vector<float> master_before = masters(adam, ps);
    int applied = -1;
    double norm = 0;
    const tf_status st =
        on ? tf_adam_step_on(adam, grads.data(), grads.size(), nullptr, &applied, &norm)
           : tf_adam_step(adam, &applied, &norm);
    if (st != TF_OK) {
      check_refusal(st);
      return;  // a refused or failed step (a timeout): the optimizer is destroyed next
    }
    if (applied != 0 && applied != 1) {
      std::abort();
    }
    const std::vector<float> master_after = masters(adam, ps);
    if (applied == 0 && std::memcmp(master_after.data(), master_before.data(),
                                    master_before.size() * sizeof(float)) != 0) {
      std::abort();  // a skipped step changed the state
    }
    if (!finite && applied == 1) {
      std::abort();  // a non-finite grad was applied
    }
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].grad == nullptr && std::memcmp(before[i].data(), ps[i].param, ps[i].bytes()) != 0) {
        std::abort();  // a param with no grad this step was changed
      }
    }
    if (applied == 1 && sane) {
      check_applied(adam, ps);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A fast link with no latency: the fuzzer is after the checks, not the timing.
  setenv("TIERFLOW_EMU_LINK", "h2d=100GB/s,d2h=100GB/s,latency=0us", 1);
  setenv("TIERFLOW_LOG", "error", 1);
  unsetenv("TIERFLOW_PLACEMENT");
  unsetenv("TIERFLOW_CONFIG");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  bool sane = true;
  const tf_adam_options options = decode_options(in, sane);
  const std::size_t groups = in.ConsumeIntegralInRange<std::size_t>(1, 2);
  std::vector<tf_adam_hyper> hypers;
  for (std::size_t g = 0; g < groups; ++g) {
    hypers.push_back(decode_hyper(in, sane));
  }
  tf_device* dev = the_device();
  std::vector<param_buffers> ps(in.ConsumeIntegralInRange<std::size_t>(1, 3));
  std::vector<tf_adam_param> descs;
  static constexpr double param_scales[] = {1.0, 1e-3, 1e3, 1e4};
  const double param_scale = param_scales[in.ConsumeIntegralInRange<int>(0, 3)];
  rng r{in.ConsumeIntegral<std::uint64_t>()};
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto& p = ps[i];
    p.dtype = in.ConsumeBool() ? TF_DTYPE_BF16 : TF_DTYPE_F32;
    p.elements = in.ConsumeIntegralInRange<std::size_t>(1, max_elements);
    if (tf_device_alloc(dev, p.bytes(), &p.param) != TF_OK ||
        tf_device_alloc(dev, p.bytes(), &p.grad_alloc) != TF_OK) {
      std::abort();
    }
    p.grad = p.grad_alloc;
    for (std::size_t e = 0; e < p.elements; ++e) {
      p.set(p.param, e, static_cast<float>(param_scale * r.uniform()));
      p.set(p.grad, e, 0.0f);
    }
    tf_adam_param d{};
    d.name = in.ConsumeBool() ? nullptr : (i == 0 ? "w" : i == 1 ? "b" : "");
    d.param = p.param;
    d.grad = p.grad;
    d.dtype = p.dtype;
    d.elements = p.elements;
    d.group = in.ConsumeIntegralInRange<std::size_t>(0, 7) == 7 ? groups : i % groups;
    d.param_on_host = in.ConsumeIntegralInRange<int>(0, 7) == 7 ? 1 : 0;
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {  // rarely: a bad descriptor
      case 13:
        d.dtype = static_cast<tf_dtype>(in.ConsumeIntegral<int>());
        break;
      case 14:
        d.elements = 0;
        break;
      case 15:
        d.grad = nullptr;  // none yet: grads come with tf_adam_step_on
        p.grad = nullptr;
        break;
      default:
        break;
    }
    descs.push_back(d);
  }
  tf_adam* adam = nullptr;
  const tf_status st =
      tf_adam_create(dev, descs.data(), descs.size(), hypers.data(), groups, &options, &adam);
  if (st != TF_OK) {
    check_refusal(st);
    if (adam != nullptr) {
      std::abort();  // a refusal returns no object
    }
  } else {
    run_steps(in, adam, ps, sane);
    tf_adam_destroy(adam);
  }
  for (const auto& p : ps) {
    (void)tf_device_free(dev, p.param, p.bytes());
    (void)tf_device_free(dev, p.grad_alloc, p.bytes());
  }
  return 0;
}
