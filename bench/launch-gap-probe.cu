// What a kernel's launch adds to an event-timed call, beside the kernel's own run: a kernel of
// fixed length (each block busy for the same number of cycles) launched after a spin, timed
// with events around the launch as kforge's timer and bench/peers do, and with the GPU's
// global timer inside (first block's start to last block's end). Variants differ in one launch
// property at a time: dynamic shared memory (a carve-out change), a cluster, a large parameter
// block, and programmatic dependent launch (PDL) with and without the griddepcontrol.wait that
// makes it safe. A PDL launch that never waits shows what a kernel could hide from the timer.
//   nvcc -std=c++17 -arch=sm_90a -o launch-gap-probe bench/launch-gap-probe.cu &&
//   ./launch-gap-probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// stamps[0]: the spin's end; stamps[1]: first block start (min); stamps[2]: last block end (max).
__global__ void spin(uint64_t cycles, unsigned long long* stamps) {
  const uint64_t t0 = clock64();
  while (uint64_t(clock64()) - t0 < cycles) {
  }
  stamps[0] = global_ns();
}

struct Big {
  unsigned long long pad[128];  // 1 KB of parameters, as a GEMM's TMA descriptors and params
};

template <bool kWait, bool kBig>
__global__ void work(uint64_t cycles, unsigned long long* stamps, Big big) {
  extern __shared__ char smem[];
  if constexpr (kWait) asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t start = global_ns();
  const uint64_t t0 = clock64();
  while (uint64_t(clock64()) - t0 < cycles) {
  }
  if (threadIdx.x == 0) {
    if (kBig && big.pad[threadIdx.x] == 12345) smem[0] = 1;  // keep the parameters alive
    atomicMin(&stamps[1], start);
    atomicMax(&stamps[2], global_ns());
  }
}

struct Variant {
  const char* name;
  int smem;
  int cluster;
  bool pdl;
  bool wait;
  bool big;
};

template <bool kWait, bool kBig>
void launch(const Variant& v, int blocks, uint64_t cycles, unsigned long long* stamps,
            cudaStream_t s) {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[2]{};
  int n = 0;
  if (v.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = v.cluster;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (v.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.gridDim = dim3(blocks, 1, 1);
  config.blockDim = dim3(384, 1, 1);
  config.dynamicSmemBytes = v.smem;
  config.stream = s;
  config.attrs = attrs;
  config.numAttrs = n;
  Big big{};
  CHECK(cudaLaunchKernelEx(&config, work<kWait, kBig>, cycles, stamps, big));
}

void launch_variant(const Variant& v, int blocks, uint64_t cycles, unsigned long long* stamps,
                    cudaStream_t s) {
  if (v.wait && v.big) launch<true, true>(v, blocks, cycles, stamps, s);
  if (v.wait && !v.big) launch<true, false>(v, blocks, cycles, stamps, s);
  if (!v.wait && v.big) launch<false, true>(v, blocks, cycles, stamps, s);
  if (!v.wait && !v.big) launch<false, false>(v, blocks, cycles, stamps, s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Samples {
  std::vector<double> events, inside, lead;  // us
  int early = 0;  // calls whose first block started before the spin ended
};

// 50 calls of `v` (after 10 to warm up), each opened by `open` (the work a timer puts ahead of
// the start event: a spin, which stamps its end, or a flush), then start event, launch, stop
// event. `lead` means something only after the spin.
template <class Open>
Samples time_calls(const Variant& v, int blocks, uint64_t work_cycles, Open open,
                   unsigned long long* stamps, cudaEvent_t start, cudaEvent_t stop,
                   cudaStream_t s) {
  Samples out;
  for (int i = 0; i < 60; ++i) {
    const unsigned long long init[3] = {0, ~0ull, 0};
    CHECK(cudaMemcpyAsync(stamps, init, sizeof init, cudaMemcpyHostToDevice, s));
    open(i);
    CHECK(cudaEventRecord(start, s));
    launch_variant(v, blocks, work_cycles, stamps, s);
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventSynchronize(stop));
    unsigned long long got[3];
    CHECK(cudaMemcpy(got, stamps, sizeof got, cudaMemcpyDeviceToHost));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i < 10) continue;  // warm-up
    out.events.push_back(ms * 1e3);
    out.inside.push_back((got[2] - got[1]) / 1e3);
    out.lead.push_back((double(got[1]) - double(got[0])) / 1e3);
    out.early += got[1] < got[0];
  }
  return out;
}

int main() {
  int sms = 0, clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const int max_smem = 200 << 10;
  for (auto f : {(const void*)work<true, true>, (const void*)work<true, false>,
                 (const void*)work<false, true>, (const void*)work<false, false>}) {
    CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  }
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long* stamps;
  CHECK(cudaMalloc(&stamps, 3 * sizeof(unsigned long long)));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));

  const Variant variants[] = {
      {"plain", 0, 1, false, false, false},
      {"smem 200 KB", max_smem, 1, false, false, false},
      {"cluster 2", 0, 2, false, false, false},
      {"params 1 KB", 0, 1, false, false, true},
      {"smem + cluster 2 + params (a CUTLASS GEMM)", max_smem, 2, false, false, true},
      {"PDL, waits", 0, 1, true, true, false},
      {"GEMM-like + PDL, waits", max_smem, 2, true, true, true},
      {"PDL, never waits", 0, 1, true, false, false},
      {"GEMM-like + PDL, never waits", max_smem, 2, true, false, true},
  };
  const uint64_t spin_cycles = uint64_t(clock_khz) * 100 / 1000;  // ~100 us at the base clock
  std::printf("SMs %d, clock %d kHz; one block per SM, 384 threads\n", sms, clock_khz);
  std::printf("%-44s %8s %9s %9s %9s %9s\n", "variant (work us)", "events", "inside", "ev-inside",
              "lead", "start<spin");
  for (double work_us : {5.0, 50.0}) {
    const uint64_t work_cycles = uint64_t(clock_khz * work_us / 1000);
    for (const Variant& v : variants) {
      const Samples r = time_calls(
          v, sms, work_cycles, [&](int) { spin<<<1, 32, 0, s>>>(spin_cycles, stamps); }, stamps,
          start, stop, s);
      char name[64];
      std::snprintf(name, sizeof name, "%s (%.0f)", v.name, work_us);
      std::printf("%-44s %8.2f %9.2f %9.2f %9.2f %6d/50\n", name, median(r.events),
                  median(r.inside), median(r.events) - median(r.inside), median(r.lead), r.early);
    }
  }
  // kforge's timer opens a call with a flush (a memset twice the L2's size), not a spin: does a
  // PDL launch overlap it?
  int l2_bytes = 0;
  CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const size_t flush_bytes = 2 * size_t(l2_bytes);
  void* flush = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  std::printf("\nafter a %zu MB memset instead of the spin\n", flush_bytes >> 20);
  std::printf("%-44s %8s %9s %9s\n", "variant (work us)", "events", "inside", "ev-inside");
  const uint64_t work_cycles = uint64_t(clock_khz * 5.0 / 1000);
  for (const Variant& v : variants) {
    const Samples r = time_calls(
        v, sms, work_cycles,
        [&](int i) { CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, s)); }, stamps, start,
        stop, s);
    char name[64];
    std::snprintf(name, sizeof name, "%s (5)", v.name);
    std::printf("%-44s %8.2f %9.2f %9.2f\n", name, median(r.events), median(r.inside),
                median(r.events) - median(r.inside));
  }
  return 0;
}
