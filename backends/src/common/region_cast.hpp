// The one check every transport's write() makes first: that a Region or RemoteRegion it was handed
// is of its own kind. An exact type comparison rather than dynamic_cast, which walks the class
// hierarchy and cost a small write about 6% of its time; the region classes are final, so the
// exact type is the only one that can match.
#pragma once

#include <type_traits>
#include <typeinfo>

namespace hetmesh::detail {

// `region` as a T, or nullptr if it is of another type.
template <typename T, typename Base>
T* region_cast(Base& region) {
  static_assert(std::is_final_v<std::remove_const_t<T>>, "region_cast needs a final class");
  return typeid(region) == typeid(T) ? static_cast<T*>(&region) : nullptr;
}

}  // namespace hetmesh::detail
