/* src/server: the hand-off methods (rpc.h; docs/protocol.md, "Hand-offs";
 * the table is engine/handoff.h). A connection that closes leaves its
 * hand-offs through its row of holdings.h (below). Loop thread only. */
#include <stdio.h>
#include <string.h>

#include "engine/handoff.h"
#include "engine/result.h"
#include "server/handoff_link.h"
#include "server/holdings.h"
#include "server/rpc.h"
#include "server/work.h"
#include "st/errors.h"

/* The table of handoffs: this kind's state in the registry (holdings.h). */
static st__handoffs_t *handoffs_of(st__server_t *srv) { return ST__HOLDING_STATE(srv, handoffs); }

static void pack_u8_tensor(msgpack_packer *pk, uint32_t arena, uint64_t bytes) {
  st__tensor_desc_t t;
  memset(&t, 0, sizeof t);
  t.arena = arena;
  t.dtype = ST_DTYPE_UINT8;
  t.ndim = 1;
  t.shape[0] = (int64_t)bytes;
  t.strides[0] = 1;
  st__pack_tensor(pk, &t);
}

/* See rpc.h. {name, role, slot, device, chunks, chunk_bytes, stride, consumers, data,
 * page} with the data arena and the page, one descriptor each. Every
 * role writes the page; only the producer writes the data, which a
 * consumer (slot >= 0) gets read-only: a uid granted read cannot write
 * the creator's chunks. */
void st__handoff_reply(st__conn_t *c, uint32_t id, const st__handoff_t *h, int slot) {
  st__build_result_t res;
  st__build_result_init(&res);
  st__arena_t *arenas[2] = {h->named.data, h->named.page_arena};
  res.arenas = arenas;
  res.narenas = 2;
  msgpack_packer pk;
  msgpack_packer_init(&pk, &res.value, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 10);
  st__pack_kv_str(&pk, "name", h->named.name);
  st__pack_kv_str(&pk, "role", slot < 0 ? "producer" : "consumer");
  st__pack_kv_int(&pk, "slot", slot);
  char dev[24];
  if (h->named.device < 0) snprintf(dev, sizeof dev, "cpu");
  else snprintf(dev, sizeof dev, "cuda:%d", h->named.device);
  st__pack_kv_str(&pk, "device", dev);
  st__pack_kv_uint(&pk, "chunks", h->chunks);
  st__pack_kv_uint(&pk, "chunk_bytes", h->chunk_bytes);
  st__pack_kv_uint(&pk, "stride", h->stride);
  st__pack_kv_uint(&pk, "consumers", h->consumers);
  st__pack_cstr(&pk, "data");
  pack_u8_tensor(&pk, 0, h->stride * h->chunks);
  st__pack_cstr(&pk, "page");
  pack_u8_tensor(&pk, 1, h->named.page_bytes);
  const unsigned char readonly[2] = {slot >= 0, 0};
  st__reply_more_t more = {.readonly_each = readonly};
  st__reply_more(c, id, slot < 0 ? "handoff_create" : "handoff_open", &res, &more);
  /* The references are the table's: nothing to drop. */
  msgpack_sbuffer_destroy(&res.value);
}

static const msgpack_object *name_of(st__rpc_req_t *r) { return st__rpc_arg(r, "name"); }

/* handoff_create {name, device?, chunk_bytes, chunks, consumers}. */
void st__rpc_handoff_create(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  const st__config_t *cfg = c->srv->cfg;
  int device = st__rpc_device(r);
  if (device == -2) return;
  const msgpack_object *name = name_of(r);
  st__handoff_spec_t s = {
      .name = name->via.str.ptr,
      .name_len = name->via.str.size,
      .device = device,
      .chunk_bytes = st__rpc_u64(r, "chunk_bytes", 0),
      .chunks = st__rpc_u64(r, "chunks", 0),
      .consumers = st__rpc_u64(r, "consumers", 0),
      .max_chunks = cfg->max_handoff_chunks,
      .max_per_connection = cfg->max_handoffs_per_connection,
  };
  st__grant_t readers;
  int given = st__rpc_readers(r, &readers);
  if (given < 0) return;
  if (given) s.readers = &readers;
  char err[400];
  st__handoff_t *h = NULL;
  int rc = st__handoff_create(handoffs_of(c->srv), &s, c->id, c->cred.uid, &h, err, sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "handoff_create: %s", err);
    return;
  }
  st__handoff_reply(c, r->id, h, -1);
}

/* handoff_open {name}. */
void st__rpc_handoff_open(st__rpc_req_t *r) {
  st__conn_t *c = r->c;
  const msgpack_object *name = name_of(r);
  char err[400];
  st__handoff_t *h = NULL;
  uint32_t slot;
  /* name@peer: the peer's hand-off, mirrored here (handoff_link.h). */
  if (memchr(name->via.str.ptr, '@', name->via.str.size)) {
    st__mirror_open(r, name->via.str.ptr, name->via.str.size);
    return;
  }
  if (st__rpc_arg(r, "consumers") || st__rpc_arg(r, "device")) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "handoff_open: 'consumers' and 'device' are for "
                  "a peer's hand-off (name@peer); a hand-off here has them from its create");
    return;
  }
  st__who_t who;
  st__rpc_who(r, &who);
  int rc = st__handoff_open(handoffs_of(c->srv), name->via.str.ptr, name->via.str.size, c->id,
                            &who, c->srv->cfg->max_handoffs_per_connection, &h, &slot,
                            err, sizeof err);
  if (rc != ST_OK) {
    st__rpc_error(r, rc, "handoff_open: %s", err);
    return;
  }
  st__handoff_reply(c, r->id, h, (int)slot);
}

/* handoff_close {name} -> true. */
void st__rpc_handoff_close(st__rpc_req_t *r) {
  const msgpack_object *name = name_of(r);
  char err[400];
  int rc = st__handoff_close(handoffs_of(r->c->srv), name->via.str.ptr, name->via.str.size,
                             r->c->id, err, sizeof err);
  if (rc != ST_OK) st__rpc_error(r, rc, "handoff_close: %s", err);
  else st__reply_true(r->c, r->id);
  st__mirrors_check(r->c->srv);
}

/* handoff_delete {name, force?} -> true (force: root and the server's
 * uid remove another uid's hand-off). */
void st__rpc_handoff_delete(st__rpc_req_t *r) {
  const msgpack_object *name = name_of(r);
  char err[400];
  st__who_t who;
  st__rpc_who(r, &who);
  int rc = st__handoff_delete(handoffs_of(r->c->srv), name->via.str.ptr, name->via.str.size,
                              &who, st__rpc_bool(r, "force", 0), err, sizeof err);
  if (rc != ST_OK) st__rpc_error(r, rc, "handoff_delete: %s", err);
  else st__reply_true(r->c, r->id);
  st__mirrors_check(r->c->srv);   /* a mirror deleted: its subscription ends */
}

/* handoffs {all?} -> [{name, uid, device, chunks, chunk_bytes, consumers,
 * open, producer, pending, followers, mirror}] of the hand-offs of the
 * caller's uid (all: of every uid, for root and the server's uid; AUTH
 * for another): `open` the consumer slots open now, `producer` whether
 * its producer is connected, `pending` the chunks published and not yet
 * acknowledged by every slot, `followers` the peers that mirror it,
 * `mirror` what it mirrors (nil: none). Read under the read side of the
 * server lock: the table, the mirrors and the followers change under the
 * write side only. */
void st__rpc_handoffs(st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const st__handoffs_t *t = handoffs_of(srv);
  st__who_t who;
  int all = st__rpc_listing_all(r, "handoffs", "hand-offs", &who);
  if (all < 0) return;
  uint32_t n = 0;
  for (const st__named_t *e = t->list.head; e; e = e->next)
    n += e->uid == who.uid || (all && who.admin);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  st__reply_begin(&sb, &pk, r->id);
  msgpack_pack_array(&pk, n);
  for (const st__named_t *e = t->list.head; e; e = e->next) {
    if (!(e->uid == who.uid || (all && who.admin))) continue;
    const st__handoff_t *h = (const st__handoff_t *)e;
    uint32_t open = 0, pending = 0;
    uint64_t mask = h->consumers >= 32 ? 0x7FFFFFFFu : ((1u << h->consumers) - 1u);
    for (uint32_t i = 0; i < h->consumers; i++) open += h->slots[i] != 0;
    for (uint32_t i = 0; i < h->chunks; i++)
      pending += (atomic_load(&h->page->chunk[i].word) & mask) != 0;
    msgpack_pack_map(&pk, 11);
    st__pack_kv_str(&pk, "name", e->name);
    st__pack_kv_uint(&pk, "uid", (uint64_t)e->uid);
    char dev[24];
    if (e->device < 0) snprintf(dev, sizeof dev, "cpu");
    else snprintf(dev, sizeof dev, "cuda:%d", e->device);
    st__pack_kv_str(&pk, "device", dev);
    st__pack_kv_uint(&pk, "chunks", h->chunks);
    st__pack_kv_uint(&pk, "chunk_bytes", h->chunk_bytes);
    st__pack_kv_uint(&pk, "consumers", h->consumers);
    st__pack_kv_uint(&pk, "open", open);
    st__pack_kv_bool(&pk, "producer", h->producer != 0);
    st__pack_kv_uint(&pk, "pending", pending);
    st__pack_cstr(&pk, "followers");
    st__hsrc_pack(&pk, srv, h->serial);
    st__pack_cstr(&pk, "mirror");
    st__mirror_pack(&pk, srv, h->serial);
  }
  st__reply_send(r->c, r->id, &sb);
}

/* ------------------------------------------------------------- holdings */

static void handoffs_release(st__server_t *srv, st__conn_t *c) {
  st__handoff_conn_closed(handoffs_of(srv), c->id);
  st__mirrors_check(srv);
}

static void handoffs_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  n->items = (uint64_t)st__handoff_conn_count(handoffs_of(srv), c->id);
}

static void handoffs_stop(st__server_t *srv, void *state) {
  (void)srv;
  st__handoff_free_all(state);
}

static int handoffs_none(st__server_t *srv) {
  const st__handoffs_t *h = handoffs_of(srv);
  return !h || !h->list.count;
}

const st__holding_kind_t st__holding_handoffs = {
    .name = "handoffs", .release = handoffs_release, .count = handoffs_count,
    .state_bytes = sizeof(st__handoffs_t), .stop = handoffs_stop, .none = handoffs_none};
