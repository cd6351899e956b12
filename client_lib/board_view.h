// How a LayerLoad (layer_load.cc) reads one block of its load board
// (common/load_board.h): pure functions of the board, so that unit tests
// run them on a board they write themselves, without a daemon.
#pragma once

#include <cstdint>

#include "common/load_board.h"
#include "kvtier/result.h"
#include "kvtier/status.h"

namespace kvtier::internal {

// Where the bytes of a block's layer are.
struct LayerPlace {
  enum class Memory {
    kArena,       // the host arena (kLoading, kLoaded)
    kDevicePool,  // the daemon's device pool (kInDevice)
  };
  Memory memory = Memory::kArena;
  // The block's offset there; layer l is at block_offset + l * layer_bytes
  // (layer-major). Untrusted: the caller checks the whole block's range.
  uint64_t block_offset = 0;
};

// Block `block`'s status as LayerLoad::status reports it: Ok while it
// loads, once loaded, and when it is whole in the device pool on a load
// that asked for that (`device_pool`). A failed block: its code (Internal
// when the board says ok). ProtocolError for a block in device memory on a
// load that did not ask for it, and for a state the format does not have
// (its bytes are never used).
Status BoardBlockStatus(const LoadBoardReader& board, uint32_t block, bool device_pool);

// Where layer `layer` of block `block` is: in the arena once layers_ready
// > `layer` (NotFound before), in the device pool at once (a kInDevice
// block is final). A block whose BoardBlockStatus is not Ok answers that.
Result<LayerPlace> BoardLayerPlace(const LoadBoardReader& board, uint32_t block, uint32_t layer, bool device_pool);

}  // namespace kvtier::internal
