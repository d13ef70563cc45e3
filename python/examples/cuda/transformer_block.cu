// A transformer block in plain CUDA C++: the workload `kforge profile` is shown and tested on.
//
// Each iteration runs, on device buffers of fp32 activations (T tokens of width D, FFN width F):
//   h      = rmsnorm(x) * w_norm              rmsnorm_kernel        x, h: [T, D]
//   q      = h @ w_q                          matmul_tiled_kernel   w_q: [D, D]
//   scores = (q @ h^T) / sqrt(D)              matmul_tiled_kernel   scores: [T, T]
//   probs  = softmax(scores) per row          softmax_rows_kernel   (in place)
//   attn   = probs @ h                        matmul_tiled_kernel   attn: [T, D]
//   gu     = attn @ w_up                      matmul_tiled_kernel   w_up: [D, 2F], gu: [T, 2F]
//   g      = silu(gu[:, :F]) * gu[:, F:]      swiglu_kernel         g: [T, F]
//   y      = g @ w_down                       matmul_tiled_kernel   w_down: [F, D], y: [T, D]
// that is 8 kernels, inside an NVTX range "step". The first --warmup iterations warm up; the
// next --iters are timed with CUDA events, printed as `gpu_time_ms=<value>`.
//
//   kforge_example_cuda --iters 10 --warmup 2 [--tokens 512 --dim 1024 --ffn 2816]
//   kforge profile --range step --skip 2 -- kforge_example_cuda --iters 10 --warmup 2
//
// --exit-code N and --abort end the program that way after the work, to test that a profile
// is still written when a program fails.
#include <nvtx3/nvToolsExt.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                        \
  do {                                                                          \
    const cudaError_t err_ = (call);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                                   \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

constexpr int kTile = 16;         // matmul tile: kTile x kTile outputs per block
constexpr int kRowThreads = 256;  // threads per row in the row-wise kernels

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w. One block per row.
__global__ void rmsnorm_kernel(const float* x, const float* w, float* y, int cols, float eps) {
  __shared__ float partial[kRowThreads];
  const float* row = x + static_cast<size_t>(blockIdx.x) * cols;
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    sum += row[c] * row[c];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / cols + eps);
  float* out = y + static_cast<size_t>(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = row[c] * scale * w[c];
}

// c[m, n] = alpha * sum_k a[m, k] * b(k, n), with b(k, n) = b[k * b_k_stride + n * b_n_stride]
// (so b may be a transposed view). Plain shared-memory tiling, one output per thread.
__global__ void matmul_tiled_kernel(const float* a, const float* b, float* c, int m, int n, int k,
                                    int b_k_stride, int b_n_stride, float alpha) {
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    const int ak = k0 + threadIdx.x;
    const int bk = k0 + threadIdx.y;
    a_tile[threadIdx.y][threadIdx.x] =
        row < m && ak < k ? a[static_cast<size_t>(row) * k + ak] : 0.f;
    b_tile[threadIdx.y][threadIdx.x] =
        bk < k && col < n
            ? b[static_cast<size_t>(bk) * b_k_stride + static_cast<size_t>(col) * b_n_stride]
            : 0.f;
    __syncthreads();
    for (int i = 0; i < kTile; ++i)
      acc += a_tile[threadIdx.y][i] * b_tile[i][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[static_cast<size_t>(row) * n + col] = alpha * acc;
}

// x[r, :] = softmax(x[r, :]), in place. One block per row.
__global__ void softmax_rows_kernel(float* x, int cols) {
  __shared__ float partial[kRowThreads];
  float* row = x + static_cast<size_t>(blockIdx.x) * cols;
  float row_max = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    row_max = fmaxf(row_max, row[c]);
  partial[threadIdx.x] = row_max;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  row_max = partial[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float e = __expf(row[c] - row_max);
    row[c] = e;
    sum += e;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inverse = 1.f / partial[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    row[c] *= inverse;
}

// g[r, j] = silu(gu[r, j]) * gu[r, ffn + j]; gu: [rows, 2 * ffn], g: [rows, ffn].
__global__ void swiglu_kernel(const float* gate_up, float* g, int rows, int ffn) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * ffn) return;
  const size_t r = i / ffn;
  const size_t j = i % ffn;
  const float gate = gate_up[r * 2 * ffn + j];
  const float up = gate_up[r * 2 * ffn + ffn + j];
  g[i] = gate / (1.f + __expf(-gate)) * up;
}

namespace {

struct Options {
  int iters = 10;
  int warmup = 2;
  int tokens = 512;
  int dim = 1024;
  int ffn = 2816;
  int exit_code = 0;
  bool abort_at_end = false;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (arg == "--iters") {
      o.iters = value();
    } else if (arg == "--warmup") {
      o.warmup = value();
    } else if (arg == "--tokens") {
      o.tokens = value();
    } else if (arg == "--dim") {
      o.dim = value();
    } else if (arg == "--ffn") {
      o.ffn = value();
    } else if (arg == "--exit-code") {
      o.exit_code = value();
    } else if (arg == "--abort") {
      o.abort_at_end = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--warmup W] [--tokens T] [--dim D] [--ffn F] "
                   "[--exit-code N] [--abort]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  if (o.iters < 1 || o.warmup < 0 || o.tokens < 1 || o.dim < 1 || o.ffn < 1) {
    std::fprintf(stderr, "sizes and --iters must be positive, --warmup not negative\n");
    std::exit(2);
  }
  return o;
}

// Deterministic inputs in [-scale, scale).
std::vector<float> filled(size_t count, float scale, unsigned seed) {
  std::vector<float> v(count);
  unsigned state = seed;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(state >> 8) / 8388608.f - 1.f);
  }
  return v;
}

float* device_copy(const std::vector<float>& host) {
  float* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return device;
}

float* device_buffer(size_t count) {
  float* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, count * sizeof(float)));
  return device;
}

// c[m, n] = alpha * a[m, k] @ b, b read through (b_k_stride, b_n_stride).
void matmul(const float* a, const float* b, float* c, int m, int n, int k, int b_k_stride,
            int b_n_stride, float alpha) {
  const dim3 block(kTile, kTile);
  const dim3 grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
  matmul_tiled_kernel<<<grid, block>>>(a, b, c, m, n, k, b_k_stride, b_n_stride, alpha);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  const int t = o.tokens;
  const int d = o.dim;
  const int f = o.ffn;
  CHECK_CUDA(cudaFree(nullptr));  // initialize CUDA before the first NVTX range

  float* x = device_copy(filled(static_cast<size_t>(t) * d, 1.f, 1));
  float* w_norm = device_copy(filled(d, 1.f, 2));
  const float weight_scale = 1.f / std::sqrt(static_cast<float>(d));
  float* w_q = device_copy(filled(static_cast<size_t>(d) * d, weight_scale, 3));
  float* w_up = device_copy(filled(static_cast<size_t>(d) * 2 * f, weight_scale, 4));
  float* w_down =
      device_copy(filled(static_cast<size_t>(f) * d, 1.f / std::sqrt(static_cast<float>(f)), 5));
  float* h = device_buffer(static_cast<size_t>(t) * d);
  float* q = device_buffer(static_cast<size_t>(t) * d);
  float* scores = device_buffer(static_cast<size_t>(t) * t);
  float* attn = device_buffer(static_cast<size_t>(t) * d);
  float* gate_up = device_buffer(static_cast<size_t>(t) * 2 * f);
  float* g = device_buffer(static_cast<size_t>(t) * f);
  float* y = device_buffer(static_cast<size_t>(t) * d);

  const auto step = [&]() {
    nvtxRangePushA("step");
    rmsnorm_kernel<<<t, kRowThreads>>>(x, w_norm, h, d, 1e-6f);
    matmul(h, w_q, q, t, d, d, d, 1, 1.f);
    matmul(q, h, scores, t, t, d, 1, d, 1.f / std::sqrt(static_cast<float>(d)));  // h^T
    softmax_rows_kernel<<<t, kRowThreads>>>(scores, t);
    matmul(scores, h, attn, t, d, t, d, 1, 1.f);
    matmul(attn, w_up, gate_up, t, 2 * f, d, 2 * f, 1, 1.f);
    const size_t elements = static_cast<size_t>(t) * f;
    swiglu_kernel<<<static_cast<unsigned>((elements + 255) / 256), 256>>>(gate_up, g, t, f);
    matmul(g, w_down, y, t, d, f, d, 1, 1.f);
    nvtxRangePop();
  };

  for (int i = 0; i < o.warmup; ++i)
    step();
  CHECK_CUDA(cudaGetLastError());
  // No synchronization after the warm-up: the timed work queues up behind it, so the GPU has
  // no idle gap between the events.
  cudaEvent_t start;
  cudaEvent_t stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < o.iters; ++i)
    step();
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  CHECK_CUDA(cudaGetLastError());
  float ms = 0.f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));

  std::vector<float> result(static_cast<size_t>(t) * d);
  CHECK_CUDA(cudaMemcpy(result.data(), y, result.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double checksum = 0;
  for (const float v : result)
    checksum += v;
  std::printf("iters=%d warmup=%d tokens=%d dim=%d ffn=%d kernels_per_iter=8\n", o.iters, o.warmup,
              t, d, f);
  std::printf("checksum=%.6e\n", checksum);
  std::printf("gpu_time_ms=%.4f\n", ms);
  std::fflush(stdout);

  if (o.abort_at_end) std::abort();
  for (float* p : {x, w_norm, w_q, w_up, w_down, h, q, scores, attn, gate_up, g, y})
    CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return o.exit_code;
}
