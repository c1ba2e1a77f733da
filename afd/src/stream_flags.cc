// Notices and flag waits a framework's stream holds on (stream_flags.hpp).
#include <hetmesh/afd/stream_flags.hpp>

#include "device_trigger.hpp"

#include <algorithm>
#include <atomic>

namespace hetmesh::afd {

struct StreamFlags::Site {
  int64_t want;     // the stream's copy of seq
  uint32_t posted;  // raised by the stream once `want` is there, lowered by the watcher
  uint32_t go;      // a flag wait's: raised by the watcher, lowered by the stream; a notice's value
};

namespace {

uint32_t load(const uint32_t& word) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(word)).load(std::memory_order_acquire);
}

void store(uint32_t& word, uint32_t value) {
  std::atomic_ref<uint32_t>(word).store(value, std::memory_order_release);
}

int64_t load64(const int64_t* word) {
  return std::atomic_ref<int64_t>(*const_cast<int64_t*>(word)).load(std::memory_order_acquire);
}

// Whether the watcher thread may read `flag` while `device`'s streams write it: on a device whose
// own memory is the host's, any; else host memory the plugin pinned, registered or mapped, the
// whole word inside it. (A stray address is refused here, not faulted on by the watcher later.)
bool host_reads(const Device& device, const int64_t* flag) {
  if (device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY)) return true;
  PointerInfo info = device.query(flag);
  const bool host = info.kind == HM_MEM_PINNED_HOST || info.kind == HM_MEM_REGISTERED_HOST ||
                    info.kind == HM_MEM_IPC_MAPPED_HOST;
  const auto offset = reinterpret_cast<uintptr_t>(flag) - reinterpret_cast<uintptr_t>(info.base);
  return host && info.size >= sizeof *flag && offset <= info.size - sizeof *flag;
}

}  // namespace

StreamFlags::StreamFlags(const Device& device, int sites)
    : memory_(device, sizeof(Site) * static_cast<uint64_t>(sites)), books_(sites) {}

StreamFlags::~StreamFlags() {
  release();
  if (watcher_) {
    watcher_->stop();
    watch();  // the waits posted since its last turn, let go too
  }
}

StreamFlags::Site& StreamFlags::site(int i) const {
  return reinterpret_cast<Site*>(memory_.data())[i];
}

int StreamFlags::take(Use use) {
  if (released_)
    throw Error(kStatusClosed, "stream flags: the engine has ended; no stream waits on it now");
  for (size_t i = 0; i < books_.size(); ++i) {
    if (books_[i].use != Use::free) continue;
    books_[i] = Book{use};
    Site& s = site(static_cast<int>(i));
    store(s.posted, 0);
    store(s.go, 0);
    return static_cast<int>(i);
  }
  throw Error(HM_ERR_OUT_OF_MEMORY,
              fmt::format("stream flags: all {} are taken (each notice, and each flag wait "
                          "captured in a graph, keeps one for the engine's life)",
                          books_.size()));
}

int StreamFlags::notice() {
  std::lock_guard lock(mutex_);
  return take(Use::notice);
}

void StreamFlags::check_notice(int notice) const {
  if (notice < 0 || static_cast<size_t>(notice) >= books_.size() ||
      books_[notice].use != Use::notice)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("stream flags: {} is no notice of this engine", notice));
}

void StreamFlags::enqueue_notice_wait(int notice, uint32_t value, const Stream& stream) {
  {
    std::lock_guard lock(mutex_);
    check_notice(notice);
    if (released_) take(Use::notice);  // refused, naming why
    Book& book = books_[notice];
    if (static_cast<int32_t>(value - book.highest) > 0) book.highest = value;
  }
  stream.wait_value32(&site(notice).go, value, HM_WAIT_GEQ);
}

void StreamFlags::raise_notice(int notice, uint32_t value) {
  std::lock_guard lock(mutex_);  // so no raise lands after release() and undoes it
  check_notice(notice);
  if (released_) return;  // released for good
  uint32_t& go = site(notice).go;
  if (static_cast<int32_t>(value - load(go)) > 0) store(go, value);  // never back (cyclic)
}

void StreamFlags::enqueue_flag_wait(const int64_t* flag, const void* seq, const Stream& stream,
                                    bool reusable) {
  if (reinterpret_cast<uintptr_t>(flag) % alignof(int64_t) != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("wait_flag: the flag at {} is not 8-byte aligned",
                            static_cast<const void*>(flag)));
  if (!host_reads(stream.device(), flag))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("wait_flag: the flag at {} is not host memory that {} writes (pinned "
                            "or registered host memory: map_pinned_tensor's view)",
                            static_cast<const void*>(flag), stream.device().selector()));
  int i;
  {
    std::lock_guard lock(mutex_);
    i = take(Use::flag);
    books_[i].flag = flag;
    books_[i].reusable = reusable;
    flag_waits_.push_back(i);
    if (!watcher_)
      watcher_ = std::make_unique<DoorbellThread>(
          "hm-flags", -1, [this] { return watch() ? Turn::worked : Turn::idle; });
  }
  Site& s = site(i);
  try {
    stream.copy(&s.want, seq, sizeof s.want);
  } catch (...) {
    forget(i);  // nothing of this wait reached the stream: its site is free again
    throw;
  }
  // Past here a failure leaves part of the wait on the stream, which may still write the site:
  // it stays taken.
  stream.write_value32(&s.posted, 1);
  stream.wait_value32(&s.go, 1, HM_WAIT_EQ);
  stream.write_value32(&s.go, 0);  // armed again, for the graph's next replay
}

void StreamFlags::forget(int i) {
  std::lock_guard lock(mutex_);
  books_[i] = Book{};
  std::erase(flag_waits_, i);
}

bool StreamFlags::watch() {
  std::lock_guard lock(mutex_);
  bool answered = false;
  for (size_t k = 0; k < flag_waits_.size();) {
    const int i = flag_waits_[k];
    Site& s = site(i);
    Book& book = books_[i];
    if (load(s.posted) == 1 && load(s.go) == 0) {
      // After release() the flag's memory may be gone: every wait is let go unread.
      if (released_ ||
          load64(book.flag) >= std::atomic_ref<int64_t>(s.want).load(std::memory_order_acquire)) {
        store(s.posted, 0);
        store(s.go, 1);
        book.answered = answered = true;
      }
    } else if (book.reusable && book.answered && load(s.go) == 0) {
      book = Book{};  // the stream passed it: the site is free again
      flag_waits_[k] = flag_waits_.back();
      flag_waits_.pop_back();
      continue;
    }
    ++k;
  }
  return answered;
}

void StreamFlags::release() {
  std::lock_guard lock(mutex_);
  if (released_) return;
  released_ = true;
  for (size_t i = 0; i < books_.size(); ++i)
    if (books_[i].use == Use::notice)
      store(site(static_cast<int>(i)).go, books_[i].highest + (1u << 30));
}

}  // namespace hetmesh::afd
