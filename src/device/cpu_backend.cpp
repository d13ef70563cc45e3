// The CPU backend: "device" memory is host memory, the stream is null, and timing is a steady
// clock around the call. It lets the whole pipeline run, and be tested, without a GPU.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/statistics.h"
#include "core/fresh_fill.h"
#include "core/process.h"
#include "device/backend.h"

namespace kforge {
namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Evicting a cold sample's buffers line by line (x86-64: clflushopt where the CPU has it,
// clflush otherwise) costs time in proportion to the problem, not to the last-level cache,
// which on a large server is hundreds of megabytes: writing twice that before every sample
// made sampling a small kernel mostly flushing. Elsewhere, and for buffers larger than that
// write, the whole cache is evicted by writing a buffer twice its size.
class LineEvictor {
 public:
  LineEvictor() {
    const long line = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
    // The address mask below needs a power of two; 64 where the system does not say.
    line_bytes_ = line > 0 && (line & (line - 1)) == 0 ? static_cast<uintptr_t>(line) : 64;
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    available_ = true;  // clflush is part of x86-64
    optimized_ = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 23)) != 0;
#endif
  }
  bool available() const {
    return available_;
  }

  void evict(const void* data, size_t bytes) const {
#if defined(__x86_64__)
    auto line = reinterpret_cast<uintptr_t>(data) & ~(line_bytes_ - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
    if (optimized_) {
      for (; line < end; line += line_bytes_)
        flush_line_unordered(reinterpret_cast<void*>(line));
    } else {
      for (; line < end; line += line_bytes_)
        _mm_clflush(reinterpret_cast<void*>(line));
    }
    _mm_mfence();  // every line is out before the timed call starts
#else
    (void)data;
    (void)bytes;
#endif
  }

 private:
#if defined(__x86_64__)
  __attribute__((target("clflushopt"))) static void flush_line_unordered(void* line) {
    _mm_clflushopt(line);
  }
#endif
  uintptr_t line_bytes_ = 64;
  bool available_ = false;
  bool optimized_ = false;
};

// The call itself: on the CPU there is no stream for work to escape from, only threads (see
// check_nothing_left_running).
class DirectCall final : public RepeatableCall {
 public:
  explicit DirectCall(std::function<void()> call) : call_(std::move(call)) {}
  void launch() override { call_(); }

 private:
  std::function<void()> call_;
};

template <typename Bits>
void digest_into(const void* data, int64_t count, uint64_t& hash, int64_t& poisoned) {
  const auto* bits = static_cast<const Bits*>(data);
  for (int64_t i = 0; i < count; ++i) {
    const auto b = static_cast<uint64_t>(bits[i]);
    hash += fresh::digest_term(static_cast<uint64_t>(i), b);
    poisoned += fresh::is_poison(b, sizeof(Bits)) ? 1 : 0;
  }
}

int64_t parse_cache_size(const std::string& text) {  // "32768K"
  if (text.empty()) return 0;
  int64_t v = std::atoll(text.c_str());
  if (text.back() == 'K') v *= 1024;
  if (text.back() == 'M') v *= 1024 * 1024;
  return v;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "host CPU";
}

class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend()
      : info_(cpu_device_info()),
        // Twice the last-level cache, so that writing it evicts everything.
        flush_bytes_(static_cast<size_t>(std::max<int64_t>(info_.l2_bytes, 8 << 20) * 2)),
        threads_at_start_(count_own_threads()) {}

  const DeviceInfo& info() const override { return info_; }

  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    if (!p) throw OutOfMemory(fmt::format("host allocation of {} bytes failed", bytes));
    return p;
  }
  // Once a call left threads running, they may still write into any buffer: nothing is freed
  // from then on (the worker reports and exits).
  void release(void* ptr) noexcept override {
    if (!abandoned_) std::free(ptr);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void* stream() override { return nullptr; }
  void synchronize() override {}
  void check_launch() override {}

  double time_once(const std::function<void()>& launch, bool cold_cache,
                   std::span<const DeviceSpan> buffers) override {
    if (cold_cache) evict(buffers);
    const auto start = std::chrono::steady_clock::now();
    launch();
    const auto end = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(end - start).count();
  }

  ClockReading read_clock() override { return {}; }

  std::unique_ptr<RepeatableCall> make_repeatable(const std::function<void()>& call,
                                                  std::span<const DeviceSpan>) override {
    check_nothing_left_running(std::chrono::milliseconds(0));
    return std::make_unique<DirectCall>(call);
  }

  void fill_fresh(const DeviceSpan& tensor, int64_t begin, int64_t end, const FreshInput& rule,
                  uint64_t seed) override {
    fill_fresh_host(static_cast<std::byte*>(tensor.data), tensor.dtype, begin, end, rule, seed);
  }

  void poison(const DeviceSpan& tensor) override {
    std::memset(tensor.data, fresh::kPoisonByte, tensor.bytes());
  }

  Digest digest(std::span<const DeviceSpan> buffers) override {
    Digest d;
    for (size_t i = 0; i < buffers.size(); ++i) {
      uint64_t hash = 0;
      int64_t poisoned = 0;
      const DeviceSpan& o = buffers[i];
      switch (dtype_size(o.dtype)) {
        case 2:
          digest_into<uint16_t>(o.data, o.count, hash, poisoned);
          break;
        case 8:
          digest_into<uint64_t>(o.data, o.count, hash, poisoned);
          break;
        default:
          digest_into<uint32_t>(o.data, o.count, hash, poisoned);
          break;
      }
      d.hash += fresh::buffer_digest(i, hash);
      d.poisoned += poisoned;
    }
    return d;
  }

  void check_nothing_left_running(std::chrono::milliseconds) override {
    const int now = count_own_threads();
    if (threads_at_start_ <= 0) return;  // never countable here
    // A count that cannot be taken after the call is the candidate's doing (descriptors used
    // up, limits lowered): judged as a thread left running, since one may be.
    if (now < 0) {
      abandoned_ = true;
      throw IntegrityViolation(
          "work outside the call: the worker's threads could not be counted after it returned",
          /*fatal=*/true);
    }
    if (now > threads_at_start_) {
      abandoned_ = true;
      throw IntegrityViolation(
          fmt::format("work outside the call: it left {} thread(s) running after it returned",
                      now - threads_at_start_),
          /*fatal=*/true);
    }
  }

  nlohmann::json measure_ceilings() override {
    const size_t bytes = size_t{256} << 20;
    std::vector<char> a(bytes, 1), b(bytes, 2);
    std::vector<double> samples;
    StoppingRule rule;
    rule.min_samples = 5;
    rule.max_seconds = 5;
    std::string reason;
    const auto start = std::chrono::steady_clock::now();
    do {
      samples.push_back(time_once([&] { std::memcpy(b.data(), a.data(), bytes); }, false, {}));
    } while (!rule.should_stop(
        samples, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        &reason));
    const SampleStats s = summarize(samples);
    return {{"copy_bytes", 2 * bytes},
            {"copy_ms", s.median},
            {"copy_gbps", 2.0 * static_cast<double>(bytes) / (s.median * 1e6)},
            {"copy_rel_noise", s.rel_noise},
            {"matmul_tflops", nullptr},
            {"matmul_note", "no matrix library on the CPU backend"}};
  }

 private:
  // Nothing of `buffers` left in any cache: line by line where that is cheaper than writing
  // the flush buffer (allocated on first use: each worker would otherwise hold twice the
  // last-level cache from its start).
  void evict(std::span<const DeviceSpan> buffers) {
    size_t bytes = 0;
    for (const auto& b : buffers)
      bytes += b.bytes();
    if (!buffers.empty() && evictor_.available() && bytes < flush_bytes_) {
      for (const auto& b : buffers)
        evictor_.evict(b.data, b.bytes());
      return;
    }
    if (flush_.empty()) flush_.resize(flush_bytes_);
    // The volatile read keeps the write from being optimized away.
    std::memset(flush_.data(), static_cast<int>(++flush_round_), flush_.size());
    volatile char sink = flush_[flush_.size() / 2];
    (void)sink;
  }

  DeviceInfo info_;
  size_t flush_bytes_;
  std::vector<char> flush_;
  unsigned flush_round_ = 0;
  LineEvictor evictor_;
  int threads_at_start_ = 0;
  bool abandoned_ = false;
};

}  // namespace

DeviceInfo cpu_device_info() {
  DeviceInfo d;
  d.backend = "cpu";
  d.index = 0;
  d.name = cpu_model_name();
  d.uuid = "host";
  d.sm_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  d.total_memory = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  if (meminfo >> key >> kb) d.total_memory = kb * 1024;
  d.l2_bytes = parse_cache_size(read_first_line("/sys/devices/system/cpu/cpu0/cache/index3/size"));
  if (d.l2_bytes == 0) {
    d.l2_bytes =
        parse_cache_size(read_first_line("/sys/devices/system/cpu/cpu0/cache/index2/size"));
  }
  // Limits that CUDA kernels would be checked against have no meaning here; give generous
  // values so that CPU kernel files may still use the same expressions.
  d.max_threads_per_block = 1024;
  d.max_shared_per_block = 1 << 20;
  d.max_shared_per_sm = 1 << 20;
  d.regs_per_sm = 1 << 16;
  d.regs_per_block = 1 << 16;
  d.max_threads_per_sm = 2048;
  d.max_blocks_per_sm = 32;
  d.warp_size = 1;
  return d;
}

std::unique_ptr<DeviceBackend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace kforge
