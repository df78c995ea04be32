/* src/server: the result maps of hello, info and endpoints
 * (docs/protocol.md, "Methods"). Loop thread. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/bind.h"
#include "mem/arena.h"
#include "server/conn.h"
#include "st/wire.h"

static void pack_key(msgpack_packer *pk, const char *k) {
  st__pack_cstr(pk, k);
}

static void pack_bool(msgpack_packer *pk, int v) {
  if (v) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
}

/* Packs the device list of hello and info. Loop thread. */
void st__describe_devices(msgpack_packer *pk, const st__devices_t *d) {
  msgpack_pack_array(pk, (size_t)d->count);
  for (int i = 0; i < d->count; i++) {
    const st__device_t *dev = &d->list[i];
    msgpack_pack_map(pk, 5);
    pack_key(pk, "index");
    msgpack_pack_int(pk, dev->index);
    pack_key(pk, "kind");
    st__pack_cstr(pk, dev->kind);
    pack_key(pk, "name");
    st__pack_cstr(pk, dev->name);
    pack_key(pk, "uuid");
    st__pack_cstr(pk, dev->uuid);
    pack_key(pk, "memory_bytes");
    msgpack_pack_uint64(pk, dev->memory_bytes);
  }
}

static void pack_limits(msgpack_packer *pk, const st__config_t *cfg, int full) {
  msgpack_pack_map(pk, full ? 6 : 2);
  pack_key(pk, "max_message_bytes");
  msgpack_pack_uint64(pk, cfg->max_message_bytes);
  pack_key(pk, "max_inflight");
  msgpack_pack_int(pk, cfg->max_inflight);
  if (!full) return;
  pack_key(pk, "max_connections");
  msgpack_pack_int(pk, cfg->max_connections);
  pack_key(pk, "frame_timeout_ms");
  msgpack_pack_int(pk, cfg->frame_timeout_ms);
  pack_key(pk, "max_object_bytes");
  msgpack_pack_uint64(pk, cfg->max_object_bytes);
  pack_key(pk, "shutdown_grace_s");
  msgpack_pack_double(pk, cfg->shutdown_grace_s);
}

/* Packs the result of hello for a connection on socket `device`. */
void st__describe_hello(msgpack_packer *pk, st__server_t *srv, int device) {
  msgpack_pack_map(pk, 7);
  pack_key(pk, "protocol");
  msgpack_pack_int(pk, ST_PROTOCOL_VERSION);
  pack_key(pk, "version");
  st__pack_cstr(pk, ST_VERSION_STRING);
  pack_key(pk, "server_id");
  st__pack_cstr(pk, srv->server_id);
  pack_key(pk, "pid");
  msgpack_pack_int(pk, (int)getpid());
  pack_key(pk, "device");
  msgpack_pack_int(pk, device);
  pack_key(pk, "devices");
  st__describe_devices(pk, &srv->devices);
  pack_key(pk, "limits");
  pack_limits(pk, srv->cfg, 0);
}

static void pack_counters(msgpack_packer *pk, const st__counters_t *c) {
#define COUNTERS(X)                                                                        \
  X(requests) X(errors) X(calls) X(calls_ok) X(calls_dropped) X(notifications)             \
  X(bytes_received) X(bytes_sent) X(fds_sent) X(fds_received) X(connections)               \
  X(auth_refused) X(limit_refused) X(protocol_errors) X(busy) X(timeouts) X(read_pauses)   \
  X(reloads) X(reload_failures)
#define COUNT(name) +1
  msgpack_pack_map(pk, 0 COUNTERS(COUNT));
#define PACK(name)               \
  pack_key(pk, #name);           \
  msgpack_pack_uint64(pk, c->name);
  COUNTERS(PACK)
#undef PACK
#undef COUNT
#undef COUNTERS
}

/* Packs the result of info (docs/protocol.md). Loop thread. */
void st__describe_info(msgpack_packer *pk, st__server_t *srv) {
  const st__config_t *cfg = srv->cfg;
  msgpack_pack_map(pk, 16);
  pack_key(pk, "server_id");
  st__pack_cstr(pk, srv->server_id);
  pack_key(pk, "version");
  st__pack_cstr(pk, ST_VERSION_STRING);
  pack_key(pk, "protocol");
  msgpack_pack_int(pk, ST_PROTOCOL_VERSION);
  pack_key(pk, "pid");
  msgpack_pack_int(pk, (int)getpid());
  pack_key(pk, "uptime_s");
  msgpack_pack_double(pk, st__now_mono() - srv->started_mono);
  pack_key(pk, "ready");
  pack_bool(pk, srv->gen && !srv->shutting_down);

  pack_key(pk, "generation");
  msgpack_pack_map(pk, 5);
  pack_key(pk, "number");
  msgpack_pack_uint64(pk, srv->gen ? srv->gen->number : 0);
  pack_key(pk, "loaded_at");
  msgpack_pack_double(pk, srv->gen ? srv->gen->loaded_at : 0.0);
  pack_key(pk, "endpoints");
  msgpack_pack_uint64(pk, srv->gen ? srv->gen->nendpoints : 0);
  pack_key(pk, "dir");
  st__pack_cstr(pk, cfg->endpoints_dir);
  pack_key(pk, "last_reload");
  if (!srv->last_reload_done) {
    msgpack_pack_nil(pk);
  } else {
    msgpack_pack_map(pk, 3);
    pack_key(pk, "ok");
    pack_bool(pk, srv->last_reload_ok);
    pack_key(pk, "error");
    st__pack_cstr(pk, srv->last_reload_error);
    pack_key(pk, "at");
    msgpack_pack_double(pk, srv->last_reload_at);
  }

  pack_key(pk, "devices");
  st__describe_devices(pk, &srv->devices);
  pack_key(pk, "cuda");
  msgpack_pack_map(pk, 2);
  pack_key(pk, "devices");
  msgpack_pack_int(pk, srv->devices.cuda_count);
  pack_key(pk, "reason");
  st__pack_cstr(pk, srv->devices.cuda_count ? NULL : srv->devices.cuda_reason);

  pack_key(pk, "sockets");
  msgpack_pack_array(pk, (size_t)srv->nlisteners);
  for (int i = 0; i < srv->nlisteners; i++) {
    msgpack_pack_map(pk, 2);
    pack_key(pk, "device");
    msgpack_pack_int(pk, srv->listeners[i].device);
    pack_key(pk, "path");
    st__pack_cstr(pk, srv->listeners[i].path);
  }

  pack_key(pk, "workers");
  msgpack_pack_int(pk, srv->pool ? st__pool_size(srv->pool) : 0);
  pack_key(pk, "connections");
  msgpack_pack_int(pk, srv->nconns);
  pack_key(pk, "inflight");
  msgpack_pack_uint64(pk, srv->pool ? st__pool_outstanding(srv->pool) : 0);
  pack_key(pk, "counters");
  pack_counters(pk, &srv->counters);
  pack_key(pk, "limits");
  pack_limits(pk, cfg, 1);

  uint64_t count = 0, bytes = 0;
  st__arena_stats(&count, &bytes);
  pack_key(pk, "arenas");
  msgpack_pack_map(pk, 2);
  pack_key(pk, "count");
  msgpack_pack_uint64(pk, count);
  pack_key(pk, "bytes");
  msgpack_pack_uint64(pk, bytes);
}

static const char *execution_name(st__execution_t e) {
  return e == ST_EXEC_TASK ? "task" : "direct";
}

static const char *concurrency_name(st__concurrency_t c) {
  return c == ST_CONC_SERIALIZED ? "serialized" : "parallel";
}

/* Packs the result of endpoints: every declaration of gen, sorted. */
void st__describe_endpoints(msgpack_packer *pk, const st__generation_t *gen) {
  size_t n = gen ? gen->nendpoints : 0;
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) {
    const st__endpoint_decl_t *ep = &gen->endpoints[i];
    msgpack_pack_map(pk, 17);
    pack_key(pk, "name");
    st__pack_cstr(pk, ep->name);
    pack_key(pk, "file");
    st__pack_cstr(pk, ep->file);
    pack_key(pk, "line");
    msgpack_pack_int(pk, ep->line);
    pack_key(pk, "execution");
    st__pack_cstr(pk, execution_name(ep->execution));
    pack_key(pk, "concurrency");
    st__pack_cstr(pk, concurrency_name(ep->concurrency));
    pack_key(pk, "managed");
    pack_bool(pk, ep->managed);
    pack_key(pk, "cache");
    pack_bool(pk, ep->cache);
    pack_key(pk, "cache_format_key");
    st__pack_cstr(pk, ep->cache_format_key);
    pack_key(pk, "singleflight");
    pack_bool(pk, ep->singleflight);
    pack_key(pk, "timeout");
    if (ep->timeout_s > 0) msgpack_pack_double(pk, ep->timeout_s);
    else msgpack_pack_nil(pk);
    pack_key(pk, "device");
    st__pack_cstr(pk, ep->device);
    pack_key(pk, "ipc");
    st__pack_cstr(pk, ep->ipc == ST_IPC_LEGACY ? "legacy" : "vmm");
    /* params: every parameter, with its default (nil for required ones). */
    pack_key(pk, "params");
    msgpack_pack_map(pk, ep->nparams);
    size_t nrequired = 0;
    for (size_t k = 0; k < ep->nparams; k++) {
      const st__param_t *p = &ep->params[k];
      st__pack_cstr(pk, p->name);
      if (p->required || !p->default_mp) {
        msgpack_pack_nil(pk);
        nrequired++;
      } else {
        pk->callback(pk->data, p->default_mp, p->default_len);
      }
    }
    pack_key(pk, "required");
    msgpack_pack_array(pk, nrequired);
    for (size_t k = 0; k < ep->nparams; k++)
      if (ep->params[k].required || !ep->params[k].default_mp)
        st__pack_cstr(pk, ep->params[k].name);
    pack_key(pk, "types");
    msgpack_pack_map(pk, ep->nparams);
    for (size_t k = 0; k < ep->nparams; k++) {
      st__pack_cstr(pk, ep->params[k].name);
      st__pack_cstr(pk, st__param_type_name(ep->params[k].type));
    }
    pack_key(pk, "doc");
    st__pack_cstr(pk, ep->doc);
    pack_key(pk, "fingerprint");
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)ep->fingerprint);
    st__pack_cstr(pk, fp);
  }
}
