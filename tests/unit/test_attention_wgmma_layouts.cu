// The register and shared-memory layouts kernels/flash_attention/flash_attention_wgmma.cu relies
// on, checked on the host against CuTe's own layouts (no GPU): which rows and keys a consumer
// thread's scores are, that rounding the scores into P V's A operand keeps every value in its
// place, and that the transposed view of V is the same bytes as the tile TMA writes.
//
// The kernel file is compiled here as it is, with its defaults (BLOCK_N 128, two stages).
#define KF_ELEM_BF16
#define BLOCK_N 128
#define STAGES 2
#define PINGPONG 1
#define HEADS_PER_SECTION 8
#define PERSISTENT 0
#define LAZY_RESCALE 1
#define BLOCK_M 128
#include "flash_attention_wgmma.cu"

#include <gtest/gtest.h>

namespace {

using namespace cute;
using kf_attention_wgmma::Element;
using kf_attention_wgmma::row_half;
using kf_attention_wgmma::Tiles;

// Where the kernel's masking and softmax take a score to be: value i of consumer thread
// `thread` in a 128 x BLOCK_N tile (warp group w = thread / 128 owns rows 64w + 0..63; in a
// warp, lane l is in quad g = l / 4 at t = l % 4).
std::pair<int, int> expected_row_and_column(int thread, int i) {
  const int warp_group = thread / 128, warp = thread % 128 / 32, lane = thread % 32;
  const int row = 64 * warp_group + 16 * warp + lane / 4 + 8 * row_half(i);
  const int column = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
  return {row, column};
}

template <int kDim>
void check_scores_hold_two_rows_a_thread() {
  typename Tiles<kDim>::MmaQK mma;
  for (int thread = 0; thread < 256; ++thread) {
    Tensor coord = mma.get_thread_slice(thread).partition_C(
        make_identity_tensor(Shape<Int<BLOCK_M>, Int<BLOCK_N>>{}));
    ASSERT_EQ(int(size(coord)), BLOCK_N / 2);
    for (int i = 0; i < int(size(coord)); ++i) {
      const auto [row, column] = expected_row_and_column(thread, i);
      ASSERT_EQ(int(get<0>(coord(i))), row) << "thread " << thread << " value " << i;
      ASSERT_EQ(int(get<1>(coord(i))), column) << "thread " << thread << " value " << i;
    }
  }
}

template <int kDim>
void check_probabilities_keep_the_scores_places() {
  using T = Tiles<kDim>;
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  const auto tile = Shape<Int<BLOCK_M>, Int<BLOCK_N>>{};
  for (int thread = 0; thread < 256; ++thread) {
    Tensor scores = mma_qk.get_thread_slice(thread).partition_C(make_identity_tensor(tile));
    // P's fragment as the kernel makes it: a compact tensor of partition_shape_A's shape, filled
    // value by value from S; here, what P V's A operand takes each of its values to be.
    Tensor operand = mma_pv.get_thread_slice(thread).partition_A(make_identity_tensor(tile));
    ASSERT_EQ(shape(operand), partition_shape_A(mma_pv, tile));
    ASSERT_EQ(int(size(operand)), int(size(scores)));
    // The kernel copies S's registers into P's in storage order: both fragments must store
    // value i at offset i.
    const auto s_fragment = partition_fragment_C(mma_qk, tile);
    const auto p_fragment = make_tensor<Element>(partition_shape_A(mma_pv, tile));
    for (int i = 0; i < int(size(scores)); ++i) {
      ASSERT_EQ(int(s_fragment.layout()(i)), i);
      ASSERT_EQ(int(p_fragment.layout()(i)), i);
    }
    for (int i = 0; i < int(size(scores)); ++i) {
      ASSERT_EQ(get<0>(operand(i)), get<0>(scores(i))) << "thread " << thread << " value " << i;
      ASSERT_EQ(get<1>(operand(i)), get<1>(scores(i))) << "thread " << thread << " value " << i;
    }
  }
}

template <int kDim>
void check_output_rows_follow_the_same_rule() {
  typename Tiles<kDim>::MmaPV mma;
  for (int thread = 0; thread < 256; ++thread) {
    Tensor coord =
        mma.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<_128, Int<kDim>>{}));
    ASSERT_EQ(int(size(coord)), kDim / 2);
    for (int i = 0; i < int(size(coord)); i += 2) {
      const auto [row, column] = expected_row_and_column(thread, i);
      ASSERT_EQ(int(get<0>(coord(i))), row) << "thread " << thread << " value " << i;
      ASSERT_EQ(int(get<1>(coord(i))), column);
      // The epilogue writes values i and i + 1 as one pair of neighbouring columns.
      ASSERT_EQ(int(get<0>(coord(i + 1))), row);
      ASSERT_EQ(int(get<1>(coord(i + 1))), column + 1);
    }
  }
}

template <int kDim>
void check_transposed_v_is_the_same_bytes() {
  using T = Tiles<kDim>;
  const typename T::SmemLayoutKV v{};
  const typename T::SmemLayoutVt vt{};
  for (int stage = 0; stage < STAGES; ++stage) {
    for (int key = 0; key < BLOCK_N; ++key) {
      for (int d = 0; d < kDim; ++d) {
        ASSERT_EQ(vt(d, key, stage), v(key, d, stage)) << "key " << key << " dim " << d;
      }
    }
  }
  // And the tiles do not overlap: the stage's elements are a permutation of its range.
  std::vector<int> seen(size_t(cosize(v)), 0);
  for (int stage = 0; stage < STAGES; ++stage) {
    for (int key = 0; key < BLOCK_N; ++key) {
      for (int d = 0; d < kDim; ++d)
        ++seen[size_t(v(key, d, stage))];
    }
  }
  for (const int count : seen)
    ASSERT_EQ(count, 1);
}

TEST(AttentionWgmmaLayouts, ScoresHoldTwoRowsAThreadInQuadOrder) {
  check_scores_hold_two_rows_a_thread<64>();
  check_scores_hold_two_rows_a_thread<128>();
}

TEST(AttentionWgmmaLayouts, ProbabilitiesKeepTheScoresPlacesAsTheAOperand) {
  check_probabilities_keep_the_scores_places<64>();
  check_probabilities_keep_the_scores_places<128>();
}

TEST(AttentionWgmmaLayouts, OutputRowsFollowTheSameRule) {
  check_output_rows_follow_the_same_rule<64>();
  check_output_rows_follow_the_same_rule<128>();
}

TEST(AttentionWgmmaLayouts, TransposedVIsTheSameBytes) {
  check_transposed_v_is_the_same_bytes<64>();
  check_transposed_v_is_the_same_bytes<128>();
}

}  // namespace
