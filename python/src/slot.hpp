// A slot of an engine's registered memory, seen from Python: an object with __dlpack__ and
// __dlpack_device__ (the DLPack exchange protocol), so that torch.from_dlpack and
// numpy.from_dlpack make a tensor over the slot's own bytes, with no copy. Each exported tensor
// holds the engine's memory (SlotOwner::memory), so that memory outlives every tensor made from
// it, even past the engine's close(); a slot of a closed engine refuses every use.
#pragma once

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/device.hpp>

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::python {

namespace py = pybind11;

// The element types a slot holds. fp8 travels as uint8 (DLPack 0.6 and torch 1.13 have no fp8);
// hetmesh.as_tensor views it as torch.float8_e4m3fn where torch has that.
enum class Element { fp8, bf16, fp16, fp32, int32, uint32, int64 };
Element element_of(afd::Dtype dtype);
// "fp8", "bfloat16", "float16", "float32", "int32", "uint32", "int64"
const char* element_name(Element element);
// Its DLPack type (fp8: uint8).
DLDataType dl_type(Element element);

struct SlotLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty: row-major
  Element element = Element::fp8;
};

// The engine a slot's memory belongs to.
class SlotOwner {
 public:
  // A reference that keeps the engine's memory (and what it needs) while a tensor uses it.
  // Throws Error(kStatusClosed) once the engine was closed.
  virtual std::shared_ptr<const void> memory() const = 0;

 protected:
  ~SlotOwner() = default;
};

class Slot {
 public:
  // `data` lies in memory of `device` that `engine` (the C++ side of the Python object `owner`)
  // holds until it is closed.
  Slot(void* data, SlotLayout layout, const Device& device, py::object owner,
       const SlotOwner& engine);

  // A new DLPack capsule ("dltensor") over the slot. `stream` is the consumer's stream; the slot
  // is ready when the call that handed it out returned (wait, get_batch), so it is not waited on.
  py::capsule dlpack(const py::object& stream) const;
  // (DLDeviceType, device id): kDLCPU for memory the host may address (the cpu plugin's, the
  // asic_stub's), else the plugin's own DLPack type with its device index.
  py::tuple dlpack_device() const;

  uintptr_t data_ptr() const;
  py::tuple shape() const;
  py::tuple strides() const;
  // element_name of its elements
  std::string dtype() const;
  uint64_t nbytes() const;
  std::string repr() const;

 private:
  // The engine's memory, or the error that its engine was closed.
  std::shared_ptr<const void> memory() const;

  void* data_;
  SlotLayout layout_;
  DLDevice device_{};
  py::object owner_;  // keeps engine_ valid; None once the garbage collector cleared it
  const SlotOwner* engine_;
  friend void bind_slot(py::module_& m);
};

void bind_slot(py::module_& m);

// A type setup that shows the garbage collector the Python object `T::*member` holds, so that a
// cycle through it (an engine subclass that keeps its own slots or streams as attributes) is
// collected instead of keeping the engine, its threads and its memory forever. For types made only
// by C++ (never by Python's __init__), whose value always exists.
template <typename T, py::object T::*Member>
py::custom_type_setup gc_visible() {
  return py::custom_type_setup([](PyHeapTypeObject* heap_type) {
    PyTypeObject* type = &heap_type->ht_type;
    type->tp_flags |= Py_TPFLAGS_HAVE_GC;
    type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) {
      Py_VISIT(Py_TYPE(self));
      Py_VISIT((py::cast<T&>(py::handle(self)).*Member).ptr());
      return 0;
    };
    type->tp_clear = [](PyObject* self) {
      py::cast<T&>(py::handle(self)).*Member = py::none();
      return 0;
    };
  });
}

}  // namespace hetmesh::python
