// What the per-layer C++ sides of hetmesh.stepmesh and hetmesh.vllm_afd (stepmesh_serve.cc,
// connector_ffn.cc, connector_attention.cc) share: the memory their Python used in place before
// (a later call from it goes to the engine without Python), a tensor read or left to Python, and
// maps of Python objects emptied without running Python inside them.
#pragma once

#include "caller_tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

namespace hetmesh::python {

// Memory ranges by their start: the most bytes used in place from each.
class LearntMemory {
 public:
  // The most starts it remembers (more: it forgets and learns again).
  static constexpr size_t kMaxRemembered = 4096;

  void learn(const CallerTensor& t) {
    if (t.bytes == 0) return;
    if (memory_.size() >= kMaxRemembered) memory_.clear();
    uint64_t& most = memory_[reinterpret_cast<uintptr_t>(t.data)];
    most = std::max(most, t.bytes);
  }

  // Whether `t` lies within memory learnt (an empty tensor never does: Python sends those).
  bool known(const CallerTensor& t) const {
    auto it = memory_.find(reinterpret_cast<uintptr_t>(t.data));
    return t.bytes > 0 && it != memory_.end() && t.bytes <= it->second;
  }

  void forget() { memory_.clear(); }

 private:
  std::map<uintptr_t, uint64_t> memory_;
};

// caller_tensor(), or nullopt where `tensor` is not one it takes (another dtype, device or
// layout, not a tensor, its own __dlpack__ raising): Python decides about those.
inline std::optional<CallerTensor> caller_tensor_or_none(const py::handle& tensor,
                                                         const Device& device,
                                                         std::optional<Element> element,
                                                         uint64_t row_bytes, const char* what) {
  try {
    return caller_tensor(tensor, device, element, row_bytes, what);
  } catch (const py::error_already_set& e) {
    if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt and such go on
    return std::nullopt;
  } catch (const std::exception&) {  // ours
    return std::nullopt;
  }
}

// Takes `key`'s entry out of `map` (None where there is none).
template <typename Map>
py::object take_from(Map& map, const typename Map::key_type& key) {
  auto it = map.find(key);
  if (it == map.end()) return py::none();
  py::object value = std::move(it->second);
  map.erase(it);
  return value;
}

// Empties `map` with its Python references dropped only after: a reference's end may run
// Python code that calls back into the map's owner.
template <typename Map>
void drop(Map& map) {
  Map gone;
  gone.swap(map);
}

}  // namespace hetmesh::python
