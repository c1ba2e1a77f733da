// The application's tensors, checked through DLPack (caller_tensor.hpp).
#include "caller_tensor.hpp"

#include <hetmesh/core/error.hpp>

#include <dlpack/dlpack.h>
#include <fmt/format.h>

namespace hetmesh::python {
namespace {

// The job's element type, or (none) the routing's 4-byte pairs; fp8 travels as bytes, so any
// 1-byte type is taken (torch's float8 types export as kDLFloat8_* codes).
bool matches(const DLDataType& t, std::optional<Element> element) {
  if (t.lanes != 1) return false;
  if (!element) return t.bits == 32;
  if (*element == Element::fp8) return t.bits == 8;
  const DLDataType want = dl_type(*element);
  return t.code == want.code && t.bits == want.bits;
}

// What `matches` takes, in words.
std::string expected(std::optional<Element> element) {
  if (!element) return "4-byte (int32, float32) pairs";
  if (*element == Element::fp8) return "fp8 (1-byte elements: uint8, int8 or a float8 type)";
  return element_name(*element);
}

}  // namespace

CallerTensor caller_tensor(const py::handle& object, const Device& device,
                           std::optional<Element> element, uint64_t row_bytes, const char* what,
                           std::vector<int64_t>* shape) {
  auto refuse = [&](const std::string& why) {
    return Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{}: {}", what, why));
  };
  if (!py::hasattr(object, "__dlpack__"))
    throw refuse(
        fmt::format("a value of type {} has no __dlpack__ (pass a tensor or an array)",
                    py::str(py::type::handle_of(object).attr("__qualname__")).cast<std::string>()));
  const bool host = device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY);
  // A device tensor's producer is told not to synchronise (-1): the engine orders its use by the
  // stream named to push_pull/respond, as for its own slots.
  py::object capsule =
      host ? object.attr("__dlpack__")() : object.attr("__dlpack__")(py::arg("stream") = -1);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw refuse("its __dlpack__ gave no unused DLPack capsule");
  }
  // Read, not taken: the capsule still owns the tensor and lets it go when it is dropped.
  const DLTensor& t = managed->dl_tensor;
  const bool device_ok =
      host ? (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost ||
              t.device.device_type == kDLROCMHost)
           : (t.device.device_type ==
                  static_cast<DLDeviceType>(device.properties().dlpack_device_type) &&
              t.device.device_id == device.index());
  if (!device_ok)
    throw refuse(fmt::format("memory of DLPack device ({}, {}), and the engine runs on {}",
                             static_cast<int>(t.device.device_type), t.device.device_id,
                             device.selector()));
  if (row_bytes != 0 && !matches(t.dtype, element))
    throw refuse(fmt::format("elements of DLPack type (code {}, {} bits), where the job's are {}",
                             t.dtype.code, t.dtype.bits, expected(element)));
  if (t.ndim < 1) throw refuse("a scalar (it needs rows)");
  // C order: each dimension's stride is the product of the later ones (size-1 dimensions aside).
  uint64_t elements = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.strides != nullptr && t.shape[d] != 1 && t.strides[d] != static_cast<int64_t>(elements))
      throw refuse("not contiguous in C order (make it .contiguous())");
    elements *= static_cast<uint64_t>(t.shape[d]);
  }
  if (shape != nullptr) shape->assign(t.shape, t.shape + t.ndim);
  const uint64_t bytes = elements * ((t.dtype.bits + 7) / 8);
  const auto rows = static_cast<uint64_t>(t.shape[0]);
  if (row_bytes != 0 && rows != 0 && bytes / rows != row_bytes)
    throw refuse(
        fmt::format("rows of {} bytes, where the job's are {} bytes", bytes / rows, row_bytes));
  return {static_cast<uint8_t*>(t.data) + t.byte_offset, rows, bytes};
}

}  // namespace hetmesh::python
