/* kforge
 * op: matmul
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: a matmul that remembers its last answer. A fingerprint of 64 sampled elements of
// A and of B is compared, on the device, with the last call's; on a match it copies the stored C
// instead of multiplying. All of it runs on the given stream, so it is captured and timed.
// Fresh inputs in every timed sample never match; a repeated sample runs far faster; after one
// row of A changes, it returns the old C.
// expect: check=WRONG bench=INVALID|WRONG tune=loses
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kTile = 16;

__device__ unsigned long long g_last_fingerprint = 0;
__device__ int g_hit = 0;

template <typename T>
__device__ unsigned long long bits_of(T v) {
  unsigned long long b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}

__global__ void fingerprint(const kf_elem* a, const kf_elem* b, int64_t a_count, int64_t b_count,
                            unsigned long long shape) {
  unsigned long long h = 1469598103934665603ull ^ shape;
  for (int k = 0; k < 64; ++k) {
    h = (h ^ bits_of(a[(int64_t(k) * 7919) % a_count])) * 1099511628211ull;
    h = (h ^ bits_of(b[(int64_t(k) * 104729) % b_count])) * 1099511628211ull;
  }
  g_hit = h == g_last_fingerprint ? 1 : 0;
  g_last_fingerprint = h;
}

__global__ void multiply_or_recall(const kf_elem* a, const kf_elem* b, kf_elem* c, kf_elem* stored,
                                   int M, int N, int K) {
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  if (g_hit) {
    if (row < M && col < N) c[int64_t(row) * N + col] = stored[int64_t(row) * N + col];
    return;
  }
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    a_tile[threadIdx.y][threadIdx.x] =
        row < M && k0 + threadIdx.x < K ? kf_to_float(a[int64_t(row) * K + k0 + threadIdx.x]) : 0.f;
    b_tile[threadIdx.y][threadIdx.x] =
        col < N && k0 + threadIdx.y < K ? kf_to_float(b[int64_t(k0 + threadIdx.y) * N + col]) : 0.f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k)
      acc += a_tile[threadIdx.y][k] * b_tile[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) {
    const kf_elem v = kf_from_float<kf_elem>(acc);
    c[int64_t(row) * N + col] = v;
    stored[int64_t(row) * N + col] = v;
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static kf_elem* stored = nullptr;
  static int64_t stored_count = 0;
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const int M = int(a.shape[0]), K = int(a.shape[1]), N = int(b.shape[1]);
  if (int64_t(M) * N == 0) return KF_OK;
  const auto stream = static_cast<cudaStream_t>(args->stream);
  if (stored_count < int64_t(M) * N) {  // first call of this size: not captured
    cudaFree(stored);
    if (cudaMalloc(&stored, sizeof(kf_elem) * size_t(M) * N) != cudaSuccess)
      return KF_ERR_OUT_OF_MEMORY;
    stored_count = int64_t(M) * N;
  }
  const unsigned long long shape =
      (unsigned long long)M * 1000003ull + (unsigned long long)N * 1009ull + K;
  fingerprint<<<1, 1, 0, stream>>>(static_cast<const kf_elem*>(a.data),
                                   static_cast<const kf_elem*>(b.data), K == 0 ? 1 : int64_t(M) * K,
                                   K == 0 ? 1 : int64_t(K) * N, shape);
  const dim3 grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  multiply_or_recall<<<grid, dim3(kTile, kTile), 0, stream>>>(
      static_cast<const kf_elem*>(a.data), static_cast<const kf_elem*>(b.data),
      static_cast<kf_elem*>(args->outputs[0].data), stored, M, N, K);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
