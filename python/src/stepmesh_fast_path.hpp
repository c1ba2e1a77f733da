// hetmesh.stepmesh's push_pull in steady state, without Python per tensor: once a call of a layout
// went through the shim's Python (which said the layout to the servers and registered the
// tensors' memory), the next calls of that layout from the same memory are checked and pushed
// here. Everything else (a new layout, memory past the shim's bound, a call to refuse) goes back
// to the shim, which says why.
#pragma once

#include "caller_tensor.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace hetmesh::python {

namespace py = pybind11;

// One push tensor as its layout key: the caller's key, dtype (torch's dtype object: its
// identity), dimensions past the first, and the first where the bytes cannot tell it.
struct LayoutEntry {
  int64_t key = 0;
  const void* dtype = nullptr;
  std::vector<int64_t> trailing;
  int64_t first = -1;
  auto operator<=>(const LayoutEntry&) const = default;
};
using LayoutKey = std::vector<LayoutEntry>;

class StepMeshFastPath {
 public:
  struct Settings {
    std::vector<int> rail;           // the F each pull tensor answers from, in server order
    std::vector<int> extra_tensors;  // the job's A2F tensor of each push tensor past the first
    uint64_t max_bytes = 0;          // of any one tensor
    // torch.cuda's current raw stream of a device index (a borrowed reference: the shim's
    // module holds torch), or null where the engine's device is not a CUDA GPU.
    PyObject* current_stream = nullptr;
  };
  explicit StepMeshFastPath(Settings settings) : settings_(std::move(settings)) {}
  const Settings& settings() const { return settings_; }

  // The most layouts and memory ranges it remembers (more: it forgets and learns again).
  static constexpr size_t kMaxRemembered = 4096;

  // The push's tensors, read through DLPack: nullopt where the shim's Python must take the call
  // (a scalar, a key that is not an int, memory not yet learned, a layout not yet learned).
  struct Push {
    std::vector<CallerTensor> tensors;
    uint64_t number = 0;  // the layout's
  };
  std::optional<Push> read_pushes(const py::list& tensors, const py::list& keys,
                                  const Device& device) const;
  // The pull tensors, or nullopt where one is memory not yet learned.
  std::optional<std::vector<CallerTensor>> read_pulls(const py::list& tensors,
                                                      const Device& device) const;

  // A call the shim pushed with every tensor in place: its layout is `number`, its memory
  // registered.
  void learn(const py::list& pushes, const py::list& keys, const py::list& pulls, uint64_t number,
             const Device& device);
  // The shim renumbers its layouts.
  void forget_layouts() { layouts_.clear(); }

 private:
  std::optional<LayoutKey> key_of(const py::list& tensors, const py::list& keys,
                                  std::vector<CallerTensor>* read, const Device& device) const;
  bool known(const CallerTensor& t) const;
  void remember(const CallerTensor& t);

  Settings settings_;
  std::map<LayoutKey, uint64_t> layouts_;
  std::map<uintptr_t, uint64_t> memory_;  // a tensor's start -> the most bytes pushed from it
};

}  // namespace hetmesh::python
