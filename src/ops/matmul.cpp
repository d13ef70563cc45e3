// matmul: C[m, n] = sum_k A[m, k] * B[k, n]. fp32 means fp32: no TF32 in the default mode.
#include "ops/matmul.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "ops/registry.h"

namespace kforge {
namespace {

Sizes mnk(int64_t m, int64_t n, int64_t k) {
  return {{"M", m}, {"N", n}, {"K", k}};
}

}  // namespace

Sizes matmul_sizes(int64_t m, int64_t n, int64_t k) {
  return mnk(m, n, k);
}

std::vector<SizeCase> matmul_test_sizes() {
  return {{"tiny", mnk(128, 128, 128)},      {"small", mnk(512, 512, 512)},
          {"medium", mnk(1024, 1024, 1024)}, {"large", mnk(2048, 2048, 2048)},
          {"xlarge", mnk(4096, 4096, 4096)}, {"tall", mnk(8192, 1024, 1024)},
          {"wide", mnk(1024, 8192, 1024)},   {"deep_k", mnk(1024, 1024, 8192)},
          {"llm_qkv", mnk(4096, 4096, 512)}, {"llm_mlp", mnk(4096, 11008, 4096)}};
}

// The first six have N or K off a multiple of 8, which a TMA kernel cannot address: they test a
// tensor-core file's plain path. The next three are TMA-aligned but cut every tile short, so the
// fast path's own edges are tested too: M, N and K each a partial tile (1000 = 7 x 128 + 104,
// 1064 = 4 x 256 + 40, 520 = 8 x 64 + 8), fewer rows than one 64-row wgmma atom, and one row.
// The last has more tiles than an H100 or H200 has SMs (160 of 128 x 256), each of two K steps
// and the last along N a partial one (1088 = 4 x 256 + 64): a persistent kernel's block runs
// several tiles shorter than anything it overlaps across tiles (matmul_wgmma.cu's EPILOGUE 3
// stores a tile's slices during the next tile's first eight K steps).
std::vector<SizeCase> matmul_edge_sizes() {
  return {{"edge_1023", mnk(1023, 1023, 1023)},   {"edge_4097", mnk(4097, 4097, 512)},
          {"edge_1537", mnk(1537, 1537, 1537)},   {"one_row", mnk(1, 777, 129)},
          {"one_col", mnk(333, 1, 65)},           {"odd_k", mnk(65, 67, 3)},
          {"ragged_tiles", mnk(1000, 1064, 520)}, {"short_m", mnk(40, 264, 64)},
          {"one_row_aligned", mnk(1, 776, 136)},  {"shallow_k", mnk(4096, 1088, 128)}};
}

double matmul_max_input_magnitude(const Sizes& sizes, DType dtype) {
  const double k = static_cast<double>(sizes.at("K"));
  const double out_max = dtype == DType::f16 ? 65504.0 : 3.4028234663852886e38;
  return 0.5 * std::sqrt(out_max / k);
}

void matmul_products(const Sizes& sizes, const std::vector<double>& a, const std::vector<double>& b,
                     std::vector<double>& c, std::vector<double>* squares) {
  const int64_t m = sizes.at("M"), n = sizes.at("N"), k = sizes.at("K");
  parallel_for(m, [&](int64_t i) {
    double* row = c.data() + i * n;
    std::fill(row, row + n, 0.0);
    double* square_row = squares ? squares->data() + i * n : nullptr;
    if (square_row) std::fill(square_row, square_row + n, 0.0);
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      const double* brow = b.data() + p * n;
      for (int64_t j = 0; j < n; ++j)
        row[j] += aip * brow[j];
      if (square_row) {
        for (int64_t j = 0; j < n; ++j)
          square_row[j] += aip * aip * brow[j] * brow[j];
      }
    }
  });
}

namespace {

class Matmul final : public OpSpec {
 public:
  std::string_view name() const override { return "matmul"; }
  std::string_view formula() const override { return "C = A @ B"; }
  std::vector<std::string> size_names() const override { return {"M", "N", "K"}; }
  std::vector<TensorSpec> tensors() const override {
    return {{"A", {"M", "K"}}, {"B", {"K", "N"}}, {"C", {"M", "N"}, true}};
  }
  std::vector<SizeCase> test_sizes() const override { return matmul_test_sizes(); }
  std::vector<SizeCase> edge_sizes() const override { return matmul_edge_sizes(); }
  std::vector<SizeCase> bench_sizes() const override { return test_sizes(); }
  Sizes default_size() const override { return mnk(4096, 4096, 4096); }
  std::vector<DType> dtypes() const override { return {DType::f16, DType::bf16, DType::f32}; }
  Tolerance tolerance(DType dtype) const override {
    return tolerance_by_dtype(dtype, {1e-2, 1e-2}, {2e-2, 2e-2}, {1e-4, 1e-4});
  }
  double max_input_magnitude(const Sizes& sizes, DType dtype) const override {
    return matmul_max_input_magnitude(sizes, dtype);
  }

  // An element is a dot product of K terms. Its rounding error in fp32 grows like
  // eps * sqrt(K) * rss, rss = sqrt(sum of squared terms), while TF32 inputs err by ~1e-3 * rss:
  // a tolerance relative to rss (the magnitude reference() provides) admits the first and
  // rejects the second, which |C| alone cannot do for elements near zero.
  bool tolerance_relative_to_magnitude() const override { return true; }

  void reference(const Sizes& sizes, std::span<const std::vector<double>> in,
                 std::span<const double>, std::span<std::vector<double>> out) const override {
    const bool magnitude = out.size() > 1;
    matmul_products(sizes, in[0], in[1], out[0], magnitude ? &out[1] : nullptr);
    if (magnitude) {
      for (double& v : out[1])
        v = std::sqrt(v);
    }
  }

  Cost cost(const Sizes& sizes, DType dtype) const override {
    const double m = static_cast<double>(sizes.at("M")), n = static_cast<double>(sizes.at("N")),
                 k = static_cast<double>(sizes.at("K"));
    return {(m * k + k * n + m * n) * static_cast<double>(dtype_size(dtype)), 2 * m * n * k};
  }
};

}  // namespace

std::unique_ptr<OpSpec> make_matmul_spec() {
  return std::make_unique<Matmul>();
}

}  // namespace kforge
