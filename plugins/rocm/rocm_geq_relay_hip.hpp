// The HM_WAIT_GEQ relay's runtime side on HIP: gate words in coherent pinned host memory, the
// stream wait for a ticket (hipStreamWaitValue64), and reading words in device memory.
#pragma once

#include "rocm_geq_relay.hpp"
#include "rocm_loader.hpp"

#include <map>

namespace hm::rocm {

class HipRelayBackend final : public CyclicWaitRelay::Backend {
 public:
  explicit HipRelayBackend(const Runtime& hip) : hip_(hip) {}
  ~HipRelayBackend() override;

  void* allocate_gates(size_t bytes) override;
  void free_gates(void* chunk) override;
  void wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) override;
  bool read_device_word(const CyclicWaitRelay::Word& word, uint32_t* value) override;

 private:
  const Runtime& hip_;
  std::map<int32_t, hipStream_t> read_streams_;  // watcher thread only: device -> stream
  bool read_failure_logged_ = false;
};

}  // namespace hm::rocm
