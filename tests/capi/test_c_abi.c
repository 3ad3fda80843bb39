/* The C ABI from C: an optimizer over emulated device memory, stepped and checked against a
 * scalar AdamW written here; errors as codes with messages; metrics; save and load; device
 * memory misused (wrong sizes, double frees, foreign pointers, absurd copies). */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c_check.h"
#include "tierflow/tierflow.h"

static uint64_t rng_state;
static double uniform(void) { /* xorshift64*, in (0, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return ((double)((rng_state * 2685821657736338717ULL) >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
  return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

/* AdamW on one element, as tierflow's header states it (volatile: one rounding per op). */
static void reference(float* p, float* m, float* v, float grad, double lr, double b1, double b2,
                      double eps, double wd, unsigned long long t) {
  const float decay = (float)(1.0 - lr * wd);
  const float step = (float)(-(lr / (1.0 - pow(b1, (double)t))));
  const float bc2 = (float)sqrt(1.0 - pow(b2, (double)t));
  volatile float g = grad * 1.0f;
  volatile float pp = *p * decay;
  volatile float a = *m * (float)b1, b = (float)(1.0 - b1) * g;
  volatile float mm = a + b;
  volatile float c = *v * (float)b2, d = (float)(1.0 - b2) * g;
  volatile float e = d * g;
  volatile float vv = c + e;
  volatile float root = sqrtf(vv);
  volatile float denom = root / bc2 + (float)eps;
  volatile float num = step * mm;
  volatile float upd = num / denom;
  *p = pp + upd;
  *m = mm;
  *v = vv;
}

/* The largest block the device gives now, to the page: what a refused call must not change. */
static size_t largest_alloc(tf_device* dev) {
  size_t largest = 0;
  for (size_t step = SIZE_MAX / 2 + 1; step >= 4096; step /= 2) {
    void* p = NULL;
    if (largest <= SIZE_MAX - step && tf_device_alloc(dev, largest + step, &p) == TF_OK) {
      largest += step;
      CHECK(tf_device_free(dev, p, largest) == TF_OK);
    }
  }
  return largest;
}

/* tf_device_free frees what tf_device_alloc gave this device, with the size asked for: a wrong
 * size, a second free, a foreign pointer (host memory, an address inside an allocation, another
 * device's block) is refused with a message, and leaves the device as it was. */
static void device_memory_misuse(tf_device* dev) {
  const size_t before = largest_alloc(dev);
  CHECK(before >= ((size_t)1 << 30));
  const size_t bytes = 3 * 4096 + 100;
  void* p = NULL;
  CHECK(tf_device_alloc(dev, bytes, &p) == TF_OK && p != NULL);
  const size_t wrong[3] = {4096, bytes + 1, 64 * bytes}; /* fewer pages, the same, more */
  for (int i = 0; i < 3; ++i) {
    CHECK(tf_device_free(dev, p, wrong[i]) == TF_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tf_last_error(), "tf_device_free: ") != NULL);
    char sizes_named[96];
    snprintf(sizes_named, sizeof sizes_named, "allocated with %zu bytes, not %zu", bytes, wrong[i]);
    CHECK(strstr(tf_last_error(), sizes_named) != NULL);
  }
  CHECK(tf_device_free(dev, p, bytes) == TF_OK); /* still allocated: freed with its size */
  CHECK(tf_device_free(dev, p, bytes) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "not allocated by tf_device_alloc on this device") != NULL);
  CHECK(strstr(tf_last_error(), "freed already") != NULL);

  char* host = malloc(bytes);
  char on_stack[64];
  CHECK(tf_device_free(dev, host, bytes) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "not allocated by tf_device_alloc on this device") != NULL);
  CHECK(tf_device_free(dev, on_stack, sizeof on_stack) == TF_ERR_INVALID_ARGUMENT);
  free(host);
  void* q = NULL;
  CHECK(tf_device_alloc(dev, 4 * 4096, &q) == TF_OK && q != NULL);
  CHECK(tf_device_free(dev, (char*)q + 4096, 3 * 4096) == TF_ERR_INVALID_ARGUMENT);
  tf_device* other = NULL;
  void* theirs = NULL;
  CHECK(tf_device_open("emulated", &other) == TF_OK);
  CHECK(tf_device_alloc(other, 4096, &theirs) == TF_OK);
  CHECK(tf_device_free(dev, theirs, 4096) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_device_free(other, theirs, 4096) == TF_OK);
  tf_device_destroy(other);
  CHECK(tf_device_free(dev, q, 4 * 4096) == TF_OK);

  CHECK(tf_device_free(dev, NULL, 0) == TF_OK); /* NULL (a 0-byte alloc): nothing to free */
  CHECK(tf_device_free(dev, NULL, 100) == TF_OK);
  /* Nothing refused changed the device: it gives what it gave before, and no more. */
  CHECK(largest_alloc(dev) == before);
  void* big = NULL;
  CHECK(tf_device_alloc(dev, before, &big) == TF_OK);
  CHECK(tf_device_free(dev, big, before) == TF_OK);
  CHECK(tf_device_alloc(dev, before + 4096, &big) == TF_ERR_OUT_OF_MEMORY);
}

/* tf_build_info_json names this library's version, and says "cuda":false exactly when
 * tf_device_open("cuda") says the build lacks the CUDA backend. */
static void build_info(void) {
  const char* info = tf_build_info_json();
  printf("build: %s\n", info);
  char version[64];
  snprintf(version, sizeof version, "{\"version\":\"%s\",", tf_version());
  CHECK(strncmp(info, version, strlen(version)) == 0);
  const int cuda = strstr(info, "\"cuda\":true,\"cuda_runtime\":\"") != NULL;
  CHECK(cuda || strstr(info, "\"cuda\":false,\"cuda_runtime\":null}") != NULL);
  tf_device* dev = NULL;
  if (tf_device_open("cuda", &dev) == TF_OK) {
    CHECK(cuda);
    tf_device_destroy(dev);
  } else {
    CHECK((strstr(tf_last_error(), "built without the CUDA backend") == NULL) == cuda);
  }
}

/* A copy that outlives its limit is the failure under test (a refused copy returns at once). */
static void on_alarm(int sig) {
  (void)sig;
  static const char text[] = "test_c_abi: a tf_device_copy did not return (hung)\n";
  const ssize_t written = write(2, text, sizeof text - 1);
  (void)written;
  _exit(1);
}

/* Compressed moments (options.state_dtype, a group's hyper.state_dtype): bad values refused
 * by name, streamed mode refuses them, a group's dtype is fixed after creation, and an int8
 * optimizer holds less state than an fp32 one over the same params and steps alike. */
static size_t state_bytes_of(const tf_adam* adam) {
  char json[4096];
  size_t needed = 0;
  CHECK(tf_adam_metrics_json(adam, json, sizeof json, &needed) == TF_OK);
  const char* at = strstr(json, "\"state_bytes\":");
  CHECK(at != NULL);
  return at != NULL ? (size_t)strtoull(at + strlen("\"state_bytes\":"), NULL, 10) : 0;
}

static void compressed_state(tf_device* dev) {
  enum { N = 6000 };
  float* p[2];
  float* g = malloc(N * sizeof(float));
  for (int k = 0; k < 2; ++k) {
    p[k] = malloc(N * sizeof(float));
  }
  for (size_t e = 0; e < N; ++e) {
    p[0][e] = p[1][e] = normal();
    g[e] = 0.01f * normal();
  }
  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  CHECK(hyper.state_dtype == -1);
  tf_adam_options options;
  tf_adam_options_default(&options);
  CHECK(options.state_dtype == 0);
  options.mode = TF_ADAM_CPU;
  tf_adam* adam[2] = {NULL, NULL};
  tf_adam_param param = {"w", p[0], g, TF_DTYPE_F32, N, 0, 0};
  options.state_dtype = 3;
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[0]) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "options->state_dtype must be 0 (fp32), 1 (bf16) or 2 (int8)") !=
        NULL);
  options.state_dtype = 0;
  hyper.state_dtype = 7;
  CHECK(tf_adam_check(&hyper, 0, NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "state_dtype") != NULL);
  hyper.state_dtype = 2;
  options.mode = TF_ADAM_AUTO; /* picks cpu for int8 moments */
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[0]) == TF_OK);
  hyper.state_dtype = -1; /* the options' fp32 */
  param.param = p[1];
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[1]) == TF_OK);
  for (int step = 0; step < 3; ++step) {
    for (int k = 0; k < 2; ++k) {
      int applied = 0;
      CHECK(tf_adam_step(adam[k], &applied, NULL) == TF_OK && applied == 1);
    }
  }
  /* The same grads: int8 moments move the weights as fp32 ones do, within their precision.
   * 3 steps of lr 1e-3 move a weight by about 3e-3 either way (m / sqrt(v) is ~1 for a
   * constant grad, and int8's never larger than ~1.1 of it); a grad below 2^-17 of its block's
   * largest has m's code 0 and does not move (about 1 element in 60 000: at some seeds one of
   * these 6000), so every weight is within two such movements and nearly all within 3e-4. */
  double most = 0;
  size_t far = 0;
  for (size_t e = 0; e < N; ++e) {
    const double d = fabs((double)p[0][e] - p[1][e]);
    most = d > most ? d : most;
    far += d >= 3e-4 ? 1 : 0;
  }
  CHECK(most > 0 && most < 7e-3);
  CHECK(far <= N / 100);
  const size_t int8_bytes = state_bytes_of(adam[0]);
  const size_t fp32_bytes = state_bytes_of(adam[1]);
  CHECK(fp32_bytes == 2 * N * sizeof(float));             /* m and v; the param is its own master */
  CHECK(int8_bytes == 2 * N + 2 * 4 * ((N + 255) / 256)); /* codes and a scale per block */
  hyper.state_dtype = 0;
  CHECK(tf_adam_set_hyper(adam[0], 0, &hyper) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "fixed at creation") != NULL);
  hyper.state_dtype = -1;
  hyper.lr = 5e-4;
  CHECK(tf_adam_set_hyper(adam[0], 0, &hyper) == TF_OK);
  for (int k = 0; k < 2; ++k) {
    tf_adam_destroy(adam[k]);
    free(p[k]);
  }
  free(g);
}

/* bf16 host params with their master in 16 bits (options.master = 1) step as with a separate
 * fp32 master: the masters bit for bit, 2 B per param less state; refused with an overlap. */
static void master_remainder(tf_device* dev) {
  enum { N = 5000 };
  uint16_t* p[2];
  uint16_t* g = malloc(N * sizeof(uint16_t));
  for (int k = 0; k < 2; ++k) {
    p[k] = malloc(N * sizeof(uint16_t));
  }
  for (size_t e = 0; e < N; ++e) {
    float x = normal();
    float y = 0.01f * normal();
    uint32_t u;
    memcpy(&u, &x, 4);
    p[0][e] = p[1][e] = (uint16_t)(u >> 16);
    memcpy(&u, &y, 4);
    g[e] = (uint16_t)(u >> 16);
  }
  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  tf_adam_options options;
  tf_adam_options_default(&options);
  CHECK(options.master == 0);
  options.mode = TF_ADAM_CPU;
  tf_adam* adam[2] = {NULL, NULL};
  tf_adam_param param = {"w", p[0], g, TF_DTYPE_BF16, N, 0, 0};
  options.master = 2;
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[0]) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "options->master must be 0 (fp32) or 1 (remainder)") != NULL);
  options.master = 1;
  options.overlap = 1;
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[0]) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "remainder") != NULL);
  options.overlap = 0;
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[0]) == TF_OK);
  options.master = 0;
  param.param = p[1];
  CHECK(tf_adam_create(dev, &param, 1, &hyper, 1, &options, &adam[1]) == TF_OK);
  for (int step = 0; step < 3; ++step) {
    for (int k = 0; k < 2; ++k) {
      int applied = 0;
      CHECK(tf_adam_step(adam[k], &applied, NULL) == TF_OK && applied == 1);
    }
  }
  float* master[2];
  for (int k = 0; k < 2; ++k) {
    master[k] = malloc(N * sizeof(float));
    CHECK(tf_adam_master_weights(adam[k], 0, master[k], N) == TF_OK);
  }
  CHECK(memcmp(master[0], master[1], N * sizeof(float)) == 0);
  size_t moved = 0;
  for (size_t e = 0; e < N; ++e) {
    uint32_t u;
    memcpy(&u, &master[0][e], 4);
    moved += (u & 0xffffu) != 0 ? 1 : 0; /* the remainder holds bits a bf16 cannot */
    CHECK(p[0][e] == (uint16_t)((u + 0x8000u) >> 16));
  }
  CHECK(moved > N / 2);
  CHECK(state_bytes_of(adam[1]) - state_bytes_of(adam[0]) == 2 * N); /* 4 B -> 2 B of master */
  for (int k = 0; k < 2; ++k) {
    tf_adam_destroy(adam[k]);
    free(master[k]);
    free(p[k]);
  }
  free(g);
}

int main(int argc, char** argv) {
  const char* seed_text = getenv("TIERFLOW_TEST_SEED");
  rng_state =
      seed_text != NULL ? strtoull(seed_text, NULL, 10) : (uint64_t)time(NULL) * 2654435761u;
  if (rng_state == 0) {
    rng_state = 88172645463325252ULL;
  }
  printf("test_c_abi: random seed %llu (replay with TIERFLOW_TEST_SEED)\n",
         (unsigned long long)rng_state);
  const char* dir = argc > 1 ? argv[1] : ".";
  printf("tierflow %s\n", tf_version());
  build_info();

  tf_device* dev = NULL;
  CHECK(tf_device_open("no-such-backend", &dev) == TF_ERR_INPUT);
  CHECK(strstr(tf_last_error(), "no-such-backend") != NULL);
  CHECK(dev == NULL);
  CHECK(tf_device_open("emulated", NULL) == TF_ERR_INVALID_ARGUMENT);
  if (tf_device_open("emulated", &dev) != TF_OK) {
    fprintf(stderr, "cannot open the emulated device: %s\n", tf_last_error());
    return 1;
  }
  CHECK(strcmp(tf_device_backend(dev), "emulated") == 0);
  device_memory_misuse(dev);
  compressed_state(dev);
  master_remainder(dev);

  enum { N0 = 1500, N1 = 333, STEPS = 5 };
  const size_t sizes[2] = {N0, N1};
  float* host_p[2];
  float* ref_p[2];
  float* ref_m[2];
  float* ref_v[2];
  float* host_g[2];
  void* dev_p[2];
  void* dev_g[2];
  for (int i = 0; i < 2; ++i) {
    host_p[i] = malloc(sizes[i] * sizeof(float));
    host_g[i] = malloc(sizes[i] * sizeof(float));
    ref_p[i] = malloc(sizes[i] * sizeof(float));
    ref_m[i] = calloc(sizes[i], sizeof(float));
    ref_v[i] = calloc(sizes[i], sizeof(float));
    for (size_t e = 0; e < sizes[i]; ++e) {
      host_p[i][e] = ref_p[i][e] = normal();
    }
    CHECK(tf_device_alloc(dev, sizes[i] * sizeof(float), &dev_p[i]) == TF_OK);
    CHECK(tf_device_alloc(dev, sizes[i] * sizeof(float), &dev_g[i]) == TF_OK);
    CHECK(tf_device_copy(dev, dev_p[i], host_p[i], sizes[i] * sizeof(float), TF_COPY_H2D) == TF_OK);
  }
  /* A copy kind outside the enum (C lets any int through): refused, nothing copied. */
  CHECK(tf_device_copy(dev, dev_p[0], host_p[0], sizeof(float), (tf_copy_kind)7) ==
        TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "kind must be TF_COPY_H2D or TF_COPY_D2H") != NULL);
  /* A size no emulated device buffer can have: refused at once, nothing copied. */
  signal(SIGALRM, on_alarm);
  alarm(30);
  CHECK(tf_device_copy(dev, dev_p[0], host_p[0], SIZE_MAX, TF_COPY_H2D) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "tf_device_copy: ") != NULL);
  CHECK(strstr(tf_last_error(), "18446744073709551615 bytes") != NULL || SIZE_MAX != UINT64_MAX);
  CHECK(tf_device_copy(dev, host_p[0], dev_p[0], SIZE_MAX, TF_COPY_D2H) == TF_ERR_INVALID_ARGUMENT);
  alarm(0);

  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  hyper.lr = 2e-3;
  tf_adam_options options;
  tf_adam_options_default(&options);
  options.mode = TF_ADAM_CPU;
  options.chunk_elements = 256;
  options.overlap = 1; /* odd steps announce their grads with tf_adam_grad_ready */
  tf_adam_param params[2] = {
      {"w0", dev_p[0], dev_g[0], TF_DTYPE_F32, N0, 0, 0},
      {"w1", dev_p[1], dev_g[1], TF_DTYPE_F32, N1, 0, 0},
  };

  /* Bad arguments: a code, a message, no optimizer. */
  tf_adam* adam = NULL;
  tf_adam_hyper bad = hyper;
  bad.lr = -1;
  CHECK(tf_adam_create(dev, params, 2, &bad, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "lr must be") != NULL);
  CHECK(adam == NULL);
  options.device_timeout_s = -1;
  CHECK(tf_adam_create(dev, params, 2, &hyper, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "device_timeout_s") != NULL);
  CHECK(adam == NULL);
  options.device_timeout_s = 5;
  bad = hyper;
  bad.beta2 = 1.0;
  CHECK(tf_adam_create(dev, params, 2, &bad, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "beta2") != NULL);
  tf_adam_param null_param[1] = {{"x", NULL, dev_g[0], TF_DTYPE_F32, N0, 0, 0}};
  CHECK(tf_adam_create(dev, null_param, 1, &hyper, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "param pointer is null") != NULL);
  tf_adam_param wrong_group[1] = {{"x", dev_p[0], dev_g[0], TF_DTYPE_F32, N0, 3, 0}};
  CHECK(tf_adam_create(dev, wrong_group, 1, &hyper, 1, &options, &adam) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "group is 3") != NULL);
  CHECK(tf_adam_create(dev, params, 2, &hyper, 1, &options, NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_step(NULL, NULL, NULL) == TF_ERR_INVALID_ARGUMENT);

  CHECK(tf_adam_create(dev, params, 2, &hyper, 1, &options, &adam) == TF_OK);
  if (adam == NULL) {
    return 1;
  }
  tf_adam_mode mode = TF_ADAM_AUTO;
  CHECK(tf_adam_mode_in_force(adam, &mode) == TF_OK && mode == TF_ADAM_CPU);

  for (unsigned long long t = 1; t <= STEPS; ++t) {
    const double lr = hyper.lr * (1.0 - 0.1 * (double)t);
    CHECK(tf_adam_set_lr(adam, lr) == TF_OK);
    for (int i = 0; i < 2; ++i) {
      for (size_t e = 0; e < sizes[i]; ++e) {
        host_g[i][e] = 0.1f * normal();
        reference(&ref_p[i][e], &ref_m[i][e], &ref_v[i][e], host_g[i][e], lr, hyper.beta1,
                  hyper.beta2, hyper.eps, hyper.weight_decay, t);
      }
      CHECK(tf_device_copy(dev, dev_g[i], host_g[i], sizes[i] * sizeof(float), TF_COPY_H2D) ==
            TF_OK);
      if (t % 2 == 1) { /* as a backward pass would: each grad final in turn */
        CHECK(tf_adam_grad_ready(adam, (size_t)i, i == 0 ? NULL : dev_g[i], NULL) == TF_OK);
      }
    }
    int applied = 0;
    double norm = 0;
    CHECK(tf_adam_step(adam, &applied, &norm) == TF_OK);
    CHECK(applied == 1);
    CHECK(norm > 0);
  }
  unsigned long long count = 0;
  CHECK(tf_adam_step_count(adam, 0, &count) == TF_OK && count == STEPS);
  CHECK(tf_adam_grad_ready(adam, 2, NULL, NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "out of range") != NULL);
  CHECK(tf_adam_grad_ready(NULL, 0, NULL, NULL) == TF_ERR_INVALID_ARGUMENT);
  /* cpu mode with overlap: announced grads are copied; the emulated device names no stream. */
  void* copy_stream = &copy_stream;
  int copies = -1;
  CHECK(tf_adam_grad_copy_stream(adam, &copy_stream, &copies) == TF_OK);
  CHECK(copies == 1 && copy_stream == NULL);
  CHECK(tf_adam_grad_copy_stream(adam, NULL, &copies) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_discard_grads(NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_discard_grads(adam) == TF_OK); /* nothing announced: a no-op */
  int current = -1;
  CHECK(tf_adam_sync_params(adam, &current) == TF_OK && current == 1);
  CHECK(tf_adam_sync_params(NULL, &current) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_adam_set_lr(adam, -5) == TF_ERR_INVALID_ARGUMENT);

  /* The device params and the master weights equal the reference, bit for bit. */
  for (int i = 0; i < 2; ++i) {
    CHECK(tf_device_copy(dev, host_p[i], dev_p[i], sizes[i] * sizeof(float), TF_COPY_D2H) == TF_OK);
    CHECK(memcmp(host_p[i], ref_p[i], sizes[i] * sizeof(float)) == 0);
    float* master = malloc(sizes[i] * sizeof(float));
    CHECK(tf_adam_master_weights(adam, (size_t)i, master, sizes[i]) == TF_OK);
    CHECK(memcmp(master, ref_p[i], sizes[i] * sizeof(float)) == 0);
    CHECK(tf_adam_master_weights(adam, (size_t)i, master, sizes[i] + 1) == TF_ERR_INVALID_ARGUMENT);
    free(master);
  }

  /* A NaN grad skips the step. */
  host_g[1][(size_t)(uniform() * N1)] = NAN;
  CHECK(tf_device_copy(dev, dev_g[1], host_g[1], N1 * sizeof(float), TF_COPY_H2D) == TF_OK);
  int applied = 1;
  CHECK(tf_adam_step(adam, &applied, NULL) == TF_OK);
  CHECK(applied == 0);
  CHECK(strstr(tf_last_error(), "w1") != NULL);

  /* Metrics: too small a buffer says how much it needs. */
  size_t needed = 0;
  char tiny[4];
  CHECK(tf_adam_metrics_json(adam, tiny, sizeof tiny, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > sizeof tiny);
  char* json = malloc(needed);
  CHECK(tf_adam_metrics_json(adam, json, needed, NULL) == TF_OK);
  CHECK(strstr(json, "\"steps\":5") != NULL);
  CHECK(strstr(json, "\"skipped_steps\":1") != NULL);
  CHECK(strstr(json, "\"overlap\":\"backward\"") != NULL);
  CHECK(strstr(json, "\"speculative_steps\":0") == NULL); /* the odd steps speculated */
  free(json);

  /* Save, spoil the params, load: back to the saved state. */
  char path[4096];
  snprintf(path, sizeof path, "%s/c_abi_%llu.tfck", dir, (unsigned long long)(rng_state % 100000));
  CHECK(tf_adam_save(adam, path) == TF_OK);
  float* junk = malloc(N0 * sizeof(float));
  for (size_t e = 0; e < N0; ++e) {
    junk[e] = 1.0f;
  }
  CHECK(tf_device_copy(dev, dev_p[0], junk, N0 * sizeof(float), TF_COPY_H2D) == TF_OK);
  CHECK(tf_adam_load(adam, path) == TF_OK);
  CHECK(tf_device_copy(dev, junk, dev_p[0], N0 * sizeof(float), TF_COPY_D2H) == TF_OK);
  CHECK(memcmp(junk, ref_p[0], N0 * sizeof(float)) == 0);
  free(junk);
  CHECK(tf_adam_load(adam, "/nonexistent/x.tfck") == TF_ERR_INPUT);
  CHECK(strstr(tf_last_error(), "/nonexistent/x.tfck") != NULL);
  remove(path);

  /* The calls a framework makes: a step over this step's grads (w0 has none: left alone),
   * per-param state out and in, where the state is. */
  size_t count_params = 0, elements = 0;
  CHECK(tf_adam_param_count(adam, &count_params) == TF_OK && count_params == 2);
  CHECK(tf_adam_param_elements(adam, 1, &elements) == TF_OK && elements == N1);
  CHECK(tf_adam_param_elements(adam, 2, &elements) == TF_ERR_INVALID_ARGUMENT);
  for (size_t e = 0; e < N1; ++e) {
    host_g[1][e] = 0.1f * normal();
    reference(&ref_p[1][e], &ref_m[1][e], &ref_v[1][e], host_g[1][e], hyper.lr * 0.5, hyper.beta1,
              hyper.beta2, hyper.eps, hyper.weight_decay, STEPS + 1);
  }
  CHECK(tf_device_copy(dev, dev_g[1], host_g[1], N1 * sizeof(float), TF_COPY_H2D) == TF_OK);
  CHECK(tf_adam_set_lr(adam, hyper.lr * 0.5) == TF_OK);
  const void* grads[2] = {NULL, dev_g[1]};
  CHECK(tf_adam_step_on(adam, grads, 3, NULL, &applied, NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "count is 3, but the optimizer has 2 params") != NULL);
  CHECK(tf_adam_step_on(adam, grads, 2, NULL, &applied, NULL) == TF_OK && applied == 1);
  unsigned long long steps0 = 0, steps1 = 0;
  float* m1 = malloc(N1 * sizeof(float));
  float* v1 = malloc(N1 * sizeof(float));
  float* p1 = malloc(N1 * sizeof(float));
  CHECK(tf_adam_get_state(adam, 0, NULL, NULL, NULL, 0, &steps0) == TF_OK && steps0 == STEPS);
  CHECK(tf_adam_get_state(adam, 1, p1, m1, v1, N1, &steps1) == TF_OK && steps1 == STEPS + 1);
  CHECK(memcmp(p1, ref_p[1], N1 * sizeof(float)) == 0);
  CHECK(memcmp(m1, ref_m[1], N1 * sizeof(float)) == 0);
  CHECK(memcmp(v1, ref_v[1], N1 * sizeof(float)) == 0);
  CHECK(tf_adam_get_state(adam, 1, p1, NULL, NULL, N1 - 1, NULL) == TF_ERR_INVALID_ARGUMENT);
  /* w0 kept its params (it had no grad). */
  CHECK(tf_device_copy(dev, host_p[0], dev_p[0], N0 * sizeof(float), TF_COPY_D2H) == TF_OK);
  CHECK(memcmp(host_p[0], ref_p[0], N0 * sizeof(float)) == 0);
  /* State in: w1 takes new moments and step; a negative exp_avg_sq is refused first. */
  for (size_t e = 0; e < N1; ++e) {
    m1[e] = 0.01f * normal();
    v1[e] = 0.001f * fabsf(normal()) + 1e-6f;
  }
  v1[N1 / 2] = -1.0f;
  CHECK(tf_adam_set_state(adam, 1, NULL, m1, v1, N1, 3) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "exp_avg_sq[") != NULL);
  v1[N1 / 2] = 0.5f;
  CHECK(tf_adam_set_state(adam, 1, NULL, m1, v1, N1, 3) == TF_OK);
  float* back = malloc(N1 * sizeof(float));
  CHECK(tf_adam_get_state(adam, 1, NULL, NULL, back, N1, &steps1) == TF_OK && steps1 == 3);
  CHECK(memcmp(back, v1, N1 * sizeof(float)) == 0);
  /* A step count the next step would wrap (to 0: a bias correction of 1 - beta^0 = 0, NaN
   * weights) is refused before anything changes; 2^63 - 1 is the largest taken. */
  float* m_new = malloc(N1 * sizeof(float));
  for (size_t e = 0; e < N1; ++e) {
    m_new[e] = 1.0f;
  }
  const unsigned long long too_many[2] = {ULLONG_MAX, 1ULL << 63};
  for (int k = 0; k < 2; ++k) {
    CHECK(tf_adam_set_state(adam, 1, NULL, m_new, NULL, N1, too_many[k]) ==
          TF_ERR_INVALID_ARGUMENT);
    CHECK(strstr(tf_last_error(), "tf_adam_set_state: step ") != NULL);
    CHECK(strstr(tf_last_error(), "at most 9223372036854775807") != NULL);
    CHECK(tf_adam_get_state(adam, 1, NULL, back, NULL, N1, &steps1) == TF_OK && steps1 == 3);
    CHECK(memcmp(back, m1, N1 * sizeof(float)) == 0);
  }
  CHECK(tf_adam_set_state(adam, 1, NULL, NULL, NULL, N1, (1ULL << 63) - 1) == TF_OK);
  CHECK(tf_adam_get_state(adam, 1, NULL, NULL, NULL, 0, &steps1) == TF_OK &&
        steps1 == (1ULL << 63) - 1);
  CHECK(tf_adam_set_state(adam, 1, NULL, NULL, NULL, N1, 3) == TF_OK);
  free(m_new);
  /* refresh_master: the master takes the device values. */
  for (size_t e = 0; e < N1; ++e) {
    p1[e] = normal();
  }
  CHECK(tf_device_copy(dev, dev_p[1], p1, N1 * sizeof(float), TF_COPY_H2D) == TF_OK);
  CHECK(tf_adam_refresh_master(adam, 1) == TF_OK);
  CHECK(tf_adam_get_state(adam, 1, back, NULL, NULL, N1, NULL) == TF_OK);
  CHECK(memcmp(back, p1, N1 * sizeof(float)) == 0);
  free(back);
  free(m1);
  free(v1);
  free(p1);
  CHECK(tf_adam_where_json(adam, tiny, sizeof tiny, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  json = malloc(needed);
  CHECK(tf_adam_where_json(adam, json, needed, NULL) == TF_OK);
  CHECK(strstr(json, "\"master_params\":{\"total_pages\":") != NULL);
  CHECK(strstr(json, "\"node_tiers\":{") != NULL);
  free(json);

  tf_adam_destroy(adam);
  tf_adam_destroy(NULL);
  for (int i = 0; i < 2; ++i) {
    CHECK(tf_device_free(dev, dev_p[i], sizes[i] * sizeof(float)) == TF_OK);
    CHECK(tf_device_free(dev, dev_g[i], sizes[i] * sizeof(float)) == TF_OK);
    free(host_p[i]);
    free(host_g[i]);
    free(ref_p[i]);
    free(ref_m[i]);
    free(ref_v[i]);
  }
  tf_device_destroy(dev);
  tf_device_destroy(NULL);
  if (failures != 0) {
    fprintf(stderr, "test_c_abi: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_c_abi: all checks passed\n");
  return 0;
}
