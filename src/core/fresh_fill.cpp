#include "core/fresh_fill.h"

#include <algorithm>

#include "core/parallel.h"

namespace kforge {

void fill_fresh_host(std::byte* data, DType dtype, int64_t begin, int64_t end,
                     const FreshInput& rule, uint64_t seed) {
  if (rule.kind == FreshInput::Kind::keep || end <= begin) return;
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((end - begin + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t stop = std::min(end, begin + (c + 1) * kChunk);
    for (int64_t i = begin + c * kChunk; i < stop; ++i) {
      const auto index = static_cast<uint64_t>(i);
      const double v =
          rule.kind == FreshInput::Kind::index
              ? static_cast<double>(
                    fresh::index_at(seed, index, rule.bound, rule.special, rule.special_share))
              : static_cast<double>(fresh::normal_at(seed, index) * static_cast<float>(rule.scale));
      store_element(data, dtype, static_cast<size_t>(i), v);
    }
  });
}

}  // namespace kforge
