#include "expert_runner.hpp"

#include <hetmesh/asic_stub.h>

#include <fmt/format.h>

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
      : device_(device), launch_(launch), args_(model.expert_args(rank, count)) {
    Stream upload = device.create_stream();
    for (int l = 0; l < model.shape().layers; ++l) {
      auto host = model.expert_weights(l, args_.first_expert, args_.last_expert);
      weights_.push_back(device.allocate(std::max<size_t>(host.size() * sizeof(float), 4)));
      upload.copy(weights_.back().data(), host.data(), host.size() * sizeof(float));
      upload.synchronize(std::chrono::seconds(60));
    }
  }

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

}  // namespace

std::unique_ptr<ExpertRunner> ExpertRunner::create(const Device& device, const TinyMoe& model,
                                                   int rank, int count) {
  if (device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY))
    return std::make_unique<HostRunner>(model, rank, count);
  const void* table = nullptr;
  if (device.api().get_extension != nullptr &&
      device.api().get_extension(HM_ASIC_STUB_LAUNCH_EXTENSION, HM_ASIC_STUB_LAUNCH_VERSION,
                                 &table) == HM_OK)
    return std::make_unique<AsicStubRunner>(
        device, static_cast<const hm_asic_stub_launch_ext*>(table), model, rank, count);
  throw Error(HM_ERR_NOT_SUPPORTED,
              fmt::format("the demo has no expert kernels for {} (its memory is not "
                          "host-addressable and it offers no {} extension)",
                          device.selector(), HM_ASIC_STUB_LAUNCH_EXTENSION));
}

}  // namespace hetmesh::demo
