// Packs of elements, and loads and stores of a whole pack in one instruction, with or without
// cache hints, for CUDA kernel files.
//
// A struct of 16-bit elements copied with `=` may move element by element; these go through
// the built-in type of the pack's size (AccessBits), which is also the type the cache-hint
// intrinsics (__ldg, __ldcs, __stcs) take. The hinted forms are spelled out even where a plain
// access would do: once some stores are inline assembly (__stcs), the compiler can no longer
// prove that nothing writes x, and would stop using the read-only path for it on its own.
#ifndef KFORGE_ELEM_ACCESS_CUH_
#define KFORGE_ELEM_ACCESS_CUH_

#include <cstdint>
#include <cstring>

#include "kforge/elem_cuda.cuh"

namespace kf {

// kVec consecutive elements, aligned so that one instruction loads or stores all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

// The built-in type of each access size.
template <int kBytes>
struct AccessBits;
template <>
struct AccessBits<2> {
  using Type = unsigned short;
};
template <>
struct AccessBits<4> {
  using Type = unsigned int;
};
template <>
struct AccessBits<8> {
  using Type = uint2;
};
template <>
struct AccessBits<16> {
  using Type = uint4;
};

// *p in one access: from global or shared memory, no hint.
template <typename T>
__device__ __forceinline__ T load_bits(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits bits = *reinterpret_cast<const Bits*>(p);
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p = value in one access, no hint.
template <typename T>
__device__ __forceinline__ void store_bits(T* p, const T& value) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  Bits bits;
  memcpy(&bits, &value, sizeof(T));
  *reinterpret_cast<Bits*>(p) = bits;
}

// *p, which nothing writes during the kernel, through the read-only data path (__ldg).
template <typename T>
__device__ __forceinline__ T load_readonly(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits bits = __ldg(reinterpret_cast<const Bits*>(p));
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p, which nothing writes during the kernel: through the read-only path (__ldg), or, with
// kLastUse, marked as the last read of its data (__ldcs, evict-first).
template <bool kLastUse, typename T>
__device__ __forceinline__ T load(const T* p) {
  using Bits = typename AccessBits<sizeof(T)>::Type;
  const Bits* bits_ptr = reinterpret_cast<const Bits*>(p);
  const Bits bits = kLastUse ? __ldcs(bits_ptr) : __ldg(bits_ptr);
  T value;
  memcpy(&value, &bits, sizeof(T));
  return value;
}

// *p = value; with kStreaming evict-first (__stcs): the value is not read again by the kernel.
template <bool kStreaming, typename T>
__device__ __forceinline__ void store(T* p, const T& value) {
  if constexpr (kStreaming) {
    using Bits = typename AccessBits<sizeof(T)>::Type;
    Bits bits;
    memcpy(&bits, &value, sizeof(T));
    __stcs(reinterpret_cast<Bits*>(p), bits);
  } else {
    *p = value;
  }
}

}  // namespace kf

#endif  // KFORGE_ELEM_ACCESS_CUH_
