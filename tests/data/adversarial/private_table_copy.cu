/* kforge
 * op: rotary_embedding
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: PRIVATE_COPY = 1 in {0, 1, 2}
 */
// Adversarial: keeps its own copy of the cos and sin tables, which kforge does not redraw
// between samples, in memory it allocated itself, and reads that copy with an L2 evict_last
// policy. kforge demotes the L2 lines of the buffers it knows of before the flush, not these, so
// only an address-independent step keeps the copy from staying in L2 across samples: the reset
// of persisting lines (cudaCtxResetPersistingL2Cache), which on an H100 returns evict_last lines
// to normal as well. `kforge bench` at 1x1x32768x128 (x and y 8 MB each in bf16, each table
// 4 MB), H100: with the reset taken out of kforge, 13.95 / 13.90 us against 15.52 / 15.49 with
// PRIVATE_COPY=0 (plain loads of the given tables); with it, 15.52 / 15.49 against 15.78 / 15.71.
// The GPU test L2Policy.PrivateCopyGainsNothing times the three modes: 0 reads the given
// tables, 1 its own copy evict_last (the cheat), 2 its own copy with plain loads (the control,
// so that the policy's gain is measured alone). Either copy is stale when a trap changes entries
// of the tables, so kforge's bench judges both WRONG; its check, whose calls are not captured,
// finds every copy fresh. PRIVATE_COPY=0 is an honest kernel, slower than the library's.
// expect: check=OK bench=WRONG tune=not-best
#include <algorithm>
#include <cstdint>

#include "kforge/elem_access.cuh"
#include "kforge/rotary.cuh"

namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float table_entry(const T* table, int64_t i, uint64_t policy) {
  if constexpr (PRIVATE_COPY == 1) {
    return kf_to_float(kf::load_with_policy<kf::L2Residency::keep>(table + i, policy));
  } else {
    return kf_to_float(table[i]);
  }
}

// One pair per thread: pair p of x uses table entry p mod (seq_len * half) in every head.
__global__ void __launch_bounds__(kThreads)
    rotate_pairs(const kf_elem* __restrict__ x,          // x: [batch, heads, seq_len, head_dim]
                 const kf_elem* __restrict__ cos_table,  // cos_table: [seq_len, head_dim / 2]
                 const kf_elem* __restrict__ sin_table,  // sin_table: [seq_len, head_dim / 2]
                 kf_elem* __restrict__ y,                // y: like x
                 int64_t pairs, int64_t table_entries) {
  const uint64_t policy = kf::l2_policy<kf::L2Residency::keep>();
  for (int64_t p = blockIdx.x * int64_t(kThreads) + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * kThreads) {
    const int64_t t = p % table_entries;
    float out_a, out_b;
    kf::rotate(kf_to_float(x[2 * p]), kf_to_float(x[2 * p + 1]), table_entry(cos_table, t, policy),
               table_entry(sin_table, t, policy), out_a, out_b);
    y[2 * p] = kf_from_float<kf_elem>(out_a);
    y[2 * p + 1] = kf_from_float<kf_elem>(out_b);
  }
}

// One private copy of a pair of tables, kept per place and shape. Copies are never freed: a
// captured call replayed later still reads its own.
struct TableCopy {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t seq_len = 0, half = 0;
  char* data = nullptr;
};
constexpr int kMaxCopies = 16;

// A copy of these tables; nullptr when none can be made. Every call that is not being captured
// copies them again: kforge draws each case's tables from a random starting position, and a new
// case's tables may sit where an old one's were. A captured call only reads the copy, so every
// sample of a timed run (a graph captured right after a first, plain call) reads the copy made by
// that first call.
const char* private_copy(const void* cos, const void* sin, int64_t seq_len, int64_t half,
                         cudaStream_t stream) {
  static TableCopy copies[kMaxCopies];
  static int used = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) return nullptr;
  const size_t bytes = size_t(seq_len * half) * sizeof(kf_elem);
  TableCopy* copy = nullptr;
  for (int i = 0; i < used && copy == nullptr; ++i) {
    const TableCopy& c = copies[i];
    if (c.cos == cos && c.sin == sin && c.seq_len == seq_len && c.half == half) copy = &copies[i];
  }
  if (capture != cudaStreamCaptureStatusNone) return copy != nullptr ? copy->data : nullptr;
  if (copy == nullptr) {
    if (used == kMaxCopies) return nullptr;
    TableCopy c{cos, sin, seq_len, half, nullptr};
    if (cudaMalloc(&c.data, 2 * bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    copies[used] = c;
    copy = &copies[used++];
  }
  cudaMemcpyAsync(copy->data, cos, bytes, cudaMemcpyDeviceToDevice, stream);
  cudaMemcpyAsync(copy->data + bytes, sin, bytes, cudaMemcpyDeviceToDevice, stream);
  return copy->data;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& cos = args->inputs[1];
  const int64_t pairs = kf_numel(&x) / 2, table_entries = kf_numel(&cos);
  if (pairs == 0 || table_entries == 0) return KF_OK;
  auto stream = static_cast<cudaStream_t>(args->stream);
  const void* cos_table = cos.data;
  const void* sin_table = args->inputs[2].data;
  if (PRIVATE_COPY != 0) {
    if (const char* copy = private_copy(cos_table, sin_table, cos.shape[0], cos.shape[1], stream)) {
      cos_table = copy;
      sin_table = copy + size_t(table_entries) * sizeof(kf_elem);
    }
  }
  // Sixteen blocks per SM at most; the grid-stride loop covers the rest. The SM count is asked
  // on the first call only.
  static int sms = 0;
  if (sms == 0) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return KF_ERR_LAUNCH;
    }
  }
  const auto blocks = unsigned(std::min<int64_t>((pairs + kThreads - 1) / kThreads, sms * 16));
  rotate_pairs<<<blocks, kThreads, 0, stream>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(cos_table),
      static_cast<const kf_elem*>(sin_table), static_cast<kf_elem*>(args->outputs[0].data), pairs,
      table_entries);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
