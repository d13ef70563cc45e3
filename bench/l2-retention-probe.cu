// Can a kernel keep its inputs in L2 through the flush that is meant to make every timed sample
// cold? kforge flushes by writing a buffer twice the L2's size before each sample. A line marked
// evict_last (a load policy any kernel may use) or persisting (an access policy window over a
// set-aside part of L2, which a kernel's host code may configure) is evicted after normal lines,
// so a flush of normal writes may never reach it. This program times a read of a buffer that
// fits in L2 after each way of marking it, then the flush, against the same read cold and warm:
// a read as fast as the warm one means the buffer survived the flush.
//
// Build and run (on the GPU machine):
//   nvcc -std=c++20 -O2 -arch=sm_90a -o l2-retention-probe bench/l2-retention-probe.cu
//   ./l2-retention-probe [MB]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <vector>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

enum class Policy { normal, evict_last, evict_first };

__device__ __forceinline__ uint4 load(const uint4* p, Policy policy) {
  uint4 v;
  if (policy == Policy::normal) return *p;
  uint64_t hint;
  if (policy == Policy::evict_last)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(hint));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(hint));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(hint));
  return v;
}

// Reads every 16 bytes of x once; the sum goes to `sink` so that nothing is optimized away.
__global__ void read_all(const uint4* x, size_t n, Policy policy, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = load(x + i, policy);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Lowers every line of [p, p + bytes) that is in L2 to normal priority (no effect on lines that
// are not there).
__global__ void demote(const char* p, size_t bytes) {
  for (size_t off = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 128; off < bytes;
       off += size_t(gridDim.x) * blockDim.x * 128) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p + off));
  }
}

// A flush whose own lines are evict_last, so that they displace any evict_last line in the
// L2, then lowered to normal so that they do not hold the L2 against the timed kernel.
__global__ void write_evict_last(uint4* p, size_t n, unsigned value) {
  uint64_t hint;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(hint));
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %1, %1, %1}, %2;" ::"l"(p + i),
                 "r"(value), "l"(hint)
                 : "memory");
  }
}

// Reads every 16 bytes of p with an evict_last policy: a flush that leaves its lines clean.
__global__ void read_evict_last(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = load(p + i, Policy::evict_last);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Writes every 16 bytes of x with plain stores, as kforge's redraw of the inputs does.
__global__ void rewrite(uint4* x, size_t n, unsigned value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    x[i] = make_uint4(value, value, value, value);
  }
}

struct Probe {
  cudaStream_t stream;
  uint4* x;
  size_t x_bytes;
  char* flush;
  size_t flush_bytes;
  unsigned* sink;
  int blocks;
  cudaEvent_t start, stop;
  unsigned round = 0;

  void read(Policy policy) { read_all<<<blocks, 512, 0, stream>>>(x, x_bytes / 16, policy, sink); }
  void read_with_window(float hit_ratio) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeAccessPolicyWindow;
    attr.val.accessPolicyWindow.base_ptr = x;
    attr.val.accessPolicyWindow.num_bytes = x_bytes;
    attr.val.accessPolicyWindow.hitRatio = hit_ratio;
    attr.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr.val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(512);
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&config, read_all, static_cast<const uint4*>(x), x_bytes / 16,
                             Policy::normal, sink));
  }
  // kforge's flush (src/device/cuda_backend.cpp): a memset of twice the L2.
  void memset_flush() { CHECK(cudaMemsetAsync(flush, ++round & 0xff, flush_bytes, stream)); }
  void evict_last_flush() {
    write_evict_last<<<blocks, 512, 0, stream>>>(reinterpret_cast<uint4*>(flush), flush_bytes / 16,
                                                 ++round);
    demote<<<blocks, 512, 0, stream>>>(flush, flush_bytes);
  }
  // The address-independent candidates: evict_last lines of the flush buffer displace any
  // other evict_last line, are demoted, and the memset flush then leaves the usual state.
  void evict_last_read_flush() {
    read_evict_last<<<blocks, 512, 0, stream>>>(reinterpret_cast<const uint4*>(flush),
                                                flush_bytes / 16, sink);
    demote<<<blocks, 512, 0, stream>>>(flush, flush_bytes);
  }
  void rewrite_x() { rewrite<<<blocks, 512, 0, stream>>>(x, x_bytes / 16, ++round); }
  void demote_x() { demote<<<blocks, 512, 0, stream>>>(reinterpret_cast<char*>(x), x_bytes); }

  // Median over `reps` of the normal read of x, timed after `before` ran.
  double timed_read(const std::function<void()>& before, int reps = 21) {
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
      before();
      CHECK(cudaEventRecord(start, stream));
      read(Policy::normal);
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

int main(int argc, char** argv) {
  const size_t mb = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 16;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  Probe p{};
  CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
  p.x_bytes = mb << 20;
  p.flush_bytes = size_t(prop.l2CacheSize) * 2;
  CHECK(cudaMalloc(&p.x, p.x_bytes));
  CHECK(cudaMalloc(&p.flush, p.flush_bytes));
  CHECK(cudaMalloc(&p.sink, sizeof(unsigned)));
  CHECK(cudaMemset(p.x, 1, p.x_bytes));
  CHECK(cudaEventCreate(&p.start));
  CHECK(cudaEventCreate(&p.stop));
  p.blocks = prop.multiProcessorCount * 4;
  std::printf("%s, L2 %d MB, persisting L2 at most %d MB, window at most %d MB; x %zu MB\n",
              prop.name, prop.l2CacheSize >> 20, prop.persistingL2CacheMaxSize >> 20,
              prop.accessPolicyMaxWindowSize >> 20, mb);

  struct Row {
    const char* what;
    std::function<void()> before;
  };
  // The persisting rows mark as much of x as the L2 set aside for persisting lines holds: the
  // device's own set-aside in the first pass (some devices come up with one), the most it
  // allows in the second.
  const size_t carve = std::min<size_t>(prop.persistingL2CacheMaxSize, p.x_bytes);
  size_t set_aside = 0;
  CHECK(cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize));
  const std::vector<Row> rows = {
      {"cold: memset flush", [&] { p.memset_flush(); }},
      {"warm: normal read, no flush", [&] { p.read(Policy::normal); }},
      {"normal read, memset flush",
       [&] {
         p.read(Policy::normal);
         p.memset_flush();
       }},
      {"evict_first read, memset flush",
       [&] {
         p.read(Policy::evict_first);
         p.memset_flush();
       }},
      {"evict_last read, memset flush",
       [&] {
         p.read(Policy::evict_last);
         p.memset_flush();
       }},
      {"evict_last read, rewrite x, memset flush",
       [&] {
         p.read(Policy::evict_last);
         p.rewrite_x();
         p.memset_flush();
       }},
      {"evict_last read, demote x, memset flush",
       [&] {
         p.read(Policy::evict_last);
         p.demote_x();
         p.memset_flush();
       }},
      {"evict_last read, evict_last flush + demote",
       [&] {
         p.read(Policy::evict_last);
         p.evict_last_flush();
       }},
      {"cold: evict_last flush + demote", [&] { p.evict_last_flush(); }},
      {"evict_last read, reset persisting, memset flush",
       [&] {
         p.read(Policy::evict_last);
         CHECK(cudaStreamSynchronize(p.stream));
         CHECK(cudaCtxResetPersistingL2Cache());
         p.memset_flush();
       }},
      {"evict_last read, el write flush + demote, memset",
       [&] {
         p.read(Policy::evict_last);
         p.evict_last_flush();
         p.memset_flush();
       }},
      {"cold: el write flush + demote, memset",
       [&] {
         p.evict_last_flush();
         p.memset_flush();
       }},
      {"evict_last read, el read flush + demote, memset",
       [&] {
         p.read(Policy::evict_last);
         p.evict_last_read_flush();
         p.memset_flush();
       }},
      {"cold: el read flush + demote, memset",
       [&] {
         p.evict_last_read_flush();
         p.memset_flush();
       }},
      {"evict_last read, el read flush (no demote), memset",
       [&] {
         p.read(Policy::evict_last);
         read_evict_last<<<p.blocks, 512, 0, p.stream>>>(reinterpret_cast<const uint4*>(p.flush),
                                                         p.flush_bytes / 16, p.sink);
         p.memset_flush();
       }},
      {"persisting window, memset flush",
       [&] {
         p.read_with_window(std::min(1.0f, float(set_aside) / float(p.x_bytes)));
         p.memset_flush();
       }},
      {"persisting window, reset persisting, memset flush",
       [&] {
         p.read_with_window(std::min(1.0f, float(set_aside) / float(p.x_bytes)));
         CHECK(cudaStreamSynchronize(p.stream));
         CHECK(cudaCtxResetPersistingL2Cache());
         p.memset_flush();
       }},
      {"persisting window, el read flush + demote, memset",
       [&] {
         p.read_with_window(std::min(1.0f, float(set_aside) / float(p.x_bytes)));
         p.evict_last_read_flush();
         p.memset_flush();
       }},
      {"persisting window, evict_last flush + demote",
       [&] {
         p.read_with_window(std::min(1.0f, float(set_aside) / float(p.x_bytes)));
         p.evict_last_flush();
       }},
  };
  // Three passes: the device's own set-aside, the most it allows, none (where the reset of
  // persisting lines has nothing set aside to act on).
  for (int pass = 0; pass < 3; ++pass) {
    if (pass > 0) {
      CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, pass == 1 ? carve : 0));
      CHECK(cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize));
    }
    std::printf("\nwith %zu KB of L2 set aside for persisting lines%s\n", set_aside >> 10,
                pass == 0 ? " (the device's own)" : "");
    std::printf("%-52s %10s\n", "before the timed normal read of x", "median us");
    for (const Row& row : rows) {
      if (set_aside == 0 && std::string_view(row.what).starts_with("persisting window")) continue;
      std::printf("%-52s %10.2f\n", row.what, p.timed_read(row.before));
    }
  }
  return 0;
}
