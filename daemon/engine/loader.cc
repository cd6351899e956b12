// Layer-wise loads (loader.h): the load's record and board; the
// LayerStreamer (layer_streamer.h) reads its blocks from the tiers below
// layer by layer.
//
// A load pins every key through Hooks::claim, as a Pin does: host hits are
// pinned at once, blocks being promoted or demoted are waited for, and the
// blocks found only below are claimed for promotion (kPromoting, so other
// pins wait for them). Those of the load's layout are streamed: their
// arena extents are allocated up front, and their layers are read one
// layer-range read each, in the order (layer 0 of every block, layer 1 of
// every block, ...), as many at once as the tiers take, a block's later
// layers once its first one landed. A block whose layers have all landed
// ends its promotion (Promoter::FinishPromotion commits and pins it for
// its waiters, the load among them); a failed read fails only its block.
// The load record turns all this into the board's words.
#include "daemon/engine/loader.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/load_board.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

Loader::Loader(HostTier& host, EngineCounters& counters, Hooks hooks)
    : host_(host), counters_(counters), hooks_(std::move(hooks)) {}

Result<HostTier::Extent> Loader::Open(const std::shared_ptr<LoadRecord>& load, size_t n) {
  Result<uint64_t> id = loads_.Open(load->connection);  // the slot, filled below
  if (!id.ok()) return id.status();
  load->id = *id;
  const uint32_t blocks = static_cast<uint32_t>(n);
  Result<HostTier::Extent> board = hooks_.allocate(LoadBoardBytes(blocks, load->verify ? load->layers : 0));
  if (!board.ok()) {
    loads_.Abandon(load->connection, load->id);
    return board.status();
  }
  {
    MutexLock lock(load->mu);
    load->board_extent = *board;
    load->board = LoadBoardWriter(host_.Bytes(*board).data(), blocks, load->layers, load->layer_bytes, load->verify);
    load->pending.assign(load->layers, blocks);
    load->counted.assign(n * load->layers, 0);
    load->leases.assign(n, 0);
    load->unresolved = n;
  }
  loads_.Fill(load->connection, load->id, load);
  return *board;
}

Result<Loader::LoadStart> Loader::Begin(ConnectionId connection, const NamespaceFingerprint& ns,
                                        std::span<const BlockKey> keys, LoadFlags flags) {
  if (keys.empty()) return InvalidArgument("a load needs at least one key");
  if (keys.size() > kMaxLoadBlocks) {
    return InvalidArgument("a load of " + std::to_string(keys.size()) + " blocks; at most " +
                           std::to_string(kMaxLoadBlocks));
  }
  const std::optional<NamespaceLayout> registered = hooks_.layout(ns);
  if (!registered || registered->block_bytes == 0 || registered->layer_count == 0) {
    return InvalidArgument("the namespace has no registered block layout to load layer by layer");
  }
  const NamespaceLayout layout = *registered;
  auto load = std::make_shared<LoadRecord>();
  load->connection = connection;
  load->layers = layout.layer_count;
  load->layer_bytes = layout.block_bytes / layout.layer_count;
  load->in_place = flags.in_place && hooks_.hold_above != nullptr;
  load->verify = flags.verify;
  const bool verify = flags.verify;
  if (load->in_place) {
    load->ns = ns;
    load->keys.assign(keys.begin(), keys.end());
  }
  const size_t n = keys.size();
  Result<HostTier::Extent> board = Open(load, n);
  if (!board.ok()) return board.status();
  Bump(counters_.loads);
  Bump(counters_.load_blocks, static_cast<int64_t>(n));

  // Blocks held in place above need no pin; the rest (`pinned`, by their
  // index in the load) are claimed.
  std::vector<size_t> pinned;
  std::vector<BlockKey> pinned_keys;
  for (size_t i = 0; i < n; ++i) {
    std::optional<BlockTier::InPlace> held;
    if (load->in_place) held = hooks_.hold_above(ns, keys[i], layout.layer_count, layout.block_bytes);
    if (held) {
      MutexLock lock(load->mu);
      load->held.emplace_back(i, held->offset);
      load->board.SetInDevice(static_cast<uint32_t>(i), held->offset);
      for (uint32_t l = 0; l < load->layers; ++l) load->Count(i, l);
      --load->unresolved;
      continue;
    }
    // Not above, or not of the layout: load it.
    pinned.push_back(i);
    pinned_keys.push_back(keys[i]);
  }
  // Those that cannot arrive by the deadline are not read at all.
  std::vector<size_t> late;
  if (flags.deadline_us > 0 && hooks_.late && !pinned.empty()) {
    const std::vector<bool> is_late = hooks_.late(ns, pinned_keys, static_cast<double>(flags.deadline_us));
    size_t kept = 0;
    for (size_t j = 0; j < pinned.size(); ++j) {
      if (j < is_late.size() && is_late[j]) {
        late.push_back(pinned[j]);
        continue;
      }
      pinned[kept] = pinned[j];
      pinned_keys[kept] = pinned_keys[j];
      ++kept;
    }
    pinned.resize(kept);
    pinned_keys.resize(kept);
  }
  {
    MutexLock lock(load->mu);
    load->Advance();
  }

  auto batch = std::make_shared<PinBatch>();
  batch->connection = connection;
  batch->with_layers = verify;  // every layer's checksum, for the board
  batch->done = [](std::vector<PinGrant>) {};
  batch->on_resolve = [this, load, pinned](size_t index, const PinGrant& grant) {
    Resolved(load, pinned[index], grant, /*at_once=*/false);
  };
  PinClaims claims = hooks_.claim(batch, ns, pinned_keys);
  for (PinClaim& c : claims.promote) c.index = pinned[c.index];

  LoadStart out;
  out.load = load->id;
  out.board_offset = board->offset;
  out.board_bytes = LoadBoardBytes(static_cast<uint32_t>(n), verify ? load->layers : 0);
  if (verify) out.layer_checksums.resize(n);
  out.layers = load->layers;
  out.layer_bytes = load->layer_bytes;
  out.blocks.assign(n, Status::Ok());
  for (size_t j = 0; j < pinned.size(); ++j) {
    if (batch->waiting[j]) continue;
    const size_t i = pinned[j];
    const PinGrant& grant = batch->grants[j];
    if (grant.status.ok() && grant.length != layout.block_bytes) {
      out.blocks[i] =
          InvalidArgument("block " + keys[i].ToHex() + " is " + std::to_string(grant.length) +
                          " bytes, not a whole block of its namespace (" + std::to_string(layout.block_bytes) + ")");
    } else {
      out.blocks[i] = grant.status;
      if (verify && grant.status.ok()) out.layer_checksums[i] = {true, grant.checksum, grant.layer_checksums};
    }
    Resolved(load, i, grant, /*at_once=*/true);
  }
  if (!late.empty()) {
    PinGrant failed;
    failed.status = TimedOut("cannot be read into host memory by the load's deadline (" +
                             std::to_string(flags.deadline_us) + " us), by kvtierd's estimate; recompute it");
    for (size_t i : late) {
      out.blocks[i] = failed.status;
      Resolved(load, i, failed, /*at_once=*/true);
    }
    Bump(counters_.load_late_blocks, static_cast<int64_t>(late.size()));
  }
  std::vector<PinClaim> streamed;
  for (const PinClaim& c : claims.promote) {
    out.source = std::max(out.source, hooks_.reported(c.from.level));
    out.below_bytes_per_layer += c.from.info.payload_bytes / std::max<uint32_t>(1, c.from.info.layer_count);
    if (c.from.info.layer_count == layout.layer_count && c.from.info.payload_bytes == layout.block_bytes) {
      streamed.push_back(c);
    } else {
      hooks_.promote(c.key, c.from);  // not of the layout: whole, and the load says InvalidArgument
    }
  }
  if (!streamed.empty()) hooks_.stream(load, streamed);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  if (hooks_.pinned) hooks_.pinned();
  return out;
}

void Loader::Resolved(const std::shared_ptr<LoadRecord>& load, size_t index, const PinGrant& grant, bool at_once) {
  LeaseId release = 0;
  bool offer = false;
  {
    MutexLock lock(load->mu);
    const bool whole = grant.length == uint64_t{load->layers} * load->layer_bytes;
    // A load that verifies gets every layer's checksum (PinBatch::
    // with_layers) onto the board. A block settled at once without them
    // (its writer sent none) is checked whole by the client, from the
    // answer; one that lands later without them cannot be: it fails.
    const bool has_sums = grant.layer_checksums.size() == load->layers;
    const bool sums = !load->board.has_checksums() || has_sums || at_once;
    if (grant.status.ok() && whole && sums) {
      for (uint32_t l = 0; l < load->layers && load->board.has_checksums() && has_sums; ++l) {
        load->board.SetLayerChecksum(static_cast<uint32_t>(index), l, grant.layer_checksums[l]);
      }
      load->board.SetOffset(static_cast<uint32_t>(index), grant.offset);
      load->board.SetLoaded(static_cast<uint32_t>(index));
      offer = load->in_place;
      if (load->ended) {
        release = grant.lease;
      } else {
        load->leases[index] = grant.lease;
      }
    } else {
      if (grant.status.ok()) release = grant.lease;  // pinned, but not a whole block of the layout
      const StatusCode code = !grant.status.ok() ? grant.status.code()
                              : whole            ? StatusCode::kUnimplemented  // no layer checksums to verify
                                                 : StatusCode::kInvalidArgument;
      load->board.SetFailed(static_cast<uint32_t>(index), code);
      Bump(counters_.load_failed_blocks);
    }
    for (uint32_t l = 0; l < load->layers; ++l) load->Count(index, l);
    --load->unresolved;
    load->Advance();
  }
  if (release != 0) hooks_.release(load->connection, std::span<const LeaseId>(&release, 1));
  // A hit of a load into GPU memory: worth a copy in the tier above.
  if (offer) hooks_.offer_above(load->ns, load->keys[index]);
  FreeBoardIfDone(load);
}

void Loader::FreeBoardIfDone(const std::shared_ptr<LoadRecord>& load) {
  HostTier::Extent board;
  {
    MutexLock lock(load->mu);
    if (!load->ended || load->unresolved != 0 || load->board_extent.length == 0) return;
    board = load->board_extent;
    load->board_extent = {};
  }
  host_.Free(board);
}

Status Loader::End(ConnectionId connection, uint64_t id) {
  std::shared_ptr<LoadRecord> load = loads_.Take(connection, id);
  if (!load) return NotFound("load " + std::to_string(id) + " is not open on this connection");
  std::vector<LeaseId> leases;
  std::vector<std::pair<size_t, uint64_t>> held;
  {
    MutexLock lock(load->mu);
    load->ended = true;
    for (LeaseId& lease : load->leases) {
      if (lease != 0) leases.push_back(std::exchange(lease, 0));
    }
    held.swap(load->held);
  }
  for (const auto& [index, offset] : held) hooks_.release_above(load->keys[index], offset);
  if (!leases.empty()) hooks_.release(connection, leases);
  FreeBoardIfDone(load);
  return Status::Ok();
}

void Loader::EndAll(ConnectionId connection) {
  for (uint64_t id : loads_.Ids(connection))
    End(connection, id).IgnoreError();  // raced with its own End: gone either way
}

}  // namespace kvtier
