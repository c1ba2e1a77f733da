// hetmesh.stepmesh's push_pull in steady state (stepmesh_fast_path.hpp).
#include "stepmesh_fast_path.hpp"

#include <hetmesh/core/error.hpp>

#include <algorithm>

namespace hetmesh::python {

std::optional<LayoutKey> StepMeshFastPath::key_of(const py::list& tensors, const py::list& keys,
                                                  std::vector<CallerTensor>* read,
                                                  const Device& device) const {
  LayoutKey layout;
  layout.reserve(tensors.size());
  std::vector<int64_t> shape;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const py::handle tensor = tensors[i];
    const py::handle key = keys[i];
    if (!PyLong_CheckExact(key.ptr())) return std::nullopt;
    LayoutEntry entry;
    entry.key = PyLong_AsLongLong(key.ptr());
    if (entry.key == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return std::nullopt;
    }
    // What the shim would refuse or flatten (a scalar, memory it cannot read) it says itself.
    CallerTensor t;
    try {
      t = caller_tensor(tensor, device, std::nullopt, 0, "push_pull's tensor", &shape);
    } catch (const std::exception&) {  // ours, or the tensor's own __dlpack__'s
      return std::nullopt;
    }
    if (shape.empty()) return std::nullopt;
    entry.dtype = tensor.attr("dtype").ptr();  // torch's dtypes live as long as torch
    entry.trailing.assign(shape.begin() + 1, shape.end());
    if (std::find(entry.trailing.begin(), entry.trailing.end(), 0) != entry.trailing.end())
      entry.first = shape[0];
    layout.push_back(std::move(entry));
    if (read != nullptr) read->push_back(t);
  }
  return layout;
}

bool StepMeshFastPath::known(const CallerTensor& t) const {
  if (t.bytes == 0) return true;
  auto it = memory_.find(reinterpret_cast<uintptr_t>(t.data));
  return it != memory_.end() && t.bytes <= it->second;
}

void StepMeshFastPath::remember(const CallerTensor& t) {
  if (t.bytes == 0) return;
  if (memory_.size() >= kMaxRemembered) memory_.clear();
  uint64_t& most = memory_[reinterpret_cast<uintptr_t>(t.data)];
  most = std::max(most, t.bytes);
}

std::optional<StepMeshFastPath::Push> StepMeshFastPath::read_pushes(const py::list& tensors,
                                                                    const py::list& keys,
                                                                    const Device& device) const {
  Push push;
  push.tensors.reserve(tensors.size());
  std::optional<LayoutKey> layout = key_of(tensors, keys, &push.tensors, device);
  if (!layout) return std::nullopt;
  auto it = layouts_.find(*layout);
  if (it == layouts_.end()) return std::nullopt;
  for (const CallerTensor& t : push.tensors)
    if (!known(t)) return std::nullopt;
  push.number = it->second;
  return push;
}

std::optional<std::vector<CallerTensor>> StepMeshFastPath::read_pulls(const py::list& tensors,
                                                                      const Device& device) const {
  std::vector<CallerTensor> pulls;
  pulls.reserve(tensors.size());
  for (const py::handle tensor : tensors) {
    try {
      pulls.push_back(caller_tensor(tensor, device, std::nullopt, 0, "push_pull's pull tensor"));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (!known(pulls.back())) return std::nullopt;
  }
  return pulls;
}

void StepMeshFastPath::learn(const py::list& pushes, const py::list& keys, const py::list& pulls,
                             uint64_t number, const Device& device) {
  std::vector<CallerTensor> read;
  std::optional<LayoutKey> layout = key_of(pushes, keys, &read, device);
  if (!layout) return;
  for (const py::handle tensor : pulls) {
    try {
      read.push_back(caller_tensor(tensor, device, std::nullopt, 0, "push_pull's pull tensor"));
    } catch (const std::exception&) {  // not learnt: the next call comes through Python again
      return;
    }
  }
  for (const CallerTensor& t : read)
    remember(t);
  if (layouts_.size() >= kMaxRemembered) layouts_.clear();
  layouts_[*layout] = number;
}

}  // namespace hetmesh::python
