// Search strategies, registered by name. A strategy proposes points of a SearchSpace and is told
// what each one cost; it never sees compilers or GPUs, so every strategy can be run on recorded
// measurements (`kforge tune --replay`) and tested without a device.
//
// The tuner keeps several proposals in flight (compiling ahead of the GPU), so a strategy is
// asked for its next point before earlier ones are observed. Observations arrive in proposal
// order, which keeps a strategy's path a function of its seed and the costs alone.
//
// A space can have 10^12 points and more, so a strategy never holds anything per point of the
// space: it samples points lazily and remembers only what it proposed and observed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tune/space.h"

namespace kforge {

// `exhaustive` refuses a space with more feasible points than this (or an estimated count):
// it would not finish, and a budgeted search covers such a space better.
inline constexpr uint64_t kExhaustiveLimit = 1'000'000;

class Strategy {
 public:
  virtual ~Strategy() = default;

  // The next point to evaluate, never one proposed before; nullopt when the strategy has
  // nothing to propose until more observations arrive, or has covered the space.
  virtual std::optional<PointId> propose() = 0;
  // The cost of a proposed point: its median time, or +infinity when it failed.
  virtual void observe(PointId point, double cost) = 0;
};

struct StrategyInfo {
  std::string name;
  std::string summary;
};

// Throws UsageError for an unknown name (the message lists the known ones), and for
// `exhaustive` over a space above kExhaustiveLimit.
//
// `starts` are feasible points known to be good elsewhere (the same size's row in another
// device's table, say): every strategy proposes them before anything of its own, `local`
// climbs from the best start of a file instead of its defaults, `evolution` seeds its
// population with them, and `given` proposes the starts and nothing else.
std::unique_ptr<Strategy> make_strategy(std::string_view name, const SearchSpace& space,
                                        uint64_t seed, const std::vector<PointId>& starts = {});
const std::vector<StrategyInfo>& strategies();

}  // namespace kforge
