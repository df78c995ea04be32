/* src/xfer/engines.h: the engines this build knows (engines.c), by the
 * name the server and the helper use on their socket. */
#ifndef ST_XFER_ENGINES_H
#define ST_XFER_ENGINES_H

#include <stddef.h>

#include "xfer/engine.h"

/* The engine named `name` ("ucx", "nccl"); NULL for an unknown name. */
const st__xfer_engine_t *st__xfer_engine(const char *name);

/* The rows, in the order a probe reports them. */
extern const st__xfer_engine_t *const st__xfer_engines[];
extern const size_t st__xfer_engine_count;

#endif
