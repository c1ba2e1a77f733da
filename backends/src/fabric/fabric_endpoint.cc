#include "fabric/fabric_endpoint.hpp"

#include "fabric/fabric_library.hpp"
#include "fabric/fabric_wire.hpp"

#include <hetmesh/transport/fabric_info.hpp>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include <unistd.h>

namespace hetmesh::detail {

void throw_fabric(const char* call, int ret, const std::string& where) {
  throw Error(HM_ERR_BACKEND,
              fmt::format("fabric: {} failed ({}): {}", call, fabric_strerror(-ret), where));
}

FabricMr::~FabricMr() {
  fi_close(&mr_->fid);
}

namespace {

// The modes of memory registration hetmesh handles: it allocates what it registers, keeps local
// descriptors, sends virtual addresses or offsets as the provider wants, takes the provider's
// keys and binds registrations to the endpoint.
constexpr uint64_t kMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

bool is_shm(const fi_info& info) {
  return info.fabric_attr->prov_name != nullptr &&
         std::string_view(info.fabric_attr->prov_name) == "shm";
}

bool wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace

// The providers that offer what hetmesh needs, for `provider` ("auto": any), bound to `host`
// where that works. nullptr with `why` set when none does.
fi_info* query(const std::string& provider, const std::string& host, const std::string& domain,
               std::string& why) {
  const FabricLibrary& lib = fabric_library();
  fi_info* hints = lib.dupinfo(nullptr);
  if (hints == nullptr) throw Error(HM_ERR_OUT_OF_MEMORY, "fabric: fi_allocinfo");
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = kMrModes;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (provider != "auto") hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!domain.empty()) hints->domain_attr->name = strdup(domain.c_str());
  fi_info* info = nullptr;
  int ret = -FI_ENODATA;
  // Bound to the listen address first (a loopback job stays on loopback), else wherever the
  // provider lives (shm has no IP address; a wildcard means the provider's first interface).
  if (!wildcard(host))
    ret = lib.getinfo(FI_VERSION(1, 17), host.c_str(), nullptr, FI_SOURCE, hints, &info);
  if (ret != 0) ret = lib.getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
  lib.freeinfo(hints);
  if (ret != 0) {
    why = fabric_strerror(-ret);
    return nullptr;
  }
  return info;
}

bool ordered(const fi_info& info) {
  constexpr uint64_t kNeeded = FI_ORDER_WAW | FI_ORDER_SAW;
  return (info.tx_attr->msg_order & kNeeded) == kNeeded &&
         (info.rx_attr->msg_order & kNeeded) == kNeeded;
}

FabricEndpoint::FabricEndpoint(const std::string& provider, const std::string& host,
                               const std::string& domain_name) {
  std::string why;
  fi_info* list = query(provider, host, domain_name, why);
  if (list == nullptr)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("fabric: no libfabric provider {}{} offers reliable datagrams with "
                            "messages and RMA writes here (fi_getinfo: {}; `fi_info -l` lists "
                            "the providers this libfabric has, `fi_info -v` their domains)",
                            provider == "auto" ? "at all" : "'" + provider + "'",
                            domain_name.empty() ? "" : " in domain '" + domain_name + "'", why));
  // "auto" never takes shm: it does not survive a peer's death (below), and on one host the ipc
  // transport does what it does.
  const fi_info* pick = list;
  if (provider == "auto")
    while (pick != nullptr && is_shm(*pick))
      pick = pick->next;
  if (pick == nullptr) {
    fabric_library().freeinfo(list);
    throw Error(HM_ERR_NOT_SUPPORTED,
                "fabric: \"auto\" found only libfabric's shm provider here, which it does not "
                "choose (a killed peer can wedge it: docs/failures.md); name provider = \"shm\" "
                "to use it anyway, or use the ipc transport within a host");
  }
  info_ = fabric_library().dupinfo(pick);
  fabric_library().freeinfo(list);
  if (info_ == nullptr) throw Error(HM_ERR_OUT_OF_MEMORY, "fabric: fi_dupinfo");
  const std::string where = fmt::format("provider {}, domain {}", this->provider(), domain());
  try {  // from here on, close() frees what was opened, info_ included
    if (is_shm(*info_)) {
      // libfabric 1.17's shm (Debian 12's) keeps a spinlock in each process's shared segment, taken
      // by the peers that write to it: a peer killed while it holds one leaves the survivor
      // spinning inside fi_cq_read or a post for good, beyond any timeout of ours.
      static std::once_flag warned;
      std::call_once(warned, [] {
        log(LogLevel::warn,
            "fabric: libfabric's shm provider does not survive a peer killed mid-operation (a "
            "lock in their shared segment stays held and this process then spins inside "
            "libfabric); for tests, or use the ipc transport within a host (docs/failures.md)");
      });
      // shm names endpoints after the process by default, which two endpoints of one process (or
      // a process whose pid came back) share: fi_enable then fails with EBUSY. A random name each.
      uint8_t nonce[8];
      random_bytes(nonce);
      std::string name = fmt::format("fi_shm://hetmesh-{}-{:02x}", getpid(), fmt::join(nonce, ""));
      free(info_->src_addr);
      info_->src_addr = strdup(name.c_str());
      info_->src_addrlen = name.size() + 1;
    }
    if (int ret = fabric_library().fabric(info_->fabric_attr, &fabric_, nullptr); ret != 0)
      throw_fabric("fi_fabric", ret, where);
    if (int ret = fi_domain(fabric_, info_, &domain_, nullptr); ret != 0)
      throw_fabric("fi_domain", ret, where);
    fi_av_attr av{};
    av.type =
        info_->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info_->domain_attr->av_type;
    if (int ret = fi_av_open(domain_, &av, &av_, nullptr); ret != 0)
      throw_fabric("fi_av_open", ret, where);
    fi_cq_attr cq{};
    cq.format = FI_CQ_FORMAT_DATA;
    cq.size = std::max<size_t>(4096, info_->tx_attr->size + info_->rx_attr->size);
    cq.wait_obj = FI_WAIT_UNSPEC;
    waitable_ = fi_cq_open(domain_, &cq, &cq_, nullptr) == 0;
    if (!waitable_) {
      cq.wait_obj = FI_WAIT_NONE;
      if (int ret = fi_cq_open(domain_, &cq, &cq_, nullptr); ret != 0)
        throw_fabric("fi_cq_open", ret, where);
    }
    if (int ret = fi_endpoint(domain_, info_, &ep_, nullptr); ret != 0)
      throw_fabric("fi_endpoint", ret, where);
    if (int ret = fi_ep_bind(ep_, &av_->fid, 0); ret != 0)
      throw_fabric("fi_ep_bind (address vector)", ret, where);
    if (int ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV); ret != 0)
      throw_fabric("fi_ep_bind (completion queue)", ret, where);
    if (int ret = fi_enable(ep_); ret != 0) throw_fabric("fi_enable", ret, where);
  } catch (...) {
    close();
    throw;
  }
  ordered_ = detail::ordered(*info_);
  notify_by_data_ = ordered_ && info_->domain_attr->cq_data_size >= sizeof(uint64_t) &&
                    !(info_->domain_attr->mr_mode & FI_MR_PROV_KEY) &&
                    info_->domain_attr->mr_key_size >= sizeof(uint64_t);
  max_message_ = info_->ep_attr->max_msg_size;
  if (max_message_ < kMessageBytes) {
    close();
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("fabric: {} takes messages of at most {} bytes, fewer than a notice's "
                            "buffer ({})",
                            where, max_message_, kMessageBytes));
  }
  log(LogLevel::info,
      "fabric: {}: writes and notices {}; notifications {}; messages and writes up to {} bytes; "
      "{} CQ",
      where,
      ordered_ ? "back to back (ordered)" : "each after the delivery of the writes before it",
      notify_by_data_ ? "as the write's remote CQ data" : "as notice messages", max_message_,
      waitable_ ? "a waitable" : "a polled");
}

FabricEndpoint::~FabricEndpoint() {
  close();
}

void FabricEndpoint::close_endpoint() {
  if (ep_) fi_close(&ep_->fid);
  ep_ = nullptr;
}

void FabricEndpoint::close() {
  // Endpoint first: it stops using the rest.
  if (ep_) fi_close(&ep_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (av_) fi_close(&av_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fabric_library().freeinfo(info_);
  ep_ = nullptr, cq_ = nullptr, av_ = nullptr, domain_ = nullptr, fabric_ = nullptr;
  info_ = nullptr;
}

std::string FabricEndpoint::provider() const {
  return info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : "?";
}

std::string FabricEndpoint::domain() const {
  return info_->domain_attr->name ? info_->domain_attr->name : "?";
}

std::vector<uint8_t> FabricEndpoint::address() const {
  std::vector<uint8_t> name(kMaxFabricAddress);
  size_t length = name.size();
  if (int ret = fi_getname(&ep_->fid, name.data(), &length); ret != 0)
    throw_fabric("fi_getname", ret, provider());
  name.resize(length);
  return name;
}

fi_addr_t FabricEndpoint::insert(const uint8_t* address, size_t length) {
  // The provider reads its own format's length, or up to a NUL for string formats: the bytes go
  // in zero-padded past what the peer sent, so no read runs beyond them.
  std::vector<uint8_t> padded(kMaxFabricAddress + 1, 0);
  std::memcpy(padded.data(), address, std::min<size_t>(length, kMaxFabricAddress));
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(av_, padded.data(), 1, &out, 0, nullptr);
  if (ret != 1 || out == FI_ADDR_NOTAVAIL)
    throw Error(kStatusProtocolError,
                fmt::format("fabric: the peer's address was refused by {}'s address vector ({})",
                            provider(), ret < 0 ? fabric_strerror(-ret) : "not inserted"));
  return out;
}

std::unique_ptr<FabricMr> FabricEndpoint::register_memory(void* base, uint64_t size, bool remote) {
  const uint64_t mode = info_->domain_attr->mr_mode;
  // Message buffers take no RMA at all; regions take peers' writes, under a key nobody can guess
  // where this side chooses it (a stranger who knew it could write without any token).
  const uint64_t access = remote ? FI_WRITE | FI_REMOTE_WRITE : FI_SEND | FI_RECV;
  const size_t bits = std::min<size_t>(64, 8 * info_->domain_attr->mr_key_size);
  fid_mr* mr = nullptr;
  int ret = -FI_ENOKEY;
  for (int attempt = 0; attempt < 8 && ret == -FI_ENOKEY; ++attempt) {
    uint64_t key = 0;
    if (!(mode & FI_MR_PROV_KEY)) {
      random_bytes({reinterpret_cast<uint8_t*>(&key), sizeof key});
      if (bits < 64) key &= (1ull << bits) - 1;
    }
    ret = fi_mr_reg(domain_, base, size, access, 0, key, 0, &mr, nullptr);
  }
  if (ret != 0)
    throw_fabric("fi_mr_reg", ret, fmt::format("{} bytes at {} with {}", size, base, provider()));
  auto owned = std::make_unique<FabricMr>(mr);
  if (mode & FI_MR_ENDPOINT) {
    if ((ret = fi_mr_bind(mr, &ep_->fid, 0)) != 0) throw_fabric("fi_mr_bind", ret, provider());
    if ((ret = fi_mr_enable(mr)) != 0) throw_fabric("fi_mr_enable", ret, provider());
  }
  return owned;
}

uint64_t FabricEndpoint::remote_base(const void* base) const {
  return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(base) : 0;
}

}  // namespace hetmesh::detail

namespace hetmesh {

std::vector<FabricProviderInfo> list_fabric_providers() {
  std::string why;
  fi_info* list = detail::query("auto", "", "", why);
  std::vector<FabricProviderInfo> out;
  for (fi_info* i = list; i != nullptr; i = i->next) {
    // One line per provider and domain: libfabric repeats them for each address it has there.
    FabricProviderInfo f{i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "?",
                         i->domain_attr->name ? i->domain_attr->name : "?",
                         i->ep_attr->max_msg_size, detail::ordered(*i), (i->caps & FI_HMEM) != 0};
    if (std::none_of(out.begin(), out.end(), [&](const FabricProviderInfo& o) {
          return o.provider == f.provider && o.domain == f.domain;
        }))
      out.push_back(std::move(f));
  }
  if (list) detail::fabric_library().freeinfo(list);
  return out;
}

}  // namespace hetmesh
