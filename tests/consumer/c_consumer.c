/* A C program against the installed shared library (tierflow::shared, tierflow-c.pc): opens
 * the emulated device, copies through it and prints what it read back. */
#include <stdio.h>
#include <string.h>

#include "tierflow/tierflow.h"

int main(void) {
  tf_device* dev = NULL;
  if (tf_device_open("emulated", &dev) != TF_OK) {
    fprintf(stderr, "tf_device_open: %s\n", tf_last_error());
    return 1;
  }
  const char text[] = "tierflow-c";
  char back[sizeof text] = {0};
  void* d = NULL;
  if (tf_device_alloc(dev, sizeof text, &d) != TF_OK ||
      tf_device_copy(dev, d, text, sizeof text, TF_COPY_H2D) != TF_OK ||
      tf_device_copy(dev, back, d, sizeof text, TF_COPY_D2H) != TF_OK ||
      tf_device_free(dev, d, sizeof text) != TF_OK) {
    fprintf(stderr, "copy: %s\n", tf_last_error());
    tf_device_destroy(dev);
    return 1;
  }
  tf_device_destroy(dev);
  printf("%s %s\n", back, tf_version());
  return strcmp(back, text) == 0 ? 0 : 1;
}
