/* kvtier C ABI: the calls of kvtier::Client (client.h) for engines and
 * bindings that cannot use C++. Pure C11, standard headers only; the library
 * itself is libkvtier_client.
 *
 *   kvtier_client* c;
 *   if (kvtier_connect(path, &ns, 1, &c) != KVTIER_OK) puts(kvtier_last_error());
 *   kvtier_chain_keys(&ns, tokens, n_tokens, keys, cap, &n_keys);
 *   kvtier_lookup(c, 0, keys, n_keys, &prefix, NULL);
 *   kvtier_get(c, 0, keys[0], dst, dst_bytes, &len);
 *   kvtier_close(c);
 *
 * Conventions of every function below:
 * - The return value is a KVTIER_* status code; KVTIER_OK is success.
 * - A NULL pointer where one is required is KVTIER_INVALID_ARGUMENT. Array
 *   pointers may be NULL when their element count is 0.
 * - Every call except kvtier_last_error and kvtier_status_name first clears
 *   this thread's error message, and sets it if it fails (see
 *   kvtier_last_error).
 * - Input pointers are borrowed for the duration of the call only; nothing
 *   the caller passes in is retained. Output arrays are written, never kept.
 * - No C++ exception crosses this ABI: an unexpected one becomes
 *   KVTIER_INTERNAL.
 * - A kvtier_client is thread-safe: any number of threads may call it at
 *   once (requests are pipelined on one connection), except that
 *   kvtier_close must not race with any other call on the same client.
 *   A kvtier_view belongs to one thread at a time.
 */
#ifndef KVTIER_KVTIER_C_H_
#define KVTIER_KVTIER_C_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the numeric values of kvtier::StatusCode (status.h). */
#define KVTIER_OK 0
#define KVTIER_INVALID_ARGUMENT 1
#define KVTIER_NOT_FOUND 2
#define KVTIER_ALREADY_EXISTS 3
#define KVTIER_NO_SPACE 4
#define KVTIER_BUSY 5
#define KVTIER_IO_ERROR 6
#define KVTIER_CORRUPTION 7
#define KVTIER_PROTOCOL_ERROR 8
#define KVTIER_VERSION_MISMATCH 9
#define KVTIER_UNAVAILABLE 10
#define KVTIER_PERMISSION_DENIED 11
#define KVTIER_FAILED_PRECONDITION 12
#define KVTIER_UNIMPLEMENTED 13
#define KVTIER_INTERNAL 14
#define KVTIER_CANCELLED 15
#define KVTIER_TIMED_OUT 16

/* Tiers: the values of kvtier::Tier (client.h). */
#define KVTIER_TIER_NONE 0
#define KVTIER_TIER_HBM 1
#define KVTIER_TIER_HOST 2
#define KVTIER_TIER_NVME 3
#define KVTIER_TIER_REMOTE 4

/* A connection to kvtierd. Opaque; created by kvtier_connect, destroyed by
 * kvtier_close. */
typedef struct kvtier_client kvtier_client;

/* A block pinned in the daemon's arena (kvtier::BlockView). Opaque; created
 * by kvtier_pin, destroyed by kvtier_view_release. */
typedef struct kvtier_view kvtier_view;

/* Arena space reserved for a zero-copy put (kvtier::Reservation). Opaque;
 * created by kvtier_reserve, destroyed by kvtier_reservation_free. */
typedef struct kvtier_reservation kvtier_reservation;

/* A prefix saved layer by layer (kvtier::LayerSave). Opaque; created by
 * kvtier_begin_save, destroyed by kvtier_save_free. */
typedef struct kvtier_layer_save kvtier_layer_save;

/* A prefix loading layer by layer (kvtier::LayerLoad). Opaque; created by
 * kvtier_begin_load, destroyed by kvtier_end_load. */
typedef struct kvtier_layer_load kvtier_layer_load;

/* A 128-bit block key (kvtier::BlockKey): the high and low 64 bits. */
typedef struct {
  uint64_t hi, lo;
} kvtier_key;

/* Mirrors kvtier::NamespaceDescriptor (block_key.h): everything that changes
 * the bytes of a KV block. Strings are NUL-terminated and borrowed for the
 * call; NULL reads as "" (object_kind: see below). The last four fields
 * (block keys v2, docs/KEYS.md) were appended: 0 / NULL reads as the
 * default (pp_size 1, kv_format_version 1, object_kind "kv"), so a
 * zero-initialised struct that sets the fields above stays valid. */
typedef struct {
  const char* model_id;               /* e.g. "meta-llama/Llama-3.1-8B-Instruct" */
  const char* model_revision;         /* required */
  const char* adapter_id;             /* NULL or "": no adapter */
  const char* adapter_revision;       /* NULL or "" when there is no adapter */
  const char* kv_dtype;               /* e.g. "bf16" */
  uint32_t block_tokens;              /* tokens per block, > 0 */
  uint32_t layer_count;               /* > 0 */
  const char* kv_layout;              /* e.g. "layer_major_kv" */
  uint64_t bytes_per_token_per_layer; /* > 0 (K and V together) */
  uint32_t tp_rank;                   /* < tp_size */
  uint32_t tp_size;                   /* > 0 */
  uint32_t pp_rank;                   /* pipeline-parallel rank, < pp_size */
  uint32_t pp_size;                   /* 0 reads as 1 */
  uint32_t kv_format_version;         /* engine KV data-format version; 0 reads as 1 */
  const char* object_kind;            /* NULL reads as "kv"; else 1-64 of [a-z0-9_],
                                         e.g. "recurrent_state" */
} kvtier_namespace;

/* Options of kvtier_connect_with_options (a subset of kvtier::ClientOptions).
 * Initialise it with kvtier_client_options_init, which sets `size` and every
 * default, then change fields: later versions may append fields, and the
 * library reads only the first `size` bytes (a field past them keeps its
 * default). */
typedef struct {
  size_t size;          /* sizeof(kvtier_client_options) as the caller compiled it */
  int verify_checksums; /* != 0: every read checks the bytes it hands out
                           against the checksums recorded at commit
                           (kvtier::ClientOptions::verify_checksums): a
                           mismatch is KVTIER_CORRUPTION, never the bytes,
                           and the block is reported so later reads miss.
                           Costs a hash of the bytes read. Default 0. */
} kvtier_client_options;

/* Options of kvtier_begin_load_with (kvtier::LoadOptions). Initialise it
 * with kvtier_load_options_init, which sets `size` and every default, then
 * change fields; as with kvtier_client_options, the library reads only the
 * first `size` bytes. */
typedef struct {
  size_t size;      /* sizeof(kvtier_load_options) as the caller compiled it */
  void* const* dst; /* NULL: zero-copy (kvtier_load_layer_span); else n host
                       buffers of dst_capacity bytes (a whole block or more) */
  size_t dst_capacity;
  void* const* device_dst; /* or n device pointers on device_ordinal (not with dst);
                              see kvtier_begin_load_device */
  int device_ordinal;
  void* cuda_stream;             /* a cudaStream_t; NULL: the legacy default stream */
  double compute_us_per_layer;   /* > 0: plan the buffer depth (kvtier_load_plan) */
  int wait_for_depth;            /* != 0: return once the planned depth is in */
  double recompute_us_per_layer; /* recomputing the prefix, per layer (0: unknown) */
  uint64_t deadline_us;          /* how long the load may take, from the call; 0:
                                    layers x recompute_us_per_layer when that is
                                    > 0, else none. A block the daemon estimates
                                    cannot be in host memory by then fails at once
                                    (KVTIER_TIMED_OUT in statuses, not read); past
                                    it, kvtier_wait_layer fails the blocks not yet
                                    whole with KVTIER_TIMED_OUT and returns. */
} kvtier_load_options;

/* A preload plan (kvtier::PreloadPlan, kvtier/preload.h). */
typedef struct {
  uint32_t layers_to_preload; /* n_pre, in [1, layers] */
  uint64_t buffer_bytes;      /* n_pre x bytes_per_layer */
  double read_bytes_per_s;    /* the daemon's measured bandwidth planned with */
  double read_us_per_layer;   /* t_read, margin and per-layer overhead in */
  double stall_us;            /* n_pre x t_read */
  double total_us;            /* stall + layers x compute */
  int recompute_instead;      /* 1: recomputing the prefix is no slower */
} kvtier_preload_plan;

/* A ready-time estimate (kvtier::ReadyEstimate, kvtier/ready_estimate.h):
 * its per-block tiers and per-tier shares go to the caller's arrays of
 * kvtier_estimate_ready. Times in microseconds from the call. */
typedef struct {
  size_t prefix_blocks;        /* the longest cached prefix, as kvtier_lookup's */
  uint64_t prefix_bytes;       /* its blocks' bytes */
  double host_ready_us;        /* until all of it can be in host memory (0: it is) */
  double gpu_ready_us;         /* until all of it can be in GPU memory (0: it is, in the HBM tier) */
  uint64_t gpu_copy_bytes;     /* bytes of it not in the HBM tier */
  double gpu_copy_bytes_per_s; /* the host copy rate they were timed at */
  size_t n_below;              /* tiers below the host: shares the daemon sent */
} kvtier_ready_estimate;

/* One tier below the host in a ready estimate (kvtier::ReadyTierShare). */
typedef struct {
  uint8_t tier;              /* KVTIER_TIER_NVME or _REMOTE */
  uint32_t blocks;           /* blocks of the prefix to read from it */
  uint64_t bytes;            /* their bytes */
  uint32_t promoting_blocks; /* blocks of the prefix already being read up from it */
  uint32_t queued_reads;     /* reads in flight on it, any caller's */
  uint64_t queued_bytes;     /* their bytes: a new read waits behind them */
  double read_bytes_per_s;   /* the measured bandwidth used (as kvtier_plan_preload's) */
  double overhead_us;        /* one read's overhead, when the prefix reads from it */
  double ready_us;           /* overhead + (queued + bytes) / bandwidth; 0: nothing of the prefix here */
} kvtier_ready_tier;

/* Per-thread error message. */

// The message of the last failed call on this thread, "" if the last call
// succeeded or there was none. The string is owned by the library and stays
// valid until the next kvtier_* call on this thread. Never NULL.
const char* kvtier_last_error(void);

// The stable lower-case name of a status code ("not_found"), or "unknown".
// A static string; never NULL. Pure: does not touch kvtier_last_error.
const char* kvtier_status_name(int code);

/* Keys (no connection needed; thread-safe). */

// Writes the namespace fingerprint (the key block 0 chains from) to `*out`.
// KVTIER_INVALID_ARGUMENT if the descriptor does not validate (the message
// names the field) or a pointer is NULL.
int kvtier_namespace_fingerprint(const kvtier_namespace* ns, kvtier_key* out);

// Computes the chained keys of every full block of `tokens` (a partial
// trailing block gets none) into out[0 .. *out_count). `*out_count` is set to
// the number of keys needed even when out_capacity is too small; then nothing
// is written to `out` and the result is KVTIER_INVALID_ARGUMENT.
// KVTIER_INVALID_ARGUMENT also for a bad descriptor or NULL pointers.
int kvtier_chain_keys(const kvtier_namespace* ns, const uint32_t* tokens, size_t n_tokens, kvtier_key* out,
                      size_t out_capacity, size_t* out_count);

// kvtier_chain_keys with a per-request cache salt (tenant / user isolation):
// cache_salt[0 .. salt_len) enters block 0, so every key differs from the
// unsalted chain's. salt_len 0 (cache_salt may then be NULL) is
// kvtier_chain_keys. KVTIER_INVALID_ARGUMENT also for salt_len > 4096 or a
// NULL cache_salt with salt_len > 0. Per-block extra keys (multimodal,
// prompt embeds) are C++ only (kvtier::ChainExtras).
int kvtier_chain_keys_salted(const kvtier_namespace* ns, const char* cache_salt, size_t salt_len,
                             const uint32_t* tokens, size_t n_tokens, kvtier_key* out, size_t out_capacity,
                             size_t* out_count);

// Writes the 32 lower-case hex digits of `key` and a NUL to `out`.
// KVTIER_INVALID_ARGUMENT if `out` is NULL.
int kvtier_key_to_hex(kvtier_key key, char out[33]);

/* Connection. */

// Connects to the daemon at `socket_path` (NULL: the default
// /run/kvtier/kvtierd.sock), registers `namespaces` (namespace id i is
// namespaces[i]) and maps the arena. On success `*out` owns a new client the
// caller frees with kvtier_close; on failure `*out` is NULL.
// KVTIER_UNAVAILABLE if no daemon listens, KVTIER_TIMED_OUT if the daemon
// does not answer within 5 s, KVTIER_PROTOCOL_ERROR for a malformed
// answer, KVTIER_VERSION_MISMATCH, KVTIER_INVALID_ARGUMENT for a bad
// descriptor, KVTIER_IO_ERROR.
// The client uses kvtier::ClientOptions' defaults: every call below that
// waits for the daemon gives up after 30 s with KVTIER_TIMED_OUT, and the
// client is then failed: later calls return KVTIER_UNAVAILABLE at once.
// When the daemon closes the connection (it exited or restarted), calls
// return KVTIER_UNAVAILABLE at once while the client reconnects on its own
// (kvtier::ClientOptions::reconnect); views, reservations and saves from
// before stay readable but end with KVTIER_UNAVAILABLE.
int kvtier_connect(const char* socket_path, const kvtier_namespace* namespaces, size_t n_namespaces,
                   kvtier_client** out);

// Sets `*options` to the defaults kvtier_connect uses, and its `size` to
// sizeof(kvtier_client_options). NULL is a no-op.
void kvtier_client_options_init(kvtier_client_options* options);

// kvtier_connect with `options` (NULL: the defaults, as kvtier_connect).
// KVTIER_INVALID_ARGUMENT also when options->size is smaller than the
// struct's first version (sizeof(size_t) + sizeof(int), padded).
int kvtier_connect_with_options(const char* socket_path, const kvtier_namespace* namespaces, size_t n_namespaces,
                                const kvtier_client_options* options, kvtier_client** out);

// Frees `client`. NULL is a no-op. Must not race with other calls on
// `client`. The connection closes at once if no view pinned through
// `client` is alive, else when the last of them is released: until then
// those views stay pinned on the daemon (their bytes valid and unchanged)
// and kvtier_view_release still unpins them there (KVTIER_OK).
void kvtier_close(kvtier_client* client);

/* Operations. `ns` is a namespace id from kvtier_connect; one out of range is
 * KVTIER_INVALID_ARGUMENT. A lost connection is KVTIER_UNAVAILABLE; no answer
 * within 30 s is KVTIER_TIMED_OUT (see kvtier_connect). */

// Longest cached prefix of keys[0 .. n): `*prefix_blocks` consecutive hits
// from keys[0]. If `tiers` is not NULL it receives n entries: the tier of
// each hit, KVTIER_TIER_NONE from index *prefix_blocks on.
int kvtier_lookup(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, size_t* prefix_blocks,
                  uint8_t* tiers);

// Copies `len` bytes from `data` into the arena and publishes the block.
// KVTIER_OK also when it was already cached (puts are idempotent);
// KVTIER_NO_SPACE when nothing can be evicted; KVTIER_INVALID_ARGUMENT for
// len 0 or a block larger than the arena.
int kvtier_put(kvtier_client* client, uint32_t ns, kvtier_key key, const void* data, size_t len);

// kvtier_put for n blocks in one round trip: data[i] holds lens[i] bytes of
// keys[i]. Returns KVTIER_OK when the call went through, with each key's code
// in statuses[i] (all KVTIER_UNAVAILABLE if the connection is lost); the
// thread's error message is that of the first failed key. Not KVTIER_OK only
// for bad arguments (NULL arrays, `ns` out of range).
int kvtier_put_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data,
                     const size_t* lens, size_t n, int* statuses);

// kvtier_put_batch for n consecutive blocks of one prefix chain, root
// first (keys[i-1] is keys[i]'s parent); `parent`, if not NULL, is the
// block before keys[0] (the last block of the cached prefix a prefill
// extended). The daemon keeps these links for its SSD admission, which
// never writes a block whose prefix is cached nowhere (kvtier::ChainLinks).
int kvtier_put_chain(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data,
                     const size_t* lens, size_t n, const kvtier_key* parent, int* statuses);

// Copies the block into `dst` (capacity bytes) and sets `*len` to its length.
// KVTIER_NOT_FOUND on a miss; KVTIER_INVALID_ARGUMENT if the block is larger
// than `capacity` (`*len` is then 0); KVTIER_CORRUPTION on a checksum
// mismatch when checksum verification is on (kvtier_client_options.
// verify_checksums): `*len` is 0, the bytes in `dst` must not be used, and
// the block is reported to the daemon so later reads miss. Without
// verification the bytes are copied as they are in the arena.
int kvtier_get(kvtier_client* client, uint32_t ns, kvtier_key key, void* dst, size_t capacity, size_t* len);

// kvtier_get for n blocks in one round trip: keys[i] into dst[i] of
// capacities[i] bytes, its length in lens[i] (0 on failure), its code in
// statuses[i]. KVTIER_OK when the call went through, as kvtier_put_batch.
int kvtier_get_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, void* const* dst,
                     const size_t* capacities, size_t n, size_t* lens, int* statuses);

// Zero-copy read: pins the block and points `*data` at its `*len` bytes in
// the shared arena, read-only. The bytes stay valid and unchanged until
// kvtier_view_release(*out), which the caller must call, also after
// kvtier_close (the view keeps the connection, and so the pin, alive) and
// after a failure of the connection (then, as for kvtier::BlockView, the
// bytes are unchanged after a timeout, but may change once the daemon itself
// closed the connection). KVTIER_NOT_FOUND on a miss; with checksum
// verification on, KVTIER_CORRUPTION when the pinned bytes do not match
// their checksum (checked before the view is handed out: the pin is
// released and the block reported, later reads miss); on failure *out is
// NULL.
int kvtier_pin(kvtier_client* client, uint32_t ns, kvtier_key key, kvtier_view** out, const void** data, size_t* len);

// Unpins the block (waiting for the daemon) and frees `view`; its data
// pointer is dangling afterwards. NULL is a no-op (KVTIER_OK).
// KVTIER_UNAVAILABLE if the connection failed earlier (the pin ends as the
// socket closes), KVTIER_TIMED_OUT; `view` is freed either way. Releasing
// the last view of a closed client closes its connection.
int kvtier_view_release(kvtier_view* view);

// Removes keys[0 .. n); `*erased` (may be NULL) gets how many were cached.
// Pinned blocks leave lookups at once and are freed on their last release.
int kvtier_erase(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, size_t* erased);

// Queue hints (Client::Enqueue and friends): request `request` (this
// client's own id) will need keys[0 .. n) of `ns`, root first, expected to
// start `start_in_us` microseconds from now, in conversation `session`
// (0: none); again with the same id replaces it. KVTIER_BUSY when the
// daemon holds 65536 queued requests.
int kvtier_enqueue(kvtier_client* client, uint64_t request, uint32_t ns, const kvtier_key* keys, size_t n,
                   uint64_t start_in_us, uint64_t session);
// The request left the queue (started, or finished / dropped before
// starting). KVTIER_NOT_FOUND if it is not queued.
int kvtier_request_started(kvtier_client* client, uint64_t request);
int kvtier_request_finished(kvtier_client* client, uint64_t request);
// Conversation `session` (not 0) opened (`open` != 0) or closed.
int kvtier_session_hint(kvtier_client* client, uint64_t session, int open);

// The whole arena mapping (kvtier::Client::arena): its base address and
// length, e.g. for one cudaHostRegister at start-up. Valid until
// kvtier_close and the release of the client's last view, reservation and
// save, or until a reconnect (the daemon restarted): then ask again, the
// client uses the new daemon's arena.
int kvtier_arena(kvtier_client* client, void** base, size_t* len);

// Zero-copy put (kvtier::Client::Reserve): reserves sizes[i] bytes of the
// arena for keys[i]. statuses[i] gets each key's code: KVTIER_OK (write
// exactly sizes[i] bytes at data[i], then kvtier_commit),
// KVTIER_ALREADY_EXISTS (cached or being written elsewhere: skip it; data[i]
// is NULL), KVTIER_NO_SPACE or another failure (data[i] NULL). On KVTIER_OK
// `*out` is a reservation the caller frees with kvtier_reservation_free;
// nothing of it is visible before kvtier_commit. Not KVTIER_OK: bad
// arguments or a failed call (no per-key codes, `*out` NULL).
int kvtier_reserve(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const size_t* sizes, size_t n,
                   kvtier_reservation** out, void** data, int* statuses);
// Publishes every block reserved KVTIER_OK (the daemon checksums each);
// statuses[i] gets each key's outcome (reservation codes passed through).
// KVTIER_FAILED_PRECONDITION if it was committed before.
int kvtier_commit(kvtier_reservation* reservation, int* statuses);
// Frees the reservation; one not committed returns its space, publishing
// nothing. NULL is a no-op.
void kvtier_reservation_free(kvtier_reservation* reservation);

// Layer-wise save (kvtier::LayerSave): reserves a whole block of `ns` for
// each of keys[0 .. n), root first (`parent`, if not NULL, is the block
// before keys[0]). `*layer_bytes` gets one layer's bytes (a block is
// layer-major: layer l at l * layer_bytes); statuses[i] each block's code
// as kvtier_reserve. `*out` as kvtier_reserve's, freed by kvtier_save_free.
int kvtier_begin_save(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, const kvtier_key* parent,
                      kvtier_layer_save** out, size_t* layer_bytes, int* statuses);
// Copies src[i] (layer_bytes each; entries of blocks not KVTIER_OK may be
// NULL) into layer `layer` of every block. KVTIER_INVALID_ARGUMENT for a
// layer out of range, KVTIER_FAILED_PRECONDITION once finished.
int kvtier_save_layer(kvtier_layer_save* save, uint32_t layer, const void* const* src);
// Zero-copy: `*data` is layer `layer` of block `block` in the arena
// (layer_bytes long); after writing a layer in every block, call
// kvtier_layer_written. KVTIER_INVALID_ARGUMENT for indices out of range
// or a block not KVTIER_OK (`*data` NULL).
int kvtier_save_layer_span(kvtier_layer_save* save, size_t block, uint32_t layer, void** data);
int kvtier_layer_written(kvtier_layer_save* save, uint32_t layer);
// Publishes the saved layers to this node's peers as they are saved
// (kvtier::LayerSave::PublishToPeers); `free_when_taken` non-zero: a
// hand-off, each block leaves this node once a peer has read it whole.
// KVTIER_FAILED_PRECONDITION once finished; KVTIER_INVALID_ARGUMENT when
// a second call asks another free_when_taken than the first.
int kvtier_save_publish_to_peers(kvtier_layer_save* save, int free_when_taken);
// Commits every block in one request once every layer is in; statuses[i]
// as kvtier_commit. KVTIER_FAILED_PRECONDITION while a layer is missing
// (nothing committed; the save stays open) or once finished.
int kvtier_finish_save(kvtier_layer_save* save, int* statuses);
// Frees the save; one not finished leaves nothing visible and returns its
// space. NULL is a no-op.
void kvtier_save_free(kvtier_layer_save* save);

// Preload planning (kvtier::Client::PlanPreload): layers of a prefix with
// `bytes_per_layer` per layer to hold before computing new tokens that take
// `compute_us_per_layer` a layer, reading from `source_tier`
// (KVTIER_TIER_HOST, _NVME, _REMOTE) at the daemon's measured bandwidth;
// `recompute_us_per_layer` 0 if unknown. KVTIER_NOT_FOUND without such a
// tier, KVTIER_INVALID_ARGUMENT for no layers or bytes.
int kvtier_plan_preload(kvtier_client* client, uint8_t source_tier, uint64_t bytes_per_layer,
                        double compute_us_per_layer, uint32_t layers, double recompute_us_per_layer,
                        kvtier_preload_plan* out);

// Ready-time estimate (kvtier::Client::EstimateReady): for the longest
// cached prefix of keys[0 .. n), when it can be in host and GPU memory, from
// the daemon's measured bandwidths and the reads queued on each tier (R of a
// router's max(Q, R) + C). `*out` is filled; if `tiers` is not NULL it
// receives n entries as kvtier_lookup's; if `below` is not NULL it receives
// the first min(below_cap, out->n_below) tiers below the host, highest
// first. KVTIER_INVALID_ARGUMENT for an unknown `ns` or more than 65,536 keys.
int kvtier_estimate_ready(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                          kvtier_ready_estimate* out, uint8_t* tiers, kvtier_ready_tier* below, size_t below_cap);

// Layer-wise load (kvtier::Client::BeginLoad, kvtier::LayerLoad) of
// keys[0 .. n) of `ns`, root first, whole blocks of the namespace. `dst`:
// NULL for zero-copy (kvtier_load_layer_span), else n host buffers of at
// least `dst_capacity` bytes each (a whole block or more), into which
// kvtier_wait_layer copies each layer. `compute_us_per_layer` > 0 plans
// the buffer depth (kvtier_load_plan); `wait_for_depth` != 0 then returns
// only once that many layers are in. statuses[i] (NULL: not wanted) gets
// each block's code at the start (KVTIER_OK: loading or loaded;
// KVTIER_NOT_FOUND...); `*layers` and `*layer_bytes` (each may be NULL) the
// layout. On failure `*out` is NULL.
int kvtier_begin_load(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, void* const* dst,
                      size_t dst_capacity, double compute_us_per_layer, int wait_for_depth, kvtier_layer_load** out,
                      uint32_t* layers, size_t* layer_bytes, int* statuses);
// kvtier_begin_load into GPU memory (LoadOptions::device_dst): n device
// pointers on device `device_ordinal`, each with room for a whole block;
// kvtier_wait_layer then enqueues the layer's host-to-device copies and
// makes `cuda_stream` (a cudaStream_t; NULL: the legacy default stream)
// wait for them on the GPU, without waiting on the host. Blocks the
// daemon holds in GPU memory on that device (its HBM tier) are copied
// device to device instead, from a mapping of the daemon's device pool
// the client opens once per connection; they have no arena bytes
// (kvtier_load_layer_span: KVTIER_FAILED_PRECONDITION).
// KVTIER_UNIMPLEMENTED when libkvtier_client was built without CUDA,
// KVTIER_UNAVAILABLE without a usable device.
int kvtier_begin_load_device(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                             void* const* device_dst, int device_ordinal, void* cuda_stream,
                             double compute_us_per_layer, int wait_for_depth, kvtier_layer_load** out, uint32_t* layers,
                             size_t* layer_bytes, int* statuses);
// Sets `size` and the defaults of kvtier::LoadOptions (no buffers, no plan,
// no deadline: every field 0). NULL is a no-op. Inline, so that `size` is
// the struct the caller compiled, whatever the library's version.
static inline void kvtier_load_options_init(kvtier_load_options* options) {
  if (options == NULL) return;
  memset(options, 0, sizeof *options);
  options->size = sizeof *options;
}
// kvtier_begin_load with every option (kvtier_load_options), the deadline
// among them. KVTIER_INVALID_ARGUMENT for options not initialised by
// kvtier_load_options_init (`size` too small), both dst and device_dst, a
// negative time, or a recompute time that is not finite.
int kvtier_begin_load_with(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                           const kvtier_load_options* options, kvtier_layer_load** out, uint32_t* layers,
                           size_t* layer_bytes, int* statuses);
// Waits until layer `layer` is in place in every block that has not failed
// (copied into the buffers in copy mode), or until the load's deadline
// (then the blocks not yet whole fail with KVTIER_TIMED_OUT and it
// returns KVTIER_OK). A layer already in place costs a
// memory read. KVTIER_TIMED_OUT (the load goes on: wait again),
// KVTIER_UNAVAILABLE (the daemon is gone), KVTIER_INVALID_ARGUMENT.
int kvtier_wait_layer(kvtier_layer_load* load, uint32_t layer);
// Layers in place in every block that has not failed (a memory read).
uint32_t kvtier_layers_ready(const kvtier_layer_load* load);
// Block `block`'s code: KVTIER_OK while loading and once loaded, else why it
// failed (recompute it): with checksum verification on, KVTIER_CORRUPTION
// once one of its layers did not match its checksum in kvtier_wait_layer
// (reported; its bytes must not be used). The usable prefix: the blocks before the first
// failed one, usable as cached KV (final once the last layer was waited
// for).
int kvtier_load_block_status(const kvtier_layer_load* load, size_t block);
size_t kvtier_load_usable_prefix(const kvtier_layer_load* load);
// Zero-copy: `*data` is layer `layer` of block `block` in the arena
// (layer_bytes long, read-only), valid after kvtier_wait_layer(layer) and
// until kvtier_end_load. KVTIER_NOT_FOUND for a failed block or a layer not
// in place, KVTIER_INVALID_ARGUMENT for indices out of range,
// KVTIER_FAILED_PRECONDITION for a block of a kvtier_begin_load_device load
// that the daemon hands over in its device memory (the HBM tier: its
// bytes reach the device buffers only, never the arena),
// KVTIER_PROTOCOL_ERROR when the load board names memory outside the arena.
int kvtier_load_layer_span(const kvtier_layer_load* load, size_t block, uint32_t layer, const void** data);
// The depth plan of a load begun with compute_us_per_layer > 0;
// KVTIER_NOT_FOUND otherwise.
int kvtier_load_plan(const kvtier_layer_load* load, kvtier_preload_plan* out);
// Ends the load (the daemon drops its pins; spans dangle) and frees it,
// waiting for the daemon. NULL is a no-op (KVTIER_OK).
int kvtier_end_load(kvtier_layer_load* load);

// Reads one daemon counter by name (e.g. "engine.commits") into `*value`.
// KVTIER_NOT_FOUND if the daemon has no such counter.
int kvtier_stat(kvtier_client* client, const char* name, int64_t* value);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_KVTIER_C_H_ */
