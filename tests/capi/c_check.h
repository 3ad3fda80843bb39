/* CHECK for the C ABI's C tests: counts a failed condition and prints it with the calling
 * thread's last tierflow error; each test returns 1 when `failures` is not 0. */
#ifndef TIERFLOW_TESTS_C_CHECK_H
#define TIERFLOW_TESTS_C_CHECK_H

#include <stdio.h>

#include "tierflow/tierflow.h"

static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              tf_last_error());                                                               \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

#endif /* TIERFLOW_TESTS_C_CHECK_H */
