#include "python/src/convert.h"

#include <string>

#include "python/src/errors.h"

namespace kvtier::python {
namespace py = pybind11;

std::vector<BlockKey> ToKeys(const py::handle& keys) {
  std::vector<BlockKey> out;
  for (py::handle k : keys) out.push_back(k.cast<BlockKey>());
  return out;
}

std::vector<uint32_t> ToTokens(const py::handle& tokens) {
  std::vector<uint32_t> out;
  if (PyObject_CheckBuffer(tokens.ptr()) && !py::isinstance<py::bytes>(tokens)) {
    // numpy / array.array: convert through numpy-free buffer reading.
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(tokens).request();
    if (info.ndim != 1) throw StatusError(InvalidArgument("tokens must be one-dimensional"));
    out.reserve(static_cast<size_t>(info.shape[0]));
    auto* base = static_cast<const char*>(info.ptr);
    for (py::ssize_t i = 0; i < info.shape[0]; ++i) {
      const char* p = base + i * info.strides[0];
      int64_t v = 0;
      const std::string& f = info.format;
      if (f == "I" || f == "=I" || f == "<I")
        v = *reinterpret_cast<const uint32_t*>(p);
      else if (f == "i" || f == "=i" || f == "<i")
        v = *reinterpret_cast<const int32_t*>(p);
      else if (f == "l" || f == "q" || f == "<q" || f == "=q")
        v = *reinterpret_cast<const int64_t*>(p);
      else if (f == "L" || f == "Q" || f == "<Q" || f == "=Q") {
        uint64_t u = *reinterpret_cast<const uint64_t*>(p);
        if (u > UINT32_MAX) throw StatusError(InvalidArgument("token id out of the u32 range"));
        v = static_cast<int64_t>(u);
      } else {
        throw StatusError(InvalidArgument("tokens: unsupported buffer format '" + f + "' (use integers)"));
      }
      if (v < 0 || v > static_cast<int64_t>(UINT32_MAX)) {
        throw StatusError(InvalidArgument("token id " + std::to_string(v) + " out of the u32 range"));
      }
      out.push_back(static_cast<uint32_t>(v));
    }
    return out;
  }
  for (py::handle t : tokens) {
    long long v = t.cast<long long>();
    if (v < 0 || v > static_cast<long long>(UINT32_MAX)) {
      throw StatusError(InvalidArgument("token id " + std::to_string(v) + " out of the u32 range"));
    }
    out.push_back(static_cast<uint32_t>(v));
  }
  return out;
}

namespace {

py::object AsBufferObject(const py::handle& obj) {
  if (PyObject_CheckBuffer(obj.ptr())) return py::reinterpret_borrow<py::object>(obj);
  // A torch tensor: its numpy() shares the memory (CPU tensors only; torch
  // raises a TypeError naming the device otherwise).
  if (py::hasattr(obj, "numpy") && py::hasattr(obj, "detach")) return obj.attr("detach")().attr("numpy")();
  throw StatusError(InvalidArgument(std::string("expected a buffer (bytes, bytearray, memoryview, numpy "
                                                "array or CPU tensor), got ") +
                                    std::string(py::str(py::type::of(obj).attr("__name__")))));
}

}  // namespace

HeldBuffer::HeldBuffer(const py::handle& obj, bool writable) {
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 2) {
    // (address, nbytes): raw memory the caller vouches for (an engine's
    // pinned pool, a tensor's data_ptr()).
    auto t = py::reinterpret_borrow<py::tuple>(obj);
    auto address = t[0].cast<uintptr_t>();
    auto nbytes = t[1].cast<size_t>();
    if (address == 0 && nbytes != 0) throw StatusError(InvalidArgument("null address"));
    raw_ = {reinterpret_cast<std::byte*>(address), nbytes};
    return;
  }
  owner_ = AsBufferObject(obj);
  auto* view = new Py_buffer;  // buffer_info releases and deletes it
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(owner_.ptr(), view, flags) != 0) {
    delete view;
    PyErr_Clear();
    throw StatusError(
        InvalidArgument(writable ? "expected a writable C-contiguous buffer" : "expected a C-contiguous buffer"));
  }
  info_ = py::buffer_info(view, /*ownview=*/true);
  raw_ = {static_cast<std::byte*>(view->buf), static_cast<size_t>(view->len)};
}

HeldBuffers::HeldBuffers(const py::handle& seq, bool writable) {
  for (py::handle b : seq) held_.emplace_back(b, writable);
}

void HeldBuffers::ExpectOnePer(size_t keys) const {
  if (held_.size() != keys) throw StatusError(InvalidArgument("one buffer per key"));
}

std::vector<std::span<std::byte>> HeldBuffers::writable() {
  std::vector<std::span<std::byte>> out;
  for (HeldBuffer& h : held_) out.push_back(h.writable());
  return out;
}

std::vector<std::span<const std::byte>> HeldBuffers::readable() const {
  std::vector<std::span<const std::byte>> out;
  for (const HeldBuffer& h : held_) out.push_back(h.readable());
  return out;
}

}  // namespace kvtier::python
