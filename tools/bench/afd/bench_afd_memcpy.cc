// `hetmesh bench afd`: the memcpy baselines, run in the command's own process with the same bytes
// as one A's round trip:
//   - serial and hot: one thread copies the round trip's buffers one after another, the same small
//     buffers every time (cache-hot): the strictest, and the target;
//   - parallel over the slots: one thread per (A, F) pair, every pair at once, through buffers laid
//     out and sized like the engine's slots (so the same cache footprint).
#include "bench_afd.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <latch>
#include <new>
#include <thread>

namespace hetmesh::cli {

using afd::now_ns;

// The same bytes as one A's round trip with the engine's parallelism and footprint: a thread per
// (A, F) pair copies A's tokens and routing for micro-batch mb into F's slot for (A, mb), then F's
// outputs for (A, mb) into A's slot for (mb, F); every pair at once; buffers laid out as the
// engine's slots, cycling over the micro-batches. One round trip per A at a time. Returns the p50
// over As and iterations of the time until an A's last pair is done.
double memcpy_parallel_p50_us(const afd::EngineSpec& spec, int samples) {
  const int A = spec.attention, F = spec.ffn, M = spec.micro_batches;
  const uint64_t a2f = uint64_t{spec.tokens} * spec.a2f_bytes_per_token(),
                 f2a = spec.f2a_slot_bytes();
  auto buffers = [](int count, uint64_t bytes, uint8_t fill) {
    std::vector<std::vector<uint8_t>> v;
    for (int i = 0; i < count; ++i)
      v.emplace_back(bytes, static_cast<uint8_t>(fill + i));
    return v;
  };
  std::vector<std::vector<uint8_t>> a_send, a_receive, f_receive, f_send;
  try {
    a_send = buffers(A, M * a2f, 1), a_receive = buffers(A, uint64_t(M) * F * f2a, 2);
    f_receive = buffers(F, uint64_t(A) * M * a2f, 3), f_send = buffers(F, uint64_t(A) * M * f2a, 4);
  } catch (const std::bad_alloc&) {
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("bench afd: the parallel memcpy baseline's buffers (the job's slots "
                            "over again, {:.1f} MiB in this process): out of memory",
                            2.0 * uint64_t(A) * M * (a2f + uint64_t(F) * f2a) / (1 << 20)));
  }
  const int warmup = 5, total = warmup + samples;
  std::vector<int64_t> end(static_cast<size_t>(A * F));
  std::vector<double> us;
  try {
    us.reserve(static_cast<size_t>(samples) * A);  // on_phase, noexcept, never allocates
  } catch (const std::bad_alloc&) {
    throw Error(HM_ERR_OUT_OF_MEMORY,
                "bench afd: the parallel memcpy baseline's samples: out of memory");
  }
  int64_t start = 0;
  int phase = 0;
  auto on_phase = [&]() noexcept {
    if (phase % 2 == 0) {
      start = now_ns();
    } else if (phase / 2 >= warmup) {
      for (int a = 0; a < A; ++a) {
        int64_t last = 0;
        for (int f = 0; f < F; ++f)
          last = std::max(last, end[static_cast<size_t>(a * F + f)]);
        us.push_back(static_cast<double>(last - start) / 1e3);
      }
    }
    ++phase;
  };
  std::barrier sync(A * F, on_phase);
  // Every pair's thread starts before any copies: one that cannot start ends the others at once
  // (each would wait at the barrier for it) and the error names it.
  std::latch started(1);
  std::atomic<bool> abandon{false};
  std::vector<std::thread> threads;
  auto pair = [&](int a, int f) {
    started.wait();
    if (abandon) return;
    auto ua = static_cast<size_t>(a), uf = static_cast<size_t>(f);
    for (int it = 0; it < total; ++it) {
      const uint64_t mb = static_cast<uint64_t>(it % M);
      sync.arrive_and_wait();
      std::memcpy(f_receive[uf].data() + (ua * M + mb) * a2f, a_send[ua].data() + mb * a2f, a2f);
      std::memcpy(a_receive[ua].data() + (mb * F + uf) * f2a,
                  f_send[uf].data() + (ua * M + mb) * f2a, f2a);
      end[ua * F + uf] = now_ns();
      sync.arrive_and_wait();
    }
  };
  try {
    for (int a = 0; a < A; ++a)
      for (int f = 0; f < F; ++f)
        threads.push_back(start_thread("hm-memcpy", [&pair, a, f] { pair(a, f); }));
  } catch (...) {
    abandon = true;
    started.count_down();
    for (auto& t : threads)
      t.join();
    throw;
  }
  started.count_down();
  for (auto& t : threads)
    t.join();
  return afd::percentiles(us).p50;
}

double memcpy_p50_us(uint64_t bytes, int samples) {
  std::vector<uint8_t> a, b;
  try {
    a.assign(bytes, 1), b.assign(bytes, 2);
  } catch (const std::bad_alloc&) {
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("bench afd: the serial memcpy baseline's two buffers of a round "
                            "trip's bytes ({:.1f} MiB in this process): out of memory",
                            2.0 * bytes / (1 << 20)));
  }
  std::vector<double> us;
  for (int i = 0; i < samples + 5; ++i) {
    int64_t t0 = now_ns();
    std::memcpy(b.data(), a.data(), bytes);
    int64_t t1 = now_ns();
    if (i >= 5) us.push_back(static_cast<double>(t1 - t0) / 1e3);
    a[static_cast<size_t>(i) % bytes] ^= b[bytes / 2];
  }
  return afd::percentiles(us).p50;
}

}  // namespace hetmesh::cli
