/* src/xfer/engines.c: the table of engines (see engines.h). A new engine
 * is one file that fills a st__xfer_engine_t, and one row here. */
#include "xfer/engines.h"

#include <string.h>

const st__xfer_engine_t *const st__xfer_engines[] = {&st__xfer_ucx_engine,
                                                     &st__xfer_nccl_engine};
const size_t st__xfer_engine_count = sizeof st__xfer_engines / sizeof st__xfer_engines[0];

const st__xfer_engine_t *st__xfer_engine(const char *name) {
  for (size_t i = 0; name && i < st__xfer_engine_count; i++)
    if (strcmp(st__xfer_engines[i]->name, name) == 0) return st__xfer_engines[i];
  return NULL;
}
