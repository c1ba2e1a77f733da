#include "expert_runner.hpp"

#include "cuda/expert_kernels.h"

#include <hetmesh/plugins/asic_stub.h>
#include <hetmesh/plugins/cuda.h>
#include <hetmesh/core/plugin.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>

namespace hetmesh::demo {
namespace {

// The device can be read and written by the host: run the experts right here.
class HostRunner : public ExpertRunner {
 public:
  HostRunner(const TinyMoe& model, int rank, int count) : args_(model.expert_args(rank, count)) {
    for (int l = 0; l < model.shape().layers; ++l)
      weights_.push_back(model.expert_weights(l, args_.first_expert, args_.last_expert));
  }
  void run(int layer, const afd::Batch::FromAttention& part, const Stream&) override {
    ExpertArgs args = args_;
    args.tokens = part.tokens;
    run_experts(args, part.tokens_data, static_cast<const Route*>(part.routing_data),
                weights_[static_cast<size_t>(layer)].data(), part.output);
  }

 private:
  ExpertArgs args_;
  std::vector<std::vector<float>> weights_;
};

// Device memory holding `layer`'s expert weights per layer, uploaded once.
std::vector<Buffer> upload_weights(const Device& device, const TinyMoe& model,
                                   const ExpertArgs& args) {
  std::vector<Buffer> weights;
  Stream upload = device.create_stream();
  for (int l = 0; l < model.shape().layers; ++l) {
    auto host = model.expert_weights(l, args.first_expert, args.last_expert);
    weights.push_back(device.allocate(std::max<size_t>(host.size() * sizeof(float), 4)));
    upload.copy(weights.back().data(), host.data(), host.size() * sizeof(float));
    upload.synchronize(std::chrono::seconds(60));
  }
  return weights;
}

void expert_kernel(void* const* buffers, size_t, const void* args) {
  run_experts(*static_cast<const ExpertArgs*>(args), buffers[0],
              static_cast<const Route*>(buffers[1]), static_cast<const float*>(buffers[3]),
              buffers[2]);
}

// asic_stub: weights live in device memory, uploaded once; each part is one launch.
class AsicStubRunner : public ExpertRunner {
 public:
  AsicStubRunner(const Device& device, const hm_asic_stub_launch_ext* launch, const TinyMoe& model,
                 int rank, int count)
      : device_(device),
        launch_(launch),
        args_(model.expert_args(rank, count)),
        weights_(upload_weights(device, model, args_)) {}

  void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) override {
    ExpertArgs args = args_;
    args.tokens = part.tokens;
    void* buffers[4] = {part.tokens_data, part.routing_data, part.output,
                        weights_[static_cast<size_t>(layer)].data()};
    uint64_t sizes[4] = {uint64_t{part.tokens} * args.hidden * dtype_bytes(args.a2f),
                         uint64_t{part.tokens} * args.top_k * sizeof(Route),
                         uint64_t{part.tokens} * args.hidden * dtype_bytes(args.f2a),
                         weights_[static_cast<size_t>(layer)].size()};
    device_.plugin().check(
        launch_->launch(stream.native(), expert_kernel, buffers, sizes, 4, &args, sizeof args),
        "hm.asic_stub.launch");
  }

 private:
  Device device_;
  const hm_asic_stub_launch_ext* launch_;
  ExpertArgs args_;
  std::vector<Buffer> weights_;
};

static_assert(HM_DEMO_FP8 == static_cast<int>(Dtype::fp8) &&
                  HM_DEMO_BF16 == static_cast<int>(Dtype::bf16) &&
                  HM_DEMO_FP16 == static_cast<int>(Dtype::fp16) &&
                  HM_DEMO_FP32 == static_cast<int>(Dtype::fp32),
              "the CUDA kernel's element type codes are hetmesh::afd::Dtype's");

// cuda: the kernel is in libhetmesh-demo-cuda.so (built by nvcc, installed beside the plugins),
// launched on the plugin's own CUDA stream through the cuda plugin's "hm.cuda.native" extension.
class CudaRunner : public ExpertRunner {
 public:
  CudaRunner(const Device& device, const hm_cuda_native_ext* native, const TinyMoe& model, int rank,
             int count)
      : device_(device), native_(native), args_(model.expert_args(rank, count)) {
    std::string path = (std::filesystem::path(installed_plugin_dir()).parent_path() / "demo" /
                        "libhetmesh-demo-cuda.so")
                           .string();
    library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr)
      throw Error(HM_ERR_NOT_SUPPORTED,
                  fmt::format("the demo's CUDA kernels for {} could not be loaded: {}",
                              device.selector(), dlerror()));
    run_ = reinterpret_cast<hm_demo_cuda_run_experts_fn>(dlsym(library_, HM_DEMO_CUDA_RUN_EXPERTS));
    if (run_ == nullptr)
      throw Error(HM_ERR_NOT_SUPPORTED,
                  fmt::format("{} does not export {}", path, HM_DEMO_CUDA_RUN_EXPERTS));
    weights_ = upload_weights(device, model, args_);
  }
  // The library stays loaded: the CUDA runtime inside it must outlive every stream it used.

  void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) override {
    void* cu_stream = nullptr;
    int32_t ordinal = 0;
    device_.plugin().check(native_->stream_native(stream.native(), &cu_stream, &ordinal),
                           "hm.cuda.native.stream_native");
    hm_demo_expert_args a{part.tokens,
                          args_.hidden,
                          args_.ffn_dim,
                          args_.top_k,
                          args_.first_expert,
                          args_.last_expert,
                          static_cast<int32_t>(args_.a2f),
                          static_cast<int32_t>(args_.f2a)};
    char error[256] = "";
    if (run_(&a, part.tokens_data, part.routing_data,
             static_cast<const float*>(weights_[static_cast<size_t>(layer)].data()), part.output,
             cu_stream, ordinal, error, sizeof error) != 0)
      throw Error(HM_ERR_BACKEND, fmt::format("{}: expert kernel: {}", device_.selector(), error));
  }

 private:
  Device device_;
  const hm_cuda_native_ext* native_;
  ExpertArgs args_;
  void* library_ = nullptr;
  hm_demo_cuda_run_experts_fn run_ = nullptr;
  std::vector<Buffer> weights_;
};

template <typename Table>
const Table* extension(const Device& device, const char* name, uint32_t version) {
  const void* table = nullptr;
  if (device.api().get_extension == nullptr ||
      device.api().get_extension(name, version, &table) != HM_OK)
    return nullptr;
  return static_cast<const Table*>(table);
}

}  // namespace

std::unique_ptr<ExpertRunner> ExpertRunner::create(const Device& device, const TinyMoe& model,
                                                   int rank, int count) {
  if (device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY))
    return std::make_unique<HostRunner>(model, rank, count);
  if (auto* launch = extension<hm_asic_stub_launch_ext>(device, HM_ASIC_STUB_LAUNCH_EXTENSION,
                                                        HM_ASIC_STUB_LAUNCH_VERSION))
    return std::make_unique<AsicStubRunner>(device, launch, model, rank, count);
  if (auto* native =
          extension<hm_cuda_native_ext>(device, HM_CUDA_NATIVE_EXTENSION, HM_CUDA_NATIVE_VERSION))
    return std::make_unique<CudaRunner>(device, native, model, rank, count);
  throw Error(
      HM_ERR_NOT_SUPPORTED,
      fmt::format("the demo has no expert kernels for {} (its memory is not "
                  "host-addressable and it offers neither {} nor {})",
                  device.selector(), HM_ASIC_STUB_LAUNCH_EXTENSION, HM_CUDA_NATIVE_EXTENSION));
}

}  // namespace hetmesh::demo
