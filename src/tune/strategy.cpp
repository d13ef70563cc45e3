#include "tune/strategy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/random.h"

namespace kforge {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// What every strategy keeps: the space, a seeded generator, which points were proposed, and
// the costs observed so far.
class StrategyBase : public Strategy {
 protected:
  StrategyBase(const SearchSpace& space, uint64_t seed)
      : space_(space),
        rng_(seed, 0x7475'6e65),
        proposed_(space.size(), false),
        cost_(space.size(), kUnknown) {}

  size_t uniform_index(size_t n) { return static_cast<size_t>(rng_.next() % n); }
  bool was_proposed(size_t p) const { return proposed_[p]; }
  size_t mark(size_t p) {
    proposed_[p] = true;
    ++proposals_;
    return p;
  }
  bool observed(size_t p) const { return !std::isnan(cost_[p]); }
  size_t outstanding() const { return proposals_ - observations_; }
  void record(size_t p, double cost) {
    cost_[p] = cost;
    ++observations_;
    if (cost < best_cost_) {
      best_cost_ = cost;
      best_ = p;
    }
  }

  // A point nobody proposed yet, uniformly (rejection sampling first; a scan once the space
  // is mostly used up).
  std::optional<size_t> random_unproposed() {
    if (proposals_ >= space_.size()) return std::nullopt;
    for (int attempt = 0; attempt < 64; ++attempt) {
      const size_t p = uniform_index(space_.size());
      if (!proposed_[p]) return p;
    }
    const size_t start = uniform_index(space_.size());
    for (size_t i = 0; i < space_.size(); ++i) {
      const size_t p = (start + i) % space_.size();
      if (!proposed_[p]) return p;
    }
    return std::nullopt;
  }

  // The default point of the first file that has a feasible one: the hand-picked start.
  std::optional<size_t> default_start() const {
    for (size_t f = 0; f < space_.files().size(); ++f) {
      if (const auto p = space_.default_point(static_cast<int>(f))) return p;
    }
    return std::nullopt;
  }

  void shuffle(std::vector<size_t>& v) {
    for (size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[uniform_index(i)]);
  }

  const SearchSpace& space_;
  Rng rng_;
  std::vector<bool> proposed_;
  std::vector<double> cost_;
  size_t proposals_ = 0;
  size_t observations_ = 0;
  std::optional<size_t> best_;
  double best_cost_ = std::numeric_limits<double>::infinity();
};

// Every point, in the space's order.
class Exhaustive final : public StrategyBase {
 public:
  Exhaustive(const SearchSpace& space, uint64_t seed) : StrategyBase(space, seed) {}
  std::optional<size_t> propose() override {
    if (next_ >= space_.size()) return std::nullopt;
    return mark(next_++);
  }
  void observe(size_t p, double cost) override { record(p, cost); }

 private:
  size_t next_ = 0;
};

// Uniform sampling without replacement: the baseline any smarter strategy must beat.
class RandomSearch final : public StrategyBase {
 public:
  RandomSearch(const SearchSpace& space, uint64_t seed) : StrategyBase(space, seed) {
    order_.resize(space.size());
    for (size_t i = 0; i < order_.size(); ++i)
      order_[i] = i;
  }
  std::optional<size_t> propose() override {
    // Incremental Fisher-Yates: position next_ gets a uniform pick of the rest.
    if (next_ >= order_.size()) return std::nullopt;
    std::swap(order_[next_], order_[next_ + uniform_index(order_.size() - next_)]);
    return mark(order_[next_++]);
  }
  void observe(size_t p, double cost) override { record(p, cost); }

 private:
  std::vector<size_t> order_;
  size_t next_ = 0;
};

// Iterated local search, one climber per kernel file. A climber starts from its file's
// defaults, tries the neighbours of its current point (one tunable changed) in random order and
// moves to any that is faster; when a point has no untried neighbour left, it is a local
// optimum: the climber jumps to a random walk of a few steps from its best point and climbs
// again. Neighbours never leave a file (tunables differ between files), so files with
// fundamentally different strategies each get a climber, and proposals go round-robin between
// them: the budget is shared evenly and no file is judged by one point.
class LocalSearch final : public StrategyBase {
 public:
  LocalSearch(const SearchSpace& space, uint64_t seed)
      : StrategyBase(space, seed), climbers_(space.files().size()) {}

  std::optional<size_t> propose() override {
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

  void observe(size_t p, double cost) override {
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
    size_t current = 0;
    double current_cost = std::numeric_limits<double>::infinity();
    std::vector<size_t> queue;  // untried neighbours of `current`
    std::optional<size_t> best;
    double best_cost = std::numeric_limits<double>::infinity();
    size_t proposed = 0;
    size_t observed = 0;
  };

  std::optional<size_t> propose_in(size_t file) {
    Climber& c = climbers_[file];
    if (!c.started) {
      c.started = true;
      auto start = space_.default_point(static_cast<int>(file));
      if (!start || was_proposed(*start)) start = random_unproposed_in(file);
      if (!start) return std::nullopt;
      move_to(c, *start);
      return start;
    }
    while (!c.queue.empty()) {
      const size_t n = c.queue.back();
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

  void move_to(Climber& c, size_t p) {
    c.current = p;
    c.current_cost = observed(p) ? cost_[p] : std::numeric_limits<double>::infinity();
    c.queue = space_.neighbors(p);
    shuffle(c.queue);
  }

  std::optional<size_t> perturbed_best(const Climber& c, size_t file) {
    const size_t from = c.best ? *c.best : c.current;
    for (int attempt = 0; attempt < 32; ++attempt) {
      size_t p = from;
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

  // A point of `file` nobody proposed yet, uniformly among them (a scan from a random start).
  std::optional<size_t> random_unproposed_in(size_t file) {
    const size_t start = uniform_index(space_.size());
    for (size_t i = 0; i < space_.size(); ++i) {
      const size_t p = (start + i) % space_.size();
      if (!was_proposed(p) && static_cast<size_t>(space_.point(p).file) == file) return p;
    }
    return std::nullopt;
  }

  std::vector<Climber> climbers_;
  size_t next_file_ = 0;
};

// A steady-state evolutionary algorithm: a population of the best points seen; each proposal
// is a child of two tournament-selected parents of the same file (uniform crossover of their
// tunables) with a mutation that moves one tunable to a nearby candidate. The population is
// the model of where fast variants live; children that are infeasible or already tried are
// redrawn.
class Evolution final : public StrategyBase {
 public:
  Evolution(const SearchSpace& space, uint64_t seed) : StrategyBase(space, seed) {}

  std::optional<size_t> propose() override {
    if (proposals_ < kPopulation) {
      const auto first = proposals_ == 0 ? default_start() : std::nullopt;
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

  void observe(size_t p, double cost) override {
    record(p, cost);
    if (!std::isfinite(cost)) return;
    population_.push_back(p);
    if (population_.size() > kPopulation) {
      const auto worst = std::max_element(population_.begin(), population_.end(),
                                          [&](size_t a, size_t b) { return cost_[a] < cost_[b]; });
      population_.erase(worst);
    }
  }

 private:
  static constexpr size_t kPopulation = 12;

  size_t tournament() {
    const size_t a = population_[uniform_index(population_.size())];
    const size_t b = population_[uniform_index(population_.size())];
    return cost_[a] <= cost_[b] ? a : b;
  }

  std::optional<size_t> breed() {
    const SpacePoint& mother = space_.point(tournament());
    const SpacePoint* father = &space_.point(tournament());
    if (father->file != mother.file) father = &mother;
    SpacePoint child = mother;
    for (size_t i = 0; i < child.choice.size(); ++i) {
      if (rng_.next() & 1) child.choice[i] = father->choice[i];
    }
    // Mutate one tunable: a step to an adjacent candidate, or (one time in four) any candidate.
    const auto& params = space_.files()[child.file]->params;
    if (!params.empty()) {
      const size_t i = uniform_index(params.size());
      const int n = static_cast<int>(params[i].candidates.size());
      int c = child.choice[i];
      if (uniform_index(4) == 0) {
        c = static_cast<int>(uniform_index(static_cast<size_t>(n)));
      } else {
        c += (rng_.next() & 1) ? 1 : -1;
      }
      child.choice[i] = static_cast<uint8_t>(std::clamp(c, 0, n - 1));
    }
    return space_.find(child);
  }

  std::vector<size_t> population_;
};

}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> list = {
      {"exhaustive", "every feasible variant, in order"},
      {"random", "uniform sampling without replacement"},
      {"local", "iterated local search from the defaults: climb neighbours, jump when stuck"},
      {"evolution", "steady-state evolutionary search: crossover and mutation of the best"},
  };
  return list;
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, const SearchSpace& space,
                                        uint64_t seed) {
  if (name == "exhaustive") return std::make_unique<Exhaustive>(space, seed);
  if (name == "random") return std::make_unique<RandomSearch>(space, seed);
  if (name == "local") return std::make_unique<LocalSearch>(space, seed);
  if (name == "evolution") return std::make_unique<Evolution>(space, seed);
  std::vector<std::string> names;
  for (const auto& s : strategies())
    names.push_back(s.name);
  throw UsageError(fmt::format("unknown strategy '{}' (known: {})", name, fmt::join(names, ", ")));
}

}  // namespace kforge
