#include "expert_runner.hpp"

#include <hetmesh/demo_experts.h>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

namespace hetmesh::demo {
namespace {

static_assert(HM_DEMO_FP8 == static_cast<int>(Dtype::fp8) &&
                  HM_DEMO_BF16 == static_cast<int>(Dtype::bf16) &&
                  HM_DEMO_FP16 == static_cast<int>(Dtype::fp16) &&
                  HM_DEMO_FP32 == static_cast<int>(Dtype::fp32),
              "the kernel libraries' element type codes are hetmesh::afd::Dtype's");
static_assert(sizeof(Route) == sizeof(hm_demo_route) &&
                  offsetof(Route, weight) == offsetof(hm_demo_route, weight),
              "the demo's routing entry is hm_demo_route");

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
    run_experts(args, part.tokens_data(), static_cast<const Route*>(part.routing_data()),
                weights_[static_cast<size_t>(layer)].data(), part.output);
  }

 protected:
  ExpertArgs args_;
  std::vector<std::vector<float>> weights_;
};

// Any other device without a kernel library: each part comes to the host through the plugin's own
// copies, is computed there, and goes back before run() returns. Correct on every conformant
// plugin; the data path is the device's, the arithmetic the host's.
class StagedHostRunner : public HostRunner {
 public:
  using HostRunner::HostRunner;
  void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) override {
    ExpertArgs args = args_;
    args.tokens = part.tokens;
    const ExpertBytes bytes = expert_bytes(args);
    tokens_.resize(bytes.tokens);
    routing_.resize(part.tokens * size_t{args.top_k});
    output_.resize(bytes.output);
    stream.copy(tokens_.data(), part.tokens_data(), bytes.tokens);
    stream.copy(routing_.data(), part.routing_data(), bytes.routing);
    stream.synchronize(std::chrono::seconds(60));
    run_experts(args, tokens_.data(), routing_.data(), weights_[static_cast<size_t>(layer)].data(),
                output_.data());
    stream.copy(part.output, output_.data(), bytes.output);
    stream.synchronize(std::chrono::seconds(60));  // output_ is reused by the next part
  }

 private:
  std::vector<uint8_t> tokens_, output_;
  std::vector<Route> routing_;
};

// Device memory holding each layer's expert weights, uploaded once.
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

// The plugin's kernel library (hetmesh/demo_experts.h): weights live in device memory, uploaded
// once; each part is one call, enqueued on the part's stream.
class KernelLibraryRunner : public ExpertRunner {
 public:
  KernelLibraryRunner(const Device& device, std::string path, hm_demo_experts_fn experts,
                      const TinyMoe& model, int rank, int count)
      : device_(device),
        path_(std::move(path)),
        experts_(experts),
        args_(model.expert_args(rank, count)),
        weights_(upload_weights(device, model, args_)) {}

  void run(int layer, const afd::Batch::FromAttention& part, const Stream& stream) override {
    hm_demo_experts_call call{};
    call.struct_size = sizeof call;
    call.plugin = &device_.api();
    call.device = device_.index();
    call.stream = stream.native();
    call.args = {part.tokens,
                 args_.hidden,
                 args_.ffn_dim,
                 args_.top_k,
                 args_.first_expert,
                 args_.last_expert,
                 static_cast<int32_t>(args_.a2f),
                 static_cast<int32_t>(args_.f2a)};
    call.tokens = part.tokens_data();
    call.routing = static_cast<const hm_demo_route*>(part.routing_data());
    call.weights = static_cast<const float*>(weights_[static_cast<size_t>(layer)].data());
    call.out = part.output;
    char error[256] = "";
    call.error = error;
    call.error_size = sizeof error;
    if (hm_status s = experts_(&call); s != HM_OK)
      throw Error(s, fmt::format("{}: {} of {}: {}", device_.selector(), HM_DEMO_EXPERTS_ENTRY_V1,
                                 path_, error[0] ? error : "(no message)"));
  }

 private:
  Device device_;
  std::string path_;
  hm_demo_experts_fn experts_;
  ExpertArgs args_;
  std::vector<Buffer> weights_;
};

// Where `hetmesh demo` looks for `plugin`'s kernel library: $HETMESH_DEMO_KERNELS (ignored in a
// setuid process, as the plugin loader's variables are), else ../demo beside the plugin file.
std::string demo_kernel_library_path(const Plugin& plugin) {
  const std::string file = HM_DEMO_EXPERTS_PREFIX + plugin.name() + ".so";
  if (const char* dir = secure_getenv("HETMESH_DEMO_KERNELS"); dir != nullptr && *dir != '\0')
    return (std::filesystem::path(dir) / file).string();
  return (std::filesystem::path(plugin.path()).parent_path().parent_path() / "demo" / file)
      .string();
}

}  // namespace

std::unique_ptr<ExpertRunner> ExpertRunner::create(const Device& device, const TinyMoe& model,
                                                   int rank, int count) {
  std::unique_ptr<ExpertRunner> runner;
  if (device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY)) {
    runner = std::make_unique<HostRunner>(model, rank, count);
    runner->route = "on the host (the device's memory is host-addressable)";
    return runner;
  }
  const std::string path = demo_kernel_library_path(device.plugin());
  if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    // Never dlclose()d: a vendor runtime inside it must outlive every stream it used.
    auto experts = reinterpret_cast<hm_demo_experts_fn>(dlsym(library, HM_DEMO_EXPERTS_ENTRY_V1));
    if (experts == nullptr)
      throw Error(HM_ERR_NOT_SUPPORTED, fmt::format("{}: {} does not export {}", device.selector(),
                                                    path, HM_DEMO_EXPERTS_ENTRY_V1));
    log(LogLevel::info, "{}: experts run by {}", device.selector(), path);
    runner = std::make_unique<KernelLibraryRunner>(device, path, experts, model, rank, count);
    runner->route = "by " + path;
    return runner;
  }
  const char* why = dlerror();
  log(LogLevel::warn,
      "{}: experts run on the host through staging: the device's memory is not host-addressable "
      "and its plugin's kernel library did not load ({}); see hetmesh/demo_experts.h",
      device.selector(), why ? why : path.c_str());
  runner = std::make_unique<StagedHostRunner>(model, rank, count);
  runner->route = "on the host through staging (no kernel library: see the log)";
  return runner;
}

}  // namespace hetmesh::demo
