// The search space of a tune: every assignment of a kernel file's tunables that can be built and
// launched for one problem on one device.
//
// The raw space is the product of the candidate lists, and a rich template (a dozen tunables)
// has 10^12 combinations and more, so the space is never held in memory. A point is named by
// a 64-bit mixed-radix index over its file's candidate lists (PointId), and whether it is
// feasible is decided for that one point by evaluating the file's constraints: every
// `require:` line, derived value, and the declared threads / shared memory / cluster size
// against the device's limits.
//
// Counting is a depth-first search over the tunables in declaration order: a constraint is
// checked as soon as the values it names are bound, so a violation prunes the whole subtree
// below it at once, and below the deepest constraint a subtree is counted without being
// visited. The raw combinations each constraint removed are counted, so `kforge tune` can
// say why the space is as small as it is. When that search would visit too many nodes, the
// counts are estimated from uniformly sampled raw points instead, and say so.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compile/kernel_file.h"
#include "device/backend.h"

namespace kforge {

// A point's identity: its file's first id plus the mixed-radix number whose digits are the
// indices of the point's candidates, the first tunable the most significant. Ids of one file
// are contiguous, and they increase in the solver's depth-first order.
using PointId = uint64_t;

// One point, decoded: a file (index into the space's files) and, per tunable of that file,
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
  // The depth-first count visits at most this many nodes (a tunable bound to a candidate) per
  // file: about 0.1 s with a constraint at every depth. A file that needs more is counted by
  // sampling.
  static constexpr uint64_t kCountNodeLimit = 2'000'000;
  // Raw points drawn per file to estimate its counts: a share p is then known to about
  // sqrt(p (1 - p) / 50000), under 0.23 percentage points.
  static constexpr uint64_t kEstimateSamples = 50'000;
  // The most feasible points enumerate() lists.
  static constexpr uint64_t kEnumerateLimit = 1'000'000;

  // `context` binds everything expressions may name besides the tunables: the device limits,
  // `elem_bytes` and the problem's sizes. Throws UsageError when a constraint names something
  // that is neither a tunable, a derived value nor in `context`, or when the raw space has
  // more points than a PointId can number.
  static SearchSpace solve(std::vector<const KernelFile*> files, const Bindings& context,
                           const DeviceInfo& device);

  SearchSpace(SearchSpace&&) noexcept;
  SearchSpace& operator=(SearchSpace&&) noexcept;
  ~SearchSpace();

  const std::vector<const KernelFile*>& files() const { return files_; }
  // Raw combinations of every file; a double for reports (ids are exact: raw_end()).
  double raw_size() const { return static_cast<double>(raw_end()); }
  // One past the last raw id, and the raw ids of one file: [first_id(f), first_id(f + 1)).
  PointId raw_end() const { return first_id_.back(); }
  PointId first_id(int file) const { return first_id_.at(static_cast<size_t>(file)); }

  // Feasible points: exact, or estimated when counts_estimated().
  uint64_t size() const { return feasible_; }
  bool counts_estimated() const { return estimate_samples_ > 0; }
  // Raw points sampled per estimated file; 0 when every count is exact.
  uint64_t estimate_samples() const { return estimate_samples_; }
  // Raw combinations removed, by reason ("require 'VEC * elem_bytes <= 16' (line 7)", ...);
  // estimated (rounded) when counts_estimated().
  const std::map<std::string, double>& pruned() const { return pruned_; }
  double solve_seconds() const { return solve_seconds_; }

  // When the counts are exact, the feasible points are known as runs of consecutive ids
  // (a constraint-free subtree is one run), and can be addressed by rank: 0 .. size() - 1 in
  // id order. Without ranks, a caller samples raw ids and keeps the feasible ones.
  bool ranked() const { return !counts_estimated(); }
  PointId nth(uint64_t rank) const;
  // The ranks of one file's feasible points: [rank_begin(f), rank_begin(f + 1)).
  uint64_t rank_begin(int file) const { return rank_begin_.at(static_cast<size_t>(file)); }
  // Every feasible point in id order; throws UsageError when there are more than `limit` or
  // the counts are estimated.
  std::vector<PointId> enumerate(uint64_t limit = kEnumerateLimit) const;

  SpacePoint point(PointId id) const;
  // The id of a point; throws std::out_of_range for a file or choice out of range.
  PointId id_of(const SpacePoint& point) const;
  bool feasible(PointId id) const;
  // The point's id when it is feasible.
  std::optional<PointId> find(const SpacePoint& point) const;
  // The point of a file's default values, when it is feasible.
  std::optional<PointId> default_point(int file) const;
  // The point of `file` with these tunables (the rest at their defaults), when every value is
  // a candidate and the point is feasible.
  std::optional<PointId> point_with(int file, const ParamValues& tunables) const;

  // Tunables plus derived values, ready for Variant::make.
  ParamValues values(PointId id) const;
  LaunchShape launch_shape(PointId id) const;

  // The feasible points one step from `id`: one tunable changed; or, where that change alone
  // breaks a constraint, the change with the repair() that makes it feasible. Constraints that
  // couple tunables (`ROW_PACKS == 0 || UNROLL == 1`) would otherwise wall a region off from
  // every walk of one-tunable steps but those through its (slower) border.
  std::vector<PointId> neighbors(PointId id) const;
  // `point` made feasible by moving other tunables than `kept`, one at a time, each to its
  // nearest candidate (by position in its list) that gets the point further through the
  // file's constraints in solver order; nullopt when no move gets further.
  std::optional<PointId> repair(SpacePoint point, size_t kept) const;

 private:
  struct FilePlan;
  struct FileCounts;
  SearchSpace();
  // Why a point is infeasible (the first constraint it breaks in solver order), or "".
  std::string violation(PointId id) const;
  void add_run(PointId first, uint64_t count);

  std::vector<const KernelFile*> files_;
  Bindings context_;
  DeviceInfo device_;
  std::vector<std::unique_ptr<FilePlan>> plans_;
  std::vector<PointId> first_id_;  // per file, plus raw_end() at the back
  uint64_t feasible_ = 0;
  uint64_t estimate_samples_ = 0;
  std::map<std::string, double> pruned_;
  // Runs of feasible ids: run i starts at run_first_[i] and holds the ranks from run_rank_[i]
  // up to the next run's (or size()).
  std::vector<PointId> run_first_;
  std::vector<uint64_t> run_rank_;
  PointId run_end_ = 0;
  std::vector<uint64_t> rank_begin_;  // per file, plus size() at the back
  double solve_seconds_ = 0;
};

}  // namespace kforge
