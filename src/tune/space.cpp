#include "tune/space.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/random.h"
#include "device/launch_limits.h"

namespace kforge {
namespace {

// The sampled estimate of a space's counts is part of its report and of `--budget P%`, so it
// is drawn from a fixed stream: the same space gives the same estimate.
constexpr uint64_t kEstimateSeed = 0x7370'6163'6521;

}  // namespace

// One file's counts: exact (with the feasible ids as runs), or from samples.
struct SearchSpace::FileCounts {
  uint64_t feasible = 0;  // exact: points; sampled: samples that were feasible
  std::map<std::string, uint64_t> pruned;
  std::vector<std::pair<PointId, uint64_t>> runs;  // exact only: (first id, count), in order

  void add_run(PointId first, uint64_t count) {
    if (!runs.empty() && runs.back().first + runs.back().second == first) {
      runs.back().second += count;
    } else {
      runs.emplace_back(first, count);
    }
    feasible += count;
  }
};

// How to decide one file's points. Every name an expression can use gets a slot in a values
// array; tunables are bound one per depth, and each step (a derived value to compute or a
// constraint to test) runs at the first depth where all of its names are bound.
struct SearchSpace::FilePlan {
  struct Step {
    enum Kind { derive, require, threads, shared, cluster } kind;
    const Expression* expression;
    int slot = -1;                 // derive: where the value goes
    std::vector<int> input_slots;  // the expression's variables, in its order
    std::string reason;            // require: the text reported when it fails
  };

  const KernelFile& file;
  std::vector<long long> initial_values;         // by slot: the context bound, the rest 0
  std::map<std::string, int, std::less<>> slot;  // name -> slot
  std::vector<int> param_slot;                   // by depth
  std::vector<std::vector<Step>> steps_at;       // steps_at[d]: after tunable d is bound
  // Raw points below depth d: the product of the candidate counts of tunables d and later.
  // subtree[d + 1] is also the id stride of tunable d.
  std::vector<uint64_t> subtree;
  // The deepest depth with a step: below it, nothing can fail, so a subtree that got there
  // is feasible as a whole.
  size_t deepest_step = 0;

  FilePlan(const KernelFile& f, const Bindings& context) : file(f), steps_at(f.params.size() + 1) {
    for (const auto& [name, value] : context)
      bind_new(name, value);
    for (const auto& p : file.params)
      bind_new(p.name, 0);
    for (const auto& dv : file.derived)
      bind_new(dv.name, 0);
    for (const auto& p : file.params)
      param_slot.push_back(slot.at(p.name));
    // A derived value is ready when its inputs are; later steps may depend on it.
    std::vector<size_t> ready_depth(initial_values.size(), 0);
    for (size_t i = 0; i < file.params.size(); ++i)
      ready_depth[static_cast<size_t>(param_slot[i])] = i + 1;
    const auto add = [&](Step step) {
      size_t depth = 0;
      for (const auto& name : step.expression->variables()) {
        const auto it = slot.find(name);
        if (it == slot.end()) {
          throw UsageError(fmt::format(
              "{}: '{}' names '{}', which is not a parameter, a derived value, a device limit or "
              "a size of the problem",
              file.path.string(), step.expression->text(), name));
        }
        step.input_slots.push_back(it->second);
        depth = std::max(depth, ready_depth[static_cast<size_t>(it->second)]);
      }
      if (step.kind == Step::derive) ready_depth[static_cast<size_t>(step.slot)] = depth;
      deepest_step = std::max(deepest_step, depth);
      steps_at[depth].push_back(std::move(step));
    };
    for (const auto& dv : file.derived)
      add({Step::derive, &dv.expression, slot.at(dv.name)});
    for (const auto& r : file.requirements) {
      add({Step::require,
           &r.expression,
           -1,
           {},
           fmt::format("{} '{}' (line {})", r.pruning_only ? "prune" : "require",
                       r.expression.text(), r.line)});
    }
    if (file.block_threads) add({Step::threads, &*file.block_threads});
    if (file.shared_bytes) add({Step::shared, &*file.shared_bytes});
    if (file.cluster_blocks) add({Step::cluster, &*file.cluster_blocks});

    subtree.assign(file.params.size() + 1, 1);
    for (size_t depth = file.params.size(); depth-- > 0;) {
      if (__builtin_mul_overflow(subtree[depth + 1], file.params[depth].candidates.size(),
                                 &subtree[depth])) {
        throw UsageError(too_many_combinations(file));
      }
    }
  }

  static std::string too_many_combinations(const KernelFile& file) {
    std::vector<size_t> counts;
    for (const auto& p : file.params)
      counts.push_back(p.candidates.size());
    return fmt::format(
        "{}: {} raw combinations are more than a 64-bit index can number; hold some tunables "
        "fixed (--fix NAME=VALUE) or split the file",
        file.path.string(), fmt::join(counts, " x "));
  }

  void bind_new(const std::string& name, long long value) {
    slot[name] = static_cast<int>(initial_values.size());
    initial_values.push_back(value);
  }

  // Runs the steps of one depth over `values`; returns the reason of the first failure, or "".
  // `passed`, when given, counts the steps that held.
  std::string run_steps(size_t depth, std::vector<long long>& values,
                        std::vector<long long>& scratch, const DeviceInfo& device,
                        size_t* passed = nullptr) const {
    for (const Step& step : steps_at[depth]) {
      scratch.resize(step.input_slots.size());
      for (size_t i = 0; i < step.input_slots.size(); ++i)
        scratch[i] = values[static_cast<size_t>(step.input_slots[i])];
      long long v = 0;
      try {
        v = step.expression->evaluate_values(scratch.data());
      } catch (const Error& e) {
        return step.kind == Step::derive ? fmt::format("derive: {}", e.what()) : e.what();
      }
      std::string why;
      switch (step.kind) {
        case Step::derive:
          values[static_cast<size_t>(step.slot)] = v;
          break;
        case Step::require:
          if (v == 0) why = step.reason;
          break;
        case Step::threads:
          why = threads_violation(v, device);
          break;
        case Step::shared:
          why = dynamic_shared_violation(v, device);
          break;
        case Step::cluster:
          why = cluster_violation(v, device);
          break;
      }
      if (!why.empty()) return why;
      if (passed) ++*passed;
    }
    return "";
  }

  // The first constraint the point `choice` breaks, in the order the depth-first count meets
  // them (so a sampled point is blamed on the reason its subtree would be), or "". `passed`,
  // when given, counts the steps that held before it: a measure of how near feasible it is.
  std::string violation(const std::vector<uint8_t>& choice, std::vector<long long>& values,
                        std::vector<long long>& scratch, const DeviceInfo& device,
                        size_t* passed = nullptr) const {
    values = initial_values;
    if (std::string why = run_steps(0, values, scratch, device, passed); !why.empty()) return why;
    for (size_t depth = 0; depth < deepest_step; ++depth) {
      values[static_cast<size_t>(param_slot[depth])] = file.params[depth].candidates[choice[depth]];
      if (std::string why = run_steps(depth + 1, values, scratch, device, passed); !why.empty())
        return why;
    }
    return "";
  }

  // Depth-first count of the file's points, whose ids start at `first`; nullopt when it would
  // visit more than `node_limit` nodes.
  std::optional<FileCounts> count_exact(PointId first, const DeviceInfo& device,
                                        uint64_t node_limit) const {
    FileCounts counts;
    std::vector<long long> values = initial_values;
    std::vector<long long> scratch;
    if (const std::string why = run_steps(0, values, scratch, device); !why.empty()) {
      counts.pruned[why] += subtree[0];
      return counts;
    }
    uint64_t nodes = 0;
    const std::function<bool(size_t, PointId)> descend = [&](size_t depth, PointId base) {
      if (depth >= deepest_step) {
        // No constraint is left below: every point of the subtree is feasible.
        counts.add_run(base, subtree[depth]);
        return true;
      }
      const TunableParam& param = file.params[depth];
      for (size_t c = 0; c < param.candidates.size(); ++c) {
        if (++nodes > node_limit) return false;
        values[static_cast<size_t>(param_slot[depth])] = param.candidates[c];
        if (const std::string why = run_steps(depth + 1, values, scratch, device); !why.empty()) {
          counts.pruned[why] += subtree[depth + 1];
          continue;
        }
        if (!descend(depth + 1, base + c * subtree[depth + 1])) return false;
      }
      return true;
    };
    if (!descend(0, first)) return std::nullopt;
    return counts;
  }

  // Draws `samples` raw points uniformly from a fixed stream and tallies why each is
  // infeasible, or that it is feasible.
  FileCounts count_sampled(size_t file_index, const DeviceInfo& device, uint64_t samples) const {
    FileCounts counts;
    Rng rng(kEstimateSeed, file_index);
    std::vector<uint8_t> choice(file.params.size());
    std::vector<long long> values;
    std::vector<long long> scratch;
    for (uint64_t s = 0; s < samples; ++s) {
      for (size_t d = 0; d < choice.size(); ++d)
        choice[d] = static_cast<uint8_t>(rng.next() % file.params[d].candidates.size());
      const std::string why = violation(choice, values, scratch, device);
      if (why.empty()) {
        ++counts.feasible;
      } else {
        ++counts.pruned[why];
      }
    }
    return counts;
  }
};

SearchSpace::SearchSpace() = default;
SearchSpace::SearchSpace(SearchSpace&&) noexcept = default;
SearchSpace& SearchSpace::operator=(SearchSpace&&) noexcept = default;
SearchSpace::~SearchSpace() = default;

SearchSpace SearchSpace::solve(std::vector<const KernelFile*> files, const Bindings& context,
                               const DeviceInfo& device) {
  const auto start = std::chrono::steady_clock::now();
  SearchSpace space;
  space.files_ = std::move(files);
  space.context_ = context;
  space.device_ = device;
  space.first_id_.push_back(0);
  for (const KernelFile* file : space.files_) {
    for (const auto& p : file->params) {
      if (p.candidates.size() > 255) {
        throw UsageError(
            fmt::format("{}: param {} has more than 255 candidates", file->path.string(), p.name));
      }
    }
    space.plans_.push_back(std::make_unique<FilePlan>(*file, context));
    PointId end = 0;
    if (__builtin_add_overflow(space.first_id_.back(), space.plans_.back()->subtree[0], &end)) {
      throw UsageError(fmt::format(
          "the {} files together have more raw combinations than a 64-bit index can number; "
          "tune fewer files at once or hold some tunables fixed (--fix NAME=VALUE)",
          space.files_.size()));
    }
    space.first_id_.push_back(end);
  }

  uint64_t exact_feasible = 0;
  double sampled_feasible = 0;
  std::map<std::string, double> sampled_pruned;
  space.rank_begin_.push_back(0);
  for (size_t f = 0; f < space.plans_.size(); ++f) {
    const FilePlan& plan = *space.plans_[f];
    if (auto counts = plan.count_exact(space.first_id_[f], device, kCountNodeLimit)) {
      for (const auto& [first, count] : counts->runs)
        space.add_run(first, count);
      exact_feasible += counts->feasible;
      space.rank_begin_.push_back(exact_feasible);
      for (const auto& [why, count] : counts->pruned)
        space.pruned_[why] += static_cast<double>(count);
      continue;
    }
    // Too many nodes to count: estimate from a uniform sample of the file's raw points.
    space.estimate_samples_ = kEstimateSamples;
    const FileCounts counts = plan.count_sampled(f, device, kEstimateSamples);
    const double raw_per_sample =
        static_cast<double>(plan.subtree[0]) / static_cast<double>(kEstimateSamples);
    sampled_feasible += raw_per_sample * static_cast<double>(counts.feasible);
    for (const auto& [why, count] : counts.pruned)
      sampled_pruned[why] += raw_per_sample * static_cast<double>(count);
  }
  if (space.counts_estimated()) {
    // Ranks need every file's feasible points; an estimated file has none listed.
    space.run_first_.clear();
    space.run_rank_.clear();
    space.rank_begin_.clear();
    for (const auto& [why, count] : sampled_pruned)
      space.pruned_[why] += std::round(count);
  }
  space.feasible_ = exact_feasible + static_cast<uint64_t>(std::llround(sampled_feasible));
  space.solve_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return space;
}

void SearchSpace::add_run(PointId first, uint64_t count) {
  const uint64_t rank = run_rank_.empty() ? 0 : run_rank_.back() + (run_end_ - run_first_.back());
  if (!run_first_.empty() && run_end_ == first) {
    run_end_ += count;
    return;
  }
  run_first_.push_back(first);
  run_rank_.push_back(rank);
  run_end_ = first + count;
}

PointId SearchSpace::nth(uint64_t rank) const {
  if (!ranked() || rank >= feasible_) {
    throw std::out_of_range(fmt::format("no feasible point of rank {}", rank));
  }
  const auto run = std::upper_bound(run_rank_.begin(), run_rank_.end(), rank) - 1;
  return run_first_[static_cast<size_t>(run - run_rank_.begin())] + (rank - *run);
}

std::vector<PointId> SearchSpace::enumerate(uint64_t limit) const {
  if (!ranked()) {
    throw UsageError(fmt::format(
        "the space has about {} feasible points (estimated): too many to list", feasible_));
  }
  if (feasible_ > limit) {
    throw UsageError(
        fmt::format("the space has {} feasible points: more than {} to list", feasible_, limit));
  }
  std::vector<PointId> out;
  out.reserve(feasible_);
  for (size_t r = 0; r < run_first_.size(); ++r) {
    const uint64_t next_rank = r + 1 < run_rank_.size() ? run_rank_[r + 1] : feasible_;
    for (uint64_t i = 0; i < next_rank - run_rank_[r]; ++i)
      out.push_back(run_first_[r] + i);
  }
  return out;
}

SpacePoint SearchSpace::point(PointId id) const {
  if (id >= raw_end()) throw std::out_of_range(fmt::format("no point {} in the space", id));
  const size_t f = static_cast<size_t>(std::upper_bound(first_id_.begin(), first_id_.end(), id) -
                                       first_id_.begin()) -
                   1;
  const auto& params = files_[f]->params;
  SpacePoint p{static_cast<int>(f), std::vector<uint8_t>(params.size())};
  PointId rest = id - first_id_[f];
  for (size_t d = params.size(); d-- > 0;) {
    p.choice[d] = static_cast<uint8_t>(rest % params[d].candidates.size());
    rest /= params[d].candidates.size();
  }
  return p;
}

PointId SearchSpace::id_of(const SpacePoint& p) const {
  const FilePlan& plan = *plans_.at(static_cast<size_t>(p.file));
  const auto& params = plan.file.params;
  if (p.choice.size() != params.size()) throw std::out_of_range("a point of another file");
  PointId id = first_id_[static_cast<size_t>(p.file)];
  for (size_t d = 0; d < params.size(); ++d) {
    if (p.choice[d] >= params[d].candidates.size()) throw std::out_of_range("no such candidate");
    id += p.choice[d] * plan.subtree[d + 1];
  }
  return id;
}

std::string SearchSpace::violation(PointId id) const {
  const SpacePoint p = point(id);
  std::vector<long long> values;
  std::vector<long long> scratch;
  return plans_[static_cast<size_t>(p.file)]->violation(p.choice, values, scratch, device_);
}

bool SearchSpace::feasible(PointId id) const {
  return violation(id).empty();
}

std::optional<PointId> SearchSpace::find(const SpacePoint& point) const {
  const PointId id = id_of(point);
  if (!feasible(id)) return std::nullopt;
  return id;
}

std::optional<PointId> SearchSpace::default_point(int file) const {
  return point_with(file, {});
}

std::optional<PointId> SearchSpace::point_with(int file, const ParamValues& tunables) const {
  const KernelFile& f = *files_.at(static_cast<size_t>(file));
  for (const auto& [name, value] : tunables) {
    if (std::none_of(f.params.begin(), f.params.end(),
                     [&](const TunableParam& p) { return p.name == name; })) {
      return std::nullopt;
    }
  }
  SpacePoint p{file, {}};
  for (const auto& param : f.params) {
    const auto given = tunables.find(param.name);
    const long long value =
        given == tunables.end() ? param.default_for(context_.at("elem_bytes")) : given->second;
    const auto it = std::find(param.candidates.begin(), param.candidates.end(), value);
    if (it == param.candidates.end()) return std::nullopt;
    p.choice.push_back(static_cast<uint8_t>(it - param.candidates.begin()));
  }
  return find(p);
}

ParamValues SearchSpace::values(PointId id) const {
  const SpacePoint p = point(id);
  const KernelFile& file = *files_[static_cast<size_t>(p.file)];
  ParamValues params;
  for (size_t i = 0; i < file.params.size(); ++i)
    params[file.params[i].name] = file.params[i].candidates[p.choice[i]];
  return file.with_derived(params, context_);
}

LaunchShape SearchSpace::launch_shape(PointId id) const {
  const KernelFile& file = *files_[static_cast<size_t>(point(id).file)];
  Bindings b = context_;
  for (const auto& [name, value] : values(id))
    b[name] = value;
  LaunchShape shape;
  if (file.block_threads) shape.threads = file.block_threads->evaluate(b);
  if (file.shared_bytes) shape.dynamic_shared_bytes = file.shared_bytes->evaluate(b);
  if (file.cluster_blocks) shape.cluster_blocks = file.cluster_blocks->evaluate(b);
  return shape;
}

std::vector<PointId> SearchSpace::neighbors(PointId id) const {
  const SpacePoint p = point(id);
  const FilePlan& plan = *plans_[static_cast<size_t>(p.file)];
  std::vector<PointId> out;
  std::set<PointId> seen;  // a change repaired by moving another can meet that one repaired
  for (size_t d = 0; d < p.choice.size(); ++d) {
    for (size_t c = 0; c < plan.file.params[d].candidates.size(); ++c) {
      if (c == p.choice[d]) continue;
      SpacePoint changed = p;
      changed.choice[d] = static_cast<uint8_t>(c);
      // The change itself when it is feasible, else the change repaired.
      if (const auto n = repair(changed, d); n && seen.insert(*n).second) out.push_back(*n);
    }
  }
  return out;
}

std::optional<PointId> SearchSpace::repair(SpacePoint point, size_t kept) const {
  const FilePlan& plan = *plans_.at(static_cast<size_t>(point.file));
  std::vector<long long> values;
  std::vector<long long> scratch;
  // How far a point gets through the file's steps in solver order: all the way when feasible.
  const auto reach = [&](const SpacePoint& p) {
    size_t passed = 0;
    return plan.violation(p.choice, values, scratch, device_, &passed).empty()
               ? std::numeric_limits<size_t>::max()
               : passed;
  };
  struct Move {
    size_t tunable = 0;
    uint8_t candidate = 0;
    size_t reach = 0;
    int distance = 0;
  };
  // Tunable e's nearest candidate (the lower first at equal distance) that gets `point` further
  // than `from`, if any.
  const auto nearest_gain = [&](size_t e, size_t from) -> std::optional<Move> {
    const int n = static_cast<int>(plan.file.params[e].candidates.size());
    const int at = point.choice[e];
    for (int distance = 1; distance < n; ++distance) {
      std::optional<Move> best;
      for (const int c : {at - distance, at + distance}) {
        if (c < 0 || c >= n) continue;
        SpacePoint moved = point;
        moved.choice[e] = static_cast<uint8_t>(c);
        const size_t r = reach(moved);
        if (r > from && (!best || r > best->reach))
          best = Move{e, static_cast<uint8_t>(c), r, distance};
      }
      if (best) return best;
    }
    return std::nullopt;
  };
  std::vector<bool> moved(point.choice.size(), false);
  moved.at(kept) = true;
  // The winning move already measured the point it leads to: its reach is the next `now`.
  for (size_t now = reach(point); now != std::numeric_limits<size_t>::max();) {
    // Of the tunables not moved yet, the one whose nearest gain gets furthest (the nearer on a
    // tie) is moved.
    std::optional<Move> best;
    for (size_t e = 0; e < point.choice.size(); ++e) {
      if (moved[e]) continue;
      const auto gain = nearest_gain(e, now);
      if (gain && (!best || gain->reach > best->reach ||
                   (gain->reach == best->reach && gain->distance < best->distance)))
        best = gain;
    }
    if (!best) return std::nullopt;
    point.choice[best->tunable] = best->candidate;
    moved[best->tunable] = true;
    now = best->reach;
  }
  return id_of(point);
}

}  // namespace kforge
