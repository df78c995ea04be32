/* src/server: what a build's consumers receive (work.h, "deliver.c"): an
 * error, an object (with a lease when the endpoint is managed), or a
 * plain result; a call is answered on its connection if that is still
 * open, a task ends. Loop thread only.
 */
#include <stdlib.h>

#include <stdio.h>
#include <string.h>

#include "server/views.h"
#include "server/work.h"
#include "st/errors.h"

static void call_error(st__server_t *srv, const st__consumer_t *k, int code, const char *msg) {
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  if (!c || c->dead) return;
  st__conn_send_error(c, k->request_id, code, msg);
  st__conn_request_done(c);
}

/* Every consumer of *list gets the error; the list is freed and *list
 * left empty. */
void st__deliver_error(st__server_t *srv, st__consumer_t **list, int code, const char *msg) {
  st__consumer_t *k = *list;
  *list = NULL;
  while (k) {
    st__consumer_t *next = k->next;
    if (k->kind == ST_CONSUMER_CALL) call_error(srv, k, code, msg);
    else st__task_finish_error(srv, k->task, code, msg);
    free(k);
    k = next;
  }
}

/* A call that asked for a view receives r (obj's result, or a plain
 * result when obj is NULL) through it (views.h). Returns 1 when the reply
 * waits for a copy (views.c then counts the request done). */
static int deliver_view(st__server_t *srv, st__conn_t *c, const st__consumer_t *k,
                        const st__build_result_t *r, const st__object_t *obj, int lease,
                        const char *endpoint) {
  st__view_to_t to;
  memset(&to, 0, sizeof to);
  to.kind = obj ? ST__VIEW_TO_OBJECT : ST__VIEW_TO_PLAIN;
  to.conn_id = c->id;
  to.request_id = k->request_id;
  to.readonly = obj && (k->readonly || obj->readonly);
  to.object_id = obj ? obj->id : 0;
  to.lease = lease;
  snprintf(to.what, sizeof to.what, "%s", endpoint);
  char owner[40];
  snprintf(owner, sizeof owner, "object:%llu", obj ? (unsigned long long)obj->id : 0ull);
  st__view_source_t src = {.result = r, .owner = obj ? owner : NULL};
  st__viewspec_t *spec = NULL;
  char err[600];
  /* The text was parsed when the call came: this does not fail but for
   * memory. */
  int rc = st__viewspec_parse(k->view, k->view_len, &spec, err, sizeof err);
  if (rc != ST_OK) {
    st__conn_send_error(c, k->request_id, rc, err);
    if (lease) st__drop_lease(srv, c, (st__object_t *)obj);
    return 0;
  }
  int waits = st__views_reply(srv, c, spec, &src, &to);
  st__viewspec_free(spec);
  return waits;
}

/* One consumer receives obj; see work.h. */
void st__deliver_object(st__server_t *srv, const st__consumer_t *k, st__object_t *obj) {
  if (k->kind == ST_CONSUMER_TASK) {
    st__task_finish_object(srv, k->task, obj);
    return;
  }
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  if (!c || c->dead) return;   /* counted dropped when it closed */
  int lease = 0;
  if (obj->managed) {
    if (st__objects_lease(&srv->objects, obj, c->id) != ST_OK) {
      st__conn_send_error(c, k->request_id, ST_ERR_OUT_OF_MEMORY, "out of memory taking a lease");
      st__conn_request_done(c);
      return;
    }
    c->leases++;
    lease = 1;
  }
  st__objects_touch(&srv->objects, obj);
  if (k->view) {
    if (!deliver_view(srv, c, k, &obj->result, obj, lease, obj->endpoint))
      st__conn_request_done(c);
    return;
  }
  int rc = k->readonly || obj->readonly
               ? st__reply_object_readonly(c, k->request_id, obj, lease)
               : st__reply_object(c, k->request_id, obj, lease);
  if (rc != ST_OK && lease)
    st__drop_lease(srv, c, obj);   /* the client never saw it */
  st__conn_request_done(c);
}

/* The only consumer of a plain build receives its result; see work.h. */
void st__deliver_plain(st__server_t *srv, const st__consumer_t *k, st__job_t *job) {
  if (k->kind == ST_CONSUMER_TASK) {
    st__task_finish_plain(srv, k->task, &job->result);
    return;
  }
  st__conn_t *c = st__conn_find(srv, k->conn_id);
  if (!c || c->dead) return;   /* counted dropped when it closed */
  if (k->view) {
    if (!deliver_view(srv, c, k, &job->result, NULL, 0, job->ep->name))
      st__conn_request_done(c);
    return;
  }
  st__reply_call_result(c, k->request_id, job->ep->name, &job->result,
                        k->readonly ? NULL : job->result_args);
  st__conn_request_done(c);
}
