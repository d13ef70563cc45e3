/* kforge
 * op: fused_mlp
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: ROW_BLOCK = 8 in {1, 2, 4, 8, 16}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// SwiGLU MLP y = (silu(x W_gate^T) * (x W_up^T)) W_down^T on the CPU, single-threaded.
//
// Idea: rows of x are taken ROW_BLOCK at a time. For each hidden unit j, the weight rows
// W_gate[j, :] and W_up[j, :] are converted to acc_t once and dotted with every row of the
// block, giving act[r, j] = silu(gate) * up; then for each output column c, W_down[c, :] is
// converted once and dotted with every act row. Every dot product runs over two contiguous
// rows, and converting each weight row once per block makes element conversion cost
// 1 / ROW_BLOCK of the multiply-adds. The hidden activation stays in acc_t and is never rounded
// to the element type, as in a fused kernel. fp32 accumulates in double (1e-4 tolerance, sums
// over dim and hidden reaching 13824 terms); fp16 and bf16 accumulate in float. Dot products
// use UNROLL independent partial sums added in a fixed order, so results are deterministic.
//
// Tunables:
//   ROW_BLOCK  rows of x that share each converted weight row.
//   UNROLL     independent partial sums per dot product.
#include <cmath>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

int64_t min_i64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

void row_to_acc(const kf_elem* row, int64_t n, acc_t* out) {  // row, out: [n]
  for (int64_t i = 0; i < n; ++i) {
    out[i] = kf_to_float(row[i]);
  }
}

acc_t dot(const acc_t* u, const acc_t* v, int64_t n) {  // u, v: [n]
  acc_t partial[UNROLL] = {};
  int64_t i = 0;
  for (; i + UNROLL <= n; i += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      partial[k] += u[i + k] * v[i + k];
    }
  }
  for (; i < n; ++i) {
    partial[0] += u[i] * v[i];
  }
  acc_t total = 0;
  for (int k = 0; k < UNROLL; ++k) {
    total += partial[k];
  }
  return total;
}

// silu(g) = g * sigmoid(g); for very negative g, exp(-g) overflows to inf and the result is -0.
acc_t silu(acc_t g) {
  return g / (acc_t(1) + std::exp(-g));
}

bool has_shape(const kf_tensor& t, int64_t rows, int64_t cols) {
  return t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 4 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& w_gate = args->inputs[1];
  const kf_tensor& w_up = args->inputs[2];
  const kf_tensor& w_down = args->inputs[3];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || w_gate.dtype != kf_elem_dtype || w_up.dtype != kf_elem_dtype ||
      w_down.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim != 2 || w_gate.ndim != 2) return KF_ERR_UNSUPPORTED;
  const int64_t batch = x.shape[0], dim = x.shape[1], hidden = w_gate.shape[0];
  if (!has_shape(w_gate, hidden, dim) || !has_shape(w_up, hidden, dim) ||
      !has_shape(w_down, dim, hidden) || !has_shape(y, batch, dim)) {
    return KF_ERR_UNSUPPORTED;
  }

  const auto* x_data = static_cast<const kf_elem*>(x.data);          // x: [batch, dim]
  const auto* gate_data = static_cast<const kf_elem*>(w_gate.data);  // w_gate: [hidden, dim]
  const auto* up_data = static_cast<const kf_elem*>(w_up.data);      // w_up: [hidden, dim]
  const auto* down_data = static_cast<const kf_elem*>(w_down.data);  // w_down: [dim, hidden]
  auto* y_data = static_cast<kf_elem*>(y.data);                      // y: [batch, dim]

  // Scratch in acc_t, kept between calls so that only larger problems allocate:
  //   x_block: [ROW_BLOCK, dim], act: [ROW_BLOCK, hidden],
  //   gate_row, up_row: [dim], down_row: [hidden].
  thread_local std::vector<acc_t> x_block, act, gate_row, up_row, down_row;
  try {
    x_block.resize(size_t(ROW_BLOCK * dim));
    act.resize(size_t(ROW_BLOCK * hidden));
    gate_row.resize(size_t(dim));
    up_row.resize(size_t(dim));
    down_row.resize(size_t(hidden));
  } catch (const std::bad_alloc&) {
    return KF_ERR_OUT_OF_MEMORY;
  }

  for (int64_t r0 = 0; r0 < batch; r0 += ROW_BLOCK) {
    const int64_t row_count = min_i64(ROW_BLOCK, batch - r0);
    for (int64_t r = 0; r < row_count; ++r) {
      row_to_acc(x_data + (r0 + r) * dim, dim, x_block.data() + r * dim);
    }
    // act[r, j] = silu(x[r, :] . W_gate[j, :]) * (x[r, :] . W_up[j, :])
    for (int64_t j = 0; j < hidden; ++j) {
      row_to_acc(gate_data + j * dim, dim, gate_row.data());
      row_to_acc(up_data + j * dim, dim, up_row.data());
      for (int64_t r = 0; r < row_count; ++r) {
        const acc_t* x_row = x_block.data() + r * dim;
        const acc_t gate = dot(x_row, gate_row.data(), dim);
        const acc_t up = dot(x_row, up_row.data(), dim);
        act[size_t(r * hidden + j)] = silu(gate) * up;
      }
    }
    // y[r, c] = act[r, :] . W_down[c, :]
    for (int64_t c = 0; c < dim; ++c) {
      row_to_acc(down_data + c * hidden, hidden, down_row.data());
      for (int64_t r = 0; r < row_count; ++r) {
        const acc_t out = dot(act.data() + r * hidden, down_row.data(), hidden);
        y_data[(r0 + r) * dim + c] = kf_from_float<kf_elem>(float(out));
      }
    }
  }
  return KF_OK;
}
