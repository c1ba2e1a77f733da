#include <hetmesh/core/log.hpp>
#include <hetmesh/transport/selection.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <fstream>

namespace hetmesh {

std::string node_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fmt::format("{}/{}", name, boot_id.empty() ? "unknown-boot" : boot_id);
}

bool rdma_device_usable(const RdmaDeviceInfo& device, std::string* why) {
  std::string problem;
  if (!device.error.empty())
    problem = device.error;
  else if (device.port_state != "ACTIVE")
    problem = fmt::format("port {} is {}", device.port, device.port_state);
  else if (device.max_inline < 0)
    problem = "it refused a probe RC queue pair";
  if (why != nullptr) *why = problem;
  return problem.empty();
}

TransportSelection choose_transport(const TransportSelectionInput& input) {
  if (input.forced)
    return {*input.forced,
            fmt::format("{} is forced by the configuration", to_string(*input.forced))};
  if (input.same_node) return {TransportKind::ipc, "auto: every peer runs on this node"};

  std::vector<std::string> unusable;  // "rxe0 port 1: DOWN", for the reason
  for (const RdmaDeviceInfo& device : input.rdma_devices) {
    std::string why;
    if (!input.rdma_device.empty() && device.name != input.rdma_device)
      why = fmt::format("not the configured device {}", input.rdma_device);
    else if (rdma_device_usable(device, &why))
      return {TransportKind::verbs,
              fmt::format("auto: a peer runs on another node and RDMA device {} port {} is usable "
                          "({}, MTU {})",
                          device.name, device.port, device.link_layer, device.active_mtu)};
    unusable.push_back(fmt::format("{} port {}: {}", device.name, device.port, why));
  }
  std::string rdma = unusable.empty()
                         ? std::string("this host has no RDMA device")
                         : fmt::format("no RDMA device is usable ({})", fmt::join(unusable, "; "));
  return {TransportKind::tcp, fmt::format("auto: a peer runs on another node and {}", rdma)};
}

TransportSelection choose_transport(std::optional<TransportKind> forced, bool same_node,
                                    const std::string& rdma_device) {
  TransportSelectionInput input;
  input.forced = forced;
  input.same_node = same_node;
  input.rdma_device = rdma_device;
  // Opening every RDMA device costs milliseconds; only do it when the answer depends on it.
  if (!forced && !same_node) input.rdma_devices = list_rdma_devices();
  TransportSelection choice = choose_transport(input);
  log(LogLevel::info, "transport: {} ({})", to_string(choice.kind), choice.reason);
  return choice;
}

}  // namespace hetmesh
