/* src/proto: msgpack-RPC framing, message shapes, value checks and tensor
 * descriptors. No I/O and no libev: callers feed bytes in and take bytes out
 * (msgpack_sbuffer). Shared by the server and libstclient (docs/protocol.md).
 *
 * Threads: every function works on the objects it is given; none keeps
 * global state, so any thread may call them on objects it owns.
 */
#ifndef ST_PROTO_H
#define ST_PROTO_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

/* ------------------------------------------------------------- reading */

/* Open non-empty containers msgpack_unpacker can hold
 * (MSGPACK_EMBED_STACK_SIZE); deeper frames are ST_ERR_PROTOCOL. */
#define ST__SCAN_DEPTH 32
/* Whole large messages the scan remembers at once (st__reader_next_sliced). */
#define ST__SCAN_LARGE 8

/* Framing scan, private to reader.c: follows the object headers of the bytes
 * handed to `up` so that a frame whose declared sizes exceed max_message (or
 * that is not msgpack) is refused before msgpack allocates for it, and so
 * that message boundaries are known exactly. */
typedef struct st__frame_scan {
  uint64_t msg_bytes;               /* bytes of the message in progress      */
  uint64_t skip;                    /* payload bytes still to pass           */
  uint64_t items;                   /* objects still due, all levels         */
  uint64_t left[ST__SCAN_DEPTH];    /* objects still due per open container  */
  uint64_t complete;                /* whole messages scanned, not yet taken */
  uint32_t objects;                 /* objects begun in this message         */
  uint32_t id;                      /* the message's id, when id_stage == 3  */
  int depth;
  int id_stage;                     /* 0 none, 1 array, 2 type ok, 3 id read */
  uint8_t head[9];                  /* an object header split across feeds   */
  uint8_t head_len, head_need;
  int err;                          /* first error found, delivered by next  */
  const char *why;                  /* static reason for err                 */
  /* Large messages (st__reader_set_slicing): the sequence numbers and
   * sizes of whole ones not yet taken, oldest first (a ring; one that
   * finds it full is decoded whole). */
  uint64_t done;                    /* whole messages scanned since the start */
  uint64_t large_at;                /* a message this large is sliced (0: none) */
  struct { uint64_t seq, bytes; } large[ST__SCAN_LARGE];
  unsigned large_head, large_n;
} st__frame_scan_t;

/* Incremental frame reader over msgpack_unpacker. Owns its buffer. */
typedef struct st__reader {
  msgpack_unpacker up;
  size_t max_message;       /* a frame larger than this is ST_ERR_LIMIT */
  int failed;               /* sticky: after an error the reader is dead */
  st__frame_scan_t scan;    /* private to reader.c                       */
  uint64_t taken;           /* messages taken (decoded) since the start  */
  msgpack_unpacker *slice;  /* a large message being decoded a slice at a
                               time (owned), or NULL                     */
  uint64_t slice_bytes, slice_fed;
} st__reader_t;

/* A decoded message. Fields point into `unpacked`, which owns the memory;
 * st__message_destroy() frees it. */
typedef struct st__message {
  int type;                 /* ST_MSG_REQUEST / RESPONSE / NOTIFICATION */
  uint32_t id;              /* request and response                       */
  const char *method;       /* request and notification; NOT NUL-terminated */
  size_t method_len;
  msgpack_object params;    /* request and notification: an ARRAY        */
  msgpack_object error;     /* response: NIL or MAP                       */
  msgpack_object result;    /* response                                  */
  msgpack_unpacked unpacked;
} st__message_t;

/* ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__reader_init(st__reader_t *r, size_t max_message);
void st__reader_destroy(st__reader_t *r);

/* Space for at least `want` more bytes; *buf and *cap receive where to write.
 * Returns ST_OK, ST_ERR_OUT_OF_MEMORY. */
int st__reader_reserve(st__reader_t *r, size_t want, char **buf, size_t *cap);

/* Marks `n` bytes written into the space from st__reader_reserve. */
void st__reader_commit(st__reader_t *r, size_t n);

/* Feeds a whole buffer (copying); for tests and clients that read into
 * their own buffers. ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__reader_feed(st__reader_t *r, const void *data, size_t n);

/* Takes the next complete message.
 *   1  a message is in *msg (caller destroys it),
 *   0  more bytes are needed,
 *  <0  ST_ERR_PROTOCOL (bytes are not msgpack, or not one of the three
 *      message shapes; *msg then holds id in msg->id if one was readable and
 *      msg->type = -1) or ST_ERR_LIMIT (the frame exceeds max_message).
 * `err` (may be NULL) receives a reason. After an error the reader stays
 * failed: the connection must be closed. */
int st__reader_next(st__reader_t *r, st__message_t *msg, char *err, size_t errlen);

/* Messages of at least `large_bytes` (0: none) are decoded by
 * st__reader_next_sliced a slice at a time. Set before bytes come. */
void st__reader_set_slicing(st__reader_t *r, size_t large_bytes);

/* st__reader_next, except that a large message (st__reader_set_slicing)
 * is decoded `slice` bytes per call, so that no call holds its thread
 * for longer than decoding that many bytes takes: 2 while it is not done
 * (call again; nothing is in *msg), then 1 with the message. Its bytes
 * stay in the reader's buffer until then: the caller reads no more
 * meanwhile, or the buffer grows by what it reads. */
int st__reader_next_sliced(st__reader_t *r, st__message_t *msg, size_t slice, char *err,
                           size_t errlen);

/* Bytes buffered that do not yet form a whole message (a half-sent frame). */
size_t st__reader_pending(const st__reader_t *r);

/* Bytes committed to the reader that no message taken so far contains
 * (whole messages not yet taken plus a half-sent frame). Right after
 * st__reader_next returned a message, the bytes committed in all minus this
 * is where that message ends in the stream. */
size_t st__reader_buffered(const st__reader_t *r);

void st__message_destroy(st__message_t *msg);

/* ------------------------------------------------------------- writing */

/* [0, id, method, <caller packs params>] */
void st__pack_request_head(msgpack_packer *pk, uint32_t id, const char *method);
/* [1, id, nil, <caller packs result>] */
void st__pack_response_head(msgpack_packer *pk, uint32_t id);
/* [1, id, {code, name, message}, nil] — a whole message. */
void st__pack_error_response(msgpack_packer *pk, uint32_t id, int err, const char *message);
/* The same response up to its error map's `extra` more key/value pairs,
 * which the caller packs, then the nil result. */
void st__pack_error_response_head(msgpack_packer *pk, uint32_t id, int err, const char *message,
                                  size_t extra);
/* [2, method, <caller packs params>] */
void st__pack_notification_head(msgpack_packer *pk, const char *method);
/* {code, name, message}; err is a negative ST_ERR_*. */
void st__pack_error(msgpack_packer *pk, int err, const char *message);
/* A NUL-terminated string (NULL packs nil). */
void st__pack_cstr(msgpack_packer *pk, const char *s);
/* true (v nonzero) or false. */
void st__pack_bool(msgpack_packer *pk, int v);
/* One map entry: the key `k` (a literal or other NUL-terminated string)
 * and then its value, as the packer of the value's type packs it (a NULL
 * string packs nil). The caller counted the entry in the map's size. */
void st__pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void st__pack_kv_int(msgpack_packer *pk, const char *k, int64_t v);
void st__pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v);
void st__pack_kv_double(msgpack_packer *pk, const char *k, double v);
void st__pack_kv_bool(msgpack_packer *pk, const char *k, int v);
/* An ext value whose payload is the bytes of `payload`. */
void st__pack_ext(msgpack_packer *pk, int8_t type, const msgpack_sbuffer *payload);

/* ------------------------------------------------------------- inspecting */

/* Key lookup in a MAP with string keys; NULL if absent or not a map. */
const msgpack_object *st__map_get(const msgpack_object *map, const char *key);

/* params[key] as a list of ids: ST_OK with *ids the array (borrowed), or
 * NULL when the key is absent or nil; ST_ERR_INVALID_ARGUMENT ("'<key>'
 * must be an array of <noun> (integers >= 1)") when it is not an array
 * of integers >= 1. */
int st__map_get_ids(const msgpack_object *params, const char *key, const char *noun,
                    const msgpack_object **ids, char *err, size_t errlen);

/* Nonzero if o is a STR equal to s. */
int st__str_eq(const msgpack_object *o, const char *s);

/* Wire text as a C string (docs/protocol.md, "Strings"): copies the STR
 * `o` into buf[cap] with a NUL after it. Its length, or -1 when o is not
 * a STR, holds a NUL byte (C code would read it as shorter) or has cap
 * bytes or more (a cut copy could mean another word); buf is "" then.
 * Every wire string that C string functions (strcmp, strtoul, sscanf,
 * %s, ...) read goes through here. Any thread. */
long st__wire_cstr(const msgpack_object *o, char *buf, size_t cap);

/* Wire bytes p[0..n) shown in a message: printable ASCII as they are,
 * every other byte (a NUL too) as \xNN, cut after 64 bytes with "...";
 * into buf[cap] (cap >= 8), NUL-terminated. Returns buf. Any thread. */
const char *st__wire_shown(const char *p, size_t n, char *buf, size_t cap);

/* Nonzero if `features` (hello's, may be NULL) is an array that lists the
 * string `name`. */
int st__features_has(const msgpack_object *features, const char *name);

/* The named-parameter map of a request: `params` must be an ARRAY of zero
 * or one MAP. *map receives the map or NULL for []. ST_OK or
 * ST_ERR_INVALID_ARGUMENT with a reason in err. */
int st__params_map(const msgpack_object *params, const msgpack_object **map,
                   char *err, size_t errlen);

/* Checks that every key of a params map is in the NULL-terminated list
 * `allowed`. ST_OK or ST_ERR_INVALID_ARGUMENT ("unknown parameter 'x'"). */
int st__params_check(const msgpack_object *map, const char *const *allowed,
                     char *err, size_t errlen);

/* Checks a client-supplied value: only nil, bool, int, float, str, bin,
 * array and map (string keys at every level), nested at most ST_MAX_DEPTH.
 * Ext values are refused unless allow_ext. ST_OK or ST_ERR_INVALID_ARGUMENT. */
int st__check_value(const msgpack_object *o, int allow_ext, char *err, size_t errlen);

/* ------------------------------------------------------------- descriptors */

typedef struct st__tensor_desc {
  uint32_t arena;                  /* index in the reply's arenas */
  uint64_t offset;                 /* bytes from the arena start  */
  st_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  int64_t strides[ST_MAX_NDIM];    /* in elements, >= 0            */
} st__tensor_desc_t;

/* Bytes of a legacy CUDA IPC handle (cudaIpcMemHandle_t). */
#define ST_IPC_HANDLE_LEN 64

typedef struct st__arena_desc {
  uint32_t fd;                     /* index among the message's fds;
                                      unused (0) for a legacy arena  */
  uint64_t bytes;
  int cuda;                        /* 0 cpu, 1 cuda                 */
  char uuid[48];                   /* "GPU-..." or ""               */
  char backend[16];                /* "memfd", "vmm", "legacy"      */
  uint64_t id;
  /* backend "legacy" only (docs/protocol.md, "Legacy CUDA IPC arenas"):
   * no descriptor travels; the allocation is named by its handle. */
  int legacy;                      /* 1: backend is "legacy"        */
  unsigned char ipc_handle[ST_IPC_HANDLE_LEN]; /* of the allocation base */
  int32_t device_index;            /* the server's device ordinal   */
  uint64_t storage_bytes;          /* bytes holding data, <= bytes  */
  /* Tensor arguments only (docs/protocol.md, "Tensor arguments"): the
   * client's name for the allocation, so that the server keeps it for
   * later requests of the connection; 0 when absent. With no_fd the entry
   * carries no descriptor and names an allocation sent before. */
  uint64_t arg_id;
  int no_fd;
  /* Replies only (docs/keys.md, "Read-only mappings"): the client maps
   * the arena read-only (its descriptor, on the CPU, cannot map it
   * writable anyway). Packed as `readonly: true` when set. */
  int readonly;
} st__arena_desc_t;

/* Packs a tensor as ext ST_EXT_TENSOR. */
void st__pack_tensor(msgpack_packer *pk, const st__tensor_desc_t *d);

/* Parses an ext ST_EXT_TENSOR object (o->type == MSGPACK_OBJECT_EXT).
 * Validates dtype, ndim, non-negative sizes and strides. ST_OK or
 * ST_ERR_PROTOCOL with a reason. */
int st__parse_tensor(const msgpack_object *o, st__tensor_desc_t *d, char *err, size_t errlen);

/* Byte range [*lo, *hi) that a tensor touches, relative to its arena.
 * An empty tensor gives lo == hi == offset. ST_ERR_PROTOCOL on overflow. */
int st__tensor_extent(const st__tensor_desc_t *d, uint64_t *lo, uint64_t *hi);

/* Number of elements (product of shape; 1 for ndim 0). */
int64_t st__tensor_numel(const st__tensor_desc_t *d);

/* Arena map, as in docs/protocol.md. A legacy arena (d->legacy, backend
 * "legacy", always CUDA) is packed without "fd" and with ipc_handle,
 * device_index and storage_bytes; parsing refuses a legacy arena that has
 * an "fd" or lacks one of those, any other arena without "fd" (unless it
 * has an "arg_id": a tensor argument the server keeps, parsed with no_fd
 * set), and a backend that is not one of its device's ("memfd" for cpu;
 * "vmm" or "legacy" for cuda). A nonzero arg_id is packed as "arg_id",
 * and no_fd leaves "fd" out. */
void st__pack_arena(msgpack_packer *pk, const st__arena_desc_t *a);
/* The same map with room for `extra` more pairs, which the caller packs
 * after it (a pooled region's "pool"). */
void st__pack_arena_open(msgpack_packer *pk, const st__arena_desc_t *a, size_t extra);
int st__parse_arena(const msgpack_object *o, st__arena_desc_t *a, char *err, size_t errlen);
/* A pooled region's entry as its slab (docs/protocol.md, "Result pools"):
 * the same checks, but "fd" is optional (no_fd when absent: the slab came
 * with an earlier reply) and a legacy backend is refused. */
int st__parse_pool_slab(const msgpack_object *o, st__arena_desc_t *a, char *err, size_t errlen);

/* Modules: ext ST_EXT_MODULE whose payload is {tensors: [[name, tensor]...],
 * metadata: map}. The packer side builds the payload with
 * st__pack_tensor() and st__pack_ext(); parsing hands back the pieces. */
int st__parse_module(const msgpack_object *o, msgpack_unpacked *payload,
                     const msgpack_object **tensors, const msgpack_object **metadata,
                     char *err, size_t errlen);

#endif
