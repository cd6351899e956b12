// Conversions shared by the binding's files: Python sequences of keys and
// token ids, and the buffers callers pass in (anything with the buffer
// protocol, or a CPU torch tensor through its numpy() view).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier::python {

std::vector<BlockKey> ToKeys(const pybind11::handle& keys);
// Token ids from a list of ints or any integer buffer (numpy, array).
std::vector<uint32_t> ToTokens(const pybind11::handle& tokens);

// A caller's buffer held for the duration of a call (the export keeps the
// memory alive while the GIL is released). Must be C-contiguous.
class HeldBuffer {
 public:
  HeldBuffer(const pybind11::handle& obj, bool writable);
  std::span<std::byte> writable() { return {static_cast<std::byte*>(info_.ptr), bytes_}; }
  std::span<const std::byte> readable() const { return {static_cast<const std::byte*>(info_.ptr), bytes_}; }

 private:
  pybind11::object owner_;  // a torch tensor's numpy() view, kept while held
  pybind11::buffer_info info_;
  size_t bytes_ = 0;
};

std::vector<HeldBuffer> HoldBuffers(const pybind11::handle& seq, bool writable);

}  // namespace kvtier::python
