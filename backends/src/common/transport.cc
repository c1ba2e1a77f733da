#include "common/transports.hpp"

#include <fmt/format.h>

namespace hetmesh {

const char* to_string(TransportKind kind) {
  switch (kind) {
    case TransportKind::ipc:
      return "ipc";
    case TransportKind::tcp:
      return "tcp";
    case TransportKind::verbs:
      return "verbs";
    case TransportKind::fabric:
      return "fabric";
  }
  return "?";
}

TransportKind parse_transport_kind(const std::string& name) {
  if (name == "ipc") return TransportKind::ipc;
  if (name == "tcp") return TransportKind::tcp;
  if (name == "verbs") return TransportKind::verbs;
  if (name == "fabric") return TransportKind::fabric;
  throw Error(HM_ERR_INVALID_ARGUMENT,
              fmt::format("unknown transport '{}' (choose ipc, tcp, verbs or fabric)", name));
}

const char* to_string(RegistrationPath path) {
  switch (path) {
    case RegistrationPath::host:
      return "host";
    case RegistrationPath::ipc_handle:
      return "ipc_handle";
    case RegistrationPath::dmabuf:
      return "dmabuf";
    case RegistrationPath::peermem:
      return "peermem";
    case RegistrationPath::staging:
      return "staging";
  }
  return "?";
}

std::unique_ptr<Transport> Transport::create(const TransportOptions& options) {
  if (options.rails.size() > 1) return detail::make_rails_transport(options);
  if (options.rails.size() == 1) {  // one NIC: the transport itself, bound to it
    TransportOptions one = options;
    one.rails.clear();
    if (options.kind == TransportKind::tcp) one.listen_host = options.rails.front();
    if (options.kind == TransportKind::verbs) one.rdma_device = options.rails.front();
    return create(one);
  }
  switch (options.kind) {
    case TransportKind::tcp:
      return detail::make_tcp_transport(options);
    case TransportKind::verbs:
      return detail::make_verbs_transport(options);
    case TransportKind::ipc:
      return detail::make_ipc_transport(options);
    case TransportKind::fabric:
      return detail::make_fabric_transport(options);
    default:
      throw Error(HM_ERR_NOT_SUPPORTED,
                  fmt::format("the {} transport is not built yet", to_string(options.kind)));
  }
}

namespace detail {

void check_write_range(const char* side, uint64_t offset, uint64_t length, uint64_t size) {
  if (offset > size || length > size - offset)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write: {} range [{}, +{}) is outside its region of {} bytes", side,
                            offset, length, size));
}

void check_registration(const Device& device, const void* ptr, uint64_t size) {
  if (ptr == nullptr || size == 0)
    throw Error(HM_ERR_INVALID_ARGUMENT, "register_memory: empty range");
  PointerInfo info = device.query(ptr);
  if (info.kind == HM_MEM_UNKNOWN) return;  // plain host memory
  if (info.device != device.index() && info.kind == HM_MEM_DEVICE)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("register_memory: {} is memory of device {}, not {}", ptr, info.device,
                            device.selector()));
  uint64_t offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) -
                                          static_cast<const uint8_t*>(info.base));
  if (size > info.size - offset)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("register_memory: [{}, +{}) overruns its allocation of {} bytes", ptr,
                            size, info.size));
}

}  // namespace detail
}  // namespace hetmesh
