// Search strategies, registered by name. A strategy proposes points of a SearchSpace and is told
// what each one cost; it never sees compilers or GPUs, so every strategy can be run on recorded
// measurements (`kforge tune --replay`) and tested without a device.
//
// The tuner keeps several proposals in flight (compiling ahead of the GPU), so a strategy is
// asked for its next point before earlier ones are observed. Observations arrive in proposal
// order, which keeps a strategy's path a function of its seed and the costs alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tune/space.h"

namespace kforge {

class Strategy {
 public:
  virtual ~Strategy() = default;

  // The next point to evaluate, never one proposed before; nullopt when the strategy has
  // nothing to propose until more observations arrive, or has covered the space.
  virtual std::optional<size_t> propose() = 0;
  // The cost of a proposed point: its median time, or +infinity when it failed.
  virtual void observe(size_t point, double cost) = 0;
};

struct StrategyInfo {
  std::string name;
  std::string summary;
};

// Throws UsageError for an unknown name (the message lists the known ones).
std::unique_ptr<Strategy> make_strategy(std::string_view name, const SearchSpace& space,
                                        uint64_t seed);
const std::vector<StrategyInfo>& strategies();

}  // namespace kforge
