#include "loop/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/json_file.h"
#include "core/process.h"

namespace kforge {
namespace fs = std::filesystem;

nlohmann::json ExperimentRecord::to_json() const {
  nlohmann::json j = fields;
  j["experiment"] = number;
  j["verdict"] = verdict;
  j["kept"] = kept;
  j["commit"] = commit;
  j["proposer"] = proposer;
  j["note"] = note;
  j["time_us"] = time_us;
  j["speedup"] = speedup;
  return j;
}

ExperimentRecord ExperimentRecord::from_json(const nlohmann::json& j) {
  ExperimentRecord r;
  r.number = j.at("experiment").get<int>();
  r.verdict = j.value("verdict", "");
  r.kept = j.value("kept", false);
  r.commit = j.value("commit", "");
  r.proposer = j.value("proposer", "");
  r.note = j.value("note", "");
  r.time_us = j.value("time_us", 0.0);
  r.speedup = j.value("speedup", 0.0);
  r.fields = j;
  for (const char* key :
       {"experiment", "verdict", "kept", "commit", "proposer", "note", "time_us", "speedup"})
    r.fields.erase(key);
  return r;
}

namespace {

// Waits (up to 5 s) for a git that holds the index lock to finish; a lock older than that is
// stale, left by a git killed mid-way, and is removed.
void wait_for_index(const fs::path& repo) {
  const fs::path lock = repo / ".git" / "index.lock";
  for (int i = 0; i < 50 && fs::exists(lock); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::error_code ignored;
  fs::remove(lock, ignored);
}

// git -C repo ARGS...; throws Error with git's output when it fails. A git that a killed loop
// left running may hold the index lock: a command refused for it runs again once the lock is
// gone (wait_for_index).
std::string git(const fs::path& repo, std::vector<std::string> args) {
  args.insert(args.begin(), {"git", "-C", repo.string()});
  CommandResult r = run_command(args, std::chrono::minutes(2));
  if (!r.ok() && r.output.find("index.lock") != std::string::npos) {
    wait_for_index(repo);
    r = run_command(args, std::chrono::minutes(2));
  }
  if (!r.ok()) {
    throw Error(fmt::format("{} failed: {}", fmt::join(args, " "), r.output));
  }
  std::string out = r.output;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out;
}

// Appends one line and waits for it to reach the file.
void append_line(const fs::path& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot open {}", path.string()));
  const std::string text = line + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw Error(fmt::format("cannot append to {}", path.string()));
}

// Cuts a last line that a killed writer left without its newline.
void drop_torn_line(const fs::path& path) {
  if (!fs::exists(path)) return;
  const std::string text = read_text_file(path);
  if (text.empty() || text.back() == '\n') return;
  const size_t end = text.rfind('\n');
  fs::resize_file(path, end == std::string::npos ? 0 : end + 1);
}

std::string tsv_field(std::string text) {
  for (char& c : text) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string tsv_line(const ExperimentRecord& r) {
  return fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}", r.number, r.commit.substr(0, 12), r.verdict,
                     r.time_us > 0 ? fmt::format("{:.3f}", r.time_us) : "",
                     r.speedup > 0 ? fmt::format("{:.4f}", r.speedup) : "", tsv_field(r.proposer),
                     tsv_field(r.note));
}

}  // namespace

TaskJournal TaskJournal::open(const fs::path& task_dir, const fs::path& kernel_file) {
  TaskJournal journal(task_dir);
  const fs::path repo = task_dir / "repo";
  if (!fs::exists(repo / ".git")) {
    if (kernel_file.empty() || !fs::is_regular_file(kernel_file)) {
      throw UsageError(
          fmt::format("{} has no repository yet: a kernel file to start it from is "
                      "needed",
                      task_dir.string()));
    }
    fs::create_directories(repo);
    git(repo, {"init", "-q"});
    git(repo, {"config", "user.name", "kforge loop"});
    git(repo, {"config", "user.email", "kforge-loop@localhost"});
    fs::copy_file(kernel_file, repo / kernel_file.filename(), fs::copy_options::overwrite_existing);
    git(repo, {"add", kernel_file.filename().string()});
    git(repo, {"commit", "-q", "-m", fmt::format("start: {}", kernel_file.filename().string())});
  }
  journal.kernel_name_ = git(repo, {"ls-files"});
  if (journal.kernel_name_.empty() || journal.kernel_name_.find('\n') != std::string::npos) {
    throw Error(fmt::format("{} must track exactly one kernel file", repo.string()));
  }
  if (!fs::exists(task_dir / "results.tsv")) {
    append_line(task_dir / "results.tsv", fmt::format("{}", fmt::join(kResultsColumns, "\t")));
  }
  journal.load_records();
  journal.recover();
  return journal;
}

fs::path TaskJournal::kernel_path() const {
  return dir_ / "repo" / kernel_name_;
}

std::string TaskJournal::head() const {
  return git(dir_ / "repo", {"rev-parse", "HEAD"});
}

std::optional<fs::path> TaskJournal::interrupted() const {
  if (!interrupted_) return std::nullopt;
  return proposal_path(*interrupted_);
}

fs::path TaskJournal::proposal_path(int number) const {
  return experiment_dir(number) / ("proposal" + fs::path(kernel_name_).extension().string());
}

fs::path TaskJournal::experiment_dir(int number) const {
  return dir_ / "experiments" / fmt::format("{:04d}", number);
}

void TaskJournal::load_records() {
  const fs::path log = dir_ / "experiments.jsonl";
  drop_torn_line(log);
  drop_torn_line(dir_ / "results.tsv");
  // The experiment on results.tsv's last line (0 for the header alone): a kill between the two
  // logs leaves it one behind experiments.jsonl.
  const std::string tsv = read_text_file(dir_ / "results.tsv");
  const size_t previous = tsv.size() >= 2 ? tsv.rfind('\n', tsv.size() - 2) : std::string::npos;
  tsv_last_ = std::atoi(tsv.c_str() + (previous == std::string::npos ? 0 : previous + 1));
  records_.clear();
  if (!fs::exists(log)) return;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records_.push_back(ExperimentRecord::from_json(nlohmann::json::parse(line)));
  }
}

void TaskJournal::recover() {
  if (!fs::exists(pending_path())) return;
  const int number = read_json_file(pending_path()).at("experiment").get<int>();
  const fs::path record = experiment_dir(number) / "record.json";
  if (fs::exists(record)) {
    complete(ExperimentRecord::from_json(read_json_file(record)));
  } else {
    interrupted_ = number;
  }
}

TaskJournal::Origin TaskJournal::interrupted_origin() const {
  if (!interrupted_) return {};
  const nlohmann::json pending = read_json_file(pending_path());
  return {pending.value("proposer", ""), pending.value("note", ""),
          pending.value("fields", nlohmann::json::object())};
}

fs::path TaskJournal::begin(const std::string& proposal, const std::string& proposer,
                            const std::string& note, const nlohmann::json& fields) {
  if (interrupted_) {
    throw Error(fmt::format("experiment {} was interrupted: evaluate {} and finish it first",
                            *interrupted_, interrupted()->string()));
  }
  if (fs::exists(pending_path())) throw Error("an experiment is already under way");
  const int number = static_cast<int>(records_.size()) + 1;
  const fs::path path = proposal_path(number);
  write_text_atomically(path, proposal);
  write_json_atomically(
      pending_path(),
      {{"experiment", number}, {"proposer", proposer}, {"note", note}, {"fields", fields}});
  return path;
}

std::vector<ExperimentRecord> read_finished_experiments(const fs::path& task_dir) {
  std::vector<ExperimentRecord> records;
  const fs::path log = task_dir / "experiments.jsonl";
  if (!fs::exists(log)) return records;
  const std::string text = read_text_file(log);
  size_t begin = 0;
  for (size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', begin)) {
    if (end > begin) {
      records.push_back(
          ExperimentRecord::from_json(nlohmann::json::parse(text.substr(begin, end - begin))));
    }
    begin = end + 1;
  }
  return records;
}

std::optional<nlohmann::json> read_experiment_under_way(const fs::path& task_dir) {
  const fs::path pending = task_dir / "pending.json";
  if (!fs::exists(pending)) return std::nullopt;
  try {
    return read_json_file(pending);
  } catch (const std::exception&) {
    return std::nullopt;  // removed between the two calls: nothing is under way any more
  }
}

std::string TaskJournal::proposal_diff(int number) const {
  // The best as it stands (the repository's file) against the proposal, as `git diff` shows
  // it, with both sides named after the kernel file; cut at 64 KiB.
  const CommandResult r = run_command(
      {"git", "diff", "--no-index", "--no-color", "--unified=3", "--src-prefix=best/",
       "--dst-prefix=proposal/", kernel_path().string(), proposal_path(number).string()},
      std::chrono::minutes(1));
  if (r.timed_out || r.signal != 0 || r.exit_code > 1) return "";
  constexpr size_t kMaxDiff = 64 * 1024;
  return r.output.size() > kMaxDiff ? r.output.substr(0, kMaxDiff) + "\n[cut]\n" : r.output;
}

ExperimentRecord TaskJournal::finish(ExperimentRecord record) {
  if (!fs::exists(pending_path())) throw Error("no experiment is under way");
  record.number = read_json_file(pending_path()).at("experiment").get<int>();
  if (!record.kept) record.commit = head();
  if (!record.fields.contains("diff")) record.fields["diff"] = proposal_diff(record.number);
  write_json_atomically(experiment_dir(record.number) / "record.json", record.to_json());
  complete(record);
  return records_.back();
}

void TaskJournal::complete(ExperimentRecord record) {
  const fs::path repo = dir_ / "repo";
  const std::string subject = fmt::format("experiment {}:", record.number);
  if (record.kept) {
    // A git the killed process started may still be committing this experiment: let it finish,
    // then commit only if no commit of this experiment exists.
    wait_for_index(repo);
    const auto committed = [&] {
      return git(repo, {"log", "-n", "1", "--fixed-strings", "--grep", subject, "--format=%H"});
    };
    std::string commit = committed();
    if (commit.empty()) {
      fs::copy_file(proposal_path(record.number), kernel_path(),
                    fs::copy_options::overwrite_existing);
      git(repo, {"add", kernel_name_});
      const std::string message = fmt::format("{} {} ({})", subject, record.note, record.verdict);
      // Nothing to commit: the proposal is the current file, or a late git committed it.
      if (git(repo, {"status", "--porcelain"}).empty()) {
        commit = committed();
        if (commit.empty()) git(repo, {"commit", "-q", "--allow-empty", "-m", message});
      } else {
        try {
          git(repo, {"commit", "-q", "-m", message});
        } catch (const Error&) {
          if (committed().empty()) throw;  // not a late git's commit of the same change
        }
      }
      if (commit.empty()) commit = committed();
    }
    record.commit = commit;
    write_json_atomically(experiment_dir(record.number) / "record.json", record.to_json());
  }
  // Each log gets the record once, whichever of them a kill came between.
  if (records_.empty() || records_.back().number < record.number) {
    append_line(dir_ / "experiments.jsonl", record.to_json().dump());
    records_.push_back(record);
  }
  if (tsv_last_ < record.number) {
    append_line(dir_ / "results.tsv", tsv_line(record));
    tsv_last_ = record.number;
  }
  fs::remove(pending_path());
  interrupted_.reset();
}

}  // namespace kforge
