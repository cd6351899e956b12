#include "client_lib/board_view.h"

#include <string>

namespace kvtier::internal {
namespace {

// BoardBlockStatus for a block seen in `state` (read once by the caller).
Status StatusIn(BoardBlockState state, const LoadBoardReader& board, uint32_t block, bool device_pool) {
  switch (state) {
    case BoardBlockState::kLoading:
    case BoardBlockState::kLoaded:
      return Status::Ok();
    case BoardBlockState::kInDevice:
      if (device_pool) return Status::Ok();
      return ProtocolError("kvtierd put block " + std::to_string(block) +
                           " of the load in device memory, which the load did not ask for");
    case BoardBlockState::kFailed: {
      const StatusCode code = board.code(block);
      return Status(code == StatusCode::kOk ? StatusCode::kInternal : code,
                    "block " + std::to_string(block) + " of the load failed to load (" +
                        std::string(StatusCodeName(code)) + "); recompute it");
    }
  }
  return ProtocolError("block " + std::to_string(block) + " of the load has state " +
                       std::to_string(static_cast<uint32_t>(state)) + ", which load board version " +
                       std::to_string(kLoadBoardVersion) + " does not have");
}

}  // namespace

Status BoardBlockStatus(const LoadBoardReader& board, uint32_t block, bool device_pool) {
  return StatusIn(board.state(block), board, block, device_pool);
}

Result<LayerPlace> BoardLayerPlace(const LoadBoardReader& board, uint32_t block, uint32_t layer, bool device_pool) {
  // layers_ready, then the state, then the offset (the daemon stores them
  // in the opposite order): a block that failed after the layer was
  // counted is seen as failed, and an offset read is the one its state
  // published.
  const bool layer_in_arena = board.layers_ready() > layer;
  const BoardBlockState state = board.state(block);
  if (Status s = StatusIn(state, board, block, device_pool); !s.ok()) return s;
  if (state == BoardBlockState::kInDevice) {
    return LayerPlace{LayerPlace::Memory::kDevicePool, board.offset(block)};
  }
  // A loaded block has every layer in place, whatever the others have (a
  // load past its deadline reads its loaded blocks while others lag).
  if (!layer_in_arena && state != BoardBlockState::kLoaded) {
    return NotFound("layer " + std::to_string(layer) + " of block " + std::to_string(block) + " is not in place yet");
  }
  return LayerPlace{LayerPlace::Memory::kArena, board.offset(block)};
}

}  // namespace kvtier::internal
