/* The session's C ABI from C: weights in blocks that the session allocates, a training loop
 * of forward and backward passes through it, its optimizer over the weights by index, against
 * an optimizer made alone over host copies (param_on_host): the same bits. Plus refusals, the
 * metrics and the topology document. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_check.h"
#include "tierflow/tierflow.h"

enum { BLOCKS = 3, STEPS = 4 };

static float random_float(void) {
  return ((float)rand() / (float)RAND_MAX - 0.5f) * 2.0f + 0.01f;
}

static tf_adam_options cpu_options(void) {
  tf_adam_options o;
  tf_adam_options_default(&o);
  o.mode = TF_ADAM_CPU;
  o.chunk_elements = 700;
  o.threads = 2;
  return o;
}

int main(void) {
  uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)clock();
  printf("test_c_session: seed %llu\n", (unsigned long long)seed);
  srand((unsigned)seed);
  tf_device* dev = NULL;
  CHECK(tf_device_open("emulated", &dev) == TF_OK);
  if (dev == NULL) {
    return 1;
  }
  size_t elements[BLOCKS];
  tf_session_weight weights[BLOCKS];
  size_t block_sizes[BLOCKS];
  float* init[BLOCKS];
  float* reference[BLOCKS];
  float* grads[BLOCKS];
  for (int b = 0; b < BLOCKS; ++b) {
    elements[b] = 500 + (size_t)(rand() % 3000);
    weights[b].name = NULL;
    weights[b].bytes = elements[b] * sizeof(float);
    weights[b].data = NULL;
    block_sizes[b] = 1;
    init[b] = malloc(weights[b].bytes);
    reference[b] = malloc(weights[b].bytes);
    grads[b] = malloc(weights[b].bytes);  /* emulated device memory is host memory */
    for (size_t i = 0; i < elements[b]; ++i) {
      init[b][i] = random_float();
    }
    memcpy(reference[b], init[b], weights[b].bytes);
  }

  tf_session* s = NULL;
  CHECK(tf_session_create(NULL, NULL, &s) == TF_ERR_INVALID_ARGUMENT);
  tf_session_options so;
  tf_session_options_default(&so);
  CHECK(so.window == 2 && so.hbm_budget_bytes == 0 && so.trace == 0);
  so.trace = 1;
  CHECK(tf_session_create(dev, &so, &s) == TF_OK);
  size_t bad_sizes[2] = {1, 0};
  CHECK(tf_session_set_blocks(s, weights, bad_sizes, 2) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "block_sizes[1] is 0") != NULL);
  CHECK(tf_session_set_blocks(s, weights, block_sizes, BLOCKS) == TF_OK);
  for (int b = 0; b < BLOCKS; ++b) {
    void* host = NULL;
    CHECK(tf_session_weight_host(s, (size_t)b, &host) == TF_OK);
    if (host != NULL) {
      memcpy(host, init[b], weights[b].bytes);
    }
  }
  void* none = NULL;
  CHECK(tf_session_weight_host(s, BLOCKS, &none) == TF_ERR_INVALID_ARGUMENT);

  /* The session's optimizer over its weights by index; a plain one over the host copies. */
  tf_adam_param params[BLOCKS];
  size_t which[BLOCKS];
  tf_adam_param plain[BLOCKS];
  for (int b = 0; b < BLOCKS; ++b) {
    tf_adam_param p = {NULL, NULL, grads[b], TF_DTYPE_F32, elements[b], 0, 0};
    params[b] = p;
    which[b] = (size_t)b;
    tf_adam_param q = {NULL, reference[b], grads[b], TF_DTYPE_F32, elements[b], 0, 1};
    plain[b] = q;
  }
  tf_adam_hyper hyper;
  tf_adam_hyper_default(&hyper);
  hyper.lr = 1e-2;
  tf_adam_options o = cpu_options();
  tf_adam* adam = NULL;
  tf_adam* alone = NULL;
  o.placement = "optimizer_state=dram";
  CHECK(tf_session_adam_create(s, params, BLOCKS, which, &hyper, 1, &o, &adam) ==
        TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "the session's placement") != NULL);
  o.placement = NULL;
  which[1] = 7;
  CHECK(tf_session_adam_create(s, params, BLOCKS, which, &hyper, 1, &o, &adam) ==
        TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "weight 7 out of range") != NULL);
  which[1] = 1;
  CHECK(tf_session_adam_create(s, params, BLOCKS, which, &hyper, 1, &o, &adam) == TF_OK);
  CHECK(tf_adam_create(dev, plain, BLOCKS, &hyper, 1, &o, &alone) == TF_OK);

  void* staged[1];
  for (int step = 0; step < STEPS; ++step) {
    for (int b = 0; b < BLOCKS; ++b) {
      for (size_t i = 0; i < elements[b]; ++i) {
        grads[b][i] = random_float();
      }
    }
    for (int b = 0; b < BLOCKS; ++b) {
      CHECK(tf_session_acquire(s, (size_t)b, 0, NULL, staged, 1) == TF_OK);
      void* host = NULL;
      CHECK(tf_session_weight_host(s, (size_t)b, &host) == TF_OK);
      CHECK(staged[0] != NULL && memcmp(staged[0], host, weights[b].bytes) == 0);
    }
    CHECK(tf_session_acquire(s, 0, 0, NULL, staged, 2) == TF_ERR_INVALID_ARGUMENT);
    /* Step 1 skips the backward pass: the step must end the open pass itself. */
    for (int b = BLOCKS - 1; step != 1 && b >= 0; --b) {
      CHECK(tf_session_acquire(s, (size_t)b, 1, NULL, staged, 1) == TF_OK);
    }
    CHECK(tf_session_release(s, NULL) == TF_OK);
    int applied = 0;
    CHECK(tf_adam_step(adam, &applied, NULL) == TF_OK && applied == 1);
    CHECK(tf_adam_step(alone, &applied, NULL) == TF_OK && applied == 1);
  }
  for (int b = 0; b < BLOCKS; ++b) {
    void* host = NULL;
    CHECK(tf_session_weight_host(s, (size_t)b, &host) == TF_OK);
    CHECK(host != NULL && memcmp(host, reference[b], weights[b].bytes) == 0);
    CHECK(memcmp(reference[b], init[b], weights[b].bytes) != 0);
  }

  char small[8];
  size_t needed = 0;
  CHECK(tf_session_metrics_json(s, small, sizeof small, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  char* json = malloc(needed);
  CHECK(tf_session_metrics_json(s, json, needed, NULL) == TF_OK);
  CHECK(strstr(json, "\"passes\":4") != NULL);
  CHECK(strstr(json, "\"pass_open\":false") != NULL);
  free(json);
  CHECK(tf_session_where_json(s, small, sizeof small, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  CHECK(tf_session_trace_json(s, small, sizeof small, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > 100); /* a trace of the staging */
  CHECK(tf_topology_json(NULL, small, sizeof small, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  json = malloc(needed);
  CHECK(tf_topology_json(NULL, json, needed, NULL) == TF_OK);
  CHECK(strstr(json, "\"tiers\":[") != NULL && strstr(json, "\"initiator\":") != NULL);
  free(json);
  CHECK(tf_topology_json("/nonexistent-sysfs-root", small, sizeof small, NULL) == TF_ERR_INPUT);

  /* The session may go first: the optimizer made in it keeps it alive. */
  tf_session_destroy(s);
  int applied = 0;
  CHECK(tf_adam_step(adam, &applied, NULL) == TF_OK && applied == 1);
  tf_adam_destroy(adam);
  tf_adam_destroy(alone);
  CHECK(tf_session_end_pass(NULL) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_session_acquire(NULL, 0, 0, NULL, staged, 1) == TF_ERR_INVALID_ARGUMENT);
  tf_session_destroy(NULL);
  tf_device_destroy(dev);
  for (int b = 0; b < BLOCKS; ++b) {
    free(init[b]);
    free(reference[b]);
    free(grads[b]);
  }
  printf("test_c_session: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
