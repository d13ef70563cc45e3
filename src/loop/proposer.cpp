#include "loop/proposer.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"

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

using Factory = std::function<std::unique_ptr<Proposer>(const std::string& argument)>;

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"scripted", [](const std::string& a) { return std::make_unique<ScriptedProposer>(a); }},
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
                           double best_speedup, double elapsed_seconds) {
  if (rules.target_speedup > 0 && best_speedup >= rules.target_speedup)
    return fmt::format("the best is {:.2f}x the start (target {:.2f}x)", best_speedup,
                       rules.target_speedup);
  if (rules.max_consecutive_reverts > 0) {
    int in_a_row = 0;
    for (auto r = history.rbegin(); r != history.rend() && !r->kept; ++r)
      ++in_a_row;
    if (in_a_row >= rules.max_consecutive_reverts)
      return fmt::format("{} experiments in a row not kept", in_a_row);
  }
  if (rules.budget_seconds > 0 && elapsed_seconds >= rules.budget_seconds)
    return fmt::format("the task's time budget ({:.0f} s) is spent", rules.budget_seconds);
  return "";
}

}  // namespace kforge
