/* The C ABI end to end, from C11: starts the kvtierd given as argv[1] with a
 * 64 MiB arena in a temporary directory, drives every kvtier_c.h call
 * against it, then stops it with SIGTERM and expects exit status 0.
 * Stored blocks describe themselves (key, index, length, then a stream
 * seeded by them), so every read is either a miss or checked byte for byte. */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/kvtier_c.h"

static int passed = 0;
static int failed = 0;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (cond) {                                                                                    \
      ++passed;                                                                                    \
    } else {                                                                                       \
      ++failed;                                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: \"%s\")\n", __FILE__, __LINE__, #cond, \
              kvtier_last_error());                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_CODE(expr, want)                                                                            \
  do {                                                                                                    \
    int got_ = (expr);                                                                                    \
    if (got_ == (want)) {                                                                                 \
      ++passed;                                                                                           \
    } else {                                                                                              \
      ++failed;                                                                                           \
      fprintf(stderr, "%s:%d: %s returned %s, want %s (last error: \"%s\")\n", __FILE__, __LINE__, #expr, \
              kvtier_status_name(got_), kvtier_status_name(want), kvtier_last_error());                   \
    }                                                                                                     \
  } while (0)

enum { kBlockTokens = 16, kBlocks = 4, kBlockBytes = 64 * 1024 };
/* The daemon's arena (see WriteConfig) and the blocks that fill it. */
enum { kMiB = 1024 * 1024, kArenaMiB = 64 };

static void SleepMs(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void PutU64(uint8_t* p, uint64_t v) {
  int i;
  for (i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

/* Header: key.hi, key.lo, index, len (little-endian u64); then a stream
 * seeded by all four. */
static void FillBlock(uint8_t* buf, size_t len, kvtier_key key, uint64_t index) {
  uint64_t state = key.hi ^ (key.lo * 31) ^ (index << 48) ^ len;
  size_t i;
  for (i = 0; i < len; ++i) buf[i] = (uint8_t)SplitMix(&state);
  if (len >= 32) {
    PutU64(buf, key.hi);
    PutU64(buf + 8, key.lo);
    PutU64(buf + 16, index);
    PutU64(buf + 24, (uint64_t)len);
  }
}

/* 1 if `got` (got_len bytes) is exactly the `want_len`-byte block `index` of
 * `key` (want_len <= kMiB). */
static int SizedBlockMatches(const void* got, size_t got_len, kvtier_key key, uint64_t index, size_t want_len) {
  static uint8_t want[kMiB];
  size_t i;
  if (got_len != want_len) {
    fprintf(stderr, "block %llu: length %zu, want %zu\n", (unsigned long long)index, got_len, want_len);
    return 0;
  }
  FillBlock(want, want_len, key, index);
  for (i = 0; i < got_len; ++i) {
    if (((const uint8_t*)got)[i] != want[i]) {
      fprintf(stderr, "block %llu: first wrong byte at offset %zu\n", (unsigned long long)index, i);
      return 0;
    }
  }
  return 1;
}

/* 1 if `got` (got_len bytes) is exactly block `index` of `key`. */
static int BlockMatches(const void* got, size_t got_len, kvtier_key key, uint64_t index) {
  return SizedBlockMatches(got, got_len, key, index, kBlockBytes);
}

static kvtier_namespace TestNamespace(const char* revision) {
  kvtier_namespace ns;
  memset(&ns, 0, sizeof ns);
  ns.model_id = "test/c-abi-model";
  ns.model_revision = revision;
  ns.adapter_id = NULL;
  ns.adapter_revision = "";
  ns.kv_dtype = "bf16";
  ns.block_tokens = kBlockTokens;
  ns.layer_count = 2;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = kBlockBytes / (kBlockTokens * 2); /* BlockBytes() == 64 KiB */
  ns.tp_rank = 0;
  ns.tp_size = 1;
  return ns;
}

/* The temporary directory, config file and socket of one daemon. */
typedef struct {
  char dir[64];
  char config[128];
  char socket[128];
  pid_t pid;
} Daemon;

static int WriteConfig(Daemon* d) {
  FILE* f;
  strcpy(d->dir, "/tmp/kvtier_c_abi_XXXXXX");
  if (mkdtemp(d->dir) == NULL) {
    perror("mkdtemp");
    return 0;
  }
  snprintf(d->config, sizeof d->config, "%s/kvtierd.toml", d->dir);
  snprintf(d->socket, sizeof d->socket, "%s/kvtierd.sock", d->dir);
  f = fopen(d->config, "w");
  if (f == NULL) {
    perror("fopen");
    return 0;
  }
  fprintf(f,
          "[server]\nsocket_path = \"%s\"\n[host]\ncapacity_bytes = \"64MiB\"\n"
          "lock_memory = \"off\"\n[metrics]\nport = 0\n",
          d->socket);
  return fclose(f) == 0;
}

static int StartDaemon(Daemon* d, const char* kvtierd) {
  if (!WriteConfig(d)) return 0;
  d->pid = fork();
  if (d->pid < 0) {
    perror("fork");
    return 0;
  }
  if (d->pid == 0) {
    execl(kvtierd, kvtierd, "--config", d->config, (char*)NULL);
    perror("execl kvtierd");
    _exit(127);
  }
  return 1;
}

/* Retries kvtier_connect for up to ~10 s; NULL if the daemon never came up. */
static kvtier_client* ConnectWhenUp(Daemon* d, const kvtier_namespace* ns, size_t n_ns) {
  kvtier_client* client = NULL;
  int attempt, wstatus, rc = KVTIER_UNAVAILABLE;
  for (attempt = 0; attempt < 200; ++attempt) {
    rc = kvtier_connect(d->socket, ns, n_ns, &client);
    if (rc == KVTIER_OK) return client;
    if (waitpid(d->pid, &wstatus, WNOHANG) == d->pid) {
      fprintf(stderr, "kvtierd exited early (status 0x%x)\n", wstatus);
      d->pid = -1;
      return NULL;
    }
    SleepMs(50);
  }
  fprintf(stderr, "kvtierd not reachable after 10 s: %s: %s\n", kvtier_status_name(rc), kvtier_last_error());
  return NULL;
}

/* SIGTERM, then waits up to ~10 s (SIGKILL after). Returns the wait status,
 * or -1 if it had to be killed. */
static int StopDaemon(Daemon* d) {
  int attempt, wstatus = 0;
  if (d->pid <= 0) return -1;
  kill(d->pid, SIGTERM);
  for (attempt = 0; attempt < 200; ++attempt) {
    pid_t r = waitpid(d->pid, &wstatus, WNOHANG);
    if (r == d->pid) return wstatus;
    if (r < 0 && errno != EINTR) break;
    SleepMs(50);
  }
  fprintf(stderr, "kvtierd ignored SIGTERM for 10 s; killing it\n");
  kill(d->pid, SIGKILL);
  waitpid(d->pid, &wstatus, 0);
  return -1;
}

static void RemoveDaemonFiles(const Daemon* d) {
  unlink(d->socket);
  unlink(d->config);
  rmdir(d->dir);
}

static void TestKeysOffline(const kvtier_namespace* ns) {
  uint32_t tokens[kBlocks * kBlockTokens + 5];
  kvtier_key keys[kBlocks], fp1, fp2;
  kvtier_namespace other = TestNamespace("rev-2"), bad = TestNamespace(NULL);
  size_t count = 0, i;
  char hex[33];
  for (i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) tokens[i] = (uint32_t)(1000 + i);

  CHECK_CODE(kvtier_chain_keys(ns, tokens, kBlocks * kBlockTokens + 5, keys, 2, &count), KVTIER_INVALID_ARGUMENT);
  CHECK(count == kBlocks);
  CHECK(strlen(kvtier_last_error()) > 0);
  CHECK_CODE(kvtier_chain_keys(ns, tokens, kBlocks * kBlockTokens + 5, keys, kBlocks, &count), KVTIER_OK);
  CHECK(count == kBlocks);
  CHECK(strcmp(kvtier_last_error(), "") == 0);

  CHECK_CODE(kvtier_key_to_hex(keys[0], hex), KVTIER_OK);
  CHECK(strlen(hex) == 32);
  CHECK(strspn(hex, "0123456789abcdef") == 32);
  CHECK_CODE(kvtier_key_to_hex(keys[0], NULL), KVTIER_INVALID_ARGUMENT);

  CHECK_CODE(kvtier_namespace_fingerprint(ns, &fp1), KVTIER_OK);
  CHECK_CODE(kvtier_namespace_fingerprint(&other, &fp2), KVTIER_OK);
  CHECK(fp1.hi != fp2.hi || fp1.lo != fp2.lo);
  CHECK(fp1.hi != keys[0].hi || fp1.lo != keys[0].lo);
  CHECK_CODE(kvtier_namespace_fingerprint(&bad, &fp2), KVTIER_INVALID_ARGUMENT);
  CHECK(strlen(kvtier_last_error()) > 0);
  CHECK_CODE(kvtier_namespace_fingerprint(NULL, &fp2), KVTIER_INVALID_ARGUMENT);

  CHECK(strcmp(kvtier_status_name(KVTIER_NOT_FOUND), "not_found") == 0);
  CHECK(strcmp(kvtier_status_name(KVTIER_OK), "ok") == 0);
  CHECK(strcmp(kvtier_status_name(12345), "unknown") == 0);
}

/* The key-v2 fields: zero / NULL read as the defaults; the salted chain.
 * Checks V1 and V11 of docs/KEYS.md through the C ABI. */
static void TestKeysV2(const kvtier_namespace* ns) {
  static const uint32_t kT12[12] = {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256};
  static const char kSaltA[] = "tenant-a";
  static char big_salt[4097];
  kvtier_namespace v1ns, explicit_defaults = *ns, changed;
  kvtier_key fp, fp_default, fp_changed, plain[3], salted[3], other[3];
  size_t count = 0, i, j;
  char hex[33];

  memset(&v1ns, 0, sizeof v1ns);
  v1ns.model_id = "meta-llama/Llama-3.1-8B-Instruct";
  v1ns.model_revision = "0e9e39f249a16976918f6564b8830bc894c89659";
  v1ns.kv_dtype = "bf16";
  v1ns.block_tokens = 4;
  v1ns.layer_count = 32;
  v1ns.kv_layout = "layer_major_kv";
  v1ns.bytes_per_token_per_layer = 4096;
  v1ns.tp_size = 1;
  CHECK_CODE(kvtier_namespace_fingerprint(&v1ns, &fp), KVTIER_OK);
  CHECK_CODE(kvtier_key_to_hex(fp, hex), KVTIER_OK);
  CHECK(strcmp(hex, "20af72c79a4ba5d08c2b9e52c0543beb") == 0);
  CHECK_CODE(kvtier_chain_keys(&v1ns, kT12, 12, plain, 3, &count), KVTIER_OK);
  CHECK(count == 3);
  CHECK_CODE(kvtier_key_to_hex(plain[0], hex), KVTIER_OK);
  CHECK(strcmp(hex, "613a89fd907ba88074b75707c399af33") == 0);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, kSaltA, strlen(kSaltA), kT12, 12, salted, 3, &count), KVTIER_OK);
  CHECK(count == 3);
  CHECK_CODE(kvtier_key_to_hex(salted[0], hex), KVTIER_OK);
  CHECK(strcmp(hex, "0d22f386e960c8c0281eab673d75dd59") == 0);
  CHECK_CODE(kvtier_key_to_hex(salted[2], hex), KVTIER_OK);
  CHECK(strcmp(hex, "e65660b999559877829be757ad60d7ca") == 0);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, "tenant-b", 8, kT12, 12, other, 3, &count), KVTIER_OK);
  for (i = 0; i < 3; ++i) {
    for (j = 0; j < 3; ++j) {
      CHECK(salted[i].hi != plain[j].hi || salted[i].lo != plain[j].lo);
      CHECK(salted[i].hi != other[j].hi || salted[i].lo != other[j].lo);
    }
  }
  /* salt_len 0 is the plain chain, with or without a pointer. */
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, NULL, 0, kT12, 12, other, 3, &count), KVTIER_OK);
  CHECK(memcmp(other, plain, sizeof plain) == 0);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, kSaltA, 0, kT12, 12, other, 3, &count), KVTIER_OK);
  CHECK(memcmp(other, plain, sizeof plain) == 0);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, NULL, 3, kT12, 12, other, 3, &count), KVTIER_INVALID_ARGUMENT);
  memset(big_salt, 's', sizeof big_salt);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, big_salt, 4096, kT12, 12, other, 3, &count), KVTIER_OK);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, big_salt, 4097, kT12, 12, other, 3, &count), KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "cache_salt") != NULL);
  CHECK_CODE(kvtier_chain_keys_salted(&v1ns, kSaltA, 8, kT12, 12, other, 2, &count), KVTIER_INVALID_ARGUMENT);
  CHECK(count == 3);

  /* `ns` leaves the v2 fields zero: the same as spelling out the defaults. */
  explicit_defaults.pp_rank = 0;
  explicit_defaults.pp_size = 1;
  explicit_defaults.kv_format_version = 1;
  explicit_defaults.object_kind = "kv";
  CHECK_CODE(kvtier_namespace_fingerprint(ns, &fp), KVTIER_OK);
  CHECK_CODE(kvtier_namespace_fingerprint(&explicit_defaults, &fp_default), KVTIER_OK);
  CHECK(fp.hi == fp_default.hi && fp.lo == fp_default.lo);

  changed = explicit_defaults;
  changed.object_kind = "recurrent_state";
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_OK);
  CHECK(fp_changed.hi != fp.hi || fp_changed.lo != fp.lo);
  changed = explicit_defaults;
  changed.kv_format_version = 2;
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_OK);
  CHECK(fp_changed.hi != fp.hi || fp_changed.lo != fp.lo);
  changed = explicit_defaults;
  changed.pp_size = 2;
  changed.pp_rank = 1;
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_OK);
  CHECK(fp_changed.hi != fp.hi || fp_changed.lo != fp.lo);

  changed = explicit_defaults;
  changed.object_kind = "KV";
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "object_kind") != NULL);
  changed.object_kind = "";
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_INVALID_ARGUMENT);
  changed = explicit_defaults;
  changed.pp_size = 0; /* reads as 1 */
  changed.pp_rank = 1;
  CHECK_CODE(kvtier_namespace_fingerprint(&changed, &fp_changed), KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "pp_rank") != NULL);
}

/* Chains kBlocks keys of the test token sequence. */
static void ChainKeys(const kvtier_namespace* ns, kvtier_key keys[kBlocks]) {
  uint32_t tokens[kBlocks * kBlockTokens];
  size_t count = 0, i;
  for (i = 0; i < kBlocks * kBlockTokens; ++i) tokens[i] = (uint32_t)(7 * i + 3);
  CHECK_CODE(kvtier_chain_keys(ns, tokens, kBlocks * kBlockTokens, keys, kBlocks, &count), KVTIER_OK);
  CHECK(count == kBlocks);
}

static void TestPutLookupGet(kvtier_client* c, const kvtier_key keys[kBlocks], uint8_t* buf) {
  size_t prefix = 99, len = 0, i;
  uint8_t tiers[kBlocks];
  CHECK_CODE(kvtier_lookup(c, 0, keys, kBlocks, &prefix, tiers), KVTIER_OK);
  CHECK(prefix == 0);
  CHECK(tiers[0] == KVTIER_TIER_NONE);

  for (i = 0; i < 3; ++i) {
    FillBlock(buf, kBlockBytes, keys[i], i);
    CHECK_CODE(kvtier_put(c, 0, keys[i], buf, kBlockBytes), KVTIER_OK);
  }
  CHECK_CODE(kvtier_put(c, 0, keys[0], buf, kBlockBytes), KVTIER_OK); /* idempotent */
  CHECK_CODE(kvtier_lookup(c, 0, keys, kBlocks, &prefix, tiers), KVTIER_OK);
  CHECK(prefix == 3);
  CHECK(tiers[0] == KVTIER_TIER_HOST && tiers[1] == KVTIER_TIER_HOST && tiers[2] == KVTIER_TIER_HOST);
  CHECK(tiers[3] == KVTIER_TIER_NONE);
  CHECK_CODE(kvtier_lookup(c, 0, keys, kBlocks, &prefix, NULL), KVTIER_OK);
  CHECK(prefix == 3);

  for (i = 0; i < 3; ++i) {
    memset(buf, 0, kBlockBytes);
    CHECK_CODE(kvtier_get(c, 0, keys[i], buf, kBlockBytes, &len), KVTIER_OK);
    CHECK(BlockMatches(buf, len, keys[i], i));
  }
  CHECK_CODE(kvtier_get(c, 0, keys[0], buf, kBlockBytes / 2, &len), KVTIER_INVALID_ARGUMENT);
  CHECK(len == 0);
  CHECK_CODE(kvtier_get(c, 0, keys[3], buf, kBlockBytes, &len), KVTIER_NOT_FOUND);
  CHECK(strlen(kvtier_last_error()) > 0);
}

static void TestBatches(kvtier_client* c, const kvtier_key keys[kBlocks]) {
  static uint8_t blocks[kBlocks + 1][kBlockBytes];
  kvtier_key batch_keys[kBlocks + 1];
  const void* src[2];
  void* dst[kBlocks + 1];
  size_t lens[kBlocks + 1], caps[kBlocks + 1], put_lens[2] = {kBlockBytes, kBlockBytes}, i;
  int statuses[kBlocks + 1];

  FillBlock(blocks[0], kBlockBytes, keys[3], 3);
  FillBlock(blocks[1], kBlockBytes, keys[0], 0);
  src[0] = blocks[0];
  src[1] = blocks[1];
  batch_keys[0] = keys[3];
  batch_keys[1] = keys[0]; /* already cached: still ok */
  CHECK_CODE(kvtier_put_batch(c, 0, batch_keys, src, put_lens, 2, statuses), KVTIER_OK);
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);

  for (i = 0; i < kBlocks; ++i) batch_keys[i] = keys[i];
  batch_keys[kBlocks].hi = 0x0123456789abcdefULL; /* never stored */
  batch_keys[kBlocks].lo = 0xfedcba9876543210ULL;
  for (i = 0; i <= kBlocks; ++i) {
    memset(blocks[i], 0, kBlockBytes);
    dst[i] = blocks[i];
    caps[i] = kBlockBytes;
    statuses[i] = -1;
  }
  CHECK_CODE(kvtier_get_batch(c, 0, batch_keys, dst, caps, kBlocks + 1, lens, statuses), KVTIER_OK);
  for (i = 0; i < kBlocks; ++i) {
    CHECK(statuses[i] == KVTIER_OK);
    CHECK(BlockMatches(blocks[i], lens[i], keys[i], i));
  }
  CHECK(statuses[kBlocks] == KVTIER_NOT_FOUND);
  CHECK(lens[kBlocks] == 0);
  CHECK(strlen(kvtier_last_error()) > 0);
}

/* A chained put stores its blocks like a batch and hands the daemon their
 * links (counted as engine.chain_links); a plain batch hands none. */
static void TestPutChain(kvtier_client* c, const kvtier_namespace* ns) {
  static uint8_t blocks[2][kBlockBytes];
  uint32_t tokens[3 * kBlockTokens];
  kvtier_key chain[3];
  size_t count = 0, len = 0, lens[2] = {kBlockBytes, kBlockBytes}, i;
  const void* src[2];
  int statuses[2] = {-1, -1};
  int64_t links_before = -1, links_after = -1;
  for (i = 0; i < 3 * kBlockTokens; ++i) tokens[i] = (uint32_t)(50000 + i); /* a prompt of its own */
  CHECK_CODE(kvtier_chain_keys(ns, tokens, 3 * kBlockTokens, chain, 3, &count), KVTIER_OK);
  CHECK(count == 3);
  FillBlock(blocks[0], kBlockBytes, chain[1], 1);
  FillBlock(blocks[1], kBlockBytes, chain[2], 2);
  src[0] = blocks[0];
  src[1] = blocks[1];
  CHECK_CODE(kvtier_stat(c, "engine.chain_links", &links_before), KVTIER_OK);
  /* chain[0] is the cached prefix this "prefill" extended. */
  CHECK_CODE(kvtier_put_chain(c, 0, &chain[1], src, lens, 2, &chain[0], statuses), KVTIER_OK);
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);
  CHECK_CODE(kvtier_stat(c, "engine.chain_links", &links_after), KVTIER_OK);
  CHECK(links_after == links_before + 2);
  memset(blocks[1], 0, kBlockBytes);
  CHECK_CODE(kvtier_get(c, 0, chain[2], blocks[1], kBlockBytes, &len), KVTIER_OK);
  CHECK(BlockMatches(blocks[1], len, chain[2], 2));
  CHECK_CODE(kvtier_put_chain(c, 0, chain, NULL, lens, 2, NULL, statuses), KVTIER_INVALID_ARGUMENT);
  CHECK(strlen(kvtier_last_error()) > 0);
}

static void TestPin(kvtier_client* c, const kvtier_key keys[kBlocks]) {
  kvtier_view* view = NULL;
  const void* data = NULL;
  size_t len = 0;
  kvtier_key missing = {1, 2};
  CHECK_CODE(kvtier_pin(c, 0, keys[1], &view, &data, &len), KVTIER_OK);
  CHECK(view != NULL && data != NULL);
  if (view != NULL && data != NULL) CHECK(BlockMatches(data, len, keys[1], 1));
  CHECK_CODE(kvtier_view_release(view), KVTIER_OK);
  CHECK_CODE(kvtier_view_release(NULL), KVTIER_OK);
  CHECK_CODE(kvtier_pin(c, 0, missing, &view, &data, &len), KVTIER_NOT_FOUND);
  CHECK(view == NULL);
}

/* Verification is an option of the C ABI (kvtier_connect_with_options): a
 * block whose arena bytes changed after its commit -- written here through
 * a pin of the non-verifying client `c`, as any process sharing the arena
 * could -- is KVTIER_CORRUPTION for a verifying kvtier_get and kvtier_pin
 * (never the bytes) and is reported, so later reads miss; the
 * non-verifying client copies the bytes as they are. */
static void TestVerifiedReads(Daemon* d, kvtier_client* c, const kvtier_namespace* ns) {
  static uint8_t block[kBlockBytes], out[kBlockBytes];
  uint32_t tokens[3 * kBlockTokens];
  kvtier_key keys[3];
  kvtier_client_options options;
  kvtier_client* checked = NULL;
  kvtier_view* view = NULL;
  const void* data = NULL;
  size_t count = 0, len = 0, i;
  int64_t leases = -1;
  for (i = 0; i < 3 * kBlockTokens; ++i) tokens[i] = (uint32_t)(70000 + i); /* a prompt of its own */
  CHECK_CODE(kvtier_chain_keys(ns, tokens, 3 * kBlockTokens, keys, 3, &count), KVTIER_OK);

  kvtier_client_options_init(&options);
  CHECK(options.size == sizeof options && options.verify_checksums == 0);
  options.size = 1; /* not initialised by this library's init */
  CHECK_CODE(kvtier_connect_with_options(d->socket, ns, 1, &options, &checked), KVTIER_INVALID_ARGUMENT);
  CHECK(checked == NULL);
  kvtier_client_options_init(&options);
  options.verify_checksums = 1;
  CHECK_CODE(kvtier_connect_with_options(d->socket, ns, 1, &options, &checked), KVTIER_OK);
  if (checked == NULL) return;

  for (i = 0; i < 3; ++i) {
    FillBlock(block, kBlockBytes, keys[i], 10 + i);
    CHECK_CODE(kvtier_put(c, 0, keys[i], block, kBlockBytes), KVTIER_OK);
  }
  /* Intact: the verifying client reads them. */
  CHECK_CODE(kvtier_get(checked, 0, keys[0], out, sizeof out, &len), KVTIER_OK);
  CHECK(BlockMatches(out, len, keys[0], 10));
  /* One byte of each block changes in the arena. */
  for (i = 0; i < 3; ++i) {
    CHECK_CODE(kvtier_pin(c, 0, keys[i], &view, &data, &len), KVTIER_OK);
    if (data != NULL) ((uint8_t*)(uintptr_t)data)[len / 2] ^= 0xff; /* the arena mapping is writable */
    CHECK_CODE(kvtier_view_release(view), KVTIER_OK);
  }
  /* Without verification: the changed bytes, as documented. */
  CHECK_CODE(kvtier_get(c, 0, keys[0], out, sizeof out, &len), KVTIER_OK);
  CHECK(len == kBlockBytes && !BlockMatches(out, len, keys[0], 10));
  /* With it: Corruption, no length, and the block is gone afterwards. */
  len = 1;
  CHECK_CODE(kvtier_get(checked, 0, keys[0], out, sizeof out, &len), KVTIER_CORRUPTION);
  CHECK(len == 0);
  CHECK(strlen(kvtier_last_error()) > 0);
  view = NULL;
  data = NULL;
  CHECK_CODE(kvtier_pin(checked, 0, keys[1], &view, &data, &len), KVTIER_CORRUPTION);
  CHECK(view == NULL && data == NULL);
  CHECK_CODE(kvtier_stat(checked, "engine.leases", &leases), KVTIER_OK); /* after the reports */
  CHECK(leases == 0);
  CHECK_CODE(kvtier_get(c, 0, keys[0], out, sizeof out, &len), KVTIER_NOT_FOUND);
  CHECK_CODE(kvtier_get(c, 0, keys[1], out, sizeof out, &len), KVTIER_NOT_FOUND);
  CHECK_CODE(kvtier_get(c, 0, keys[2], out, sizeof out, &len), KVTIER_OK); /* never read verified */
  kvtier_close(checked);
  CHECK_CODE(kvtier_connect_with_options(d->socket, ns, 1, NULL, &checked), KVTIER_OK); /* NULL: defaults */
  kvtier_close(checked);
}

/* A view outliving kvtier_close keeps the connection, and so its pin: after
 * another client erased the block (a pinned block is freed on its last
 * release, an unpinned one at once) and filled the arena with more MiB
 * blocks than it holds (which overwrites every extent that is free), the
 * view still shows its own block, and releasing it unpins it on the daemon. */
static void TestViewOutlivesClose(Daemon* d, const kvtier_namespace* ns) {
  static uint8_t block[kMiB];
  kvtier_client* first = ConnectWhenUp(d, ns, 1);
  kvtier_client* second = ConnectWhenUp(d, ns, 1);
  kvtier_view* view = NULL;
  const void* data = NULL;
  size_t len = 0, erased = 0, i;
  int64_t leases = -1;
  kvtier_key pinned = {0x0a11ce0000000001ULL, 0x5eed};
  CHECK(first != NULL && second != NULL);
  if (first == NULL || second == NULL) {
    kvtier_close(first);
    kvtier_close(second);
    return;
  }
  FillBlock(block, kMiB, pinned, 100);
  CHECK_CODE(kvtier_put(first, 0, pinned, block, kMiB), KVTIER_OK);
  CHECK_CODE(kvtier_pin(first, 0, pinned, &view, &data, &len), KVTIER_OK);
  kvtier_close(first);
  CHECK_CODE(kvtier_erase(second, 0, &pinned, 1, &erased), KVTIER_OK);
  CHECK(erased == 1);
  for (i = 0; i < kArenaMiB + 2; ++i) {
    kvtier_key filler;
    filler.hi = 0xf111000000000000ULL;
    filler.lo = i;
    FillBlock(block, kMiB, filler, i);
    CHECK_CODE(kvtier_put(second, 0, filler, block, kMiB), KVTIER_OK);
  }
  CHECK(view != NULL && data != NULL);
  if (view != NULL && data != NULL) CHECK(SizedBlockMatches(data, len, pinned, 100, kMiB));
  CHECK_CODE(kvtier_stat(second, "engine.leases", &leases), KVTIER_OK);
  CHECK(leases == 1);
  CHECK_CODE(kvtier_view_release(view), KVTIER_OK);
  CHECK_CODE(kvtier_stat(second, "engine.leases", &leases), KVTIER_OK);
  CHECK(leases == 0);
  kvtier_close(second);
}

static void TestEraseStatsAndErrors(kvtier_client* c, const kvtier_key keys[kBlocks]) {
  kvtier_key doomed[2];
  size_t erased = 0, prefix = 99, len = 0;
  int64_t commits = -1;
  int statuses[1];
  uint8_t byte = 0;
  doomed[0] = keys[1];
  doomed[1] = keys[3];
  CHECK_CODE(kvtier_enqueue(c, 1, 0, keys, kBlocks, 1000000, 7), KVTIER_OK);
  CHECK_CODE(kvtier_enqueue(c, 2, 0, NULL, 1, 0, 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_request_started(c, 1), KVTIER_OK);
  CHECK_CODE(kvtier_request_finished(c, 1), KVTIER_NOT_FOUND);
  CHECK_CODE(kvtier_session_hint(c, 7, 0), KVTIER_OK);
  CHECK_CODE(kvtier_session_hint(c, 0, 1), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_erase(c, 0, doomed, 2, &erased), KVTIER_OK);
  CHECK(erased == 2);
  CHECK_CODE(kvtier_lookup(c, 0, keys, kBlocks, &prefix, NULL), KVTIER_OK);
  CHECK(prefix == 1);
  CHECK_CODE(kvtier_erase(c, 0, doomed, 2, &erased), KVTIER_OK);
  CHECK(erased == 0);

  CHECK_CODE(kvtier_stat(c, "engine.commits", &commits), KVTIER_OK);
  CHECK(commits > 0);
  CHECK_CODE(kvtier_stat(c, "no.such.counter", &commits), KVTIER_NOT_FOUND);

  CHECK_CODE(kvtier_lookup(c, 1, keys, kBlocks, &prefix, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK(strlen(kvtier_last_error()) > 0);
  CHECK_CODE(kvtier_get(c, 7, keys[0], &byte, 1, &len), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put_batch(c, 1, keys, NULL, NULL, 0, statuses), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_lookup(NULL, 0, keys, kBlocks, &prefix, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_lookup(c, 0, keys, kBlocks, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK(strlen(kvtier_last_error()) > 0);
}

/* Keys of a chain of `n` blocks from tokens seeded by `seed`. */
static void SeededKeys(const kvtier_namespace* ns, uint32_t seed, kvtier_key* keys, size_t n) {
  uint32_t tokens[kBlocks * kBlockTokens];
  size_t count = 0, i;
  for (i = 0; i < n * kBlockTokens; ++i) tokens[i] = (uint32_t)(seed * 1000003u + 11 * i);
  CHECK_CODE(kvtier_chain_keys(ns, tokens, n * kBlockTokens, keys, n, &count), KVTIER_OK);
  CHECK(count == n);
}

static size_t Prefix(kvtier_client* c, const kvtier_key* keys, size_t n) {
  size_t prefix = 99;
  CHECK_CODE(kvtier_lookup(c, 0, keys, n, &prefix, NULL), KVTIER_OK);
  return prefix;
}

static void TestZeroCopyPutAndLayerSave(kvtier_client* c, const kvtier_namespace* ns) {
  static uint8_t got[kBlockBytes];
  kvtier_key keys[2];
  size_t sizes[2] = {kBlockBytes, kBlockBytes}, arena_len = 0, layer_bytes = 0, len = 0, i;
  void* base = NULL;
  void* data[2] = {NULL, NULL};
  int statuses[2] = {-1, -1};
  kvtier_reservation* r = NULL;
  kvtier_layer_save* save = NULL;

  /* The arena: where reservations and layer spans point. */
  CHECK_CODE(kvtier_arena(c, &base, &arena_len), KVTIER_OK);
  CHECK(base != NULL && arena_len == (size_t)kArenaMiB * kMiB);

  /* Reserve, write in place, commit. */
  SeededKeys(ns, 41, keys, 2);
  CHECK_CODE(kvtier_reserve(c, 0, keys, sizes, 2, &r, data, statuses), KVTIER_OK);
  CHECK(r != NULL && statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);
  for (i = 0; i < 2; ++i) {
    CHECK((uint8_t*)data[i] >= (uint8_t*)base && (uint8_t*)data[i] + kBlockBytes <= (uint8_t*)base + arena_len);
    if (data[i] != NULL) FillBlock((uint8_t*)data[i], kBlockBytes, keys[i], 40 + i);
  }
  CHECK(Prefix(c, keys, 2) == 0); /* nothing visible before the commit */
  CHECK_CODE(kvtier_commit(r, statuses), KVTIER_OK);
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);
  CHECK_CODE(kvtier_commit(r, statuses), KVTIER_FAILED_PRECONDITION);
  kvtier_reservation_free(r);
  for (i = 0; i < 2; ++i) {
    CHECK_CODE(kvtier_get(c, 0, keys[i], got, kBlockBytes, &len), KVTIER_OK);
    CHECK(BlockMatches(got, len, keys[i], 40 + i));
  }
  /* A reservation freed without a commit leaves nothing. */
  SeededKeys(ns, 42, keys, 2);
  CHECK_CODE(kvtier_reserve(c, 0, keys, sizes, 2, &r, data, statuses), KVTIER_OK);
  kvtier_reservation_free(r);
  CHECK(Prefix(c, keys, 2) == 0);
  kvtier_reservation_free(NULL);

  /* Layer-wise save: layer 0 copied, layer 1 written in place. */
  SeededKeys(ns, 43, keys, 2);
  CHECK_CODE(kvtier_begin_save(c, 0, keys, 2, NULL, &save, &layer_bytes, statuses), KVTIER_OK);
  CHECK(save != NULL && layer_bytes == kBlockBytes / 2);
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);
  {
    static uint8_t whole[2][kBlockBytes];
    const void* src[2];
    for (i = 0; i < 2; ++i) {
      FillBlock(whole[i], kBlockBytes, keys[i], 50 + i);
      src[i] = whole[i];
    }
    CHECK_CODE(kvtier_save_layer(save, 0, src), KVTIER_OK);
    CHECK_CODE(kvtier_finish_save(save, statuses), KVTIER_FAILED_PRECONDITION); /* layer 1 missing */
    CHECK(Prefix(c, keys, 2) == 0);
    for (i = 0; i < 2; ++i) {
      void* span = NULL;
      CHECK_CODE(kvtier_save_layer_span(save, i, 1, &span), KVTIER_OK);
      if (span != NULL) memcpy(span, whole[i] + layer_bytes, layer_bytes);
    }
    CHECK_CODE(kvtier_layer_written(save, 1), KVTIER_OK);
  }
  {
    void* span = (void*)1;
    CHECK_CODE(kvtier_save_layer_span(save, 2, 0, &span), KVTIER_INVALID_ARGUMENT);
    CHECK(span == NULL);
    CHECK_CODE(kvtier_layer_written(save, 2), KVTIER_INVALID_ARGUMENT);
  }
  CHECK_CODE(kvtier_finish_save(save, statuses), KVTIER_OK);
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK);
  CHECK_CODE(kvtier_finish_save(save, statuses), KVTIER_FAILED_PRECONDITION);
  kvtier_save_free(save);
  CHECK(Prefix(c, keys, 2) == 2);
  for (i = 0; i < 2; ++i) {
    CHECK_CODE(kvtier_get(c, 0, keys[i], got, kBlockBytes, &len), KVTIER_OK);
    CHECK(BlockMatches(got, len, keys[i], 50 + i));
  }
  /* A save freed midway leaves nothing, its layers published to peers or not. */
  SeededKeys(ns, 44, keys, 2);
  CHECK_CODE(kvtier_begin_save(c, 0, keys, 2, &keys[0], &save, &layer_bytes, statuses), KVTIER_OK);
  CHECK_CODE(kvtier_layer_written(save, 0), KVTIER_OK);
  CHECK_CODE(kvtier_save_publish_to_peers(save, 1), KVTIER_OK);
  CHECK_CODE(kvtier_save_publish_to_peers(save, 1), KVTIER_OK);
  CHECK_CODE(kvtier_save_publish_to_peers(save, 0), KVTIER_INVALID_ARGUMENT); /* the first call decided */
  CHECK_CODE(kvtier_layer_written(save, 1), KVTIER_OK);
  kvtier_save_free(save);
  CHECK(Prefix(c, keys, 2) == 0);
  CHECK_CODE(kvtier_save_publish_to_peers(NULL, 0), KVTIER_INVALID_ARGUMENT);
  kvtier_save_free(NULL);
  CHECK_CODE(kvtier_begin_save(c, 0, keys, 2, NULL, NULL, &layer_bytes, statuses), KVTIER_INVALID_ARGUMENT);
}

static void TestPlanPreload(kvtier_client* c) {
  kvtier_preload_plan plan;
  memset(&plan, 0, sizeof plan);
  /* From the host tier: 36 layers of 32 MiB against no compute to hide behind: all of them. */
  CHECK_CODE(kvtier_plan_preload(c, KVTIER_TIER_HOST, 32u << 20, 0, 36, 0, &plan), KVTIER_OK);
  CHECK(plan.read_bytes_per_s > 0);
  CHECK(plan.layers_to_preload == 36);
  CHECK(plan.buffer_bytes == 36ull * (32u << 20));
  CHECK(plan.stall_us > 0 && plan.total_us >= plan.stall_us);
  /* Compute far slower than the read: one layer. */
  CHECK_CODE(kvtier_plan_preload(c, KVTIER_TIER_HOST, 4096, 1e6, 36, 0, &plan), KVTIER_OK);
  CHECK(plan.layers_to_preload == 1 && plan.buffer_bytes == 4096);
  CHECK(plan.recompute_instead == 0);
  CHECK_CODE(kvtier_plan_preload(c, KVTIER_TIER_REMOTE, 4096, 10, 36, 0, &plan), KVTIER_NOT_FOUND);
  CHECK_CODE(kvtier_plan_preload(c, KVTIER_TIER_HOST, 4096, 10, 0, 0, &plan), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_plan_preload(c, KVTIER_TIER_HOST, 4096, 10, 36, 0, NULL), KVTIER_INVALID_ARGUMENT);
}

/* A ready estimate of two cached blocks and one that is not: the prefix
 * and its tiers as kvtier_lookup's, in host memory now, then a GPU copy
 * at the host copy rate; no tier below this daemon; an unknown namespace
 * and a missing `out` are refused. */
static void TestEstimateReady(kvtier_client* c, const kvtier_namespace* ns) {
  kvtier_key keys[3];
  static uint8_t block[kBlockBytes];
  uint8_t tiers[3] = {9, 9, 9};
  kvtier_ready_tier below[2];
  kvtier_ready_estimate out;
  size_t i;

  memset(&out, 0, sizeof out);
  SeededKeys(ns, 71, keys, 3);
  for (i = 0; i < 2; ++i) {
    FillBlock(block, kBlockBytes, keys[i], 70 + i);
    CHECK_CODE(kvtier_put(c, 0, keys[i], block, kBlockBytes), KVTIER_OK);
  }
  CHECK_CODE(kvtier_estimate_ready(c, 0, keys, 3, &out, tiers, below, 2), KVTIER_OK);
  CHECK(out.prefix_blocks == 2);
  CHECK(tiers[0] == KVTIER_TIER_HOST && tiers[1] == KVTIER_TIER_HOST && tiers[2] == KVTIER_TIER_NONE);
  CHECK(out.prefix_bytes == 2 * (uint64_t)kBlockBytes);
  CHECK(out.host_ready_us == 0);
  CHECK(out.gpu_copy_bytes == out.prefix_bytes && out.gpu_copy_bytes_per_s > 0);
  CHECK(out.gpu_ready_us > 0);
  CHECK(out.n_below == 0);
  CHECK_CODE(kvtier_estimate_ready(c, 0, keys, 3, &out, NULL, NULL, 0), KVTIER_OK);
  CHECK(out.prefix_blocks == 2);
  CHECK_CODE(kvtier_estimate_ready(c, 1, keys, 3, &out, NULL, NULL, 0), KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "namespace") != NULL);
  CHECK_CODE(kvtier_estimate_ready(c, 0, keys, 3, NULL, NULL, NULL, 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_estimate_ready(c, 0, NULL, 3, &out, NULL, NULL, 0), KVTIER_INVALID_ARGUMENT);
}

/* Layer-wise load of three cached blocks and one that is not: zero-copy,
 * then into buffers with a planned depth. */
static void TestLayerLoad(kvtier_client* c, const kvtier_namespace* ns) {
  kvtier_key keys[4];
  static uint8_t whole[4][kBlockBytes];
  static uint8_t copies[4][kBlockBytes];
  void* dst[4];
  int statuses[4];
  kvtier_layer_load* load = NULL;
  uint32_t layers = 0, l;
  size_t layer_bytes = 0, i;
  kvtier_preload_plan plan;
  kvtier_load_options options;
  const void* span = NULL;

  SeededKeys(ns, 61, keys, 4);
  for (i = 0; i < 3; ++i) {
    FillBlock(whole[i], kBlockBytes, keys[i], 60 + i);
    CHECK_CODE(kvtier_put(c, 0, keys[i], whole[i], kBlockBytes), KVTIER_OK);
  }
  CHECK_CODE(kvtier_begin_load(c, 0, keys, 4, NULL, 0, 0, 0, &load, &layers, &layer_bytes, statuses), KVTIER_OK);
  CHECK(load != NULL && layers == 2 && layer_bytes == kBlockBytes / 2);
  CHECK(statuses[0] == KVTIER_OK && statuses[2] == KVTIER_OK && statuses[3] == KVTIER_NOT_FOUND);
  if (load == NULL) return;
  CHECK(kvtier_layers_ready(load) == layers); /* host blocks: in place at once */
  for (l = 0; l < layers; ++l) {
    CHECK_CODE(kvtier_wait_layer(load, l), KVTIER_OK);
    for (i = 0; i < 3; ++i) {
      CHECK_CODE(kvtier_load_layer_span(load, i, l, &span), KVTIER_OK);
      CHECK(span != NULL && memcmp(span, whole[i] + l * layer_bytes, layer_bytes) == 0);
    }
  }
  CHECK_CODE(kvtier_load_layer_span(load, 3, 0, &span), KVTIER_NOT_FOUND);
  CHECK(span == NULL);
  CHECK_CODE(kvtier_load_layer_span(load, 4, 0, &span), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_load_block_status(load, 1), KVTIER_OK);
  CHECK_CODE(kvtier_load_block_status(load, 3), KVTIER_NOT_FOUND);
  CHECK(kvtier_load_usable_prefix(load) == 3);
  CHECK_CODE(kvtier_wait_layer(load, layers), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_load_plan(load, &plan), KVTIER_NOT_FOUND); /* begun without a compute time */
  CHECK_CODE(kvtier_end_load(load), KVTIER_OK);

  /* Into the caller's buffers, returning once the planned depth is in. */
  for (i = 0; i < 4; ++i) dst[i] = copies[i];
  CHECK_CODE(kvtier_begin_load(c, 0, keys, 3, dst, kBlockBytes, 5.0, 1, &load, NULL, NULL, NULL), KVTIER_OK);
  if (load == NULL) return;
  memset(&plan, 0, sizeof plan);
  CHECK_CODE(kvtier_load_plan(load, &plan), KVTIER_OK);
  CHECK(plan.layers_to_preload >= 1 && plan.layers_to_preload <= layers && plan.read_bytes_per_s > 0);
  CHECK(kvtier_layers_ready(load) >= plan.layers_to_preload);
  CHECK_CODE(kvtier_wait_layer(load, layers - 1), KVTIER_OK);
  for (i = 0; i < 3; ++i) CHECK(BlockMatches(copies[i], kBlockBytes, keys[i], 60 + i));
  CHECK_CODE(kvtier_end_load(load), KVTIER_OK);
  CHECK_CODE(kvtier_end_load(NULL), KVTIER_OK);
  /* Too small a buffer, and no out pointer. */
  CHECK_CODE(kvtier_begin_load(c, 0, keys, 3, dst, kBlockBytes - 1, 0, 0, &load, NULL, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK(load == NULL);
  CHECK_CODE(kvtier_begin_load(c, 0, keys, 3, NULL, 0, 0, 0, NULL, NULL, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  /* Every option (kvtier_begin_load_with): into buffers, with a deadline
   * the host blocks meet. */
  kvtier_load_options_init(&options);
  CHECK(options.size == sizeof options && options.dst == NULL && options.device_dst == NULL);
  CHECK(options.deadline_us == 0 && options.recompute_us_per_layer == 0 && options.wait_for_depth == 0);
  memset(copies, 0, sizeof copies);
  for (i = 0; i < 4; ++i) dst[i] = copies[i];
  options.dst = dst;
  options.dst_capacity = kBlockBytes;
  options.deadline_us = 30000000;
  CHECK_CODE(kvtier_begin_load_with(c, 0, keys, 4, &options, &load, &layers, NULL, statuses), KVTIER_OK);
  if (load == NULL) return;
  CHECK(statuses[0] == KVTIER_OK && statuses[1] == KVTIER_OK && statuses[2] == KVTIER_OK &&
        statuses[3] == KVTIER_NOT_FOUND);
  CHECK_CODE(kvtier_wait_layer(load, layers - 1), KVTIER_OK);
  for (i = 0; i < 3; ++i) CHECK(BlockMatches(copies[i], kBlockBytes, keys[i], 60 + i));
  CHECK(kvtier_load_usable_prefix(load) == 3);
  CHECK_CODE(kvtier_end_load(load), KVTIER_OK);
  /* Options not from kvtier_load_options_init, two kinds of destination, a
   * negative time: refused, with nothing begun. */
  options.size = sizeof(size_t);
  CHECK_CODE(kvtier_begin_load_with(c, 0, keys, 3, &options, &load, NULL, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK(load == NULL && strstr(kvtier_last_error(), "kvtier_load_options_init") != NULL);
  options.size = sizeof options;
  options.device_dst = dst;
  CHECK_CODE(kvtier_begin_load_with(c, 0, keys, 3, &options, &load, NULL, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  options.device_dst = NULL;
  options.recompute_us_per_layer = -1;
  CHECK_CODE(kvtier_begin_load_with(c, 0, keys, 3, &options, &load, NULL, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_begin_load_with(c, 0, keys, 3, NULL, &load, NULL, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  /* GPU destinations: a null device pointer is refused before any CUDA call. */
  dst[0] = NULL;
  CHECK_CODE(kvtier_begin_load_device(c, 0, keys, 3, dst, 0, NULL, 0, 0, &load, NULL, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK(load == NULL);
}

int main(int argc, char** argv) {
  Daemon daemon;
  kvtier_client* client;
  kvtier_namespace ns = TestNamespace("rev-1");
  kvtier_key keys[kBlocks];
  static uint8_t buf[kBlockBytes];
  int wstatus;

  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH_TO_KVTIERD\n", argv[0]);
    return 2;
  }
  TestKeysOffline(&ns);
  TestKeysV2(&ns);
  ChainKeys(&ns, keys);

  memset(&daemon, 0, sizeof daemon);
  CHECK(StartDaemon(&daemon, argv[1]));
  client = daemon.pid > 0 ? ConnectWhenUp(&daemon, &ns, 1) : NULL;
  CHECK(client != NULL);
  if (client != NULL) {
    TestPutLookupGet(client, keys, buf);
    TestBatches(client, keys);
    TestPutChain(client, &ns);
    TestPin(client, keys);
    TestZeroCopyPutAndLayerSave(client, &ns);
    TestPlanPreload(client);
    TestEstimateReady(client, &ns);
    TestLayerLoad(client, &ns);
    TestVerifiedReads(&daemon, client, &ns);
    TestEraseStatsAndErrors(client, keys);
    kvtier_close(client);
    TestViewOutlivesClose(&daemon, &ns);
  }
  kvtier_close(NULL);

  wstatus = StopDaemon(&daemon);
  CHECK(wstatus != -1 && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  RemoveDaemonFiles(&daemon);

  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
