// The libfabric objects of one fabric transport: the provider chosen by fi_getinfo, its fabric,
// domain, address vector, completion queue and one reliable-datagram endpoint (FI_EP_RDM: one
// endpoint reaches every peer), and memory registration as the provider's mr_mode asks for it.
// Every limit is the provider's own, read from the fi_info it returned; nothing is assumed.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::detail {

// The providers (and domains) that offer reliable datagrams with messages and RMA writes, for
// `provider` ("auto": any) and `domain` ("": any), bound to `host` where that works (not for "").
// nullptr, with `why` set, when none does; else a list for fi_freeinfo.
fi_info* query(const std::string& provider, const std::string& host, const std::string& domain,
               std::string& why);

// FI_ORDER_WAW and FI_ORDER_SAW both ways: FabricEndpoint::ordered().
bool ordered(const fi_info& info);

// Throws Error(HM_ERR_BACKEND) naming the call, the provider's text for `ret` and `where`.
[[noreturn]] void throw_fabric(const char* call, int ret, const std::string& where);

// One registration with the domain; deregistered on destruction.
class FabricMr {
 public:
  explicit FabricMr(fid_mr* mr) : mr_(mr) {}
  FabricMr(const FabricMr&) = delete;
  FabricMr& operator=(const FabricMr&) = delete;
  ~FabricMr();
  void* desc() const { return fi_mr_desc(mr_); }
  uint64_t key() const { return fi_mr_key(mr_); }

 private:
  fid_mr* mr_;
};

class FabricEndpoint {
 public:
  // Opens the provider named (`auto`: the first but shm that offers reliable datagrams with
  // messages and RMA), in `domain` where one is named, else preferring a domain on `host`'s
  // interface where the provider is address-based. Throws Error(HM_ERR_NOT_SUPPORTED) naming the
  // provider and libfabric's answer when none fits.
  FabricEndpoint(const std::string& provider, const std::string& host,
                 const std::string& domain_name);
  ~FabricEndpoint();
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

  std::string provider() const;  // fi_info's prov_name, e.g. "tcp;ofi_rxm"
  std::string domain() const;
  std::vector<uint8_t> address() const;  // fi_getname
  // Inserts a peer's address (from its hello) into the address vector; throws if refused.
  fi_addr_t insert(const uint8_t* address, size_t length);

  // Registers [base, +size) with the key and binding the provider's mr_mode asks for: for RMA
  // writes from it and into it by peers (`remote`, a region), or for messages only (buffers).
  std::unique_ptr<FabricMr> register_memory(void* base, uint64_t size, bool remote);
  // Where a peer's write to [base + offset] of a region goes: base + offset where remote
  // addresses are virtual (FI_MR_VIRT_ADDR), else the offset.
  uint64_t remote_base(const void* base) const;

  // The provider keeps RMA writes in order among themselves and sends after them (FI_ORDER_WAW
  // and FI_ORDER_SAW): a link posts its writes and notices back to back. Otherwise each waits
  // for the delivery-complete completions of the writes before it.
  bool ordered() const { return ordered_; }
  // A notification can ride on the write as its remote CQ data (fabric_wire.hpp, notify_data):
  // ordered(), 8 bytes of data, and keys this side chose at random (not the provider's), which a
  // write with data must name. (A write with data never follows a notice: FabricLink::write.)
  bool notify_by_data() const { return notify_by_data_; }
  uint64_t max_message() const { return max_message_; }  // one send or RMA write, bytes
  bool waitable() const { return waitable_; }  // fi_cq_sread works: the CQ has a wait object

  // Closes the endpoint alone: the provider lets go of every operation posted on it, and no
  // completion comes any more. Registrations and the domain stay.
  void close_endpoint();

  fid_ep* ep() const { return ep_; }
  fid_cq* cq() const { return cq_; }

 private:
  void close();

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  bool ordered_ = false;
  bool notify_by_data_ = false;
  bool waitable_ = false;
  uint64_t max_message_ = 0;
};

}  // namespace hetmesh::detail
