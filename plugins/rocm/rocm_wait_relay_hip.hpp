// The HM_WAIT_GEQ relay's runtime side on HIP (the relay is the kit's,
// hetmesh/plugin_kit/wait_relay.hpp): gate words in coherent pinned host memory, the stream's
// arrival (hipStreamWriteValue64) and wait for a ticket (hipStreamWaitValue64), and reading words
// in device memory.
#pragma once

#include "rocm_loader.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <map>

namespace hm::rocm {

class HipRelayBackend final : public hm::kit::gpu::WaitRelay::Backend {
 public:
  explicit HipRelayBackend(const Runtime& hip) : hip_(hip) {}
  ~HipRelayBackend() override;

  void* allocate_gates(size_t bytes) override;
  void free_gates(void* chunk) override;
  void signal_arrival(void* stream, uint64_t* arrival, uint64_t ticket) override;
  void wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) override;
  bool read_device_word(const hm::kit::gpu::WaitRelay::Word& word, uint32_t* value) override;

 private:
  const Runtime& hip_;
  std::map<int32_t, hipStream_t> read_streams_;  // watcher thread only: device -> stream
  bool read_failure_logged_ = false;
};

}  // namespace hm::rocm
