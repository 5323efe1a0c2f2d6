/* Fuzz target: arbitrary bytes as a device string for ab_parse_device.
 * Properties checked, beyond "no crash, no sanitizer report":
 *  - a refused string leaves *out untouched and gives a bounded message;
 *  - an accepted string names a known type and an id >= 0 or
 *    AB_DEVICE_AUTO, and printing that device back as "<type>:<id>" parses
 *    to the same device (the grammar round-trips).
 * Built with libFuzzer (make fuzz) or with regression_driver.c, which
 * replays tests/fuzz/corpus/device in ordinary CI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#include "arraybridge/arraybridge.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[256];
  if (size >= sizeof text) size = sizeof text - 1;
  memcpy(text, data, size);
  text[size] = '\0';

  DLDevice d = {(DLDeviceType)-7, -7};
  ab_status st = ab_parse_device(text, &d);
  if (st != AB_OK) {
    CHECK(st == AB_ERR_INVALID_ARGUMENT);
    CHECK(d.device_type == (DLDeviceType)-7 && d.device_id == -7);
    CHECK(strlen(ab_last_error()) < 200);
    return 0;
  }
  CHECK(strcmp(ab_device_type_name(d.device_type), "unknown") != 0);
  CHECK(d.device_id >= 0 || d.device_id == AB_DEVICE_AUTO);
  char again[64];
  if (d.device_id == AB_DEVICE_AUTO)
    snprintf(again, sizeof again, "%s:auto", ab_device_type_name(d.device_type));
  else
    snprintf(again, sizeof again, "%s:%d", ab_device_type_name(d.device_type), (int)d.device_id);
  DLDevice e;
  CHECK(ab_parse_device(again, &e) == AB_OK);
  CHECK(e.device_type == d.device_type && e.device_id == d.device_id);
  return 0;
}
