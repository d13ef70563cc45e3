/* kforge
 * op: matmul_bias
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: K_BLOCK = 64 in {16, 32, 64, 128, 256}
 * param: N_BLOCK = 256 in {64, 128, 256, 512, 1024}
 */
// C = A @ B + bias on the CPU, single-threaded, loop order i-k-j: matmul_cpu.cpp's loops, with
// bias[j] added to each finished sum of column j.
//
// Idea: C is computed one tile of ROWS_PER_TILE rows x N_BLOCK columns at a time, accumulated
// in acc_t. The K dimension is walked in blocks of K_BLOCK: the B panel [K_BLOCK, N_BLOCK] is
// converted to acc_t once (and reused by every row of the tile, so element conversion costs
// 1 / ROWS_PER_TILE of the multiply-adds), then for each row i and each k of the block,
// C[i, :] += A[i, k] * B[k, :]. The innermost loop runs along a row of B and a row of the tile,
// both contiguous, so it vectorizes without reassociating any sum. Every C element sums its K
// products in ascending k, whatever the blocking, so results are deterministic and do not
// depend on the tunables. The bias is added to the finished sum in acc_t. fp32 accumulates in
// double (the fp32 tolerance is 1e-4 relative and K reaches 8192); fp16 and bf16 accumulate in
// float. Each C element is rounded once.
//
// Tunables:
//   K_BLOCK  rows of B per converted panel: the panel [K_BLOCK, N_BLOCK] should stay in L2.
//   N_BLOCK  columns of C per tile: a tile row of accumulators should stay in L1.
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

// Rows of C that share one converted B panel.
constexpr int64_t ROWS_PER_TILE = 32;

int64_t min_i64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Converts B[k0 : k0 + k_count, j0 : j0 + n_count] to acc_t, row-major with n_count columns.
void convert_b_panel(const kf_elem* b, int64_t N, int64_t k0, int64_t k_count, int64_t j0,
                     int64_t n_count, acc_t* panel) {  // b: [K, N]; panel: [k_count, n_count]
  for (int64_t k = 0; k < k_count; ++k) {
    const kf_elem* b_row = b + (k0 + k) * N + j0;
    acc_t* panel_row = panel + k * n_count;
    for (int64_t j = 0; j < n_count; ++j) {
      panel_row[j] = kf_to_float(b_row[j]);
    }
  }
}

// tile_row[:] += sum over k of a_row[k] * panel[k, :], k ascending.
void accumulate_row(const kf_elem* a_row, const acc_t* panel, int64_t k_count, int64_t n_count,
                    acc_t* tile_row) {  // a_row: [k_count]; panel: [k_count, n_count]
  for (int64_t k = 0; k < k_count; ++k) {
    const acc_t a = kf_to_float(a_row[k]);
    const acc_t* panel_row = panel + k * n_count;
    for (int64_t j = 0; j < n_count; ++j) {
      tile_row[j] += a * panel_row[j];
    }
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& c = args->outputs[0];
  if (a.dtype != kf_elem_dtype || b.dtype != kf_elem_dtype || bias.dtype != kf_elem_dtype ||
      c.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (a.ndim != 2 || b.ndim != 2 || c.ndim != 2) return KF_ERR_UNSUPPORTED;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K || c.shape[0] != M || c.shape[1] != N) return KF_ERR_UNSUPPORTED;
  if (bias.ndim != 1 || bias.shape[0] != N) return KF_ERR_UNSUPPORTED;

  const auto* a_data = static_cast<const kf_elem*>(a.data);        // A: [M, K]
  const auto* b_data = static_cast<const kf_elem*>(b.data);        // B: [K, N]
  const auto* bias_data = static_cast<const kf_elem*>(bias.data);  // bias: [N]
  auto* c_data = static_cast<kf_elem*>(c.data);                    // C: [M, N]

  // panel: [K_BLOCK, N_BLOCK], tile: [ROWS_PER_TILE, N_BLOCK], both acc_t, kept between calls.
  thread_local std::vector<acc_t> panel, tile;
  try {
    panel.resize(size_t(K_BLOCK * N_BLOCK));
    tile.resize(size_t(ROWS_PER_TILE * N_BLOCK));
  } catch (const std::bad_alloc&) {
    return KF_ERR_OUT_OF_MEMORY;
  }

  for (int64_t j0 = 0; j0 < N; j0 += N_BLOCK) {
    const int64_t n_count = min_i64(N_BLOCK, N - j0);
    for (int64_t i0 = 0; i0 < M; i0 += ROWS_PER_TILE) {
      const int64_t row_count = min_i64(ROWS_PER_TILE, M - i0);
      for (int64_t idx = 0; idx < row_count * n_count; ++idx) {
        tile[size_t(idx)] = 0;
      }
      for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK) {
        const int64_t k_count = min_i64(K_BLOCK, K - k0);
        convert_b_panel(b_data, N, k0, k_count, j0, n_count, panel.data());
        for (int64_t r = 0; r < row_count; ++r) {
          accumulate_row(a_data + (i0 + r) * K + k0, panel.data(), k_count, n_count,
                         tile.data() + r * n_count);
        }
      }
      for (int64_t r = 0; r < row_count; ++r) {
        kf_elem* c_row = c_data + (i0 + r) * N + j0;
        const acc_t* tile_row = tile.data() + r * n_count;
        const kf_elem* bias_row = bias_data + j0;
        for (int64_t j = 0; j < n_count; ++j) {
          c_row[j] = kf_from_float<kf_elem>(float(tile_row[j] + acc_t(kf_to_float(bias_row[j]))));
        }
      }
    }
  }
  return KF_OK;
}
