// Waits a framework's stream holds until the host says so, for code that orders its GPU work with
// events on the host: StepMesh's SimpleNotify and its graph-capturable wait_flag (hetmesh.stepmesh,
// docs/stepmesh.md). Built only on the ABI's stream memory operations and copies, so every plugin
// with them serves, and no kernel runs: the stream waits in the device's front end, on no SM.
//
// A notice is a word the stream waits on until the host has raised it to a value (a cyclic
// comparison, so values may count on past 2^32). A flag wait is StepMesh's `wait_flag(flag, seq)`:
// the stream waits until a 64-bit word in host memory (which anyone may write, the device through
// its mapping included) is at least a 64-bit value in device memory, read when the stream gets
// there. The stream copies that value into the wait's site, raises the site's `posted` word and
// waits on its `go` word; a watcher thread compares and raises `go`, and the stream lowers it
// behind its wait, so a graph that captured the wait replays it any number of times.
#pragma once

#include <hetmesh/core/device.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

class DoorbellThread;

class StreamFlags {
 public:
  // Room for `sites` notices and flag waits at once, in `device`'s pinned host memory.
  StreamFlags(const Device& device, int sites);
  ~StreamFlags();  // release(), then the memory goes
  StreamFlags(const StreamFlags&) = delete;
  StreamFlags& operator=(const StreamFlags&) = delete;

  // A new notice; Error(HM_ERR_OUT_OF_MEMORY) naming the limit when every site is taken.
  int notice();
  // Later work on `stream` waits until the notice was raised to `value` or past it.
  void enqueue_notice_wait(int notice, uint32_t value, const Stream& stream);
  void raise_notice(int notice, uint32_t value);

  // Later work on `stream` waits until *flag >= *seq (signed 64-bit), *seq read when the stream
  // gets there. `flag` is host memory that stays valid while a stream may wait on it; `seq` is
  // memory the stream's copies read. A `reusable` wait's site is taken back once the stream passed
  // it; one captured in a graph must not be (the graph replays it).
  void enqueue_flag_wait(const int64_t* flag, const void* seq, const Stream& stream, bool reusable);

  // Lets every stream that waits on one of these words go, now and at any later wait (the
  // engine's end); later enqueues are refused.
  void release();

 private:
  struct Site;  // in pinned host memory: the stream's copy of seq, `posted`, `go`
  enum class Use : uint8_t { free, notice, flag };
  struct Book {  // the host's record of a site
    Use use = Use::free;
    bool reusable = false;
    bool answered = false;
    uint32_t highest = 0;  // a notice's highest value waited for
    const int64_t* flag = nullptr;
  };

  Site& site(int i) const;
  int take(Use use);                    // caller holds mutex_
  void check_notice(int notice) const;  // caller holds mutex_
  bool watch();                         // one turn of the watcher: true if it answered a wait
  void forget(int i);                   // a flag wait's site, of a wait the stream never got

  HostBuffer memory_;
  std::mutex mutex_;
  std::vector<Book> books_;
  std::vector<int> flag_waits_;  // sites of flag waits, answered or not
  bool released_ = false;
  std::unique_ptr<DoorbellThread> watcher_;  // started at the first flag wait
};

}  // namespace hetmesh::afd

#pragma GCC visibility pop
