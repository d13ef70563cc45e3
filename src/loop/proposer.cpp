#include "loop/proposer.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"
#include "core/text.h"
#include "loop/llm_proposer.h"
#include "tune/strategy.h"
#include "tune/tuner.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

// A fixed sequence of kernel files, proposed in name order. It resumes where the task's history
// left off: the files already proposed by it (its experiments in the journal) are skipped.
class ScriptedProposer final : public Proposer {
 public:
  explicit ScriptedProposer(const std::string& dir) {
    if (dir.empty() || !fs::is_directory(dir))
      throw UsageError(fmt::format("scripted:DIR: {} is not a directory", dir));
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && entry.path().extension() != ".note")
        files_.push_back(entry.path());
    }
    std::sort(files_.begin(), files_.end());
    if (files_.empty()) throw UsageError(fmt::format("scripted:DIR: {} has no files", dir));
  }

  std::string_view name() const override { return "scripted"; }

  std::optional<Proposal> next(const ProposalContext& context) override {
    const auto done =
        std::count_if(context.history.begin(), context.history.end(),
                      [](const ExperimentRecord& r) { return r.proposer == "scripted"; });
    if (static_cast<size_t>(done) >= files_.size()) return std::nullopt;
    const fs::path& file = files_[static_cast<size_t>(done)];
    std::string note = file.filename().string();
    if (fs::path note_file = fs::path(file.string() + ".note"); fs::exists(note_file)) {
      const std::string text = read_text_file(note_file);
      note = text.substr(0, text.find('\n'));
    }
    return Proposal{read_text_file(file), note};
  }

 private:
  std::vector<fs::path> files_;
};

// The file's text with each tunable's default set to `values` (its `param:` header line).
std::string with_defaults(const std::string& source, const KernelFile& file,
                          const ParamValues& values) {
  std::vector<std::string> lines = split_lines(source);
  for (const TunableParam& param : file.params) {
    std::string& line = lines.at(static_cast<size_t>(param.line - 1));
    // The default is a number or an expression of elem_bytes (docs/kernel-format.md).
    const std::regex pattern("\\b" + param.name + "\\s*=\\s*(.+?)\\s+in\\s*\\{");
    std::smatch m;
    if (!std::regex_search(line, m, pattern))
      throw Error(fmt::format("line {}: no default for {} to set", param.line, param.name));
    line.replace(static_cast<size_t>(m.position(1)), static_cast<size_t>(m.length(1)),
                 std::to_string(values.at(param.name)));
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i)
    out += lines[i] + (i + 1 < lines.size() || source.ends_with('\n') ? "\n" : "");
  return out;
}

// The search of `kforge tune` over the task's file, asked for one point at a time. Its path is
// a function of its seed and the costs it is told, so a later run replays the journal's tuner
// experiments through it (same proposals, same costs) and goes on where it stopped.
class TunerProposer final : public Proposer {
 public:
  explicit TunerProposer(std::string strategy)
      : strategy_name_(strategy.empty() ? "local" : std::move(strategy)) {}

  std::string_view name() const override { return "tuner"; }

  std::optional<Proposal> next(const ProposalContext& context) override {
    if (!strategy_ || task_ != context.task_name) start(context);
    // The previous proposal's outcome is the journal's last tuner experiment.
    if (pending_) {
      const auto last =
          std::find_if(context.history.rbegin(), context.history.rend(),
                       [](const ExperimentRecord& r) { return r.proposer == "tuner"; });
      strategy_->observe(*pending_, last != context.history.rend() ? cost(*last) : kFailed);
      pending_.reset();
    }
    const std::optional<PointId> point = strategy_->propose();
    if (!point) return std::nullopt;
    pending_ = point;
    const ParamValues values = space_->values(*point);
    std::string note;
    for (const auto& [name, value] : values)
      note += fmt::format("{}{}={}", note.empty() ? "" : " ", name, value);
    return Proposal{with_defaults(context.current, *file_, values), note};
  }

 private:
  static constexpr double kFailed = std::numeric_limits<double>::infinity();

  static double cost(const ExperimentRecord& r) {
    const bool timed = r.verdict == "KEEP" || r.verdict == "REVERT" || r.verdict == "UNCHANGED";
    return timed && r.time_us > 0 ? r.time_us : kFailed;
  }

  void start(const ProposalContext& context) {
    task_ = context.task_name;
    pending_.reset();
    file_ = std::make_unique<KernelFile>(KernelFile::parse(context.current, context.kernel_path));
    if (file_->params.empty())
      throw UsageError(fmt::format("tuner: {} has no tunables", context.kernel_path.string()));
    const TuneProblem problem{context.task.op, context.task.sizes, context.task.dtype};
    space_ = std::make_unique<SearchSpace>(
        SearchSpace::solve({file_.get()}, tune_context(context.device, problem), context.device));
    strategy_ = make_strategy(strategy_name_, *space_, kSeed);
    for (const ExperimentRecord& r : context.history) {
      if (r.proposer != "tuner") continue;
      const std::optional<PointId> point = strategy_->propose();
      if (!point) break;
      strategy_->observe(*point, cost(r));
    }
  }

  static constexpr uint64_t kSeed = 1;
  std::string strategy_name_;
  std::string task_;  // the task the search is over
  std::unique_ptr<KernelFile> file_;
  std::unique_ptr<SearchSpace> space_;
  std::unique_ptr<Strategy> strategy_;
  std::optional<PointId> pending_;
};

using Factory = std::function<std::unique_ptr<Proposer>(const std::string& argument)>;

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"scripted", [](const std::string& a) { return std::make_unique<ScriptedProposer>(a); }},
      {"tuner", [](const std::string& a) { return std::make_unique<TunerProposer>(a); }},
      {"llm", [](const std::string& a) { return make_llm_proposer(a); }},
  };
  return r;
}

}  // namespace

std::unique_ptr<Proposer> make_proposer(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string argument = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const auto it = registry().find(name);
  if (it == registry().end()) {
    throw UsageError(fmt::format("no proposer named {} (there are: {})", name,
                                 fmt::join(proposer_names(), ", ")));
  }
  return it->second(argument);
}

std::vector<std::string> proposer_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry())
    names.push_back(name);
  return names;
}

std::string move_on_reason(const MoveOnRules& rules, const std::vector<ExperimentRecord>& history,
                           double best_speedup, double best_roofline, double elapsed_seconds) {
  if (rules.roofline_fraction > 0 && best_roofline >= rules.roofline_fraction)
    return fmt::format("the best is at {:.0f}% of its roofline bound (target {:.0f}%)",
                       100 * best_roofline, 100 * rules.roofline_fraction);
  if (rules.target_speedup > 0 && best_speedup >= rules.target_speedup)
    return fmt::format("the best is {:.2f}x the start (target {:.2f}x)", best_speedup,
                       rules.target_speedup);
  if (rules.max_consecutive_reverts > 0) {
    const int in_a_row = not_kept_in_a_row(history);
    if (in_a_row >= rules.max_consecutive_reverts)
      return fmt::format("{} experiments in a row not kept", in_a_row);
  }
  if (rules.budget_seconds > 0 && elapsed_seconds >= rules.budget_seconds)
    return fmt::format("the task's time budget ({:.0f} s) is spent", rules.budget_seconds);
  return "";
}

}  // namespace kforge
