/* src/server/live_stage.h: the staging copy of a live key's version for
 * peers (config.lua peer.live_reads = "staged"; docs/multihost.md, "Live
 * replication", "The trainer's choice").
 *
 * Without it, a transfer of a live key reads the key's own memory under
 * the page's fence, and the publisher's next update waits for the whole
 * transfer. With it, the source's server copies the fenced version into
 * new arenas of the same devices and sizes (device to device for CUDA, a
 * memcpy for CPU memory), on a worker, then drops the fence: the
 * publisher waits for the copy alone, and the transfer reads the copy.
 * The copy's arenas count in memory_budget like any arena; they live as
 * long as the transfer (no copy is kept between transfers).
 *
 * Loop thread, but the copy (a worker).
 */
#ifndef ST_SERVER_LIVE_STAGE_H
#define ST_SERVER_LIVE_STAGE_H

#include <stddef.h>

#include "engine/job.h"
#include "engine/result.h"
#include "server/server.h"

/* Called on the loop when the copy ended: rc ST_OK with the copy's arenas
 * in *copy (moved to the callee: it owns the references), else the error
 * with the reason. */
typedef void (*st__live_staged_fn)(void *ctx, int rc, const char *err, st__build_result_t *copy);

/* Copies the arenas of `src` (references taken for the copy's time) into
 * new arenas on a worker; `done(ctx, ...)` runs on the loop. *job is the
 * worker's job: st__live_stage_cancel(*job) before ctx goes away. ST_OK,
 * or an error with the reason (nothing started). */
int st__live_stage(st__server_t *srv, const st__build_result_t *src, st__live_staged_fn done,
                   void *ctx, st__job_t **job, char *err, size_t errlen);

/* ctx is going away: its copy is dropped when the worker is done. */
void st__live_stage_cancel(st__job_t *job);

#endif
