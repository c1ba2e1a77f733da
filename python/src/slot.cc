// DLPack export of engine slots (slot.hpp).
#include "slot.hpp"

#include "teardown.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hetmesh::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// What a consumer owns once it took a capsule: the tensor, its shape and strides, the engine's
// memory and a reference to the slot's owner (so an engine not closed runs on, and the exit hook
// still reaches it), dropped by the deleter (which may run on any thread, with or without the
// interpreter's lock).
struct Exported {
  DLManagedTensor tensor{};
  std::vector<int64_t> shape, strides;
  std::shared_ptr<const void> memory;
  PyObject* owner = nullptr;
};

void delete_exported(DLManagedTensor* tensor) {
  auto* exported = static_cast<Exported*>(tensor->manager_ctx);
  if (!Py_IsInitialized() || taking_the_lock_would_end_this_thread()) {
    // A framework freed it after the interpreter ended (or on a thread it is ending): what the
    // engine ran on may be gone too, so its memory is left to the process's end.
    new std::shared_ptr<const void>(std::move(exported->memory));
    delete exported;
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  {
    // The last tensor of a closed engine frees its memory, and ends it if it was still running
    // (an A closed after an exception): that waits on the engine's threads, which never need
    // the interpreter.
    UnlockedTeardown unlocked;
    exported->memory.reset();
  }
  Py_XDECREF(exported->owner);
  PyGILState_Release(gil);
  delete exported;
}

// A capsule that nobody consumed still owns its tensor.
void delete_unconsumed_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: renamed "used_dltensor"
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (tensor && tensor->deleter) tensor->deleter(tensor);
  PyErr_Restore(type, value, traceback);
}

}  // namespace

DLDataType dl_type(Element element) {
  switch (element) {
    case Element::fp8:
      return {kDLUInt, 8, 1};
    case Element::bf16:
      return {kDLBfloat, 16, 1};
    case Element::fp16:
      return {kDLFloat, 16, 1};
    case Element::fp32:
      return {kDLFloat, 32, 1};
    case Element::int32:
      return {kDLInt, 32, 1};
    case Element::uint32:
      return {kDLUInt, 32, 1};
    case Element::int64:
      return {kDLInt, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

const char* element_name(Element element) {
  switch (element) {
    case Element::fp8:
      return "fp8";
    case Element::bf16:
      return "bfloat16";
    case Element::fp16:
      return "float16";
    case Element::fp32:
      return "float32";
    case Element::int32:
      return "int32";
    case Element::uint32:
      return "uint32";
    case Element::int64:
      return "int64";
  }
  return "?";
}

Element element_of(afd::Dtype dtype) {
  switch (dtype) {
    case afd::Dtype::fp8:
      return Element::fp8;
    case afd::Dtype::bf16:
      return Element::bf16;
    case afd::Dtype::fp16:
      return Element::fp16;
    case afd::Dtype::fp32:
      return Element::fp32;
    case afd::Dtype::int32:
      return Element::int32;
    case afd::Dtype::int64:
      return Element::int64;
  }
  return Element::fp8;
}

Slot::Slot(void* data, SlotLayout layout, const Device& device, py::object owner,
           const SlotOwner& engine)
    : data_(data), layout_(std::move(layout)), owner_(std::move(owner)), engine_(&engine) {
  if (device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY))
    device_ = {kDLCPU, 0};
  else
    device_ = {static_cast<DLDeviceType>(device.properties().dlpack_device_type), device.index()};
}

std::shared_ptr<const void> Slot::memory() const {
  if (owner_.is_none())
    throw Error(kStatusClosed, "this slot's engine is gone (garbage-collected)");
  return engine_->memory();
}

uintptr_t Slot::data_ptr() const {
  memory();
  return reinterpret_cast<uintptr_t>(data_);
}

py::capsule Slot::dlpack(const py::object& /*stream*/) const {
  std::shared_ptr<const void> memory = this->memory();
  if (device_.device_type == kDLExtDev)
    throw Error(HM_ERR_NOT_SUPPORTED,
                "this slot is in memory that neither the host nor a DLPack framework can address "
                "(its plugin's DLPack device type is kDLExtDev)");
  auto exported = std::make_unique<Exported>();
  exported->shape = layout_.shape;
  exported->strides = layout_.strides;
  DLTensor& t = exported->tensor.dl_tensor;
  t.data = data_;
  t.device = device_;
  t.ndim = static_cast<int32_t>(exported->shape.size());
  t.dtype = dl_type(layout_.element);
  t.shape = exported->shape.data();
  t.strides = exported->strides.empty() ? nullptr : exported->strides.data();
  t.byte_offset = 0;
  exported->tensor.manager_ctx = exported.get();
  exported->tensor.deleter = delete_exported;
  exported->memory = std::move(memory);
  exported->owner = owner_.ptr();
  Py_INCREF(exported->owner);
  Exported* raw = exported.release();
  PyObject* capsule = PyCapsule_New(&raw->tensor, kCapsuleName, delete_unconsumed_capsule);
  if (!capsule) {
    delete_exported(&raw->tensor);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::tuple Slot::dlpack_device() const {
  memory();
  return py::make_tuple(static_cast<int>(device_.device_type), device_.device_id);
}

py::tuple Slot::shape() const {
  memory();
  py::tuple t(layout_.shape.size());
  for (size_t i = 0; i < layout_.shape.size(); ++i)
    t[i] = layout_.shape[i];
  return t;
}

py::tuple Slot::strides() const {
  memory();
  std::vector<int64_t> strides = layout_.strides;
  if (strides.empty()) {  // row-major
    strides.assign(layout_.shape.size(), 1);
    for (size_t i = layout_.shape.size(); i-- > 1;)
      strides[i - 1] = strides[i] * layout_.shape[i];
  }
  py::tuple t(strides.size());
  for (size_t i = 0; i < strides.size(); ++i)
    t[i] = strides[i];
  return t;
}

std::string Slot::dtype() const {
  memory();
  return element_name(layout_.element);
}

uint64_t Slot::nbytes() const {
  memory();
  uint64_t elements = 1;
  for (int64_t n : layout_.shape)
    elements *= static_cast<uint64_t>(n);
  return elements * dl_type(layout_.element).bits / 8;
}

std::string Slot::repr() const {
  try {
    return fmt::format("hetmesh.Slot(shape=({}), dtype={}, device=({}, {}), data_ptr={:#x})",
                       fmt::join(layout_.shape, ", "), dtype(),
                       static_cast<int>(device_.device_type), device_.device_id, data_ptr());
  } catch (const Error&) {
    return "hetmesh.Slot(closed)";
  }
}

void bind_slot(py::module_& m) {
  py::class_<Slot>(m, "Slot", gc_visible<Slot, &Slot::owner_>(),
                   "A slot of an engine's registered memory. torch.from_dlpack(slot) and "
                   "numpy.from_dlpack(slot) see its bytes with no copy; fp8 slots come as uint8 "
                   "(hetmesh.as_tensor views them as torch.float8_e4m3fn where torch has it).")
      .def("__dlpack__", &Slot::dlpack, py::kw_only(), py::arg("stream") = py::none())
      .def("__dlpack_device__", &Slot::dlpack_device)
      .def_property_readonly("data_ptr", &Slot::data_ptr)
      .def_property_readonly("shape", &Slot::shape)
      .def_property_readonly("strides", &Slot::strides, "in elements")
      .def_property_readonly("dtype", &Slot::dtype)
      .def_property_readonly("nbytes", &Slot::nbytes)
      .def("__repr__", &Slot::repr);
}

}  // namespace hetmesh::python
