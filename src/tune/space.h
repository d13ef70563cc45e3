// The search space of a tune: every assignment of a kernel file's tunables that can be built and
// launched for one problem on one device.
//
// The raw space is the product of the candidate lists (10^6 combinations and more for a rich
// template). It is solved by depth-first search over the tunables in declaration order: every
// constraint (a `require:` line, a derived value, the declared threads / shared memory / cluster
// size against the device's limits) is checked as soon as the values it names are bound, so a
// violated constraint prunes the whole subtree below it at once. The number of raw
// combinations each constraint removed is counted, so `kforge tune` can say why the space is
// as small as it is.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "compile/kernel_file.h"
#include "device/backend.h"

namespace kforge {

// One point of the space: a file (index into the space's files) and, per tunable of that file,
// the index of its value in the candidate list.
struct SpacePoint {
  int file = 0;
  std::vector<uint8_t> choice;
  bool operator==(const SpacePoint&) const = default;
};

// Launch facts a variant declares in its header (`threads:`, `shared_bytes:`, `cluster:`),
// evaluated for one point; 0 where the file does not declare them.
struct LaunchShape {
  long long threads = 0;
  long long dynamic_shared_bytes = 0;
  long long cluster_blocks = 1;
};

class SearchSpace {
 public:
  // `context` binds everything expressions may name besides the tunables: the device limits,
  // `elem_bytes` and the problem's sizes. Throws UsageError when a constraint names something
  // that is neither a tunable, a derived value nor in `context`.
  static SearchSpace solve(std::vector<const KernelFile*> files, const Bindings& context,
                           const DeviceInfo& device);

  const std::vector<const KernelFile*>& files() const { return files_; }
  double raw_size() const { return raw_size_; }  // a double: products overflow 64 bits
  size_t size() const { return points_.size(); }
  const SpacePoint& point(size_t index) const { return points_[index]; }
  std::optional<size_t> find(const SpacePoint& point) const;
  // The point of a file's default values, when it is feasible.
  std::optional<size_t> default_point(int file) const;

  // Tunables plus derived values, ready for Variant::make.
  ParamValues values(size_t index) const;
  LaunchShape launch_shape(size_t index) const;

  // Feasible points that differ from `index` in exactly one tunable.
  std::vector<size_t> neighbors(size_t index) const;

  // Raw combinations removed, by reason ("require 'VEC * elem_bytes <= 16' (line 7)", ...).
  const std::map<std::string, double>& pruned() const { return pruned_; }
  double solve_seconds() const { return solve_seconds_; }

 private:
  struct Solver;
  std::string key_of(const SpacePoint& p) const;

  std::vector<const KernelFile*> files_;
  Bindings context_;
  std::vector<SpacePoint> points_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, double> pruned_;
  double raw_size_ = 0;
  double solve_seconds_ = 0;
};

}  // namespace kforge
