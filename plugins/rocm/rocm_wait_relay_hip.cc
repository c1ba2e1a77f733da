// The HM_WAIT_GEQ relay's HIP side: gate words, the ticket wait, reading words in device memory.
#include "rocm_wait_relay_hip.hpp"

#include "rocm_state.hpp"

#include <cstring>

namespace hm::rocm {

HipRelayBackend::~HipRelayBackend() {
  for (auto& [device, stream] : read_streams_)
    (void)hip_.hipStreamDestroy(stream);
}

void* HipRelayBackend::allocate_gates(size_t bytes) {
  void* chunk = nullptr;
  // Coherent: the GPU sees the watcher's store without a cache flush. Portable: every device.
  check(hip_.hipHostMalloc(&chunk, bytes,
                           hipHostMallocCoherent | hipHostMallocPortable | hipHostMallocMapped),
        "hipHostMalloc");
  std::memset(chunk, 0, bytes);
  return chunk;
}

void HipRelayBackend::free_gates(void* chunk) {
  (void)hip_.hipHostFree(chunk);  // at shutdown: nothing is left to report it to
}

void HipRelayBackend::signal_arrival(void* stream, uint64_t* arrival, uint64_t ticket) {
  // HIP's stream writes follow the stream's earlier work, whose writes are visible first.
  check(hip_.hipStreamWriteValue64(static_cast<hipStream_t>(stream), arrival, ticket, 0),
        "hipStreamWriteValue64");
}

void HipRelayBackend::wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) {
  // Gte on 64 bits: tickets never reach the sign bit, so signed or unsigned compares agree.
  check(hip_.hipStreamWaitValue64(static_cast<hipStream_t>(stream), gate, ticket,
                                  hipStreamWaitValueGte, ~uint64_t{0}),
        "hipStreamWaitValue64");
}

bool HipRelayBackend::read_device_word(const hm::kit::gpu::WaitRelay::Word& word, uint32_t* value) {
  // Device memory is not host-addressable: copy the word out on a stream that nothing blocks.
  hipError_t error = hip_.hipSetDevice(word.device);
  hipStream_t& stream = read_streams_[word.device];
  if (error == hipSuccess && stream == nullptr)
    error = hip_.hipStreamCreateWithFlags(&stream, hipStreamNonBlocking);
  if (error == hipSuccess)
    error = hip_.hipMemcpyAsync(value, word.address, sizeof *value, hipMemcpyDeviceToHost, stream);
  if (error == hipSuccess) error = hip_.hipStreamSynchronize(stream);
  if (error != hipSuccess && !read_failure_logged_) {
    read_failure_logged_ = true;
    log(HM_LOG_ERROR, "HM_WAIT_GEQ relay cannot read the device word at " +
                          std::to_string(reinterpret_cast<uintptr_t>(word.address)) + ": " +
                          describe(hip_, error) + " (the stream waiting on it stays blocked)");
  }
  return error == hipSuccess;
}

}  // namespace hm::rocm
