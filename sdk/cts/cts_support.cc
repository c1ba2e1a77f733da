#include "cts.hpp"

#include <fmt/format.h>

namespace hetmesh::cts {

Environment& env() {
  static Environment* e = new Environment;
  return *e;
}

std::vector<DeviceParam> device_params() {
  std::vector<DeviceParam> params;
  for (size_t i = 0; i < env().devices.size(); ++i)
    params.push_back({i});
  return params;
}

std::vector<PairParam> pair_params() {
  std::vector<PairParam> params;
  for (size_t a = 0; a < env().devices.size(); ++a)
    for (size_t b = 0; b < env().devices.size(); ++b)
      if (a != b) params.push_back({a, b});
  return params;
}

static std::string selector_name(size_t index) {
  const Device& d = env().devices.at(index);
  return fmt::format("{}_{}", d.plugin().name(), d.index());
}

void PrintTo(const DeviceParam& param, std::ostream* out) {
  *out << env().devices.at(param.index).selector();
}

void PrintTo(const PairParam& param, std::ostream* out) {
  *out << env().devices.at(param.a).selector() << " -> " << env().devices.at(param.b).selector();
}

std::string param_name(const testing::TestParamInfo<DeviceParam>& info) {
  return selector_name(info.param.index);
}

std::string pair_name(const testing::TestParamInfo<PairParam>& info) {
  return selector_name(info.param.a) + "__" + selector_name(info.param.b);
}

std::string describe(const Device& device, hm_status status) {
  const char* e = device.api().last_error();
  return fmt::format("{} (last_error: \"{}\")", status_name(status), e ? e : "<NULL>");
}

std::string DeviceTest::lacks(hm_capabilities caps, const char* what) const {
  return fmt::format("{} lacks {} needed for {}", device().selector(),
                     capability_names(caps & ~device().properties().capabilities), what);
}

void* DeviceTest::host_buffer(uint64_t size) {
  if (has(HM_CAP_PINNED_HOST_MEMORY)) {
    pinned_.push_back(device().allocate(size, MemoryKind::pinned_host));
    return pinned_.back().data();
  }
  plain_.emplace_back(size);
  return plain_.back().data();
}

void fill_pattern(void* data, uint64_t size, uint32_t seed) {
  auto* bytes = static_cast<uint8_t*>(data);
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    bytes[i] = static_cast<uint8_t>(x >> 24);
  }
}

int64_t find_mismatch(const void* data, uint64_t size, uint32_t seed) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    if (bytes[i] != static_cast<uint8_t>(x >> 24)) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace hetmesh::cts
