// libhetmesh-demo-asic_stub.so: the demo's expert kernels for asic_stub (hetmesh/demo_experts.h),
// and the shape of one for a vendor's device: each call enqueues one "kernel" through the plugin's
// own launch extension ("hm.asic_stub.launch"), which runs the demo's run_experts on the stream's
// engine thread over host-writable views of the device buffers.
#include "model.hpp"

#include <hetmesh/demo_experts.h>
#include <hetmesh/plugins/asic_stub.h>

#include <cstdio>

namespace {

using namespace hetmesh::demo;

void expert_kernel(void* const* buffers, size_t, const void* args) {
  run_experts(*static_cast<const ExpertArgs*>(args), buffers[0],
              static_cast<const Route*>(buffers[1]), static_cast<const float*>(buffers[3]),
              buffers[2]);
}

hm_status failed(const hm_demo_experts_call* call, hm_status status, const char* what,
                 const char* why) {
  if (call->error != nullptr && call->error_size > 0)
    std::snprintf(call->error, call->error_size, "%s: %s", what, why);
  return status;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) hm_status hm_demo_experts_v1(
    const hm_demo_experts_call* call) {
  if (call == nullptr || call->struct_size < sizeof(hm_demo_experts_call))
    return HM_ERR_INVALID_ARGUMENT;
  const void* table = nullptr;
  if (call->plugin->get_extension == nullptr ||
      call->plugin->get_extension(HM_ASIC_STUB_LAUNCH_EXTENSION, HM_ASIC_STUB_LAUNCH_VERSION,
                                  &table) != HM_OK)
    return failed(call, HM_ERR_NOT_SUPPORTED, HM_ASIC_STUB_LAUNCH_EXTENSION,
                  "the device's plugin does not offer it (not asic_stub?)");
  const hm_demo_expert_args& a = call->args;
  if (a.tokens == 0) return HM_OK;
  const ExpertArgs args{a.tokens,
                        a.hidden,
                        a.ffn_dim,
                        a.top_k,
                        a.first_expert,
                        a.last_expert,
                        static_cast<Dtype>(a.a2f),
                        static_cast<Dtype>(a.f2a)};
  void* buffers[4] = {const_cast<void*>(call->tokens), const_cast<hm_demo_route*>(call->routing),
                      call->out, const_cast<float*>(call->weights)};
  const ExpertBytes bytes = expert_bytes(args);
  const uint64_t sizes[4] = {bytes.tokens, bytes.routing, bytes.output, bytes.weights};
  const auto* launch = static_cast<const hm_asic_stub_launch_ext*>(table);
  if (hm_status s =
          launch->launch(call->stream, expert_kernel, buffers, sizes, 4, &args, sizeof args);
      s != HM_OK)
    return failed(call, s, "hm.asic_stub.launch", call->plugin->last_error());
  return HM_OK;
}
