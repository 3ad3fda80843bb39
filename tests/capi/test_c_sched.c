/* The prefetch scheduler's C ABI from C: buffers the scheduler allocates in a host tier, a
 * forward-then-backward plan over them streamed through the emulated device, a step that
 * writes its buffer back, out-of-order refusals, restart, and the metrics. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_check.h"
#include "tierflow/tierflow.h"

enum { BLOCKS = 4, STEPS = 2 * BLOCKS };

int main(void) {
  uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)clock();
  printf("test_c_sched: seed %llu\n", (unsigned long long)seed);
  srand((unsigned)seed);
  tf_device* dev = NULL;
  CHECK(tf_device_open("emulated", &dev) == TF_OK);
  if (dev == NULL) {
    return 1;
  }
  tf_sched_buffer buffers[BLOCKS];
  size_t sizes[BLOCKS];
  char names[BLOCKS][16];
  for (int b = 0; b < BLOCKS; ++b) {
    sizes[b] = 1000 + (size_t)(rand() % 5000);
    snprintf(names[b], sizeof names[b], "block%d", b);
    buffers[b].name = names[b];
    buffers[b].bytes = sizes[b];
    buffers[b].data = NULL; /* the scheduler allocates it */
  }
  /* Forward 0..3, then backward 3..0; the last backward step writes its buffer. */
  size_t uses[STEPS];
  tf_sched_step steps[STEPS];
  for (int k = 0; k < STEPS; ++k) {
    uses[k] = (size_t)(k < BLOCKS ? k : STEPS - 1 - k);
    steps[k].name = NULL;
    steps[k].buffers = &uses[k];
    steps[k].count = 1;
    steps[k].writes = k == STEPS - 1;
  }
  tf_sched_options options;
  tf_sched_options_default(&options);
  CHECK(options.prefetch_across_iterations == 1);
  options.window = 2;
  tf_scheduler* s = NULL;

  size_t bad_use = BLOCKS;
  tf_sched_step bad = {"bad", &bad_use, 1, 0};
  CHECK(tf_scheduler_create(dev, buffers, BLOCKS, &bad, 1, &options, &s) ==
        TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "steps[0].buffers[0] is 4, but there are 4 buffers") != NULL);
  CHECK(s == NULL);
  options.hbm_budget_bytes = 16;
  CHECK(tf_scheduler_create(dev, buffers, BLOCKS, steps, STEPS, &options, &s) ==
        TF_ERR_INVALID_ARGUMENT);
  options.hbm_budget_bytes = 0;
  CHECK(tf_scheduler_create(dev, buffers, BLOCKS, steps, STEPS, &options, &s) == TF_OK);
  if (s == NULL) {
    return 1;
  }
  unsigned char* host[BLOCKS];
  unsigned char* expect[BLOCKS]; /* what each buffer holds, wherever it is */
  for (int b = 0; b < BLOCKS; ++b) {
    void* p = NULL;
    CHECK(tf_scheduler_host_pointer(s, (size_t)b, &p) == TF_OK && p != NULL);
    host[b] = p;
    expect[b] = malloc(sizes[b]);
    for (size_t i = 0; i < sizes[b]; ++i) {
      host[b][i] = expect[b][i] = (unsigned char)(rand() | 1);
    }
  }
  CHECK(tf_scheduler_host_pointer(s, BLOCKS, (void**)&host[0]) == TF_ERR_INVALID_ARGUMENT);

  for (int iteration = 0; iteration < 3; ++iteration) {
    for (int k = 0; k < STEPS; ++k) {
      void* staged = NULL;
      CHECK(tf_scheduler_acquire(s, (size_t)k, NULL, &staged, 1) == TF_OK);
      const int b = (int)uses[k];
      CHECK(staged != NULL && memcmp(staged, expect[b], sizes[b]) == 0);
      if (k == STEPS - 1) {
        ((unsigned char*)staged)[iteration] ^= 0x5a; /* the step changes its buffer */
        expect[b][iteration] ^= 0x5a;
      }
      CHECK(tf_scheduler_release(s, (size_t)k, k == STEPS - 1, NULL) == TF_OK);
    }
  }
  CHECK(tf_scheduler_flush(s) == TF_OK);
  /* The write-back landed: block 0's tier copy holds the three changes. */
  for (int b = 0; b < BLOCKS; ++b) {
    CHECK(memcmp(host[b], expect[b], sizes[b]) == 0);
  }
  void* staged = NULL;
  CHECK(tf_scheduler_acquire(s, 3, NULL, &staged, 1) == TF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tf_last_error(), "out of order") != NULL);
  CHECK(tf_scheduler_acquire(s, 0, NULL, &staged, 2) == TF_ERR_INVALID_ARGUMENT);
  CHECK(tf_scheduler_restart(s) == TF_OK);
  CHECK(tf_scheduler_acquire(s, 2, NULL, &staged, 1) == TF_OK); /* any step after restart */
  CHECK(memcmp(staged, host[2], sizes[2]) == 0);
  CHECK(tf_scheduler_release(s, 2, 0, NULL) == TF_OK);
  CHECK(tf_scheduler_restart(s) == TF_OK);

  size_t needed = 0;
  CHECK(tf_scheduler_metrics_json(s, NULL, 0, &needed) == TF_ERR_BUFFER_TOO_SMALL);
  char* json = malloc(needed);
  CHECK(tf_scheduler_metrics_json(s, json, needed, NULL) == TF_OK);
  CHECK(strstr(json, "\"bytes_in\":") != NULL);
  CHECK(strstr(json, "\"hbm_staging_peak_bytes\":") != NULL);
  free(json);

  tf_scheduler_destroy(s);
  tf_scheduler_destroy(NULL);
  for (int b = 0; b < BLOCKS; ++b) {
    free(expect[b]);
  }
  tf_device_destroy(dev);
  if (failures != 0) {
    fprintf(stderr, "test_c_sched: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_c_sched: all checks passed\n");
  return 0;
}
