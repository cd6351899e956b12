// Conversions between generated protobuf types and the public kvtier types
// (include/kvtier only). Both wire adapters -- the daemon's connections and the
// client library -- use them; the engine, tiers and policies never see
// generated types.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/preload.h"
#include "kvtier/ready_estimate.h"
#include "kvtier/result.h"
#include "kvtier/status.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::wire {

// Version 2: block keys v2 (docs/KEYS.md), whose descriptors carry pp_rank,
// pp_size, kv_format_version and object_kind. A v1 client computes v1 keys,
// so it must not share a daemon with v2 clients: Hello refuses it.
inline constexpr uint32_t kProtocolVersion = 2;

void ToProto(const Status& s, v1::Status* out);
Status FromProto(const v1::Status& s);

void ToProto(const BlockKey& k, v1::Key* out);
BlockKey FromProto(const v1::Key& k);
std::vector<BlockKey> FromProto(const google::protobuf::RepeatedPtrField<v1::Key>& keys);
void AddKeys(std::span<const BlockKey> keys, google::protobuf::RepeatedPtrField<v1::Key>* out);

// Packed keys (two fixed64 words per key, hi then lo).
void AddKeys(std::span<const BlockKey> keys, google::protobuf::RepeatedField<uint64_t>* out);
void AppendKey(const BlockKey& key, google::protobuf::RepeatedField<uint64_t>* out);
// InvalidArgument if the word count is odd.
Result<std::vector<BlockKey>> KeysFromProto(const google::protobuf::RepeatedField<uint64_t>& words);

// Field by field, verbatim: FromProto does not validate and reads no 0 as a
// default (a descriptor missing pp_size fails Validate()).
void ToProto(const NamespaceDescriptor& d, v1::NamespaceDescriptor* out);
NamespaceDescriptor FromProto(const v1::NamespaceDescriptor& d);

// Requests without an id (Connection::Call assigns it). Both the client
// library and the protocol tests build requests through these.
v1::Request MakeLookup(uint32_t ns, std::span<const BlockKey> keys);
// With `chain`, the keys are one prefix chain (root first) and `parent` is
// keys[0]'s parent, if any (ReserveRequest.chain).
v1::Request MakeReserve(uint32_t ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                        bool chain = false, const std::optional<BlockKey>& parent = std::nullopt);
// `checksums`: none (kvtierd hashes the blocks) or one xxh3-64 per key.
v1::Request MakeCommit(uint32_t ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                       std::span<const uint64_t> checksums = {});
v1::Request MakeAbort(uint32_t ns, std::span<const BlockKey> keys);
// Layers [first_layer, end_layer) of `keys` written; `layer_checksums` key-major;
// `free_when_taken`: the blocks are handed off (PublishLayersRequest).
v1::Request MakePublishLayers(uint32_t ns, std::span<const BlockKey> keys, uint32_t first_layer, uint32_t end_layer,
                              std::span<const uint64_t> layer_checksums, bool free_when_taken = false);
v1::Request MakePin(uint32_t ns, std::span<const BlockKey> keys);
// A Pin of layers [first_layer, last_layer) of every key.
v1::Request MakePinLayers(uint32_t ns, std::span<const BlockKey> keys, uint32_t first_layer, uint32_t last_layer);
v1::Request MakeRelease(std::span<const uint64_t> leases);
// A Release the daemon does not answer (ReleaseRequest.no_reply).
v1::Request MakeReleaseNoReply(std::span<const uint64_t> leases);
// A UsageReport: `uses` (namespace index, key) grouped per namespace in
// first-seen order, plus the local lookup counts.
v1::Request MakeUsageReport(std::span<const std::pair<uint32_t, BlockKey>> uses, uint64_t lookups, uint64_t lookup_keys,
                            uint64_t lookup_hits);
v1::Request MakeErase(uint32_t ns, std::span<const BlockKey> keys);
// An Erase with `corrupt`: `keys` did not match their checksums when read.
v1::Request MakeCorruptReport(uint32_t ns, std::span<const BlockKey> keys);
// PreloadPlan both ways (the daemon answers, the client reads).
void ToProto(const PreloadPlan& plan, v1::PreloadPlanResponse* out);
PreloadPlan FromProto(const v1::PreloadPlanResponse& p);
v1::Request MakePreloadPlan(uint32_t source_tier, uint64_t bytes_per_layer, double compute_us_per_layer,
                            uint32_t layers, double recompute_us_per_layer);
// ReadyEstimate both ways (the daemon answers, the client reads).
void ToProto(const ReadyEstimate& estimate, v1::ReadyEstimateResponse* out);
ReadyEstimate FromProto(const v1::ReadyEstimateResponse& p);
v1::Request MakeReadyEstimate(uint32_t ns, std::span<const BlockKey> keys);
v1::Request MakeStats();
// Operations: kvtier ls / drop / config get / health.
// One page of the namespace listing (empty token: the first; page_size 0:
// the daemon's default).
v1::Request MakeListNamespaces(std::string_view page_token = {}, uint32_t page_size = 0);
v1::Request MakeDrop(std::span<const BlockKey> fingerprints, std::string_view model_id,
                     std::string_view model_revision);
// Operator holds of `keys` of namespace `fingerprint` (kvtier pin / unpin).
v1::Request MakeHold(const BlockKey& fingerprint, std::span<const BlockKey> keys, uint64_t ttl_ms);
v1::Request MakeUnhold(const BlockKey& fingerprint, std::span<const BlockKey> keys);
v1::Request MakeConfig();
v1::Request MakeHealth();
// A layer-wise load (compute_us_per_layer > 0 asks for its preload plan),
// and its end.
v1::Request MakeBeginLoad(uint32_t ns, std::span<const BlockKey> keys, double compute_us_per_layer);
v1::Request MakeEndLoad(uint64_t load);
// Queue hints (QueueHint).
v1::Request MakeEnqueue(uint32_t ns, uint64_t request, std::span<const BlockKey> chain, uint64_t start_in_us,
                        uint64_t session);
v1::Request MakeRequestEvent(uint64_t request, bool started);  // STARTED or FINISHED
v1::Request MakeSessionHint(uint64_t session, bool open);

}  // namespace kvtier::wire
