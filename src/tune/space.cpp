#include "tune/space.h"

#include <chrono>
#include <functional>

#include <fmt/format.h>

#include "core/error.h"
#include "device/launch_limits.h"

namespace kforge {

// Depth-first solver for one file. Every name an expression can use gets a slot in `values`;
// tunables are bound one per depth, and each check runs at the first depth where all of its
// names are bound.
struct SearchSpace::Solver {
  // A derived value to compute, or a constraint to test, once its names are bound.
  struct Step {
    enum Kind { derive, require, threads, shared, cluster } kind;
    const Expression* expression;
    int slot = -1;                 // derive: where the value goes
    std::vector<int> input_slots;  // the expression's variables, in its order
    std::string reason;            // require: the text reported when it fails
  };

  const KernelFile& file;
  const DeviceInfo& device;
  std::vector<long long> values;                 // by slot
  std::map<std::string, int, std::less<>> slot;  // name -> slot
  std::vector<std::vector<Step>> steps_at;       // steps_at[d]: after tunable d is bound
  std::vector<double> subtree;                   // raw combinations below depth d
  std::vector<long long> scratch;

  Solver(const KernelFile& f, const Bindings& context, const DeviceInfo& d)
      : file(f), device(d), steps_at(f.params.size() + 1) {
    for (const auto& [name, value] : context)
      bind_new(name, value);
    for (const auto& p : file.params)
      bind_new(p.name, 0);
    for (const auto& dv : file.derived)
      bind_new(dv.name, 0);
    // A derived value is ready when its inputs are; later steps may depend on it.
    std::vector<int> ready_depth(values.size(), 0);
    for (size_t i = 0; i < file.params.size(); ++i)
      ready_depth[slot.at(file.params[i].name)] = static_cast<int>(i) + 1;
    const auto add = [&](Step step) {
      int depth = 0;
      for (const auto& name : step.expression->variables()) {
        const auto it = slot.find(name);
        if (it == slot.end()) {
          throw UsageError(fmt::format(
              "{}: '{}' names '{}', which is not a parameter, a derived value, a device limit or "
              "a size of the problem",
              file.path.string(), step.expression->text(), name));
        }
        step.input_slots.push_back(it->second);
        depth = std::max(depth, ready_depth[it->second]);
      }
      if (step.kind == Step::derive) ready_depth[step.slot] = depth;
      steps_at[depth].push_back(std::move(step));
    };
    for (const auto& dv : file.derived)
      add({Step::derive, &dv.expression, slot.at(dv.name)});
    for (const auto& r : file.requirements) {
      add({Step::require,
           &r.expression,
           -1,
           {},
           fmt::format("require '{}' (line {})", r.expression.text(), r.line)});
    }
    if (file.block_threads) add({Step::threads, &*file.block_threads});
    if (file.shared_bytes) add({Step::shared, &*file.shared_bytes});
    if (file.cluster_blocks) add({Step::cluster, &*file.cluster_blocks});

    subtree.assign(file.params.size() + 1, 1.0);
    for (size_t depth = file.params.size(); depth-- > 0;) {
      subtree[depth] =
          subtree[depth + 1] * static_cast<double>(file.params[depth].candidates.size());
    }
  }

  void bind_new(const std::string& name, long long value) {
    slot[name] = static_cast<int>(values.size());
    values.push_back(value);
  }

  long long evaluate(const Step& step) {
    scratch.resize(step.input_slots.size());
    for (size_t i = 0; i < step.input_slots.size(); ++i)
      scratch[i] = values[step.input_slots[i]];
    return step.expression->evaluate_values(scratch.data());
  }

  // Runs the steps of one depth; returns the reason of the first failure, or "".
  std::string run_steps(int depth) {
    for (const Step& step : steps_at[depth]) {
      long long v = 0;
      try {
        v = evaluate(step);
      } catch (const Error& e) {
        return step.kind == Step::derive ? fmt::format("derive: {}", e.what()) : e.what();
      }
      std::string why;
      switch (step.kind) {
        case Step::derive:
          values[step.slot] = v;
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
    }
    return "";
  }

  void solve(int file_index, std::vector<SpacePoint>& out, std::map<std::string, double>& pruned) {
    SpacePoint p{file_index, std::vector<uint8_t>(file.params.size())};
    if (const std::string why = run_steps(0); !why.empty()) {
      pruned[why] += subtree[0];
      return;
    }
    const std::function<void(size_t)> descend = [&](size_t depth) {
      if (depth == file.params.size()) {
        out.push_back(p);
        return;
      }
      const TunableParam& param = file.params[depth];
      const int s = slot.at(param.name);
      for (size_t c = 0; c < param.candidates.size(); ++c) {
        p.choice[depth] = static_cast<uint8_t>(c);
        values[s] = param.candidates[c];
        if (const std::string why = run_steps(static_cast<int>(depth) + 1); !why.empty()) {
          pruned[why] += subtree[depth + 1];
          continue;
        }
        descend(depth + 1);
      }
    };
    descend(0);
  }
};

SearchSpace SearchSpace::solve(std::vector<const KernelFile*> files, const Bindings& context,
                               const DeviceInfo& device) {
  const auto start = std::chrono::steady_clock::now();
  SearchSpace space;
  space.files_ = std::move(files);
  space.context_ = context;
  for (size_t f = 0; f < space.files_.size(); ++f) {
    const KernelFile& file = *space.files_[f];
    for (const auto& p : file.params) {
      if (p.candidates.size() > 255) {
        throw UsageError(
            fmt::format("{}: param {} has more than 255 candidates", file.path.string(), p.name));
      }
    }
    Solver solver(file, context, device);
    space.raw_size_ += solver.subtree[0];
    solver.solve(static_cast<int>(f), space.points_, space.pruned_);
  }
  space.index_.reserve(space.points_.size());
  for (size_t i = 0; i < space.points_.size(); ++i)
    space.index_.emplace(space.key_of(space.points_[i]), i);
  space.solve_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return space;
}

std::string SearchSpace::key_of(const SpacePoint& p) const {
  std::string key(1 + p.choice.size(), '\0');
  key[0] = static_cast<char>(p.file);
  for (size_t i = 0; i < p.choice.size(); ++i)
    key[i + 1] = static_cast<char>(p.choice[i]);
  return key;
}

std::optional<size_t> SearchSpace::find(const SpacePoint& point) const {
  const auto it = index_.find(key_of(point));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> SearchSpace::default_point(int file) const {
  const KernelFile& f = *files_.at(file);
  SpacePoint p{file, {}};
  for (const auto& param : f.params) {
    const auto it =
        std::find(param.candidates.begin(), param.candidates.end(), param.default_value);
    p.choice.push_back(static_cast<uint8_t>(it - param.candidates.begin()));
  }
  return find(p);
}

ParamValues SearchSpace::values(size_t index) const {
  const SpacePoint& p = points_.at(index);
  const KernelFile& file = *files_[p.file];
  ParamValues params;
  for (size_t i = 0; i < file.params.size(); ++i)
    params[file.params[i].name] = file.params[i].candidates[p.choice[i]];
  return file.with_derived(params, context_);
}

LaunchShape SearchSpace::launch_shape(size_t index) const {
  const KernelFile& file = *files_[points_.at(index).file];
  Bindings b = context_;
  for (const auto& [name, value] : values(index))
    b[name] = value;
  LaunchShape shape;
  if (file.block_threads) shape.threads = file.block_threads->evaluate(b);
  if (file.shared_bytes) shape.dynamic_shared_bytes = file.shared_bytes->evaluate(b);
  if (file.cluster_blocks) shape.cluster_blocks = file.cluster_blocks->evaluate(b);
  return shape;
}

std::vector<size_t> SearchSpace::neighbors(size_t index) const {
  const SpacePoint& p = points_.at(index);
  const KernelFile& file = *files_[p.file];
  std::vector<size_t> out;
  SpacePoint q = p;
  for (size_t i = 0; i < file.params.size(); ++i) {
    for (size_t c = 0; c < file.params[i].candidates.size(); ++c) {
      if (c == p.choice[i]) continue;
      q.choice[i] = static_cast<uint8_t>(c);
      if (const auto n = find(q)) out.push_back(*n);
    }
    q.choice[i] = p.choice[i];
  }
  return out;
}

}  // namespace kforge
