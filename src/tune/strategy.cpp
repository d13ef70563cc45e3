#include "tune/strategy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/random.h"

namespace kforge {
namespace {

// A uniform draw from [0, n). The modulo's bias is at most n / 2^64: under 10^-6 up to 10^13
// points.
uint64_t uniform_below(Rng& rng, uint64_t n) {
  return rng.next() % n;
}

// Draws the feasible points of the space, or of one file, in uniformly random order, each at
// most once, skipping the points a strategy has taken already (proposed by other means).
//
// In a ranked space, this is a Fisher-Yates shuffle of the ranks, kept sparse: only positions
// that a swap moved are stored, so memory grows with the draws, never with the space. When the
// counts are estimated there are no ranks, and it is rejection sampling of raw ids: just as
// uniform, at 1 / (feasible share) feasibility checks a draw; it gives up after
// kRejectionDrawLimit checks, so a space that is almost all infeasible ends the search instead
// of stalling it.
class UniformDraw {
 public:
  static constexpr uint64_t kRejectionDrawLimit = 1'000'000;

  UniformDraw(const SearchSpace& space, std::optional<int> file) : space_(space) {
    if (space.ranked()) {
      begin_ = file ? space.rank_begin(*file) : 0;
      end_ = file ? space.rank_begin(*file + 1) : space.size();
    } else {
      begin_ = file ? space.first_id(*file) : 0;
      end_ = file ? space.first_id(*file + 1) : space.raw_end();
    }
    next_ = begin_;
  }

  std::optional<PointId> next(Rng& rng, const std::unordered_set<PointId>& taken) {
    if (!space_.ranked()) {
      if (begin_ == end_) return std::nullopt;
      for (uint64_t draw = 0; draw < kRejectionDrawLimit; ++draw) {
        const PointId id = begin_ + uniform_below(rng, end_ - begin_);
        if (!taken.contains(id) && space_.feasible(id)) return id;
      }
      return std::nullopt;
    }
    while (next_ < end_) {
      // Swap a uniform pick of the positions left into position next_, which is then done.
      const uint64_t pick = next_ + uniform_below(rng, end_ - next_);
      const uint64_t rank = at(pick);
      if (pick != next_) moved_[pick] = at(next_);
      moved_.erase(next_);
      ++next_;
      const PointId id = space_.nth(rank);
      if (!taken.contains(id)) return id;
    }
    return std::nullopt;
  }

 private:
  uint64_t at(uint64_t position) const {
    const auto it = moved_.find(position);
    return it == moved_.end() ? position : it->second;
  }

  const SearchSpace& space_;
  uint64_t begin_ = 0;  // ranks when the space is ranked, else raw ids
  uint64_t end_ = 0;
  uint64_t next_ = 0;                             // ranked: positions before it are drawn
  std::unordered_map<uint64_t, uint64_t> moved_;  // position -> the rank now there
};

// What every strategy keeps: the space, a seeded generator, which points were proposed, and
// the costs observed so far; sets and maps of those points, never arrays over the space.
class StrategyBase : public Strategy {
 protected:
  StrategyBase(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : space_(space),
        rng_(seed, 0x7475'6e65),
        starts_(std::move(starts)),
        any_point_(space, std::nullopt) {}

  // The next start nobody proposed yet, marked as proposed.
  std::optional<PointId> next_start() {
    while (next_start_ < starts_.size()) {
      const PointId p = starts_[next_start_++];
      if (!was_proposed(p)) return mark(p);
    }
    return std::nullopt;
  }

  size_t uniform_index(size_t n) { return static_cast<size_t>(uniform_below(rng_, n)); }
  bool was_proposed(PointId p) const { return proposed_.contains(p); }
  PointId mark(PointId p) {
    proposed_.insert(p);
    return p;
  }
  bool observed(PointId p) const { return cost_.contains(p); }
  double cost_of(PointId p) const { return cost_.at(p); }
  // Proposed, not yet observed (each point is proposed and observed once).
  size_t outstanding() const { return proposed_.size() - cost_.size(); }
  void record(PointId p, double cost) { cost_[p] = cost; }

  // A feasible point nobody proposed yet, uniformly among them.
  std::optional<PointId> random_unproposed() { return any_point_.next(rng_, proposed_); }

  // The default point of the first file that has a feasible one: the hand-picked start.
  std::optional<PointId> default_start() const {
    for (size_t f = 0; f < space_.files().size(); ++f) {
      if (const auto p = space_.default_point(static_cast<int>(f))) return p;
    }
    return std::nullopt;
  }

  void shuffle(std::vector<PointId>& v) {
    for (size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[uniform_index(i)]);
  }

  const SearchSpace& space_;
  Rng rng_;
  std::vector<PointId> starts_;
  std::unordered_set<PointId> proposed_;
  std::unordered_map<PointId, double> cost_;

 private:
  size_t next_start_ = 0;
  UniformDraw any_point_;
};

// Every point, in the space's order (ids increasing).
class Exhaustive final : public StrategyBase {
 public:
  Exhaustive(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : StrategyBase(space, seed, std::move(starts)) {
    if (!space.ranked() || space.size() > kExhaustiveLimit) {
      throw UsageError(fmt::format(
          "exhaustive search evaluates every feasible variant, at most {}; this space has {} of "
          "{:.0f} raw combinations: use --strategy random, local or evolution with a budget "
          "(--budget N or --time S), or hold tunables fixed with --fix NAME=VALUE",
          kExhaustiveLimit,
          space.ranked() ? fmt::format("{} feasible variants", space.size())
                         : fmt::format("about {} feasible variants (estimated from {} samples)",
                                       space.size(), space.estimate_samples()),
          space.raw_size()));
    }
  }
  std::optional<PointId> propose() override {
    if (const auto start = next_start()) return start;
    while (next_ < space_.size()) {
      const PointId p = space_.nth(next_++);
      if (!was_proposed(p)) return mark(p);
    }
    return std::nullopt;
  }
  void observe(PointId p, double cost) override { record(p, cost); }

 private:
  uint64_t next_ = 0;
};

// Uniform sampling without replacement: the baseline any smarter strategy must beat.
class RandomSearch final : public StrategyBase {
 public:
  RandomSearch(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : StrategyBase(space, seed, std::move(starts)) {}
  std::optional<PointId> propose() override {
    if (const auto start = next_start()) return start;
    const auto p = random_unproposed();
    return p ? std::optional(mark(*p)) : std::nullopt;
  }
  void observe(PointId p, double cost) override { record(p, cost); }
};

// Iterated local search, one climber per kernel file. A climber starts from its file's first
// start point (else its defaults), tries the neighbours of its current point (one tunable
// changed, or two where a constraint couples them: SearchSpace::neighbors) in random order and
// moves to any that is faster; when a point has no untried neighbour left, it is a local
// optimum: the climber jumps to a random walk of a few steps from its best point and climbs
// again. Neighbours never leave a file (tunables differ between files), so files with
// fundamentally different strategies each get a climber, and proposals go round-robin between
// them: the budget is shared evenly and no file is judged by one point.
class LocalSearch final : public StrategyBase {
 public:
  LocalSearch(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : StrategyBase(space, seed, std::move(starts)), climbers_(space.files().size()) {}

  std::optional<PointId> propose() override {
    if (const auto start = next_start()) return start;
    for (size_t tried = 0; tried < climbers_.size(); ++tried) {
      const size_t file = next_file_;
      next_file_ = (next_file_ + 1) % climbers_.size();
      if (const auto p = propose_in(file)) {
        ++climbers_[file].proposed;
        return mark(*p);
      }
    }
    return std::nullopt;
  }

  void observe(PointId p, double cost) override {
    record(p, cost);
    Climber& c = climbers_[static_cast<size_t>(space_.point(p).file)];
    ++c.observed;
    if (cost < c.best_cost) {
      c.best_cost = cost;
      c.best = p;
    }
    if (p == c.current) {
      c.current_cost = cost;
    } else if (cost < c.current_cost) {
      c.current_cost = cost;
      move_to(c, p);
    }
  }

 private:
  struct Climber {
    bool started = false;
    PointId current = 0;
    double current_cost = std::numeric_limits<double>::infinity();
    std::vector<PointId> queue;  // untried neighbours of `current`
    std::optional<PointId> best;
    double best_cost = std::numeric_limits<double>::infinity();
    size_t proposed = 0;
    size_t observed = 0;
    std::optional<UniformDraw> draw;  // the file's points in random order, made when needed
  };

  std::optional<PointId> propose_in(size_t file) {
    Climber& c = climbers_[file];
    if (!c.started) {
      c.started = true;
      if (const auto start = first_start_in(file)) {
        move_to(c, *start);  // proposed already, with the other starts
      } else {
        auto from = space_.default_point(static_cast<int>(file));
        if (!from || was_proposed(*from)) from = random_unproposed_in(file);
        if (!from) return std::nullopt;
        move_to(c, *from);
        return from;
      }
    }
    while (!c.queue.empty()) {
      const PointId n = c.queue.back();
      c.queue.pop_back();
      if (!was_proposed(n)) return n;
    }
    // The neighbourhood is exhausted. Wait for its results: one of them may move the climber.
    if (c.proposed > c.observed) return std::nullopt;
    const auto jump = perturbed_best(c, file);
    if (!jump) return std::nullopt;
    move_to(c, *jump);
    return jump;
  }

  // The first start point of `file`, if any.
  std::optional<PointId> first_start_in(size_t file) const {
    for (const PointId p : starts_) {
      if (space_.point(p).file == static_cast<int>(file)) return p;
    }
    return std::nullopt;
  }

  void move_to(Climber& c, PointId p) {
    c.current = p;
    c.current_cost = observed(p) ? cost_of(p) : std::numeric_limits<double>::infinity();
    c.queue = space_.neighbors(p);
    shuffle(c.queue);
  }

  std::optional<PointId> perturbed_best(const Climber& c, size_t file) {
    const PointId from = c.best ? *c.best : c.current;
    for (int attempt = 0; attempt < 32; ++attempt) {
      PointId p = from;
      const int steps = 2 + static_cast<int>(uniform_index(2));
      for (int s = 0; s < steps; ++s) {
        const auto n = space_.neighbors(p);
        if (n.empty()) break;
        p = n[uniform_index(n.size())];
      }
      if (!was_proposed(p)) return p;
    }
    return random_unproposed_in(file);
  }

  // A feasible point of `file` nobody proposed yet, uniformly among them.
  std::optional<PointId> random_unproposed_in(size_t file) {
    Climber& c = climbers_[file];
    if (!c.draw) c.draw.emplace(space_, static_cast<int>(file));
    return c.draw->next(rng_, proposed_);
  }

  std::vector<Climber> climbers_;
  size_t next_file_ = 0;
};

// A steady-state evolutionary algorithm: a population of the best points seen; each proposal
// is a child of two tournament-selected parents of the same file (uniform crossover of their
// tunables) with a mutation that moves one tunable to a nearby candidate (and, when that breaks
// a constraint, another tunable as little as repairs it). The population is the model of where
// fast variants live; children that are infeasible or already tried are redrawn.
class Evolution final : public StrategyBase {
 public:
  Evolution(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : StrategyBase(space, seed, std::move(starts)) {}

  std::optional<PointId> propose() override {
    if (const auto start = next_start()) return start;
    if (proposed_.size() < kPopulation) {
      const auto first = proposed_.empty() ? default_start() : std::nullopt;
      const auto p = first ? first : random_unproposed();
      return p ? std::optional(mark(*p)) : std::nullopt;
    }
    if (population_.size() < 2) {
      if (outstanding() > 0) return std::nullopt;
      const auto p = random_unproposed();
      return p ? std::optional(mark(*p)) : std::nullopt;
    }
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (const auto child = breed(); child && !was_proposed(*child)) return mark(*child);
    }
    const auto p = random_unproposed();
    return p ? std::optional(mark(*p)) : std::nullopt;
  }

  void observe(PointId p, double cost) override {
    record(p, cost);
    if (!std::isfinite(cost)) return;
    population_.push_back(p);
    if (population_.size() > kPopulation) {
      const auto worst =
          std::max_element(population_.begin(), population_.end(),
                           [&](PointId a, PointId b) { return cost_of(a) < cost_of(b); });
      population_.erase(worst);
    }
  }

 private:
  static constexpr size_t kPopulation = 12;

  PointId tournament() {
    const PointId a = population_[uniform_index(population_.size())];
    const PointId b = population_[uniform_index(population_.size())];
    return cost_of(a) <= cost_of(b) ? a : b;
  }

  std::optional<PointId> breed() {
    const SpacePoint mother = space_.point(tournament());
    SpacePoint father = space_.point(tournament());
    if (father.file != mother.file) father = mother;
    SpacePoint child = mother;
    for (size_t i = 0; i < child.choice.size(); ++i) {
      if (rng_.next() & 1) child.choice[i] = father.choice[i];
    }
    // Mutate one tunable: a step to an adjacent candidate, or (one time in four) any candidate.
    const auto& params = space_.files()[static_cast<size_t>(child.file)]->params;
    if (params.empty()) return space_.find(child);
    const size_t i = uniform_index(params.size());
    const int n = static_cast<int>(params[i].candidates.size());
    int c = child.choice[i];
    if (uniform_index(4) == 0) {
      c = static_cast<int>(uniform_index(static_cast<size_t>(n)));
    } else {
      c += (rng_.next() & 1) ? 1 : -1;
    }
    child.choice[i] = static_cast<uint8_t>(std::clamp(c, 0, n - 1));
    if (const auto id = space_.find(child)) return id;
    // A mutation that breaks a constraint coupling it to other tunables is kept with those
    // moved as little as makes it feasible: a population in a region such a constraint borders
    // could never leave it otherwise.
    return space_.repair(child, i);
  }

  std::vector<PointId> population_;
};

// The start points and nothing else: a table's variants from another device, checked and timed
// on this one (`kforge tune --adopt`).
class Given final : public StrategyBase {
 public:
  Given(const SearchSpace& space, uint64_t seed, std::vector<PointId> starts)
      : StrategyBase(space, seed, std::move(starts)) {}
  std::optional<PointId> propose() override { return next_start(); }
  void observe(PointId p, double cost) override { record(p, cost); }
};

}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> list = {
      {"exhaustive", "every feasible variant, in order"},
      {"random", "uniform sampling without replacement"},
      {"local", "iterated local search from the defaults: climb neighbours, jump when stuck"},
      {"evolution", "steady-state evolutionary search: crossover and mutation of the best"},
      {"given", "the start points only (--start, or another device's table rows with --adopt)"},
  };
  return list;
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, const SearchSpace& space,
                                        uint64_t seed, const std::vector<PointId>& starts) {
  if (name == "exhaustive") return std::make_unique<Exhaustive>(space, seed, starts);
  if (name == "random") return std::make_unique<RandomSearch>(space, seed, starts);
  if (name == "local") return std::make_unique<LocalSearch>(space, seed, starts);
  if (name == "evolution") return std::make_unique<Evolution>(space, seed, starts);
  if (name == "given") return std::make_unique<Given>(space, seed, starts);
  std::vector<std::string> names;
  for (const auto& s : strategies())
    names.push_back(s.name);
  throw UsageError(fmt::format("unknown strategy '{}' (known: {})", name, fmt::join(names, ", ")));
}

}  // namespace kforge
