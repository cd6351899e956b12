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
// memory alive while the GIL is released): an object with the buffer
// protocol (C-contiguous), a CPU torch tensor, or an (address, nbytes)
// tuple of raw memory the caller keeps valid.
class HeldBuffer {
 public:
  HeldBuffer(const pybind11::handle& obj, bool writable);
  std::span<std::byte> writable() { return raw_; }
  std::span<const std::byte> readable() const { return raw_; }

 private:
  pybind11::object owner_;  // a torch tensor's numpy() view, kept while held
  pybind11::buffer_info info_;
  std::span<std::byte> raw_;
};

// The buffers of a sequence, held together, as the spans a call takes.
class HeldBuffers {
 public:
  HeldBuffers() = default;
  HeldBuffers(const pybind11::handle& seq, bool writable);
  size_t size() const { return held_.size(); }
  // InvalidArgument unless there is one buffer per key.
  void ExpectOnePer(size_t keys) const;
  std::vector<std::span<std::byte>> writable();
  std::vector<std::span<const std::byte>> readable() const;

 private:
  std::vector<HeldBuffer> held_;
};

}  // namespace kvtier::python
