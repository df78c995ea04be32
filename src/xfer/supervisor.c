/* src/xfer/supervisor.c: the server's side of the transfer helper (see
 * supervisor.h). Records to the helper wait in a queue flushed by a write
 * watcher; records from it are checked before a callback sees them (the
 * helper runs engine libraries: its bytes are input like a peer's).
 */
#include "xfer/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "xfer/engines.h"
#include "xfer/helper.h"
#include "xfer/wire.h"

#define WHO "xfer"
#define MAX_PROBES 16
/* Seconds the helper gets past a transfer's own deadline to report it. */
#define DEADLINE_SLACK 1.0
/* A helper that lived this long resets the backoff. */
#define HEALTHY_LIFE 30.0
/* Reaping: polls of waitpid, and after how many the helper is killed. */
#define REAP_PERIOD 0.01
#define REAP_KILL_AFTER 100

typedef enum { T_OPENING, T_OPENED, T_STARTED } tstate_t;

typedef struct sup_tx {
  int used;
  uint64_t id;
  tstate_t state;
  const st__xfer_sup_cbs_t *cbs;
  void *ud;
  double deadline;       /* mono: abort after this                 */
  double abort_sent;     /* mono: 0, or when the abort was sent   */
} sup_tx_t;

typedef struct outrec {
  struct outrec *next;
  uint64_t xfer;         /* 0: not a transfer's                   */
  size_t len;
  size_t nfds;
  int fds[ST_XFER_FDS_PER_MSG];
  char data[];
} outrec_t;

struct st__xfer_sup {
  struct ev_loop *loop;
  char exe[PATH_MAX];
  char ucx_library[256];
  char nccl_library[256];
  unsigned max_transfers;
  double kill_grace, restart_min, restart_max;
  int log_level;

  int sock;
  pid_t pid;
  double spawned_at;
  unsigned spawns;
  unsigned short_lives;  /* helpers in a row that died young        */
  int reap_tries;
  char kill_reason[256]; /* why the supervisor killed the helper    */
  ev_io rio, wio;
  ev_timer tick, reap, restart;
  ev_child child;        /* the default loop reaps every child itself:
                            there the status comes through this watcher */

  uint64_t next_id;
  sup_tx_t txs[ST_XFER_MAX_TRANSFERS];
  struct {
    st__xfer_sup_probe_cb cb;
    void *ud;
  } probes[MAX_PROBES];
  unsigned nprobes;
  outrec_t *head, *tail;
  char *rbuf;
};

static void flush(st__xfer_sup_t *s);
static void helper_gone(st__xfer_sup_t *s, const char *why);

static outrec_t *rec_new(msgpack_sbuffer *sb, uint64_t xfer) {
  outrec_t *r = malloc(sizeof *r + sb->size);
  if (r) {
    r->next = NULL;
    r->xfer = xfer;
    r->len = sb->size;
    r->nfds = 0;
    memcpy(r->data, sb->data, sb->size);
  }
  msgpack_sbuffer_destroy(sb);
  return r;
}

static void rec_free(outrec_t *r) {
  for (size_t i = 0; i < r->nfds; i++) close(r->fds[i]);
  free(r);
}

static void push(st__xfer_sup_t *s, outrec_t *r, int front) {
  if (front) {
    r->next = s->head;
    s->head = r;
    if (!s->tail) s->tail = r;
  } else {
    if (s->tail) s->tail->next = r;
    else s->head = r;
    s->tail = r;
  }
}

static void drop_queue(st__xfer_sup_t *s) {
  while (s->head) {
    outrec_t *r = s->head;
    s->head = r->next;
    rec_free(r);
  }
  s->tail = NULL;
}

/* The packer of a record [2, method, [map of `entries`]]. */
static void rec_begin(msgpack_sbuffer *sb, msgpack_packer *pk, const char *method,
                      size_t entries) {
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
  st__pack_notification_head(pk, method);
  msgpack_pack_array(pk, 1);
  msgpack_pack_map(pk, entries);
}

static int queue_simple(st__xfer_sup_t *s, msgpack_sbuffer *sb, uint64_t xfer) {
  outrec_t *r = rec_new(sb, xfer);
  if (!r) return ST_ERR_OUT_OF_MEMORY;
  push(s, r, 0);
  flush(s);
  return ST_OK;
}

static void flush(st__xfer_sup_t *s) {
  if (s->sock < 0) return;
  while (s->head) {
    outrec_t *r = s->head;
    char err[160];
    int rc = st__xfer_send(s->sock, r->data, r->len, r->fds, r->nfds, 1, err, sizeof err);
    if (rc == ST_ERR_BUSY) {
      ev_io_start(s->loop, &s->wio);
      return;
    }
    if (rc != ST_OK) {
      helper_gone(s, err);
      return;
    }
    s->head = r->next;
    if (!s->head) s->tail = NULL;
    rec_free(r);
  }
  ev_io_stop(s->loop, &s->wio);
}

static sup_tx_t *find(st__xfer_sup_t *s, uint64_t id) {
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++)
    if (s->txs[i].used && s->txs[i].id == id) return &s->txs[i];
  return NULL;
}

/* Ends transfer t with a done callback; the slot is free before it runs. */
static void end_tx(sup_tx_t *t, int ok, uint64_t bytes, int code, const char *error) {
  sup_tx_t copy = *t;
  memset(t, 0, sizeof *t);
  copy.cbs->done(copy.ud, copy.id, ok, bytes, code, error);
}

/* Every transfer fails with `why`, every probe is answered with it. */
static void fail_all(st__xfer_sup_t *s, const char *why) {
  drop_queue(s);
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++)
    if (s->txs[i].used) end_tx(&s->txs[i], 0, 0, ST_ERR_IO, why);
  while (s->nprobes) {
    st__xfer_sup_probe_cb cb = s->probes[0].cb;
    void *ud = s->probes[0].ud;
    memmove(&s->probes[0], &s->probes[1], (s->nprobes - 1) * sizeof s->probes[0]);
    s->nprobes--;
    st__xfer_sup_probe_t rows[8];
    size_t n = st__xfer_engine_count < 8 ? st__xfer_engine_count : 8;
    memset(rows, 0, sizeof rows);
    for (size_t k = 0; k < n; k++) {
      rows[k].engine = st__xfer_engines[k]->name;
      snprintf(rows[k].probe.reason, sizeof rows[k].probe.reason, "%s", why);
    }
    cb(ud, rows, n);
  }
}

static void queue_config(st__xfer_sup_t *s) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  rec_begin(&sb, &pk, "config", 4);
  st__pack_kv_uint(&pk, "max_transfers", s->max_transfers);
  st__pack_kv_uint(&pk, "log_level", (uint64_t)s->log_level);
  st__pack_kv_str(&pk, "ucx_library", s->ucx_library[0] ? s->ucx_library : NULL);
  st__pack_kv_str(&pk, "nccl_library", s->nccl_library[0] ? s->nccl_library : NULL);
  outrec_t *r = rec_new(&sb, 0);
  if (r) push(s, r, 1);
}

static void on_read(struct ev_loop *loop, ev_io *w, int revents);
static void on_write(struct ev_loop *loop, ev_io *w, int revents);

static int spawn(st__xfer_sup_t *s, char *err, size_t errlen) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    snprintf(err, errlen, "socketpair for the transfer helper: %s", strerror(errno));
    return ST_ERR_IO;
  }
  char fdarg[16];
  snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
  char *argv[] = {s->exe, (char *)ST_XFER_HELPER_FLAG, fdarg, NULL};
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, errlen, "fork of the transfer helper: %s", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    return ST_ERR_IO;
  }
  if (pid == 0) {
    /* The child: async-signal-safe calls only until exec. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    fcntl(sv[1], F_SETFD, 0);
    execv(s->exe, argv);
    _exit(127);
  }
  close(sv[1]);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  s->sock = sv[0];
  s->pid = pid;
  s->spawns++;
  s->spawned_at = st__now_mono();
  s->kill_reason[0] = 0;
  ev_io_init(&s->rio, on_read, s->sock, EV_READ);
  ev_io_init(&s->wio, on_write, s->sock, EV_WRITE);
  ev_io_start(s->loop, &s->rio);
  if (ev_is_default_loop(s->loop)) {
    ev_child_set(&s->child, pid, 0);
    ev_child_start(s->loop, &s->child);
  }
  queue_config(s);
  ST_LOG_I(WHO, "transfer helper started (pid %d)", (int)pid);
  flush(s);
  return ST_OK;
}

static void on_restart(struct ev_loop *loop, ev_timer *w, int revents) {
  st__xfer_sup_t *s = w->data;
  char err[200];
  if (spawn(s, err, sizeof err) != ST_OK) {
    ST_LOG_E(WHO, "%s; trying again", err);
    s->short_lives++;
    double d = s->restart_min * (double)(1u << (s->short_lives < 16 ? s->short_lives : 16));
    ev_timer_set(&s->restart, d < s->restart_max ? d : s->restart_max, 0);
    ev_timer_start(loop, &s->restart);
  }
}


/* The helper was reaped (st: its wait status; valid 0 when waitpid
 * failed): every transfer fails with why it ended, a respawn is timed. */
static void reaped(st__xfer_sup_t *s, int valid, int st, int werrno) {
  struct ev_loop *loop = s->loop;
  helper_gone(s, "reaped");
  ev_timer_stop(loop, &s->reap);
  if (ev_is_active(&s->child)) ev_child_stop(loop, &s->child);
  char why[320];
  if (s->kill_reason[0])
    snprintf(why, sizeof why, "%s", s->kill_reason);
  else if (!valid)
    snprintf(why, sizeof why, "the transfer helper exited (waitpid: %s)", strerror(werrno));
  else if (WIFSIGNALED(st))
    snprintf(why, sizeof why, "the transfer helper exited (signal %d)", WTERMSIG(st));
  else
    snprintf(why, sizeof why, "the transfer helper exited (status %d)", WEXITSTATUS(st));
  double lived = st__now_mono() - s->spawned_at;
  s->pid = 0;
  s->short_lives = lived >= HEALTHY_LIFE ? 0 : s->short_lives + 1;
  unsigned k = s->short_lives ? s->short_lives - 1 : 0;
  double d = s->restart_min * (double)(1u << (k < 16 ? k : 16));
  if (d > s->restart_max) d = s->restart_max;
  ST_LOG_W(WHO, "%s after %.1f s; a new one starts in %.2f s", why, lived, d);
  ev_timer_set(&s->restart, d, 0);
  ev_timer_start(loop, &s->restart);
  fail_all(s, why);
}

static void on_child(struct ev_loop *loop, ev_child *w, int revents) {
  st__xfer_sup_t *s = w->data;
  if (w->rpid == s->pid) reaped(s, 1, w->rstatus, 0);
}

/* Polls waitpid after the socket closed; kills a helper that lingers. */
static void on_reap(struct ev_loop *loop, ev_timer *w, int revents) {
  st__xfer_sup_t *s = w->data;
  if (++s->reap_tries == REAP_KILL_AFTER) kill(s->pid, SIGKILL);
  if (ev_is_active(&s->child)) return; /* the child watcher reaps */
  int st = 0;
  pid_t r = waitpid(s->pid, &st, WNOHANG);
  if (r == 0) return;
  reaped(s, r > 0, st, errno);
}

/* The helper's socket closed or failed: stop talking, reap it. */
static void helper_gone(st__xfer_sup_t *s, const char *why) {
  if (s->sock < 0) return;
  ev_io_stop(s->loop, &s->rio);
  ev_io_stop(s->loop, &s->wio);
  close(s->sock);
  s->sock = -1;
  ST_LOG_D(WHO, "the transfer helper's socket closed (%s)", why);
  s->reap_tries = 0;
  ev_timer_start(s->loop, &s->reap);
}

static void on_write(struct ev_loop *loop, ev_io *w, int revents) { flush(w->data); }

static void copy_text(const msgpack_object *map, const char *key, char *out, size_t cap,
                      const char *dflt) {
  const char *p;
  size_t len;
  char err[64];
  if (st__xfer_get_str(map, key, &p, &len, err, sizeof err) == ST_OK)
    snprintf(out, cap, "%.*s", (int)(len < cap - 1 ? len : cap - 1), p);
  else
    snprintf(out, cap, "%s", dflt);
}

static void on_probed(st__xfer_sup_t *s, const msgpack_object *params) {
  if (!s->nprobes) return;
  st__xfer_sup_probe_cb cb = s->probes[0].cb;
  void *ud = s->probes[0].ud;
  memmove(&s->probes[0], &s->probes[1], (s->nprobes - 1) * sizeof s->probes[0]);
  s->nprobes--;
  const msgpack_object *eng = st__map_get(params, "engines");
  st__xfer_sup_probe_t rows[8];
  size_t n = st__xfer_engine_count < 8 ? st__xfer_engine_count : 8;
  memset(rows, 0, sizeof rows);
  for (size_t k = 0; k < n; k++) {
    rows[k].engine = st__xfer_engines[k]->name;
    const msgpack_object *p = eng ? st__map_get(eng, rows[k].engine) : NULL;
    st__xfer_probe_t *out = &rows[k].probe;
    if (!p || p->type != MSGPACK_OBJECT_MAP) {
      snprintf(out->reason, sizeof out->reason, "the transfer helper did not report it");
      continue;
    }
    char err[64];
    (void)st__xfer_get_bool(p, "available", &out->available, err, sizeof err);
    copy_text(p, "version", out->version, sizeof out->version, "");
    copy_text(p, "library", out->library, sizeof out->library, "");
    copy_text(p, "reason", out->reason, sizeof out->reason, "");
  }
  cb(ud, rows, n);
}

static void on_record(st__xfer_sup_t *s, const char *buf, size_t len) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  const char *method;
  size_t mlen;
  const msgpack_object *params;
  char err[160];
  uint64_t id = 0;
  if (st__xfer_parse(buf, len, &up, &method, &mlen, &params, err, sizeof err) != ST_OK) {
    ST_LOG_W(WHO, "a record from the transfer helper was dropped: %s", err);
    goto out;
  }
  if (st__xfer_is(method, mlen, "probed")) {
    on_probed(s, params);
    goto out;
  }
  if (st__xfer_get_uint(params, "xfer", &id, err, sizeof err) != ST_OK) {
    ST_LOG_W(WHO, "a '%.*s' record from the transfer helper names no transfer",
             (int)(mlen < 40 ? mlen : 40), method);
    goto out;
  }
  sup_tx_t *t = find(s, id);
  if (!t) goto out; /* ended here already (the helper died, or was killed) */
  if (st__xfer_is(method, mlen, "opened")) {
    const uint8_t *b = NULL;
    size_t bl = 0;
    if (t->state != T_OPENING ||
        st__xfer_get_bin(params, "blob", &b, &bl, err, sizeof err) != ST_OK ||
        bl > ST_XFER_BLOB_MAX) {
      ST_LOG_W(WHO, "a bad 'opened' record for transfer %llu; aborting it",
               (unsigned long long)id);
      st__xfer_sup_abort(s, id, "the transfer helper's answer to open was malformed");
      goto out;
    }
    t->state = T_OPENED;
    if (t->cbs->opened) t->cbs->opened(t->ud, id, b, bl);
  } else if (st__xfer_is(method, mlen, "progress")) {
    uint64_t bytes = 0, total = 0;
    if (st__xfer_get_uint(params, "bytes", &bytes, err, sizeof err) == ST_OK &&
        st__xfer_get_uint(params, "total", &total, err, sizeof err) == ST_OK &&
        t->cbs->progress)
      t->cbs->progress(t->ud, id, bytes, total);
  } else if (st__xfer_is(method, mlen, "done")) {
    int ok = 0;
    uint64_t bytes = 0;
    char code_name[32], error[320];
    (void)st__xfer_get_bool(params, "ok", &ok, err, sizeof err);
    (void)st__xfer_get_uint(params, "bytes", &bytes, err, sizeof err);
    copy_text(params, "code", code_name, sizeof code_name, "IO");
    copy_text(params, "error", error, sizeof error, "the transfer failed");
    int code = ok ? ST_OK : st_err_from_name(code_name);
    if (!ok && code == 0) code = ST_ERR_IO;
    end_tx(t, ok, bytes, code, ok ? NULL : error);
  } else {
    ST_LOG_W(WHO, "an unknown record '%.*s' from the transfer helper was dropped",
             (int)(mlen < 40 ? mlen : 40), method);
  }
out:
  msgpack_unpacked_destroy(&up);
}

static void on_read(struct ev_loop *loop, ev_io *w, int revents) {
  st__xfer_sup_t *s = w->data;
  /* Bounded per wake-up, so that a chatty helper cannot hold the loop. */
  for (int i = 0; i < 64 && s->sock >= 0; i++) {
    int fds[ST_XFER_FDS_PER_MSG];
    size_t nfds = 0;
    char err[160];
    long n = st__xfer_recv(s->sock, s->rbuf, ST_XFER_MSG_MAX, fds, &nfds, err, sizeof err);
    for (size_t k = 0; k < nfds; k++) close(fds[k]); /* the helper sends none */
    if (n == ST_ERR_BUSY) return;
    if (n == ST_ERR_PROTOCOL) {
      ST_LOG_W(WHO, "transfer helper: %s; dropped", err);
      continue;
    }
    if (n <= 0) {
      helper_gone(s, n == 0 ? "closed" : err);
      return;
    }
    on_record(s, s->rbuf, (size_t)n);
  }
}

/* Deadlines: abort, then after the grace kill the helper. */
static void on_tick(struct ev_loop *loop, ev_timer *w, int revents) {
  st__xfer_sup_t *s = w->data;
  double now = st__now_mono();
  int any = 0;
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++) {
    sup_tx_t *t = &s->txs[i];
    if (!t->used) continue;
    any = 1;
    if (now < t->deadline) continue;
    if (!t->abort_sent) {
      st__xfer_sup_abort(s, t->id, "the transfer did not end by its deadline");
    } else if (now >= t->abort_sent + s->kill_grace && s->pid > 0 && !s->kill_reason[0]) {
      snprintf(s->kill_reason, sizeof s->kill_reason,
               "the transfer helper was killed: transfer %llu did not end %.1f s after its "
               "deadline",
               (unsigned long long)t->id, s->kill_grace);
      ST_LOG_E(WHO, "%s", s->kill_reason);
      kill(s->pid, SIGKILL);
    }
  }
  if (!any) ev_timer_stop(loop, &s->tick);
}

int st__xfer_sup_new(struct ev_loop *loop, const st__xfer_sup_config_t *cfg,
                     st__xfer_sup_t **out, char *err, size_t errlen) {
  st__xfer_sup_t *s = calloc(1, sizeof *s);
  char *rbuf = malloc(ST_XFER_MSG_MAX);
  if (!s || !rbuf) {
    free(s);
    free(rbuf);
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  s->rbuf = rbuf;
  s->loop = loop;
  s->sock = -1;
  snprintf(s->exe, sizeof s->exe, "%s", cfg && cfg->exe ? cfg->exe : "/proc/self/exe");
  snprintf(s->ucx_library, sizeof s->ucx_library, "%s",
           cfg && cfg->ucx_library ? cfg->ucx_library : "");
  snprintf(s->nccl_library, sizeof s->nccl_library, "%s",
           cfg && cfg->nccl_library ? cfg->nccl_library : "");
  s->max_transfers = cfg && cfg->max_transfers ? cfg->max_transfers : 16;
  if (s->max_transfers > ST_XFER_MAX_TRANSFERS) s->max_transfers = ST_XFER_MAX_TRANSFERS;
  s->kill_grace = cfg && cfg->kill_grace > 0 ? cfg->kill_grace : 5.0;
  s->restart_min = cfg && cfg->restart_min > 0 ? cfg->restart_min : 0.1;
  s->restart_max = cfg && cfg->restart_max > 0 ? cfg->restart_max : 10.0;
  s->log_level = cfg && cfg->log_level >= 0 ? cfg->log_level : ST_LOG_INFO;
  s->next_id = 1;
  ev_timer_init(&s->tick, on_tick, 0.1, 0.1);
  ev_timer_init(&s->reap, on_reap, REAP_PERIOD, REAP_PERIOD);
  ev_timer_init(&s->restart, on_restart, 0, 0);
  ev_child_init(&s->child, on_child, 0, 0);
  s->tick.data = s->reap.data = s->restart.data = s->child.data = s;
  s->rio.data = s->wio.data = s;
  int rc = spawn(s, err, errlen);
  if (rc != ST_OK) {
    free(s->rbuf);
    free(s);
    return rc;
  }
  s->rio.data = s->wio.data = s;
  *out = s;
  return ST_OK;
}

void st__xfer_sup_free(st__xfer_sup_t *s) {
  if (!s) return;
  ev_timer_stop(s->loop, &s->tick);
  ev_timer_stop(s->loop, &s->reap);
  ev_timer_stop(s->loop, &s->restart);
  if (ev_is_active(&s->child)) ev_child_stop(s->loop, &s->child);
  if (s->sock >= 0) {
    ev_io_stop(s->loop, &s->rio);
    ev_io_stop(s->loop, &s->wio);
    close(s->sock);
  }
  if (s->pid > 0) {
    /* The closed socket ends the helper; SIGKILL ends one stuck in an
     * engine call. A short bounded wait, then the kill. */
    int st;
    pid_t r = 0;
    for (int i = 0; i < 50 && (r = waitpid(s->pid, &st, WNOHANG)) == 0; i++) usleep(2000);
    if (r == 0) {
      kill(s->pid, SIGKILL);
      while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  drop_queue(s);
  free(s->rbuf);
  free(s);
}

int st__xfer_sup_open(st__xfer_sup_t *s, const char *engine, st__xfer_role_t role, int nranks,
                      int rank, uint32_t timeout_ms, const st__xfer_sup_cbs_t *cbs, void *ud,
                      uint64_t *xfer, char *err, size_t errlen) {
  const st__xfer_engine_t *e = st__xfer_engine(engine);
  if (!e || !cbs || !cbs->done || timeout_ms == 0 || nranks < 2 || rank < 0 || rank >= nranks ||
      (role != ST_XFER_SEND && role != ST_XFER_RECV)) {
    snprintf(err, errlen, !e ? "unknown transfer engine '%s' (ucx or nccl)"
                             : "bad transfer parameters (callbacks, ranks or timeout)",
             engine ? engine : "");
    return ST_ERR_INVALID_ARGUMENT;
  }
  sup_tx_t *t = NULL;
  unsigned used = 0;
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++) {
    if (s->txs[i].used) used++;
    else if (!t) t = &s->txs[i];
  }
  if (!t || used >= s->max_transfers) {
    snprintf(err, errlen, "%u transfers run already (the limit of this server)", used);
    return ST_ERR_LIMIT;
  }
  uint64_t id = s->next_id++;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  rec_begin(&sb, &pk, "open", 6);
  st__pack_kv_uint(&pk, "xfer", id);
  st__pack_kv_str(&pk, "engine", e->name);
  st__pack_kv_str(&pk, "role", role == ST_XFER_SEND ? "send" : "recv");
  st__pack_kv_uint(&pk, "nranks", (uint64_t)nranks);
  st__pack_kv_uint(&pk, "rank", (uint64_t)rank);
  st__pack_kv_uint(&pk, "timeout_ms", timeout_ms);
  outrec_t *r = rec_new(&sb, id);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  memset(t, 0, sizeof *t);
  t->used = 1;
  t->id = id;
  t->state = T_OPENING;
  t->cbs = cbs;
  t->ud = ud;
  t->deadline = st__now_mono() + timeout_ms / 1000.0 + DEADLINE_SLACK;
  *xfer = id;
  ev_timer_start(s->loop, &s->tick);
  push(s, r, 0);
  flush(s);
  return ST_OK;
}

int st__xfer_sup_start(st__xfer_sup_t *s, uint64_t xfer, const uint8_t *peer, size_t peer_len,
                       const st__xfer_sup_arena_t *arenas, size_t n, char *err,
                       size_t errlen) {
  sup_tx_t *t = find(s, xfer);
  if (!t) {
    snprintf(err, errlen, "no transfer %llu", (unsigned long long)xfer);
    return ST_ERR_NOT_FOUND;
  }
  if (t->state == T_STARTED || !peer || peer_len == 0 || peer_len > ST_XFER_BLOB_MAX ||
      n > ST_XFER_MAX_ARENAS) {
    snprintf(err, errlen, t->state == T_STARTED ? "transfer %llu was started already"
                                                : "transfer %llu: bad blob or arena count",
             (unsigned long long)xfer);
    return ST_ERR_INVALID_ARGUMENT;
  }
  /* Build every record first, so that a failure queues nothing. */
  size_t nrec = n ? (n + ST_XFER_FDS_PER_MSG - 1) / ST_XFER_FDS_PER_MSG : 1;
  outrec_t **recs = calloc(nrec, sizeof *recs);
  if (!recs) {
    snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  int rc = ST_OK;
  for (size_t k = 0; k < nrec && rc == ST_OK; k++) {
    size_t first = k * ST_XFER_FDS_PER_MSG;
    size_t cnt = n - first < ST_XFER_FDS_PER_MSG ? n - first : ST_XFER_FDS_PER_MSG;
    int last = k == nrec - 1;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    rec_begin(&sb, &pk, last ? "start" : "arenas", last ? 3 : 2);
    st__pack_kv_uint(&pk, "xfer", xfer);
    if (last) {
      st__pack_cstr(&pk, "peer");
      st__xfer_pack_bin(&pk, peer, peer_len);
    }
    st__pack_cstr(&pk, "arenas");
    msgpack_pack_array(&pk, cnt);
    for (size_t i = first; i < first + cnt; i++) {
      int window = arenas[i].len > 0;
      msgpack_pack_map(&pk, 2 + (arenas[i].cuda ? 1 : 0) + (window ? 2 : 0));
      st__pack_kv_uint(&pk, "bytes", arenas[i].bytes);
      st__pack_kv_bool(&pk, "cuda", arenas[i].cuda);
      if (arenas[i].cuda) st__pack_kv_str(&pk, "uuid", arenas[i].uuid ? arenas[i].uuid : "");
      if (window) {
        st__pack_kv_uint(&pk, "off", arenas[i].off);
        st__pack_kv_uint(&pk, "len", arenas[i].len);
      }
    }
    recs[k] = rec_new(&sb, xfer);
    if (!recs[k]) {
      rc = ST_ERR_OUT_OF_MEMORY;
      snprintf(err, errlen, "out of memory");
      break;
    }
    for (size_t i = first; i < first + cnt; i++) {
      int d = fcntl(arenas[i].fd, F_DUPFD_CLOEXEC, 3);
      if (d < 0) {
        rc = ST_ERR_IO;
        snprintf(err, errlen, "arena %zu: dup of descriptor %d: %s", i, arenas[i].fd,
                 strerror(errno));
        break;
      }
      recs[k]->fds[recs[k]->nfds++] = d;
    }
  }
  if (rc != ST_OK) {
    for (size_t k = 0; k < nrec; k++)
      if (recs[k]) rec_free(recs[k]);
    free(recs);
    return rc;
  }
  for (size_t k = 0; k < nrec; k++) push(s, recs[k], 0);
  free(recs);
  t->state = T_STARTED;
  flush(s);
  return ST_OK;
}

int st__xfer_sup_abort(st__xfer_sup_t *s, uint64_t xfer, const char *reason) {
  sup_tx_t *t = find(s, xfer);
  if (!t) return ST_ERR_NOT_FOUND;
  if (t->abort_sent) return ST_OK;
  t->abort_sent = st__now_mono();
  if (t->deadline > t->abort_sent) t->deadline = t->abort_sent; /* the grace runs from now */
  msgpack_sbuffer sb;
  msgpack_packer pk;
  rec_begin(&sb, &pk, "abort", 2);
  st__pack_kv_uint(&pk, "xfer", xfer);
  st__pack_kv_str(&pk, "reason", reason ? reason : "aborted");
  ev_timer_start(s->loop, &s->tick);
  return queue_simple(s, &sb, xfer);
}

int st__xfer_sup_probe(st__xfer_sup_t *s, st__xfer_sup_probe_cb cb, void *ud, char *err,
                       size_t errlen) {
  if (s->nprobes >= MAX_PROBES) {
    snprintf(err, errlen, "%d probes are in flight already", MAX_PROBES);
    return ST_ERR_LIMIT;
  }
  msgpack_sbuffer sb;
  msgpack_packer pk;
  rec_begin(&sb, &pk, "probe", 0);
  int rc = queue_simple(s, &sb, 0);
  if (rc != ST_OK) {
    snprintf(err, errlen, "out of memory");
    return rc;
  }
  s->probes[s->nprobes].cb = cb;
  s->probes[s->nprobes].ud = ud;
  s->nprobes++;
  return ST_OK;
}

pid_t st__xfer_sup_pid(const st__xfer_sup_t *s) { return s->pid; }
unsigned st__xfer_sup_spawns(const st__xfer_sup_t *s) { return s->spawns; }
