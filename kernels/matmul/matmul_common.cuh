// What the CUDA matmul files share: reading a call's tensors. Each file keeps its own idea,
// kernels and launch.
#ifndef KFORGE_MATMUL_COMMON_CUH_
#define KFORGE_MATMUL_COMMON_CUH_

#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

// A matmul call: C[M, N] = A[M, K] @ B[K, N], all row-major, in the compiled dtype.
struct MatmulCall {
  const kf_elem* a = nullptr;  // a: [M, K]
  const kf_elem* b = nullptr;  // b: [K, N]
  kf_elem* c = nullptr;        // c: [M, N]
  int64_t M = 0, N = 0, K = 0;
  cudaStream_t stream = nullptr;
};

bool is_matrix(const kf_tensor& t, int64_t rows, int64_t cols) {
  return t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols && t.dtype == kf_elem_dtype;
}

// Fills `call` from the ABI's arguments, or returns false for a call the files cannot take
// (KF_ERR_UNSUPPORTED): other tensor counts, shapes or dtypes, or extents past INT32_MAX / 2
// (int indices with room for a tile past the end).
bool read_matmul_call(const kf_args* args, MatmulCall& call) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return false;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 0) return false;
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const kf_tensor& c = args->outputs[0];
  if (a.ndim != 2 || b.ndim != 2) return false;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (!is_matrix(a, M, K) || !is_matrix(b, K, N) || !is_matrix(c, M, N)) return false;
  constexpr int64_t kMaxExtent = INT32_MAX / 2;
  if (M > kMaxExtent || N > kMaxExtent || K > kMaxExtent) return false;
  call = {static_cast<const kf_elem*>(a.data),
          static_cast<const kf_elem*>(b.data),
          static_cast<kf_elem*>(c.data),
          M,
          N,
          K,
          static_cast<cudaStream_t>(args->stream)};
  return true;
}

}  // namespace

#endif  // KFORGE_MATMUL_COMMON_CUH_
