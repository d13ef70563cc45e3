// Parallel loops over an index range. Each index is processed by exactly one thread, so results
// do not depend on the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
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

// For items of uneven cost (compiles, say): each of `threads` threads (0: one per core) takes
// the next index no thread has claimed yet, so the costliest items, listed first, start first
// and no thread idles while work is left. `body` must not throw.
template <typename Body>
void parallel_for_each_claimed(size_t count, unsigned threads, Body body) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  std::vector<std::jthread> pool;
  for (size_t t = 0; t < std::min<size_t>(threads, count); ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < count; i = next++)
        body(i);
    });
  }
}

}  // namespace kforge
