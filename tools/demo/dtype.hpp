// Element types on the wire: fp32, bf16, fp16 and fp8 (e4m3), converted on the host with
// round-to-nearest-even so the distributed run and the single-process reference agree bit for bit.
#pragma once

#include <hetmesh/afd/job_config.hpp>

#include <cstdint>
#include <cstring>

namespace hetmesh::demo {

using afd::Dtype;

// Stores `value` as element `index` of an array of `t` at `base`, and loads it back as float.
void store(Dtype t, void* base, size_t index, float value);
float load(Dtype t, const void* base, size_t index);

}  // namespace hetmesh::demo
