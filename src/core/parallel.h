// A minimal parallel-for over an index range, for host-side references and input generation.
// Each index is processed by exactly one thread, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace kforge {

template <typename Body>
void parallel_for(int64_t count, Body body, int64_t min_per_thread = 1) {
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::clamp<int64_t>(count / std::max<int64_t>(1, min_per_thread), 1, hw);
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i)
      body(i);
    return;
  }
  std::vector<std::jthread> pool;
  const int64_t chunk = (count + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([=, &body] {
      const int64_t end = std::min(count, (t + 1) * chunk);
      for (int64_t i = t * chunk; i < end; ++i)
        body(i);
    });
  }
}

}  // namespace kforge
