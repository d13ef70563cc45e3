// What the CUDA fused_mlp files share: reading a call's tensors. Each file keeps its own idea,
// kernels and launch.
#ifndef KFORGE_FUSED_MLP_COMMON_CUH_
#define KFORGE_FUSED_MLP_COMMON_CUH_

#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

// A fused_mlp call: y = (silu(x w_gate^T) * (x w_up^T)) w_down^T, all row-major, in the
// compiled dtype.
struct MlpCall {
  const kf_elem* x = nullptr;       // x: [batch, dim]
  const kf_elem* w_gate = nullptr;  // w_gate: [hidden, dim]
  const kf_elem* w_up = nullptr;    // w_up: [hidden, dim]
  const kf_elem* w_down = nullptr;  // w_down: [dim, hidden]
  kf_elem* y = nullptr;             // y: [batch, dim]
  int batch = 0, dim = 0, hidden = 0;
  cudaStream_t stream = nullptr;
};

bool is_matrix(const kf_tensor& t, int64_t rows, int64_t cols) {
  return t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols && t.dtype == kf_elem_dtype;
}

// Fills `call` from the ABI's arguments, or returns false for a call the files cannot take
// (KF_ERR_UNSUPPORTED): other tensor counts, shapes or dtypes, or extents past INT32_MAX / 2
// (int indices with room for a tile past the end).
bool read_mlp_call(const kf_args* args, MlpCall& call) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return false;
  if (args->num_inputs != 4 || args->num_outputs != 1 || args->num_scalars != 0) return false;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& w_gate = args->inputs[1];
  const kf_tensor& w_up = args->inputs[2];
  const kf_tensor& w_down = args->inputs[3];
  const kf_tensor& y = args->outputs[0];
  if (x.ndim != 2 || w_gate.ndim != 2) return false;
  const int64_t batch = x.shape[0], dim = x.shape[1], hidden = w_gate.shape[0];
  if (!is_matrix(x, batch, dim) || !is_matrix(w_gate, hidden, dim) ||
      !is_matrix(w_up, hidden, dim) || !is_matrix(w_down, dim, hidden) ||
      !is_matrix(y, batch, dim)) {
    return false;
  }
  constexpr int64_t kMaxExtent = INT32_MAX / 2;
  if (batch > kMaxExtent || dim > kMaxExtent || hidden > kMaxExtent) return false;
  call = {static_cast<const kf_elem*>(x.data),
          static_cast<const kf_elem*>(w_gate.data),
          static_cast<const kf_elem*>(w_up.data),
          static_cast<const kf_elem*>(w_down.data),
          static_cast<kf_elem*>(y.data),
          static_cast<int>(batch),
          static_cast<int>(dim),
          static_cast<int>(hidden),
          static_cast<cudaStream_t>(args->stream)};
  return true;
}

}  // namespace

#endif  // KFORGE_FUSED_MLP_COMMON_CUH_
