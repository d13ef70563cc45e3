// The CUDA backend: one device, one stream, events for timing, a scratch buffer twice the L2
// size for cold-cache samples, NVML for clock monitoring and cuBLAS for the matmul ceiling.
#include <chrono>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/statistics.h"
#include "device/backend.h"
#include "device/cuda_check.h"
#include "device/nvml_clock.h"

namespace kforge {
namespace {

std::string format_uuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}"
      "{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

std::string version_text(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

DeviceInfo query_device(int index) {
  cudaDeviceProp p{};
  KF_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.backend = "cuda";
  d.index = index;
  d.name = p.name;
  d.uuid = format_uuid(p.uuid);
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  d.l2_bytes = p.l2CacheSize;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  d.max_shared_per_block = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  d.max_shared_per_sm = static_cast<int64_t>(p.sharedMemPerMultiprocessor);
  d.regs_per_sm = p.regsPerMultiprocessor;
  d.regs_per_block = p.regsPerBlock;
  d.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  d.max_blocks_per_sm = p.maxBlocksPerMultiProcessor;
  d.reserved_shared_per_block = static_cast<int64_t>(p.reservedSharedMemPerBlock);
  d.warp_size = p.warpSize;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  d.driver_version = version_text(driver);
  d.runtime_version = version_text(runtime);
  return d;
}

// Maps a CUDA error raised by device code or a launch to the exception the worker reports.
[[noreturn]] void raise_device_error(cudaError_t err, const char* where) {
  const std::string what =
      fmt::format("{}: {} ({})", where, cudaGetErrorName(err), cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) throw OutOfMemory(what);
  throw KernelFault(what);
}

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : info_(query_device(device)), clock_(info_.uuid) {
    KF_CUDA_CHECK(cudaSetDevice(device));
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KF_CUDA_CHECK(cudaEventCreate(&start_));
    KF_CUDA_CHECK(cudaEventCreate(&stop_));
    flush_bytes_ = static_cast<size_t>(std::max<int64_t>(info_.l2_bytes, 1 << 20)) * 2;
    KF_CUDA_CHECK(cudaMalloc(&flush_, flush_bytes_));
    info_.max_sm_clock_mhz = clock_.max_sm_clock_mhz();
  }

  ~CudaBackend() override {
    cudaFree(flush_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  const DeviceInfo& info() const override { return info_; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (err != cudaSuccess) {
      cudaGetLastError();  // allocation failures are not sticky; clear it
      throw OutOfMemory(fmt::format("cudaMalloc({} bytes): {}", bytes, cudaGetErrorString(err)));
    }
    return p;
  }
  void release(void* ptr) noexcept override { cudaFree(ptr); }

  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    synchronize();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    synchronize();
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }
  void* stream() override { return stream_; }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "synchronize"); }
  void check_launch() override { check(cudaGetLastError(), "launch"); }

  double time_once(const std::function<void()>& launch, bool cold_cache) override {
    // The flush keeps the GPU busy while the events and the launch are queued behind it, so the
    // launch latency of the host stays out of the measured interval.
    if (cold_cache)
      check(cudaMemsetAsync(flush_, ++flush_round_ & 0xff, flush_bytes_, stream_), "flush");
    check(cudaEventRecord(start_, stream_), "event");
    launch();
    check_launch();
    check(cudaEventRecord(stop_, stream_), "event");
    check(cudaEventSynchronize(stop_), "kernel");
    float ms = 0;
    KF_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

  ClockReading read_clock() override { return clock_.read(); }

  nlohmann::json measure_ceilings() override {
    nlohmann::json out;
    measure_copy(out);
    measure_matmul(out);
    return out;
  }

 private:
  void check(cudaError_t err, const char* where) {
    if (err != cudaSuccess) raise_device_error(err, where);
  }

  SampleStats sample(const std::function<void()>& launch, bool cold_cache) {
    StoppingRule rule;
    rule.min_samples = 10;
    rule.max_seconds = 5;
    for (int i = 0; i < 3; ++i)
      time_once(launch, cold_cache);  // warm-up
    std::vector<double> samples;
    std::string reason;
    const auto start = std::chrono::steady_clock::now();
    do {
      samples.push_back(time_once(launch, cold_cache));
    } while (!rule.should_stop(
        samples, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        &reason));
    return summarize(samples);
  }

  void measure_copy(nlohmann::json& out) {
    // 1 GiB each way: far beyond L2, long enough that launch costs vanish.
    const size_t bytes = size_t{1} << 30;
    void* a = allocate(bytes);
    void* b = allocate(bytes);
    KF_CUDA_CHECK(cudaMemsetAsync(a, 0x5a, bytes, stream_));
    const SampleStats s = sample([&] { copy_on_device(b, a, bytes); }, false);
    release(a);
    release(b);
    out["copy_bytes"] = 2 * bytes;
    out["copy_ms"] = s.median;
    out["copy_gbps"] = 2.0 * static_cast<double>(bytes) / (s.median * 1e6);
    out["copy_rel_noise"] = s.rel_noise;
  }

  void measure_matmul(nlohmann::json& out) {
    // bf16 8192^3 with fp32 accumulation, on random data (zeros run measurably faster).
    const int n = 8192;
    const size_t elems = size_t{n} * n;
    std::vector<__nv_bfloat16> host(elems);
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& v : host)
      v = __float2bfloat16(normal(rng));
    auto* a = static_cast<__nv_bfloat16*>(allocate(elems * 2));
    auto* b = static_cast<__nv_bfloat16*>(allocate(elems * 2));
    auto* c = static_cast<__nv_bfloat16*>(allocate(elems * 2));
    copy_to_device(a, host.data(), elems * 2);
    copy_to_device(b, host.data(), elems * 2);
    cublasHandle_t handle = nullptr;
    KF_CUBLAS_CHECK(cublasCreate(&handle));
    KF_CUBLAS_CHECK(cublasSetStream(handle, stream_));
    const float alpha = 1.f, beta = 0.f;
    const SampleStats s = sample(
        [&] {
          KF_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                                       CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        false);
    cublasDestroy(handle);
    release(a);
    release(b);
    release(c);
    out["matmul_shape"] = "8192x8192x8192 bf16, fp32 accumulate (cuBLAS)";
    out["matmul_ms"] = s.median;
    out["matmul_tflops"] = 2.0 * n * double(n) * n / (s.median * 1e9);
    out["matmul_rel_noise"] = s.rel_noise;
  }

  DeviceInfo info_;
  NvmlClock clock_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  unsigned flush_round_ = 0;
};

}  // namespace

std::vector<DeviceInfo> list_cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i)
    devices.push_back(query_device(i));
  return devices;
}

std::unique_ptr<DeviceBackend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace kforge
