// Registering memory with the verbs transport's protection domain, path by path (verbs_memory.hpp).
#include "verbs/verbs_memory.hpp"

#include "common/staging.hpp"

#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace hetmesh::detail {
namespace {

constexpr std::chrono::seconds kCopyTimeout{60};
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

hm_status errno_status(int err) {
  return err == ENOMEM ? HM_ERR_OUT_OF_MEMORY : HM_ERR_BACKEND;
}

uint64_t page_size() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

Registration::~Registration() {
  if (mr_ != nullptr && ibv_dereg_mr(mr_) != 0)
    log(LogLevel::warn, "verbs: ibv_dereg_mr of {} bytes at {} failed: {}", size_,
        static_cast<void*>(base_), std::strerror(errno));
  std::free(plain_mirror_);
}

void Registration::stage_out(uint64_t offset, uint64_t length) {
  if (!staged() || length == 0) return;
  std::lock_guard lock(copy_mutex_);
  stream_.copy(mirror_ + offset, base_ + offset, length);
  stream_.synchronize(kCopyTimeout);
}

void Registration::stage_in(uint64_t offset, uint64_t length) {
  if (!staged() || length == 0) return;
  std::lock_guard lock(copy_mutex_);
  stream_.copy(base_ + offset, mirror_ + offset, length);
  stream_.synchronize(kCopyTimeout);
}

std::shared_ptr<Registration> RegistrationCache::get(const Device& device, void* ptr,
                                                     uint64_t size) {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [](const auto& entry) { return entry.second.expired(); });
  Key key{device.selector(), reinterpret_cast<uintptr_t>(ptr), size};
  if (auto it = entries_.find(key); it != entries_.end())
    if (auto live = it->second.lock()) {
      log(LogLevel::debug, "verbs: {} bytes of {} at {} are registered already; reusing the MR",
          size, device.selector(), ptr);
      return live;
    }
  auto registration = make(device, ptr, size);
  entries_[key] = registration;
  return registration;
}

std::shared_ptr<Registration> RegistrationCache::make(const Device& device, void* ptr,
                                                      uint64_t size) {
  std::shared_ptr<Registration> r(new Registration());
  r->context_ = context_;
  r->base_ = static_cast<uint8_t*>(ptr);
  r->size_ = size;
  const VerbsLimits& limits = context_->limits();
  if (size > limits.max_mr_size)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("verbs: cannot register {} bytes: {} allows at most {} per region",
                            size, context_->name(), limits.max_mr_size));
  if (host_addressable(device, ptr)) {
    register_host(*r, device);
    return r;
  }
  std::vector<std::string> tried;
  if (!try_dmabuf(*r, device, tried) && !try_peermem(*r, tried)) register_staged(*r, device, tried);
  return r;
}

void RegistrationCache::register_host(Registration& r, const Device& device) const {
  r.mr_ = ibv_reg_mr(context_->pd(), r.base_, r.size_, kAccess);
  if (r.mr_ == nullptr) {
    int err = errno;
    throw Error(
        errno_status(err),
        fmt::format(
            "verbs: ibv_reg_mr of {} bytes of {} at {} failed: {}{}", r.size_, device.selector(),
            static_cast<void*>(r.base_), std::strerror(err),
            err == ENOMEM || err == EPERM ? " (is RLIMIT_MEMLOCK, ulimit -l, large enough?)" : ""));
  }
  r.path_ = RegistrationPath::host;
  r.reason_ = "host-addressable memory, ibv_reg_mr";
}

bool RegistrationCache::try_dmabuf(Registration& r, const Device& device,
                                   std::vector<std::string>& tried) const {
  if (!context_->dmabuf_supported()) {
    tried.push_back(fmt::format("dma-buf unsupported ({})", context_->dmabuf_detail()));
    return false;
  }
  if (!device.has(HM_CAP_DMABUF_EXPORT)) {
    tried.push_back(fmt::format("dma-buf: {} cannot export one", device.selector()));
    return false;
  }
  try {
    // Export whole pages (CUDA and udmabuf want them), within the allocation.
    PointerInfo info = device.query(r.base_);
    auto address = reinterpret_cast<uintptr_t>(r.base_);
    uintptr_t start = address & ~(page_size() - 1);
    uintptr_t end = (address + r.size_ + page_size() - 1) & ~(page_size() - 1);
    if (info.base != nullptr) {
      start = std::max(start, reinterpret_cast<uintptr_t>(info.base));
      end = std::min(end, reinterpret_cast<uintptr_t>(info.base) + info.size);
    }
    DmaBuf dmabuf(device, reinterpret_cast<const void*>(start), end - start);
    RegDmabufMrFn reg = reg_dmabuf_mr_function();
    r.mr_ = reg(context_->pd(), dmabuf.get().offset + (address - start), r.size_, address,
                dmabuf.get().fd, kAccess);
    if (r.mr_ != nullptr) {
      r.dmabuf_.emplace(std::move(dmabuf));
      r.path_ = RegistrationPath::dmabuf;
      r.reason_ = "dma-buf exported by the plugin, ibv_reg_dmabuf_mr";
      return true;
    }
    tried.push_back(fmt::format("dma-buf: ibv_reg_dmabuf_mr failed: {}", std::strerror(errno)));
  } catch (const Error& e) {
    tried.push_back(fmt::format("dma-buf: {}", e.what()));
  }
  return false;
}

bool RegistrationCache::try_peermem(Registration& r, std::vector<std::string>& tried) const {
  if (!context_->peermem()) {
    tried.push_back(fmt::format("peermem: unusable ({})", context_->peermem_detail()));
    return false;
  }
  r.mr_ = ibv_reg_mr(context_->pd(), r.base_, r.size_, kAccess);
  if (r.mr_ == nullptr) {
    tried.push_back(fmt::format("peermem: ibv_reg_mr failed: {}", std::strerror(errno)));
    return false;
  }
  r.path_ = RegistrationPath::peermem;
  r.reason_ = fmt::format("{}; peermem: ibv_reg_mr on device memory", fmt::join(tried, "; "));
  return true;
}

void RegistrationCache::register_staged(Registration& r, const Device& device,
                                        const std::vector<std::string>& tried) const {
  r.stream_ = device.create_stream();
  if (device.has(HM_CAP_PINNED_HOST_MEMORY)) {
    try {
      r.pinned_mirror_ = device.allocate(r.size_, MemoryKind::pinned_host);
      r.mirror_ = static_cast<uint8_t*>(r.pinned_mirror_.data());
    } catch (const Error& e) {
      log(LogLevel::warn, "verbs: no pinned staging memory from {} ({}); using plain host memory",
          device.selector(), e.what());
    }
  }
  if (r.mirror_ == nullptr) {
    if (posix_memalign(&r.plain_mirror_, page_size(), r.size_) != 0)
      throw Error(HM_ERR_OUT_OF_MEMORY,
                  fmt::format("verbs: no host memory for a {}-byte staging mirror", r.size_));
    r.mirror_ = static_cast<uint8_t*>(r.plain_mirror_);
  }
  r.mr_ = ibv_reg_mr(context_->pd(), r.mirror_, r.size_, kAccess);
  if (r.mr_ == nullptr) {
    int err = errno;
    throw Error(errno_status(err),
                fmt::format("verbs: ibv_reg_mr of a {}-byte staging mirror failed: {} (tried: {})",
                            r.size_, std::strerror(err), fmt::join(tried, "; ")));
  }
  r.path_ = RegistrationPath::staging;
  r.reason_ = fmt::format("{}; staging through a registered host mirror", fmt::join(tried, "; "));
}

}  // namespace hetmesh::detail
