// Fresh input values for timed samples, and digests of outputs, computed the same way on the
// host (CPU backend) and in device kernels (CUDA backend). Header-only and plain enough for
// nvcc and a C++ compiler alike.
//
// Every timed sample redraws its inputs from a seed nobody can predict, so a kernel cannot
// reuse work from an earlier call; value i of a tensor is a pure function of (seed, i), so a
// row can be redrawn on its own and any sample can be recreated later from its seed.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KF_HOST_DEVICE __host__ __device__
#else
#define KF_HOST_DEVICE
#endif

namespace kforge {

// How one input tensor is redrawn before every timed sample.
struct FreshInput {
  enum class Kind : int32_t {
    normal,  // approximately normal values (mean 0, standard deviation `scale`)
    index,   // integers uniform in [0, bound), or `special` with probability `special_share`
    keep,    // not redrawn (tables whose structure the op relies on, e.g. RoPE's cos/sin)
  };
  Kind kind = Kind::normal;
  double scale = 1.0;
  int64_t bound = 0;
  int64_t special = 0;
  double special_share = 0.0;
  // keep only: elements per row (0: the tensor has no rows a trap may change). A trap copies a
  // few entries of every kept input that has rows from other rows (trap_entry), so that a kernel
  // reading a copy of them made in an earlier call, or values it derived from them, gives wrong
  // outputs there.
  int64_t row_length = 0;
};

namespace fresh {

// splitmix64's finalizer: every output bit depends on every input bit.
KF_HOST_DEVICE inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

KF_HOST_DEVICE inline uint64_t bits_at(uint64_t seed, uint64_t i) {
  return mix(seed ^ mix(i + 0x9e3779b97f4a7c15ull));
}

// Sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to unit variance: close to a
// standard normal, bounded by ±3.46, and computed in exact integer arithmetic up to one final
// rounding, so host and device agree bit for bit.
KF_HOST_DEVICE inline float normal_at(uint64_t seed, uint64_t i) {
  const uint64_t h = bits_at(seed, i);
  const uint32_t sum = static_cast<uint32_t>(h & 0xffff) +
                       static_cast<uint32_t>((h >> 16) & 0xffff) +
                       static_cast<uint32_t>((h >> 32) & 0xffff) + static_cast<uint32_t>(h >> 48);
  // Mean 4 * 32767.5; standard deviation sqrt(4 * (65536^2 - 1) / 12).
  return (static_cast<float>(sum) - 131070.0f) * (1.0f / 37837.23f);
}

KF_HOST_DEVICE inline int64_t index_at(uint64_t seed, uint64_t i, int64_t bound, int64_t special,
                                       double special_share) {
  const uint64_t h = bits_at(seed, i);
  // The top 24 bits decide `special`, the rest pick the index.
  const double u = static_cast<double>(h >> 40) * (1.0 / 16777216.0);
  if (u < special_share) return special;
  return bound > 0 ? static_cast<int64_t>((h & 0xffffffffffull) % static_cast<uint64_t>(bound)) : 0;
}

// A trap changes this many elements of an input, scattered over it: few enough that a kernel
// which recognizes its inputs by a sample of them takes the changed inputs for the old ones,
// and each change moves some output of most ops far beyond its tolerance.
inline constexpr int kTrapElements = 8;

// Where the j-th changed element of a trap drawn from `trap_seed` sits among `count` elements.
KF_HOST_DEVICE inline int64_t trap_element(uint64_t trap_seed, int j, int64_t count) {
  return index_at(trap_seed, static_cast<uint64_t>(j), count, 0, 0.0);
}

// How many rows of a kept input a trap changes entries of: count / row_length for a kept input
// of two rows or more; 0 for any other input (no entry of it changes).
inline int64_t trap_rows(const FreshInput& rule, int64_t count) {
  if (rule.kind != FreshInput::Kind::keep || rule.row_length <= 0) return 0;
  const int64_t rows = count / rule.row_length;
  return rows >= 2 ? rows : 0;
}

// The j-th of the kTrapElements entries a trap drawn from `trap_seed` changes in a kept input of
// `rows` rows of `row_length` elements (rows >= 2): element `to` becomes a copy of element `from`,
// the same column of another row. Every kept input of that shape gets the same entries, so that
// tables read together (RoPE's cos and sin) stay consistent: each (cos, sin) pair is still a
// rotation's. The entries are scattered, so that no kernel can tell a trap from a plain sample by
// reading a few of them (a whole row copied would show in any one column).
struct TrapEntry {
  int64_t from = 0;  // element indices
  int64_t to = 0;
};
KF_HOST_DEVICE inline TrapEntry trap_entry(uint64_t trap_seed, int j, int64_t rows,
                                           int64_t row_length) {
  const uint64_t k = 0x726f77ull + 3 * static_cast<uint64_t>(j);
  const int64_t from_row = index_at(trap_seed, k, rows, 0, 0.0);
  const int64_t to_row = (from_row + 1 + index_at(trap_seed, k + 1, rows - 1, 0, 0.0)) % rows;
  const int64_t column = index_at(trap_seed, k + 2, row_length, 0, 0.0);
  return {from_row * row_length + column, to_row * row_length + column};
}

// A digest of a buffer is the sum, modulo 2^64, of one term per element: the same whatever the
// order the terms are added in, so a parallel reduction gives the same digest as a loop.
KF_HOST_DEVICE inline uint64_t digest_term(uint64_t i, uint64_t element_bits) {
  return mix(element_bits ^ mix(i ^ 0x5851f42d4c957f2dull));
}

// A digest over several buffers: each buffer's sum mixed with its position, so that swapping two
// buffers changes the digest.
KF_HOST_DEVICE inline uint64_t buffer_digest(uint64_t position, uint64_t sum) {
  return mix(sum + position);
}

// Poisoned outputs have every bit set: a NaN in each floating type, -1 in the integer ones.
inline constexpr unsigned char kPoisonByte = 0xff;
KF_HOST_DEVICE inline bool is_poison(uint64_t element_bits, int element_bytes) {
  const uint64_t all = element_bytes >= 8 ? ~0ull : ((1ull << (8 * element_bytes)) - 1);
  return element_bits == all;
}

}  // namespace fresh
}  // namespace kforge
