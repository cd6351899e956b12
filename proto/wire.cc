#include "proto/wire.h"

namespace kvtier::wire {

void ToProto(const Status& s, v1::Status* out) {
  out->set_code(static_cast<int32_t>(s.code()));
  out->set_message(s.message());
}

Status FromProto(const v1::Status& s) {
  if (s.code() == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

void ToProto(const BlockKey& k, v1::Key* out) {
  out->set_hi(k.hi);
  out->set_lo(k.lo);
}

BlockKey FromProto(const v1::Key& k) { return BlockKey{k.hi(), k.lo()}; }

std::vector<BlockKey> FromProto(const google::protobuf::RepeatedPtrField<v1::Key>& keys) {
  std::vector<BlockKey> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(FromProto(k));
  return out;
}

void AddKeys(std::span<const BlockKey> keys, google::protobuf::RepeatedPtrField<v1::Key>* out) {
  out->Reserve(static_cast<int>(keys.size()));
  for (const BlockKey& k : keys) ToProto(k, out->Add());
}

void AddKeys(std::span<const BlockKey> keys, google::protobuf::RepeatedField<uint64_t>* out) {
  out->Reserve(out->size() + static_cast<int>(2 * keys.size()));
  for (const BlockKey& k : keys) AppendKey(k, out);
}

void AppendKey(const BlockKey& key, google::protobuf::RepeatedField<uint64_t>* out) {
  out->Add(key.hi);
  out->Add(key.lo);
}

Result<std::vector<BlockKey>> KeysFromProto(const google::protobuf::RepeatedField<uint64_t>& words) {
  if (words.size() % 2 != 0) {
    return InvalidArgument("keys must be pairs of words (hi, lo); got " + std::to_string(words.size()) + " words");
  }
  std::vector<BlockKey> keys(static_cast<size_t>(words.size()) / 2);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = BlockKey{words[2 * i], words[2 * i + 1]};
  return keys;
}

void ToProto(const NamespaceDescriptor& d, v1::NamespaceDescriptor* out) {
  out->set_model_id(d.model_id);
  out->set_model_revision(d.model_revision);
  out->set_adapter_id(d.adapter_id);
  out->set_adapter_revision(d.adapter_revision);
  out->set_kv_dtype(d.kv_dtype);
  out->set_block_tokens(d.block_tokens);
  out->set_layer_count(d.layer_count);
  out->set_kv_layout(d.kv_layout);
  out->set_bytes_per_token_per_layer(d.bytes_per_token_per_layer);
  out->set_tp_rank(d.tp_rank);
  out->set_tp_size(d.tp_size);
  out->set_pp_rank(d.pp_rank);
  out->set_pp_size(d.pp_size);
  out->set_kv_format_version(d.kv_format_version);
  out->set_object_kind(d.object_kind);
}

NamespaceDescriptor FromProto(const v1::NamespaceDescriptor& d) {
  NamespaceDescriptor out;
  out.model_id = d.model_id();
  out.model_revision = d.model_revision();
  out.adapter_id = d.adapter_id();
  out.adapter_revision = d.adapter_revision();
  out.kv_dtype = d.kv_dtype();
  out.block_tokens = d.block_tokens();
  out.layer_count = d.layer_count();
  out.kv_layout = d.kv_layout();
  out.bytes_per_token_per_layer = d.bytes_per_token_per_layer();
  out.tp_rank = d.tp_rank();
  out.tp_size = d.tp_size();
  out.pp_rank = d.pp_rank();
  out.pp_size = d.pp_size();
  out.kv_format_version = d.kv_format_version();
  out.object_kind = d.object_kind();
  return out;
}

namespace {

// Fills the (ns, keys[, sizes]) fields every keyed request body shares.
template <typename Body>
void FillKeyed(Body* body, uint32_t ns, std::span<const BlockKey> keys) {
  body->set_ns(ns);
  AddKeys(keys, body->mutable_keys());
}

}  // namespace

v1::Request MakeLookup(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r;
  FillKeyed(r.mutable_lookup(), ns, keys);
  return r;
}

v1::Request MakeReserve(uint32_t ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes, bool chain,
                        const std::optional<BlockKey>& parent) {
  v1::Request r;
  FillKeyed(r.mutable_reserve(), ns, keys);
  r.mutable_reserve()->mutable_sizes()->Add(sizes.begin(), sizes.end());
  if (chain) {
    r.mutable_reserve()->set_chain(true);
    if (parent) {
      r.mutable_reserve()->add_parent(parent->hi);
      r.mutable_reserve()->add_parent(parent->lo);
    }
  }
  return r;
}

v1::Request MakeCommit(uint32_t ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                       std::span<const uint64_t> checksums) {
  v1::Request r;
  FillKeyed(r.mutable_commit(), ns, keys);
  r.mutable_commit()->mutable_sizes()->Add(sizes.begin(), sizes.end());
  r.mutable_commit()->mutable_checksums()->Add(checksums.begin(), checksums.end());
  return r;
}

v1::Request MakeAbort(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r;
  FillKeyed(r.mutable_abort(), ns, keys);
  return r;
}

v1::Request MakePublishLayers(uint32_t ns, std::span<const BlockKey> keys, uint32_t first_layer, uint32_t end_layer,
                              std::span<const uint64_t> layer_checksums, bool free_when_taken) {
  v1::Request r;
  v1::PublishLayersRequest* p = r.mutable_publish_layers();
  FillKeyed(p, ns, keys);
  p->set_first_layer(first_layer);
  p->set_end_layer(end_layer);
  p->set_free_when_taken(free_when_taken);
  for (uint64_t c : layer_checksums) p->add_layer_checksums(c);
  return r;
}

v1::Request MakePinLayers(uint32_t ns, std::span<const BlockKey> keys, uint32_t first_layer, uint32_t last_layer) {
  v1::Request r = MakePin(ns, keys);
  r.mutable_pin()->set_first_layer(first_layer);
  r.mutable_pin()->set_last_layer(last_layer);
  return r;
}

v1::Request MakePin(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r;
  FillKeyed(r.mutable_pin(), ns, keys);
  return r;
}

v1::Request MakeRelease(std::span<const uint64_t> leases) {
  v1::Request r;
  r.mutable_release()->mutable_leases()->Add(leases.begin(), leases.end());
  return r;
}

v1::Request MakeReleaseNoReply(std::span<const uint64_t> leases) {
  v1::Request r = MakeRelease(leases);
  r.mutable_release()->set_no_reply(true);
  return r;
}

v1::Request MakeUsageReport(std::span<const std::pair<uint32_t, BlockKey>> uses, uint64_t lookups, uint64_t lookup_keys,
                            uint64_t lookup_hits) {
  v1::Request r;
  auto* report = r.mutable_usage();
  for (const auto& [ns, key] : uses) {
    v1::UsageReport::Uses* group = nullptr;
    for (auto& g : *report->mutable_uses()) {
      if (g.ns() == ns) group = &g;
    }
    if (group == nullptr) {
      group = report->add_uses();
      group->set_ns(ns);
    }
    group->add_keys(key.hi);
    group->add_keys(key.lo);
  }
  report->set_local_lookups(lookups);
  report->set_local_lookup_keys(lookup_keys);
  report->set_local_lookup_hit_blocks(lookup_hits);
  return r;
}

v1::Request MakeErase(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r;
  FillKeyed(r.mutable_erase(), ns, keys);
  return r;
}

v1::Request MakeCorruptReport(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r = MakeErase(ns, keys);
  r.mutable_erase()->set_corrupt(true);
  return r;
}

v1::Request MakeBeginLoad(uint32_t ns, std::span<const BlockKey> keys, double compute_us_per_layer) {
  v1::Request r;
  FillKeyed(r.mutable_begin_load(), ns, keys);
  r.mutable_begin_load()->set_compute_us_per_layer(compute_us_per_layer);
  return r;
}

v1::Request MakeEndLoad(uint64_t load) {
  v1::Request r;
  r.mutable_end_load()->set_load_id(load);
  return r;
}

void ToProto(const PreloadPlan& plan, v1::PreloadPlanResponse* out) {
  out->set_layers_to_preload(plan.layers_to_preload);
  out->set_buffer_bytes(plan.buffer_bytes);
  out->set_read_bytes_per_s(plan.read_bytes_per_s);
  out->set_read_us_per_layer(plan.read_us_per_layer);
  out->set_stall_us(plan.stall_us);
  out->set_total_us(plan.total_us);
  out->set_recompute_instead(plan.recompute_instead);
}

PreloadPlan FromProto(const v1::PreloadPlanResponse& p) {
  PreloadPlan plan;
  plan.layers_to_preload = p.layers_to_preload();
  plan.buffer_bytes = p.buffer_bytes();
  plan.read_bytes_per_s = p.read_bytes_per_s();
  plan.read_us_per_layer = p.read_us_per_layer();
  plan.stall_us = p.stall_us();
  plan.total_us = p.total_us();
  plan.recompute_instead = p.recompute_instead();
  return plan;
}

v1::Request MakePreloadPlan(uint32_t source_tier, uint64_t bytes_per_layer, double compute_us_per_layer,
                            uint32_t layers, double recompute_us_per_layer) {
  v1::Request r;
  auto* p = r.mutable_preload_plan();
  p->set_source_tier(source_tier);
  p->set_bytes_per_layer(bytes_per_layer);
  p->set_compute_us_per_layer(compute_us_per_layer);
  p->set_layers(layers);
  p->set_recompute_us_per_layer(recompute_us_per_layer);
  return r;
}

void ToProto(const ReadyEstimate& estimate, v1::ReadyEstimateResponse* out) {
  out->set_prefix_blocks(estimate.prefix_blocks);
  out->mutable_tiers()->Reserve(static_cast<int>(estimate.tiers.size()));
  for (Tier tier : estimate.tiers) out->add_tiers(static_cast<uint32_t>(tier));
  out->set_prefix_bytes(estimate.prefix_bytes);
  out->set_host_ready_us(estimate.host_ready_us);
  out->set_gpu_ready_us(estimate.gpu_ready_us);
  out->set_gpu_copy_bytes(estimate.gpu_copy_bytes);
  out->set_gpu_copy_bytes_per_s(estimate.gpu_copy_bytes_per_s);
  for (const ReadyTierShare& share : estimate.below) {
    v1::ReadyTierShare* s = out->add_below();
    s->set_tier(static_cast<uint32_t>(share.tier));
    s->set_blocks(share.blocks);
    s->set_bytes(share.bytes);
    s->set_promoting_blocks(share.promoting_blocks);
    s->set_queued_reads(share.queued_reads);
    s->set_queued_bytes(share.queued_bytes);
    s->set_read_bytes_per_s(share.read_bytes_per_s);
    s->set_overhead_us(share.overhead_us);
    s->set_ready_us(share.ready_us);
  }
}

ReadyEstimate FromProto(const v1::ReadyEstimateResponse& p) {
  ReadyEstimate estimate;
  estimate.prefix_blocks = p.prefix_blocks();
  for (uint32_t tier : p.tiers()) estimate.tiers.push_back(static_cast<Tier>(tier));
  estimate.prefix_bytes = p.prefix_bytes();
  estimate.host_ready_us = p.host_ready_us();
  estimate.gpu_ready_us = p.gpu_ready_us();
  estimate.gpu_copy_bytes = p.gpu_copy_bytes();
  estimate.gpu_copy_bytes_per_s = p.gpu_copy_bytes_per_s();
  for (const v1::ReadyTierShare& s : p.below()) {
    estimate.below.push_back(ReadyTierShare{static_cast<Tier>(s.tier()), s.blocks(), s.bytes(), s.promoting_blocks(),
                                            s.queued_reads(), s.queued_bytes(), s.read_bytes_per_s(), s.overhead_us(),
                                            s.ready_us()});
  }
  return estimate;
}

v1::Request MakeReadyEstimate(uint32_t ns, std::span<const BlockKey> keys) {
  v1::Request r;
  FillKeyed(r.mutable_ready_estimate(), ns, keys);
  return r;
}

v1::Request MakeStats() {
  v1::Request r;
  r.mutable_stats();
  return r;
}

v1::Request MakeListNamespaces(std::string_view page_token, uint32_t page_size) {
  v1::Request r;
  auto* body = r.mutable_list_namespaces();
  body->set_page_token(std::string(page_token));
  body->set_page_size(page_size);
  return r;
}

v1::Request MakeDrop(std::span<const BlockKey> fingerprints, std::string_view model_id,
                     std::string_view model_revision) {
  v1::Request r;
  auto* body = r.mutable_drop();
  AddKeys(fingerprints, body->mutable_fingerprints());
  body->set_model_id(std::string(model_id));
  body->set_model_revision(std::string(model_revision));
  return r;
}

v1::Request MakeHold(const BlockKey& fingerprint, std::span<const BlockKey> keys, uint64_t ttl_ms) {
  v1::Request r;
  auto* body = r.mutable_hold();
  ToProto(fingerprint, body->mutable_fingerprint());
  AddKeys(keys, body->mutable_keys());
  body->set_ttl_ms(ttl_ms);
  return r;
}

v1::Request MakeUnhold(const BlockKey& fingerprint, std::span<const BlockKey> keys) {
  v1::Request r;
  auto* body = r.mutable_unhold();
  ToProto(fingerprint, body->mutable_fingerprint());
  AddKeys(keys, body->mutable_keys());
  return r;
}

v1::Request MakeConfig() {
  v1::Request r;
  r.mutable_config();
  return r;
}

v1::Request MakeHealth() {
  v1::Request r;
  r.mutable_health();
  return r;
}

namespace {

v1::Request QueueHintOf(v1::QueueHint::Kind kind, uint64_t request, uint64_t session) {
  v1::Request r;
  auto* q = r.mutable_queue();
  q->set_kind(kind);
  q->set_request_id(request);
  q->set_session_id(session);
  return r;
}

}  // namespace

v1::Request MakeEnqueue(uint32_t ns, uint64_t request, std::span<const BlockKey> chain, uint64_t start_in_us,
                        uint64_t session) {
  v1::Request r = QueueHintOf(v1::QueueHint::ENQUEUE, request, session);
  auto* q = r.mutable_queue();
  q->set_ns(ns);
  AddKeys(chain, q->mutable_keys());
  q->set_start_in_us(start_in_us);
  return r;
}

v1::Request MakeRequestEvent(uint64_t request, bool started) {
  return QueueHintOf(started ? v1::QueueHint::STARTED : v1::QueueHint::FINISHED, request, 0);
}

v1::Request MakeSessionHint(uint64_t session, bool open) {
  return QueueHintOf(open ? v1::QueueHint::SESSION_OPEN : v1::QueueHint::SESSION_CLOSE, 0, session);
}

}  // namespace kvtier::wire
