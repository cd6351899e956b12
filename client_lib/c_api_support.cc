// The C ABI's shared helpers (c_api_support.h): the checks that the C
// codes are the C++ ones, the thread's error message, and the conversions.
#include "client_lib/c_api_support.h"

namespace kvtier::c_abi {

static_assert(KVTIER_OK == static_cast<int>(StatusCode::kOk));
static_assert(KVTIER_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(KVTIER_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(KVTIER_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists));
static_assert(KVTIER_NO_SPACE == static_cast<int>(StatusCode::kNoSpace));
static_assert(KVTIER_BUSY == static_cast<int>(StatusCode::kBusy));
static_assert(KVTIER_IO_ERROR == static_cast<int>(StatusCode::kIoError));
static_assert(KVTIER_CORRUPTION == static_cast<int>(StatusCode::kCorruption));
static_assert(KVTIER_PROTOCOL_ERROR == static_cast<int>(StatusCode::kProtocolError));
static_assert(KVTIER_VERSION_MISMATCH == static_cast<int>(StatusCode::kVersionMismatch));
static_assert(KVTIER_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(KVTIER_PERMISSION_DENIED == static_cast<int>(StatusCode::kPermissionDenied));
static_assert(KVTIER_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(KVTIER_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(KVTIER_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(KVTIER_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(KVTIER_TIMED_OUT == static_cast<int>(StatusCode::kTimedOut));
static_assert(KVTIER_TIER_NONE == static_cast<int>(Tier::kNone));
static_assert(KVTIER_TIER_HBM == static_cast<int>(Tier::kHbm));
static_assert(KVTIER_TIER_HOST == static_cast<int>(Tier::kHost));
static_assert(KVTIER_TIER_NVME == static_cast<int>(Tier::kNvme));
static_assert(KVTIER_TIER_REMOTE == static_cast<int>(Tier::kRemote));

// Owned by this thread; kvtier_last_error hands out its c_str().
thread_local std::string last_error;

// Records `s` as this thread's error (if it is one) and returns its code.
int Report(const Status& s) {
  if (!s.ok()) last_error = s.message().empty() ? std::string(StatusCodeName(s.code())) : s.message();
  return Code(s);
}

int Missing(const char* what) { return Report(InvalidArgument(std::string(what) + " is NULL")); }

BlockKey ToKey(kvtier_key k) { return BlockKey{k.hi, k.lo}; }
kvtier_key ToC(const BlockKey& k) { return kvtier_key{k.hi, k.lo}; }
kvtier_preload_plan ToC(const PreloadPlan& p) {
  return kvtier_preload_plan{p.layers_to_preload, p.buffer_bytes, p.read_bytes_per_s,         p.read_us_per_layer,
                             p.stall_us,          p.total_us,     p.recompute_instead ? 1 : 0};
}

std::vector<BlockKey> ToKeys(const kvtier_key* keys, size_t n) {
  std::vector<BlockKey> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(ToKey(keys[i]));
  return out;
}

namespace {

std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

}  // namespace

NamespaceDescriptor ToDescriptor(const kvtier_namespace& c) {
  NamespaceDescriptor d;
  d.model_id = Str(c.model_id);
  d.model_revision = Str(c.model_revision);
  d.adapter_id = Str(c.adapter_id);
  d.adapter_revision = Str(c.adapter_revision);
  d.kv_dtype = Str(c.kv_dtype);
  d.block_tokens = c.block_tokens;
  d.layer_count = c.layer_count;
  d.kv_layout = Str(c.kv_layout);
  d.bytes_per_token_per_layer = c.bytes_per_token_per_layer;
  d.tp_rank = c.tp_rank;
  d.tp_size = c.tp_size;
  // Appended in key v2: zero / NULL read as the defaults (kvtier_c.h).
  d.pp_rank = c.pp_rank;
  d.pp_size = c.pp_size == 0 ? 1 : c.pp_size;
  d.kv_format_version = c.kv_format_version == 0 ? 1 : c.kv_format_version;
  d.object_kind = c.object_kind == nullptr ? std::string("kv") : std::string(c.object_kind);
  return d;
}

Status CheckNamespace(const kvtier_client& c, uint32_t ns) {
  const size_t registered = c.client->namespaces().size();
  if (ns < registered) return Status::Ok();
  return InvalidArgument("namespace " + std::to_string(ns) + " out of range (" + std::to_string(registered) +
                         " registered)");
}

}  // namespace kvtier::c_abi
