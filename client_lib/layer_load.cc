// LayerLoad (include/kvtier/client.h): a layer-wise load followed on its
// load board (common/load_board.h) in the arena mapping.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <string>

#include "client_lib/board_view.h"
#include "client_lib/connection.h"
#include "client_lib/device_copy.h"
#include "client_lib/verify.h"
#include "common/load_board.h"
#include "kvtier/client.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

// How long one futex sleep lasts before the waiter checks its connection
// (a daemon that died never wakes it).
constexpr std::chrono::milliseconds kWaitSlice{10};

}  // namespace

Result<LayerLoad> Client::BeginLoad(NamespaceId ns, std::span<const BlockKey> keys, LoadOptions options) {
  std::shared_ptr<internal::Connection> conn = Current();
  if (ns >= conn->namespaces().size()) {
    return InvalidArgument("namespace " + std::to_string(ns) + " was not registered at Connect");
  }
  if (keys.empty()) return InvalidArgument("BeginLoad needs at least one key");
  const auto [layer_count, block_bytes] = conn->layout(ns);
  if (!options.dst.empty()) {
    if (options.dst.size() != keys.size()) {
      return InvalidArgument("BeginLoad: " + std::to_string(options.dst.size()) + " buffers for " +
                             std::to_string(keys.size()) + " keys");
    }
    for (size_t i = 0; i < options.dst.size(); ++i) {
      if (options.dst[i].size() < block_bytes) {
        return InvalidArgument("BeginLoad: buffer " + std::to_string(i) + " holds " +
                               std::to_string(options.dst[i].size()) + " bytes, a block is " +
                               std::to_string(block_bytes));
      }
    }
  }
  std::shared_ptr<internal::DeviceLoadCopier> device_copier;
  const internal::DevicePoolMapping* device_pool = nullptr;
  if (!options.device_dst.empty()) {
    if (!options.dst.empty()) return InvalidArgument("BeginLoad: host buffers or device buffers, not both");
    if (options.device_dst.size() != keys.size()) {
      return InvalidArgument("BeginLoad: " + std::to_string(options.device_dst.size()) + " device buffers for " +
                             std::to_string(keys.size()) + " keys");
    }
    for (void* p : options.device_dst) {
      if (p == nullptr) return InvalidArgument("BeginLoad: a null device buffer");
    }
    if (Status s = conn->RegisterArenaForGpu(); !s.ok()) return s;
    auto copier = internal::DeviceLoadCopier::Create(layer_count, options.device_ordinal);
    if (!copier.ok()) return copier.status();
    device_copier = std::move(*copier);
    // With the daemon's device pool mapped on this GPU, the blocks it
    // holds there come device to device (board state kInDevice).
    device_pool = conn->DevicePoolOn(options.device_ordinal);
  }
  if (!(options.compute_us_per_layer >= 0)) return InvalidArgument("compute_us_per_layer must be >= 0");
  if (!(options.recompute_us_per_layer >= 0) || !std::isfinite(options.recompute_us_per_layer)) {
    return InvalidArgument("recompute_us_per_layer must be a time >= 0");
  }
  if (options.deadline.count() < 0) return InvalidArgument("a load's deadline must be >= 0");
  // From the call: the round trip counts against it, as the engine's wait does.
  const auto started = std::chrono::steady_clock::now();
  // Past a year is no deadline (and cannot overflow the clock).
  constexpr double kNoDeadlineUs = 365.0 * 86400 * 1e6;
  double deadline_us = static_cast<double>(options.deadline.count());
  if (deadline_us == 0) deadline_us = options.recompute_us_per_layer * layer_count;
  const std::chrono::microseconds deadline(deadline_us >= kNoDeadlineUs ? 0 : static_cast<int64_t>(deadline_us));
  if (options.wait_for_depth && options.compute_us_per_layer <= 0) {
    return InvalidArgument("wait_for_depth needs compute_us_per_layer > 0 to plan the depth");
  }
  v1::Request request = wire::MakeBeginLoad(ns, keys, options.compute_us_per_layer);
  if (device_pool != nullptr) request.mutable_begin_load()->set_device_pool(true);
  const bool verify = conn->verify_checksums();
  if (verify) request.mutable_begin_load()->set_verify(true);
  // The daemon fails at once what its estimate says cannot arrive by then.
  if (deadline.count() > 0) request.mutable_begin_load()->set_deadline_us(static_cast<uint64_t>(deadline.count()));
  auto r = conn->CallSync(std::move(request));
  if (!r.ok()) return r.status();
  const v1::BeginLoadResponse& body = r->begin_load();
  LayerLoad load;
  load.conn_ = conn;
  load.id_ = body.load_id();
  load.source_ = static_cast<Tier>(body.source_tier());
  // Checked before anything is read through them: the answer names arena
  // memory this process will touch.
  auto board = conn->Slot(body.board_offset(), body.board_bytes());
  const auto blocks = static_cast<uint32_t>(keys.size());
  // A load that verifies has the board's layer checksum table; a kvtierd
  // that ignored `verify` answers a board without one.
  const bool plain_board = body.board_bytes() == LoadBoardBytes(blocks);
  const bool board_ok = board.ok() && body.board_bytes() == LoadBoardBytes(blocks, verify ? layer_count : 0) &&
                        body.board_offset() % alignof(LoadBoardHeader) == 0;
  const bool sums_ok =
      body.layer_checksums_size() == 0 || static_cast<size_t>(body.layer_checksums_size()) == keys.size();
  if (!board_ok || !sums_ok || static_cast<size_t>(body.blocks_size()) != keys.size() || body.layers() != layer_count ||
      uint64_t{body.layers()} * body.layer_bytes() != block_bytes) {
    load.ended_ = true;  // nothing of it is usable; end it on the daemon
    load.conn_->Call(
        wire::MakeEndLoad(load.id_), [](Result<v1::Response>) {}, internal::Connection::Reader::kDetached);
    if (verify && plain_board) {
      return Unimplemented(
          "kvtierd does not verify layer-wise loads (no layer checksums); connect with "
          "verify_checksums off or upgrade kvtierd");
    }
    return ProtocolError("kvtierd answered BeginLoad with a board or layout that does not fit");
  }
  load.board_ = board->data();
  load.layers_ = body.layers();
  load.layer_bytes_ = body.layer_bytes();
  for (const auto& s : body.blocks()) load.initial_.push_back(wire::FromProto(s));
  load.dst_ = std::move(options.dst);
  load.device_dst_ = std::move(options.device_dst);
  load.cuda_stream_ = options.cuda_stream;
  load.device_copier_ = std::move(device_copier);
  load.device_pool_ = device_pool;
  load.copied_.assign(load.layers_, false);
  if (deadline.count() > 0) load.deadline_ = started + deadline;
  load.verify_ = verify;
  if (verify) {
    load.ns_ = ns;
    load.keys_.assign(keys.begin(), keys.end());
    load.layer_checksums_.resize(keys.size());
    load.block_checksums_.resize(keys.size());
    load.block_checked_.assign(keys.size(), false);
    for (int i = 0; i < body.layer_checksums_size(); ++i) {
      const auto& sums = body.layer_checksums(i).layers();
      if (static_cast<uint32_t>(sums.size()) == load.layers_) {
        load.layer_checksums_[i].assign(sums.begin(), sums.end());
      } else if (sums.empty() && body.layer_checksums(i).settled() && load.initial_[i].ok()) {
        load.block_checksums_[i] = body.layer_checksums(i).block();  // checked whole
      }
    }
    load.verdicts_.assign(keys.size(), Status::Ok());
    load.verified_.assign(load.layers_, false);
  }
  if (body.has_plan()) load.plan_ = wire::FromProto(body.plan());
  if (options.wait_for_depth && load.plan_ && load.plan_->layers_to_preload > 0) {
    const uint32_t depth = std::min(load.plan_->layers_to_preload, load.layers_);
    if (Status s = load.WaitLayer(depth - 1); !s.ok()) return s;
  }
  return load;
}

LayerLoad::LayerLoad(LayerLoad&& other) noexcept { *this = std::move(other); }

LayerLoad& LayerLoad::operator=(LayerLoad&& other) noexcept {
  if (this == &other) return *this;
  End().IgnoreError();  // replaced: the old load ends
  conn_ = std::move(other.conn_);
  id_ = other.id_;
  board_ = std::exchange(other.board_, nullptr);
  layers_ = other.layers_;
  layer_bytes_ = other.layer_bytes_;
  initial_ = std::move(other.initial_);
  dst_ = std::move(other.dst_);
  device_dst_ = std::move(other.device_dst_);
  cuda_stream_ = other.cuda_stream_;
  device_copier_ = std::move(other.device_copier_);
  device_pool_ = std::exchange(other.device_pool_, nullptr);
  copied_ = std::move(other.copied_);
  source_ = other.source_;
  plan_ = std::move(other.plan_);
  ended_ = std::exchange(other.ended_, true);
  deadline_ = other.deadline_;
  late_ = other.late_;
  verify_ = other.verify_;
  ns_ = other.ns_;
  keys_ = std::move(other.keys_);
  layer_checksums_ = std::move(other.layer_checksums_);
  block_checksums_ = std::move(other.block_checksums_);
  block_checked_ = std::move(other.block_checked_);
  verdicts_ = std::move(other.verdicts_);
  verified_ = std::move(other.verified_);
  return *this;
}

LayerLoad::~LayerLoad() {
  if (ended_ || conn_ == nullptr) return;
  // Copies still reading the arena or the device pool finish before the
  // pins go.
  if (device_copier_) device_copier_->SynchronizeAll().IgnoreError();
  // Not waited for: the answer is read by whoever reads next.
  conn_->Call(
      wire::MakeEndLoad(id_), [](Result<v1::Response>) {}, internal::Connection::Reader::kDetached);
}

uint32_t LayerLoad::layers_ready() const {
  if (board_ == nullptr || ended_) return 0;
  return LoadBoardReader(board_, static_cast<uint32_t>(size())).layers_ready();
}

Status LayerLoad::status(size_t block) const {
  if (block >= size()) return InvalidArgument("block " + std::to_string(block) + " is not in this load");
  if (!initial_[block].ok()) return initial_[block];
  if (board_ == nullptr) return FailedPrecondition("the load has ended");
  if (verify_ && !verdicts_[block].ok()) return verdicts_[block];
  return internal::BoardBlockStatus(LoadBoardReader(board_, static_cast<uint32_t>(size())),
                                    static_cast<uint32_t>(block), device_pool_ != nullptr);
}

bool LayerLoad::done() const {
  if (board_ == nullptr || ended_) return true;
  return LoadBoardReader(board_, static_cast<uint32_t>(size())).resolved() == size();
}

size_t LayerLoad::usable_prefix() const {
  size_t n = 0;
  while (n < size() && status(n).ok()) ++n;
  return n;
}

Status LayerLoad::WaitLayer(uint32_t layer) {
  if (ended_ || conn_ == nullptr) return FailedPrecondition("the load has ended");
  if (layer >= layers_) {
    return InvalidArgument("layer " + std::to_string(layer) + " of a " + std::to_string(layers_) + "-layer load");
  }
  LoadBoardReader board(board_, static_cast<uint32_t>(size()));
  const auto timeout = conn_->call_timeout();
  const auto deadline =
      timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout : std::chrono::steady_clock::time_point::max();
  const std::chrono::microseconds spin(conn_->spin_wait_us());
  // Past the load's deadline nothing is waited for: the blocks loading
  // then have failed, and every other one is whole.
  while (!late_ && !board.WaitBeyond(layer, std::min(deadline, deadline_), spin, kWaitSlice)) {
    if (!conn_->Alive()) return Unavailable("the connection to kvtierd is gone; the load's layers will not come");
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) {
      FailLateBlocks();
      break;
    }
    if (now >= deadline) return TimedOut("layer " + std::to_string(layer) + " was not in place within call_timeout");
  }
  if (device_copier_) {
    if (verify_) VerifyLayers(layer);  // in the arena, before the copies read it
    return EnqueueDeviceCopies(layer);
  }
  if (dst_.empty()) {
    if (verify_) VerifyLayers(layer);
    return Status::Ok();
  }
  for (uint32_t l = 0; l <= layer; ++l) {
    if (copied_[l]) continue;
    for (size_t i = 0; i < size(); ++i) {
      auto src = ArenaLayer(i, l);
      if (src.ok()) std::memcpy(dst_[i].data() + uint64_t{l} * layer_bytes_, src->data(), src->size());
    }
    copied_[l] = true;
  }
  if (verify_) VerifyLayers(layer);  // the copies: what the engine reads
  return Status::Ok();
}

void LayerLoad::FailLateBlocks() {
  late_ = true;
  LoadBoardReader board(board_, static_cast<uint32_t>(size()));
  for (size_t i = 0; i < size(); ++i) {
    if (initial_[i].ok() && board.state(static_cast<uint32_t>(i)) == BoardBlockState::kLoading) {
      initial_[i] = TimedOut("block " + std::to_string(i) +
                             " was not whole by the load's deadline (LoadOptions::deadline); recompute it");
    }
  }
}

void LayerLoad::VerifyLayers(uint32_t layer) {
  LoadBoardReader board(board_, static_cast<uint32_t>(size()), layers_);
  for (uint32_t l = 0; l <= layer; ++l) {
    if (verified_[l]) continue;
    for (size_t i = 0; i < size(); ++i) {
      if (!verdicts_[i].ok()) continue;
      auto src = ArenaLayer(i, l);
      if (!src.ok()) continue;  // failed, or in device memory (not in the arena: not checked here)
      Status verified;
      if (block_checksums_[i]) {
        // A host hit whose writer sent no layer checksums: every layer is
        // in place from the start; the whole block is checked once.
        if (block_checked_[i]) continue;
        block_checked_[i] = true;
        const std::byte* first = src->data() - uint64_t{l} * layer_bytes_;
        verified = internal::VerifyBlock({first, uint64_t{layers_} * layer_bytes_}, *block_checksums_[i], keys_[i]);
      } else {
        std::span<const std::byte> bytes = *src;
        if (!dst_.empty()) bytes = dst_[i].subspan(uint64_t{l} * layer_bytes_, layer_bytes_);
        const uint64_t expected =
            layer_checksums_[i].empty() ? board.layer_checksum(static_cast<uint32_t>(i), l) : layer_checksums_[i][l];
        verified = internal::VerifyLayers(bytes, {&expected, 1}, l, keys_[i]);
      }
      if (verified.ok()) continue;
      verdicts_[i] = verified;
      internal::ReportCorruptAndWait(*conn_, ns_, keys_[i]);  // before End releases its pin
    }
    verified_[l] = true;
  }
}

Status LayerLoad::EnqueueDeviceCopies(uint32_t layer) {
  using Piece = internal::DeviceLoadCopier::Piece;
  using Source = internal::DeviceLoadCopier::Source;
  LoadBoardReader board(board_, static_cast<uint32_t>(size()));
  const uint64_t block_bytes = uint64_t{layers_} * layer_bytes_;
  std::vector<Piece> pieces;
  for (uint32_t l = 0; l <= layer; ++l) {
    if (copied_[l]) continue;
    pieces.clear();
    for (size_t i = 0; i < size(); ++i) {
      if (!initial_[i].ok() || (verify_ && !verdicts_[i].ok())) continue;
      auto place = internal::BoardLayerPlace(board, static_cast<uint32_t>(i), l, device_pool_ != nullptr);
      if (!place.ok()) continue;  // failed: its bytes are not used (status(i) says why)
      void* dst = static_cast<std::byte*>(device_dst_[i]) + uint64_t{l} * layer_bytes_;
      if (place->memory == internal::LayerPlace::Memory::kDevicePool) {
        const std::byte* src = device_pool_->At(place->block_offset, block_bytes);
        if (src == nullptr) return ProtocolError("block " + std::to_string(i) + " lies outside the device pool");
        pieces.push_back(Piece{dst, src + uint64_t{l} * layer_bytes_, layer_bytes_, Source::kDevicePool});
      } else {
        auto src = conn_->Slot(place->block_offset, block_bytes);
        if (!src.ok()) return ProtocolError("block " + std::to_string(i) + " lies outside the arena");
        pieces.push_back(Piece{dst, src->data() + uint64_t{l} * layer_bytes_, layer_bytes_, Source::kArena});
      }
    }
    if (Status s = device_copier_->EnqueueLayer(l, pieces); !s.ok()) return s;
    copied_[l] = true;
  }
  return device_copier_->MakeStreamWait(cuda_stream_, layer);
}

Status LayerLoad::WaitAll() {
  if (layers_ == 0) return FailedPrecondition("the load has ended");
  return WaitLayer(layers_ - 1);
}

std::span<const std::byte> LayerLoad::LayerSpan(size_t block, uint32_t layer) const {
  auto span = TryLayerSpan(block, layer);
  return span.ok() ? *span : std::span<const std::byte>();
}

Result<std::span<const std::byte>> LayerLoad::TryLayerSpan(size_t block, uint32_t layer) const {
  if (verify_ && block < size() && layer < layers_) {
    if (!verdicts_[block].ok())
      return NotFound("block " + std::to_string(block) + " failed verification: " + verdicts_[block].ToString());
    if (!verified_[layer]) {
      return NotFound("layer " + std::to_string(layer) + " is not verified yet (WaitLayer(" + std::to_string(layer) +
                      ") first)");
    }
  }
  return ArenaLayer(block, layer);
}

Result<std::span<const std::byte>> LayerLoad::ArenaLayer(size_t block, uint32_t layer) const {
  if (ended_ || board_ == nullptr) return FailedPrecondition("the load has ended");
  if (block >= size() || layer >= layers_) {
    return InvalidArgument("layer " + std::to_string(layer) + " of block " + std::to_string(block) +
                           " is not in the load");
  }
  if (!initial_[block].ok()) {
    return NotFound("block " + std::to_string(block) + " was not loaded: " + initial_[block].ToString());
  }
  LoadBoardReader board(board_, static_cast<uint32_t>(size()));
  auto place = internal::BoardLayerPlace(board, static_cast<uint32_t>(block), layer, device_pool_ != nullptr);
  if (!place.ok()) {
    const StatusCode code = place.status().code();
    if (code == StatusCode::kNotFound || code == StatusCode::kProtocolError) return place.status();
    return NotFound(place.status().message());  // a failed block
  }
  if (place->memory == internal::LayerPlace::Memory::kDevicePool) {
    return FailedPrecondition("block " + std::to_string(block) +
                              " is in device memory; use the device destination (LoadOptions::device_dst)");
  }
  auto bytes = conn_->Slot(place->block_offset, uint64_t{layers_} * layer_bytes_);
  // A board scribbled on: nothing is served from it.
  if (!bytes.ok()) return ProtocolError("block " + std::to_string(block) + " lies outside the arena");
  return std::span<const std::byte>(bytes->subspan(uint64_t{layer} * layer_bytes_, layer_bytes_));
}

Status LayerLoad::End() {
  if (ended_ || conn_ == nullptr) return Status::Ok();
  ended_ = true;
  Status copies = device_copier_ ? device_copier_->SynchronizeAll() : Status::Ok();
  board_ = nullptr;
  auto r = conn_->CallSync(wire::MakeEndLoad(id_));
  if (!r.ok()) return r.status();
  return copies;  // a failed device copy: the GPU buffers are not to be trusted
}

}  // namespace kvtier
