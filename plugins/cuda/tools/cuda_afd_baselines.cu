// hetmesh-cuda-baselines: what `hetmesh bench afd` on two NVIDIA GPUs is compared with, measured
// by the same binary in the same run (ci/gpu/bench-afd.sh):
//
//   roundtrip     A on GPU a, F on GPU f: a2f bytes a -> f, then f2a bytes f -> a, per round
//                 trip, by (1) the raw cudaMemcpyPeerAsync pair (each followed by a stream sync,
//                 as an engine must learn of arrival before it answers), the same with a polled
//                 event after each copy instead of the sync, and (2) NCCL
//                 ncclSend/ncclRecv in one process (ncclCommInitAll).
//   interference  a compute-bound kernel on GPU f, alone and while NCCL moves the same AFD
//                 traffic in the same process (NCCL's kernels take SMs; copy engines do not).
//   compute       the same kernel alone on GPU f, for `--seconds`, or for as long as process
//                 `--while-pid` lives: run it while another process (hetmesh) moves the traffic
//                 to measure that process's interference.
//
// Prints one JSON object on stdout; figures are microseconds (p50, p99) or milliseconds per
// kernel. Exit status 1 with a message on any CUDA or NCCL error.
#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "hetmesh-cuda-baselines: %s\n", message.c_str());
  std::exit(1);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void check(CUresult r, const char* what) {
  const char* name = nullptr;
  if (r != CUDA_SUCCESS)
    die(std::string(what) + ": " + (cuGetErrorName(r, &name) == CUDA_SUCCESS ? name : "?"));
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

struct Options {
  std::string mode;
  int a = 0, f = 1;
  size_t a2f = 917504, f2a = 1835008;  // StepMesh: 896 KiB fp8 out, 1.75 MiB bf16 back
  int iterations = 2000, warmup = 200, kernels = 200;
  double seconds = 2.0;
  long while_pid = 0;
};

Options parse(int argc, char** argv) {
  if (argc < 2)
    die("usage: hetmesh-cuda-baselines roundtrip|interference|compute [--a N] [--f N] "
        "[--a2f BYTES] [--f2a BYTES] [--iterations N] [--kernels N] [--seconds S]");
  Options o;
  o.mode = argv[1];
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) die(std::string("missing value for ") + argv[i]);
    std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--a")
      o.a = std::atoi(value);
    else if (key == "--f")
      o.f = std::atoi(value);
    else if (key == "--a2f")
      o.a2f = std::strtoull(value, nullptr, 10);
    else if (key == "--f2a")
      o.f2a = std::strtoull(value, nullptr, 10);
    else if (key == "--iterations")
      o.iterations = std::atoi(value);
    else if (key == "--warmup")
      o.warmup = std::atoi(value);
    else if (key == "--kernels")
      o.kernels = std::atoi(value);
    else if (key == "--seconds")
      o.seconds = std::atof(value);
    else if (key == "--while-pid")
      o.while_pid = std::atol(value);
    else
      die("unknown option " + key);
  }
  if (o.mode != "roundtrip" && o.mode != "interference" && o.mode != "compute")
    die("unknown mode " + o.mode);
  return o;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Percentiles {
  double p50, p99;
};

// Mirrors core's one percentile rule (core/include/hetmesh/core/percentile.hpp; plugins/ may not
// link the core): the sample at index round(q * (n - 1)) of the sorted samples, halves rounded up.
Percentiles percentiles(std::vector<double> v) {
  if (v.empty()) return {0, 0};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
  };
  return {at(0.50), at(0.99)};
}

// Both GPUs' buffers and streams for one A -> F -> A round trip.
struct Pair {
  Options o;
  void *a_out = nullptr, *a_in = nullptr, *f_in = nullptr, *f_out = nullptr;
  cudaStream_t a_stream = nullptr, f_stream = nullptr;
  cudaEvent_t a_done = nullptr, f_done = nullptr;
  uint32_t* flag = nullptr;  // pinned, mapped for both GPUs
  CUdeviceptr flag_device = 0;
  uint32_t round = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};

  explicit Pair(const Options& options) : o(options) {
    check(cudaSetDevice(o.a), "cudaSetDevice(a)");
    check(cudaMalloc(&a_out, o.a2f), "cudaMalloc");
    check(cudaMalloc(&a_in, o.f2a), "cudaMalloc");
    check(cudaStreamCreateWithFlags(&a_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming), "cudaEventCreate");
    cudaDeviceEnablePeerAccess(o.f, 0);
    check(cudaSetDevice(o.f), "cudaSetDevice(f)");
    check(cudaMalloc(&f_in, o.a2f), "cudaMalloc");
    check(cudaMalloc(&f_out, o.f2a), "cudaMalloc");
    check(cudaStreamCreateWithFlags(&f_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&f_done, cudaEventDisableTiming), "cudaEventCreate");
    cudaDeviceEnablePeerAccess(o.a, 0);
    cudaGetLastError();  // "already enabled" is not an error here
    check(cudaHostAlloc(reinterpret_cast<void**>(&flag), 4096,
                        cudaHostAllocPortable | cudaHostAllocMapped),
          "cudaHostAlloc");
    *flag = 0;
    void* device_view = nullptr;
    check(cudaHostGetDevicePointer(&device_view, flag, 0), "cudaHostGetDevicePointer");
    flag_device = reinterpret_cast<CUdeviceptr>(device_view);
    int devices[2] = {o.a, o.f};
    check(ncclCommInitAll(comms, 2, devices), "ncclCommInitAll");
  }
  ~Pair() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
  }

  void peer_round_trip() {
    check(cudaMemcpyPeerAsync(f_in, o.f, a_out, o.a, o.a2f, a_stream), "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(a_stream), "cudaStreamSynchronize");
    check(cudaMemcpyPeerAsync(a_in, o.a, f_out, o.f, o.f2a, f_stream), "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(f_stream), "cudaStreamSynchronize");
  }

  // The same pair, each copy followed by an event that the host polls (what a comm thread that
  // also serves other work does, and what hetmesh's completion thread does).
  void event_round_trip() {
    check(cudaMemcpyPeerAsync(f_in, o.f, a_out, o.a, o.a2f, a_stream), "cudaMemcpyPeerAsync");
    check(cudaEventRecord(a_done, a_stream), "cudaEventRecord");
    spin_on(a_done);
    check(cudaMemcpyPeerAsync(a_in, o.a, f_out, o.f, o.f2a, f_stream), "cudaMemcpyPeerAsync");
    check(cudaEventRecord(f_done, f_stream), "cudaEventRecord");
    spin_on(f_done);
  }
  // The same pair, each copy followed by a stream write of a counter into pinned host memory that
  // the host spins on: notification by the GPU itself, with no event query.
  void flag_round_trip() {
    ++round;
    check(cudaMemcpyPeerAsync(f_in, o.f, a_out, o.a, o.a2f, a_stream), "cudaMemcpyPeerAsync");
    check(cuStreamWriteValue32(a_stream, flag_device, round, CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32");
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != round)
      ;
    ++round;
    check(cudaMemcpyPeerAsync(a_in, o.a, f_out, o.f, o.f2a, f_stream), "cudaMemcpyPeerAsync");
    check(cuStreamWriteValue32(f_stream, flag_device, round, CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32");
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != round)
      ;
  }

  static void spin_on(cudaEvent_t event) {
    cudaError_t e;
    while ((e = cudaEventQuery(event)) == cudaErrorNotReady)
      std::this_thread::yield();
    check(e, "cudaEventQuery");
  }

  void nccl_round_trip() {
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(a_out, o.a2f, ncclUint8, 1, comms[0], a_stream), "ncclSend");
    check(ncclRecv(f_in, o.a2f, ncclUint8, 0, comms[1], f_stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(f_out, o.f2a, ncclUint8, 0, comms[1], f_stream), "ncclSend");
    check(ncclRecv(a_in, o.f2a, ncclUint8, 1, comms[0], a_stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    check(cudaStreamSynchronize(a_stream), "cudaStreamSynchronize");
    check(cudaStreamSynchronize(f_stream), "cudaStreamSynchronize");
  }

  template <typename Trip>
  Percentiles measure(Trip trip) {
    std::vector<double> samples;
    for (int i = 0; i < o.warmup + o.iterations; ++i) {
      double start = now_us();
      trip();
      if (i >= o.warmup) samples.push_back(now_us() - start);
    }
    return percentiles(samples);
  }
};

// Compute-bound: a long chain of dependent FMAs per thread, no memory traffic to speak of.
__global__ void compute_kernel(float* out, int rounds) {
  float x = threadIdx.x * 1e-3f, y = 1.0f;
  for (int i = 0; i < rounds; ++i) {
    x = fmaf(x, 0.999f, y);
    y = fmaf(y, 1.0001f, -x * 1e-6f);
  }
  if (x == 12345.0f) out[0] = y;  // keeps the loop alive
}

struct Compute {
  int device;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  float* sink = nullptr;
  int blocks = 0;
  int rounds = 200000;  // about a millisecond per kernel on an H200

  explicit Compute(int d) : device(d) {
    check(cudaSetDevice(device), "cudaSetDevice");
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "attribute");
    blocks = sms * 8;  // every SM full
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaMalloc(&sink, sizeof(float)), "cudaMalloc");
  }

  float one_kernel_ms() {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    compute_kernel<<<blocks, 256, 0, stream>>>(sink, rounds);
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  }

  std::vector<double> run(int kernels) {
    std::vector<double> ms;
    for (int i = 0; i < 10; ++i)
      one_kernel_ms();  // warm up clocks
    for (int i = 0; i < kernels; ++i)
      ms.push_back(one_kernel_ms());
    return ms;
  }

  // For `seconds`, or while process `pid` lives (pid > 0).
  std::vector<double> run_for(double seconds, long pid) {
    std::vector<double> ms;
    for (int i = 0; i < 10; ++i)
      one_kernel_ms();
    double end = now_us() + seconds * 1e6;
    while (pid > 0 ? kill(static_cast<pid_t>(pid), 0) == 0 : now_us() < end)
      ms.push_back(one_kernel_ms());
    return ms;
  }
};

void print_percentiles(const char* name, Percentiles p, const char* unit, bool last = false) {
  std::printf("  \"%s\": {\"p50_%s\": %.3f, \"p99_%s\": %.3f}%s\n", name, unit, p.p50, unit, p.p99,
              last ? "" : ",");
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (o.mode != "compute" && (count <= std::max(o.a, o.f) || o.a == o.f))
    die("roundtrip and interference need two distinct GPUs (--a, --f); found " +
        std::to_string(count));

  std::printf(
      "{\n  \"mode\": \"%s\", \"a\": %d, \"f\": %d, \"a2f_bytes\": %zu, \"f2a_bytes\": %zu,\n",
      o.mode.c_str(), o.a, o.f, o.a2f, o.f2a);
  if (o.mode == "roundtrip") {
    Pair pair(o);
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    std::printf("  \"nccl_version\": %d, \"iterations\": %d,\n", nccl_version, o.iterations);
    print_percentiles("peer_copy_pair", pair.measure([&] { pair.peer_round_trip(); }), "us");
    print_percentiles("peer_copy_pair_events", pair.measure([&] { pair.event_round_trip(); }),
                      "us");
    print_percentiles("peer_copy_pair_flags", pair.measure([&] { pair.flag_round_trip(); }), "us");
    print_percentiles("nccl", pair.measure([&] { pair.nccl_round_trip(); }), "us", true);
  } else if (o.mode == "interference") {
    Compute compute(o.f);
    Percentiles alone = percentiles(compute.run(o.kernels));
    Pair pair(o);
    std::atomic<bool> stop{false};
    std::vector<double> trips;  // NCCL's own round trips while the kernel runs
    std::thread traffic([&] {
      while (!stop.load()) {
        double start = now_us();
        pair.nccl_round_trip();
        trips.push_back(now_us() - start);
      }
    });
    Percentiles loaded = percentiles(compute.run(o.kernels));
    stop = true;
    traffic.join();
    print_percentiles("compute_alone", alone, "ms");
    print_percentiles("compute_with_nccl", loaded, "ms");
    std::printf("  \"nccl_round_trips_during\": %zu,\n", trips.size());
    print_percentiles("nccl_round_trip_during_compute", percentiles(trips), "us");
    std::printf("  \"nccl_slowdown_percent\": %.2f\n", (loaded.p50 / alone.p50 - 1) * 100);
  } else {
    Compute compute(o.f);
    std::vector<double> ms = compute.run_for(o.seconds, o.while_pid);
    std::printf("  \"kernels\": %zu,\n", ms.size());
    print_percentiles("compute", percentiles(ms), "ms", true);
  }
  std::printf("}\n");
  return 0;
}
