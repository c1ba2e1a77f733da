// The baselines measured in this process for every transport: a hot memcpy between host buffers
// and one DMA by the source memory's plugin.
#include "bench_transport.hpp"

#include <hetmesh/core/percentile.hpp>

#include <cstring>
#include <utility>

namespace hetmesh::cli::transport_bench {

// Hot memcpy between two host buffers: the ceiling for a same-node transport.
void measure_memcpy(Row& row, int iterations) {
  std::vector<uint8_t> a(row.size, 1), b(row.size, 2);
  std::vector<double> us;
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), row.size);
    auto t1 = Clock::now();
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    a[i % row.size] = static_cast<uint8_t>(b[(i * 7) % row.size] + 1);  // keep the copy live
  }
  row.memcpy_p50_us = percentile(us, 0.5);
  row.memcpy_gbps = static_cast<double>(row.size) / (row.memcpy_p50_us * 1e3);
  row.memcpy_us = std::move(us);
}

// One DMA: a single memcpy_async of the same bytes by the source's plugin, from its memory into
// pinned host memory (the plugin's own; plain host memory where it has none), then the stream's
// sync. The least one write of that memory to a host peer can cost, through the ABI alone.
void measure_one_dma(Row& row, const Device& device, const Buffer& source, int iterations) {
  HostBuffer host(device, row.size);
  Stream stream = device.create_stream();
  std::vector<double> us;
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    stream.copy(host.data(), source.data(), row.size);
    stream.synchronize(kWait);
    auto t1 = Clock::now();
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  row.dma_p50_us = percentile(us, 0.5);
  row.dma_gbps = static_cast<double>(row.size) / (row.dma_p50_us * 1e3);
  row.dma_us = std::move(us);
}

}  // namespace hetmesh::cli::transport_bench
