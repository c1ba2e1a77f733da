// Memory registration for the verbs transport.
//
// Host-addressable memory is registered with ibv_reg_mr (path host). Device memory the host cannot
// address tries, in order: (1) dma-buf (the plugin exports one, then ibv_reg_dmabuf_mr), (2)
// peermem (ibv_reg_mr on the device pointer, when nvidia_peermem is loaded), (3) staging: a pinned
// host mirror of the range is registered instead and the device's copy engine moves bytes between
// the mirror and the device (D2H before a write leaves, H2D after a write lands).
//
// Registrations are cached by (device, base, size): registering the same range again reuses the
// memory region for as long as any Region holds it.
#pragma once

#include "verbs/verbs_device.hpp"

#include <hetmesh/core/device.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace hetmesh::detail {

class Registration {
 public:
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  RegistrationPath path() const { return path_; }
  // Why this path: the fallbacks tried and their reasons.
  const std::string& reason() const { return reason_; }
  bool staged() const { return path_ == RegistrationPath::staging; }
  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  // The registered bytes: the memory itself, or the staging mirror.
  uint8_t* registered() const { return staged() ? mirror_ : base_; }
  // Whether the CPU may read the registered bytes (inline sends need that).
  bool cpu_readable() const { return path_ == RegistrationPath::host || staged(); }
  // The address a peer puts in its work requests (the MR's iova).
  uint64_t remote_address() const { return reinterpret_cast<uintptr_t>(registered()); }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }

  // Staging only: device -> mirror before [offset, +length) is sent, and mirror -> device after a
  // peer's write there landed. Throw Error if the copy fails or times out.
  void stage_out(uint64_t offset, uint64_t length);
  void stage_in(uint64_t offset, uint64_t length);

 private:
  friend class RegistrationCache;
  Registration() = default;
  std::shared_ptr<VerbsContext> context_;
  RegistrationPath path_ = RegistrationPath::host;
  std::string reason_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  ibv_mr* mr_ = nullptr;
  std::optional<DmaBuf> dmabuf_;
  // Staging.
  std::mutex copy_mutex_;
  Stream stream_;
  Buffer pinned_mirror_;
  void* plain_mirror_ = nullptr;  // posix_memalign'ed when the plugin has no pinned memory
  uint8_t* mirror_ = nullptr;
};

class RegistrationCache {
 public:
  explicit RegistrationCache(std::shared_ptr<VerbsContext> context)
      : context_(std::move(context)) {}
  // Returns the live registration of exactly this range, or makes one. Throws Error if no path
  // works (e.g. ibv_reg_mr refuses host memory, or the size exceeds max_mr_size).
  std::shared_ptr<Registration> get(const Device& device, void* ptr, uint64_t size);

 private:
  std::shared_ptr<Registration> make(const Device& device, void* ptr, uint64_t size);
  // The paths make() takes, in the order above. Each try_ returns whether it registered the
  // memory, adding why not to `tried` otherwise; the others throw Error if they cannot.
  void register_host(Registration& r, const Device& device) const;
  bool try_dmabuf(Registration& r, const Device& device, std::vector<std::string>& tried) const;
  bool try_peermem(Registration& r, std::vector<std::string>& tried) const;
  void register_staged(Registration& r, const Device& device,
                       const std::vector<std::string>& tried) const;
  using Key = std::tuple<std::string, uintptr_t, uint64_t>;
  std::shared_ptr<VerbsContext> context_;
  std::mutex mutex_;
  std::map<Key, std::weak_ptr<Registration>> entries_;
};

}  // namespace hetmesh::detail
