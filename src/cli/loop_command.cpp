#include "cli/loop_command.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"
#include "core/text.h"
#include "device/ceilings.h"
#include "kernelbench/kernelbench_op.h"
#include "loop/brief.h"
#include "loop/experiment.h"
#include "loop/journal.h"
#include "loop/workspace.h"
#include "ops/op_spec.h"
#include "pool/device_pool.h"
#include "tune/library.h"

namespace kforge {
namespace fs = std::filesystem;

void add_move_on_options(CLI::App* cmd, MoveOnRules& rules) {
  cmd->add_option("--max-reverts", rules.max_consecutive_reverts,
                  "Move on after this many experiments in a row not kept (0: never)")
      ->capture_default_str();
  cmd->add_option("--target-speedup", rules.target_speedup,
                  "Move on once the best is this much faster than the start (0: never)")
      ->capture_default_str();
  cmd->add_option("--task-seconds", rules.budget_seconds,
                  "Move on after this much wall time on the task in this run (0: no budget)")
      ->capture_default_str();
  cmd->add_option("--roofline", rules.roofline_fraction,
                  "Move on once the best reaches this share of its roofline bound (0: never)")
      ->capture_default_str();
}

CLI::App* add_loop_command(CLI::App& app, LoopFlags& flags, DeviceFlags& device) {
  auto* cmd = app.add_subcommand(
      "loop", "Keep/revert experiments on the tasks of a workspace (docs/loop.md)");
  cmd->add_option("workspace", flags.workspace, "A workspace from `kforge plan --extract`")
      ->required();
  cmd->add_option("--submit", flags.submit,
                  "A new version of the task's kernel file: checked, timed against the task's "
                  "best and kept (a commit) or reverted");
  cmd->add_option("--task", flags.task, "The task folder to submit to (default: the first)");
  cmd->add_option("--note", flags.note, "What the change does, for the logs");
  cmd->add_option("--proposer", flags.proposer, "Who proposed it, for the logs")
      ->capture_default_str();
  cmd->add_option("--propose", flags.propose,
                  "Run experiments from a proposer on the task until it has no more or a "
                  "move-on rule fires: " +
                      fmt::format("{}", fmt::join(proposer_names(), ", ")) +
                      " (scripted:DIR, DIR's files in name order; tuner[:STRATEGY], the file's "
                      "tunables searched; llm[:CONFIG.json], an OpenAI-compatible chat model, "
                      "see docs/loop.md)");
  add_move_on_options(cmd, flags.rules);
  cmd->add_option("--seconds", flags.total_seconds,
                  "With --propose and no --task: a wall-time budget for all tasks, spread by the "
                  "share of the run each could save (overrides --task-seconds)");
  cmd->add_option("--max-seconds", flags.max_seconds, "Timing cap per kernel and experiment")
      ->capture_default_str();
  cmd->add_flag("--next", flags.next,
                "Print the brief of the task to work on next (--task, else the largest whole-run "
                "gain): op, device and ceilings, roofline position, the file to edit, recent "
                "experiments and their failures, how to submit");
  cmd->add_flag("--status", flags.status,
                "Only show the workspace's state: read only, safe beside a running loop (which "
                "task is under way, each task's last experiment)");
  cmd->add_option("--devices", flags.devices,
                  "With --propose: devices to run tasks on side by side, one task per device at "
                  "a time (indices 0,1,3 or 'all'; with --backend cpu, CPU slots pinned to "
                  "cores). Each experiment is timed on one device against the best timed there");
  cmd->add_option("--json", flags.json_path, "Write the workspace's state as JSON ('-': stdout)");
  add_device_flags(cmd, device);
  return cmd;
}

namespace {

// The plan's figures for a task (task.json from `kforge plan --extract`): its share of the run
// and the whole-run gain if it reached its roofline bound; 0 and 1 where the file has none.
struct TaskPlanFigures {
  double share = 0;
  double gain = 1;
};

TaskPlanFigures plan_figures(const fs::path& dir) {
  const nlohmann::json j = read_json_file(dir / "task.json");
  const auto number = [&](const char* key, double otherwise) {
    return j.contains(key) && j.at(key).is_number() ? j.at(key).get<double>() : otherwise;
  };
  return {number("share", 0), number("gain", 1)};
}

nlohmann::json task_state(const fs::path& dir, const std::vector<ExperimentRecord>& records) {
  const double start = start_us(records);
  const double best = best_us(records);
  return {
      {"task", dir.filename().string()},
      {"experiments", records.size()},
      {"kept", std::count_if(records.begin(), records.end(),
                             [](const ExperimentRecord& r) { return r.kept; })},
      {"reverts_in_a_row", not_kept_in_a_row(records)},
      {"start_us", start},
      {"best_us", best},
      {"speedup", best_speedup(records)},
      {"roofline_fraction", best_timing(records).value("roofline_fraction", 0.0)},
      // The whole run with this task's kernel at its best (Amdahl, the plan's share).
      {"run_gain",
       start > 0 && best > 0 ? 1.0 / (1.0 - plan_figures(dir).share * (1.0 - best / start)) : 1.0}};
}

void print_states(const nlohmann::json& states) {
  fmt::print("{:<36} {:>5} {:>5} {:>10} {:>10} {:>8} {:>9} {:>9}\n", "task", "exps", "kept",
             "start us", "best us", "speedup", "roofline", "run gain");
  for (const nlohmann::json& s : states) {
    fmt::print("{:<36} {:>5} {:>5} {:>10.2f} {:>10.2f} {:>7.3f}x {:>8.0f}% {:>8.3f}x\n",
               s["task"].get<std::string>(), s["experiments"].get<size_t>(), s["kept"].get<int>(),
               s["start_us"].get<double>(), s["best_us"].get<double>(), s["speedup"].get<double>(),
               100 * s["roofline_fraction"].get<double>(), s["run_gain"].get<double>());
  }
}

// One `kforge loop` per workspace at a time: an advisory lock on WORKSPACE/.loop.lock, held
// until the process ends (a killed loop's lock goes with it), with its pid inside for --status.
class WorkspaceLock {
 public:
  explicit WorkspaceLock(const fs::path& workspace) : path_(workspace / ".loop.lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(fmt::format("cannot open {}: {}", path_.string(), std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      throw UsageError(
          fmt::format("another kforge loop is working on {} (pid {}); "
                      "`kforge loop {} --status` shows its progress",
                      workspace.string(), holder(path_), workspace.string()));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
      // The pid is only for --status; the lock itself holds.
    }
  }
  ~WorkspaceLock() { ::close(fd_); }
  WorkspaceLock(const WorkspaceLock&) = delete;
  WorkspaceLock& operator=(const WorkspaceLock&) = delete;

  // The pid of the loop holding the lock, or empty when none does.
  static std::string holder(const fs::path& lock_path) {
    const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);
    if (!held) return "";
    std::string pid = read_text_file(lock_path);
    return pid.substr(0, pid.find('\n'));
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

// A task of the workspace being worked on, with its journal.
struct Task {
  fs::path dir;
  LoopTask task;
  TaskJournal journal;
  TaskPlanFigures plan;
};

// The task --task names, or the first.
Task& named_or_first(std::vector<Task>& tasks, const LoopFlags& flags) {
  if (flags.task.empty()) return tasks.front();
  const auto it = std::find_if(tasks.begin(), tasks.end(),
                               [&](const Task& t) { return t.dir.filename() == flags.task; });
  if (it == tasks.end())
    throw UsageError(fmt::format("no task folder {} in {}", flags.task, flags.workspace));
  return *it;
}

// The tasks to work on: the one --task names, or all in the order of the plan's whole-run gain.
std::vector<Task*> work_order(std::vector<Task>& tasks, const LoopFlags& flags) {
  if (!flags.task.empty()) return {&named_or_first(tasks, flags)};
  std::vector<Task*> order;
  for (Task& t : tasks)
    order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const Task* a, const Task* b) { return a->plan.gain > b->plan.gain; });
  return order;
}

// `--status`: read only, safe beside a running loop.
int print_status(const LoopFlags& flags, const std::vector<fs::path>& dirs) {
  const std::string pid = WorkspaceLock::holder(fs::path(flags.workspace) / ".loop.lock");
  fmt::print("{}: {}\n", flags.workspace,
             pid.empty() ? "no loop running" : fmt::format("a loop is running (pid {})", pid));
  nlohmann::json states = nlohmann::json::array();
  for (const fs::path& dir : dirs) {
    const std::vector<ExperimentRecord> records = read_finished_experiments(dir);
    nlohmann::json state = task_state(dir, records);
    if (!records.empty()) {
      const ExperimentRecord& last = records.back();
      state["last"] = fmt::format("#{} {} {}", last.number, last.verdict, first_lines(last.note));
    }
    if (const auto pending = read_experiment_under_way(dir)) {
      state["under_way"] = fmt::format(
          "#{} ({}{}{})", pending->value("experiment", 0), pending->value("proposer", ""),
          pending->value("note", "").empty() ? "" : ": ", first_lines(pending->value("note", "")));
    }
    states.push_back(state);
  }
  print_states(states);
  for (const nlohmann::json& s : states) {
    if (s.contains("last"))
      fmt::print("{}: last {}\n", s["task"].get<std::string>(), s["last"].get<std::string>());
    if (s.contains("under_way")) {
      fmt::print("{}: {} {}\n", s["task"].get<std::string>(),
                 pid.empty() ? "interrupted (evaluated again by the next loop):" : "under way:",
                 s["under_way"].get<std::string>());
    }
  }
  if (!flags.json_path.empty()) write_json(states, flags.json_path);
  return 0;
}

// Runs `work_on` for every task of `order` on the lanes of `devices`, side by side: each lane
// takes the next task when it is free, with its own proposer made from `spec`. The first error
// stops the other lanes after their current task and is thrown here.
void run_tasks_on_lanes(DevicePool& devices, const std::vector<Task*>& order,
                        const std::string& spec,
                        const std::function<void(DeviceLane&, Proposer&, Task&)>& work_on) {
  std::mutex mutex;
  size_t next_task = 0;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < devices.size(); ++i) {
    threads.emplace_back([&, lane = &devices.lane(i)] {
      try {
        const std::unique_ptr<Proposer> proposer = make_proposer(spec);
        for (;;) {
          Task* task = nullptr;
          {
            const std::lock_guard lock(mutex);
            if (error || next_task == order.size()) return;
            task = order[next_task++];
          }
          progress_line(fmt::format("[{}] on {}", task->dir.filename().string(), lane->name));
          work_on(*lane, *proposer, *task);
        }
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

int cmd_loop(const LoopFlags& flags, const DeviceFlags& device) {
  // KernelBench problems the workspace's tasks were made from (`kforge task --kernelbench`).
  if (fs::is_directory(fs::path(flags.workspace) / "problems"))
    add_kernelbench_folder(fs::path(flags.workspace) / "problems");
  const std::vector<fs::path> dirs = workspace_task_dirs(flags.workspace);
  if (flags.status) return print_status(flags, dirs);
  const WorkspaceLock lock(flags.workspace);
  const std::string backend = pick_backend(device, nullptr);

  // Every task and its journal, a new task's repository started from the op's starter for the
  // device it runs on (the first of --devices; they are all of one model).
  std::vector<Task> tasks;
  std::optional<DeviceInfo> info;  // asked for only where a new task needs the library's starter
  const auto starter_device = [&]() -> const DeviceInfo& {
    if (!info) {
      DeviceFlags first = device;
      if (!flags.devices.empty()) first.device = parse_device_list(flags.devices, backend).front();
      info = device_info_for(first, backend);
    }
    return *info;
  };
  for (const fs::path& dir : dirs) {
    const nlohmann::json task_file = read_json_file(dir / "task.json");
    const LoopTask task = LoopTask::from_json(task_file);
    // A task may bring its own starter (a KernelBench problem's), else the op's; a task whose
    // repository exists needs none.
    fs::path starter;
    if (task_file.contains("starter")) {
      starter = dir / task_file.at("starter").get<std::string>();
    } else if (!fs::exists(dir / "repo" / ".git")) {
      starter = device_starter(*task.op, task.dtype, starter_device());
    }
    tasks.push_back({dir, task, TaskJournal::open(dir, starter), plan_figures(dir)});
  }

  std::unique_ptr<Proposer> proposer;
  if (!flags.propose.empty()) proposer = make_proposer(flags.propose);
  if (proposer && proposer->name() == "scripted" && flags.task.empty() && tasks.size() > 1) {
    throw UsageError(
        "--propose scripted:DIR holds edits of one kernel file: name its task "
        "with --task");
  }
  if (flags.next) {
    // The agent protocol's first verb: the brief of the task to work on (--task, else the one
    // with the largest whole-run gain), then `--submit FILE` for each new version.
    const Task* target = work_order(tasks, flags).front();
    WorkerClient worker({backend, device.device});
    const Ceilings ceilings = device_ceilings(worker, default_cache_dir(), false, progress_line);
    const std::string name = target->dir.filename().string();
    fmt::print("{}", task_brief({name, target->task, ceilings, target->journal.kernel_path(),
                                 target->journal.records(), flags.rules,
                                 fmt::format("kforge loop {} --task {} --submit FILE --note \"what "
                                             "changed\" --proposer agent",
                                             flags.workspace, name)}));
    return 0;
  }
  if (!flags.submit.empty() || proposer ||
      std::any_of(tasks.begin(), tasks.end(),
                  [](const Task& t) { return t.journal.interrupted().has_value(); })) {
    Compiler compiler;
    const std::vector<int> indices = flags.devices.empty()
                                         ? std::vector<int>{device.device}
                                         : parse_device_list(flags.devices, backend);
    DevicePool devices(backend, indices, compiler);
    const Ceilings ceilings =
        device_ceilings(*devices.lane(0).worker, default_cache_dir(), false, progress_line);
    const DeviceInfo device_info = devices.device();
    EvaluationOptions options;
    options.settings.max_seconds = flags.max_seconds;
    std::mutex print_mutex;  // lanes print whole lines
    // Logs the pending experiment's outcome with the proposer's fields, and a line for it.
    const auto finish = [&](Task& t, ExperimentRecord r, const std::string& note,
                            const std::string& proposed_by, const nlohmann::json& fields) {
      r.proposer = proposed_by;
      r.note = note;
      for (const auto& [key, value] : fields.items())
        r.fields[key] = value;
      // The first timed experiment times the start beside it.
      double start = start_us(t.journal.records());
      if (start == 0)
        start = r.fields.value("best", nlohmann::json::object()).value("median_us", 0.0);
      if (r.time_us > 0 && start > 0) r.speedup = start / r.time_us;
      const ExperimentRecord logged = t.journal.finish(r);
      const std::lock_guard printing(print_mutex);
      fmt::print("[{}] #{} {:<13} {} (best {:.2f} us, {:.3f}x the start) {}\n",
                 t.dir.filename().string(), logged.number, logged.verdict,
                 logged.time_us > 0 ? fmt::format("{:.2f} us", logged.time_us) : "not timed",
                 best_us(t.journal.records()), best_speedup(t.journal.records()),
                 first_lines(logged.fields.value("detail", logged.note)));
      std::fflush(stdout);  // a live line per experiment, also through a pipe
    };
    // Evaluates the pending experiment on `lane`, unless its proposer came back with nothing to
    // evaluate (fields' "failed_proposal": the verdict and why; the reply is its saved
    // proposal).
    const auto run = [&](DeviceLane& lane, Task& t, const fs::path& proposal,
                         const std::string& note, const std::string& proposed_by,
                         const nlohmann::json& fields = nlohmann::json::object()) {
      if (fields.contains("failed_proposal")) {
        ExperimentRecord failed;
        failed.verdict = fields["failed_proposal"].value("verdict", "BAD_REPLY");
        failed.fields = {{"failing_stage", "propose"},
                         {"detail", fields["failed_proposal"].value("detail", "")}};
        nlohmann::json rest = fields;  // the verdict and detail are the record's own now
        rest.erase("failed_proposal");
        finish(t, failed, note, proposed_by, rest);
        return;
      }
      ExperimentRecord r = evaluate_proposal(*lane.checker, *lane.worker, ceilings, t.task,
                                             proposal, t.journal.kernel_path(), options);
      if (devices.size() > 1) r.fields["ran_on"] = lane.name;
      finish(t, std::move(r), note, proposed_by, fields);
    };
    for (Task& t : tasks) {
      if (const auto proposal = t.journal.interrupted()) {
        progress_line(fmt::format("[{}] evaluating experiment {} again (interrupted)",
                                  t.dir.filename().string(), t.journal.records().size() + 1));
        const TaskJournal::Origin origin = t.journal.interrupted_origin();
        run(devices.lane(0), t, *proposal,
            origin.note.empty() ? "resumed" : origin.note + " (resumed)",
            origin.proposer.empty() ? "resumed" : origin.proposer, origin.fields);
      }
    }
    if (!flags.submit.empty()) {
      Task& target = named_or_first(tasks, flags);
      if (!fs::is_regular_file(flags.submit))
        throw UsageError(fmt::format("cannot read {}", flags.submit));
      const fs::path saved =
          target.journal.begin(read_text_file(flags.submit), flags.proposer, flags.note);
      run(devices.lane(0), target, saved, flags.note, flags.proposer);
    }
    if (proposer) {
      // One task (--task), or every task in the order of the plan's whole-run gain, each until
      // a move-on rule fires; a --seconds budget is spread by the share of the run each task
      // could save. With several devices each takes the next task in that order when it is
      // free, with a proposer of its own; a task stays on one device for the whole run.
      const std::vector<Task*> order = work_order(tasks, flags);
      const auto could_save = [](const Task* t) { return std::max(0.0, 1.0 - 1.0 / t->plan.gain); };
      double total_weight = 0;
      for (const Task* t : order)
        total_weight += could_save(t);
      const auto work_on = [&](DeviceLane& lane, Proposer& lane_proposer, Task& target) {
        MoveOnRules rules = flags.rules;
        if (flags.total_seconds > 0) {
          rules.budget_seconds =
              flags.total_seconds * (total_weight > 0 ? could_save(&target) / total_weight
                                                      : 1.0 / static_cast<double>(order.size()));
        }
        const auto began = std::chrono::steady_clock::now();
        // The reverts rule counts this run's experiments: a new run (another proposer, say)
        // gets its own chance; the speedup and roofline rules read the whole history.
        const size_t first_in_run = target.journal.records().size();
        const std::string name = target.dir.filename().string();
        for (;;) {
          const auto& history = target.journal.records();
          const double elapsed =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
          const std::vector<ExperimentRecord> this_run(
              history.begin() + static_cast<std::ptrdiff_t>(first_in_run), history.end());
          const std::string reason =
              move_on_reason(rules, this_run, best_speedup(history),
                             best_timing(history).value("roofline_fraction", 0.0), elapsed);
          if (!reason.empty()) {
            const std::lock_guard printing(print_mutex);
            fmt::print("[{}] moving on: {}\n", name, reason);
            std::fflush(stdout);
            break;
          }
          const fs::path kernel = target.journal.kernel_path();
          const std::string current = read_text_file(kernel);
          const auto proposal = lane_proposer.next({name, target.task, device_info, ceilings, rules,
                                                    kernel, current, history, progress_line});
          if (!proposal) {
            const std::lock_guard printing(print_mutex);
            fmt::print("[{}] moving on: the {} proposer {}\n", name, lane_proposer.name(),
                       lane_proposer.why_done());
            std::fflush(stdout);
            break;
          }
          const std::string proposed_by(lane_proposer.name());
          nlohmann::json fields = proposal->fields;
          if (!proposal->failure_verdict.empty()) {
            fields["failed_proposal"] = {{"verdict", proposal->failure_verdict},
                                         {"detail", proposal->failure}};
          }
          const fs::path saved =
              target.journal.begin(proposal->source, proposed_by, proposal->note, fields);
          run(lane, target, saved, proposal->note, proposed_by, fields);
        }
      };
      if (devices.size() == 1) {
        for (Task* t : order)
          work_on(devices.lane(0), *proposer, *t);
      } else {
        run_tasks_on_lanes(devices, order, flags.propose, work_on);
      }
    }
  }

  nlohmann::json state = nlohmann::json::array();
  for (const Task& t : tasks) {
    nlohmann::json s = task_state(t.dir, t.journal.records());
    s["kernel"] = t.journal.kernel_path().string();
    s["interrupted"] = t.journal.interrupted().has_value();
    s["head"] = t.journal.head();
    state.push_back(s);
  }
  print_states(state);
  if (!flags.json_path.empty()) write_json(state, flags.json_path);
  return 0;
}

}  // namespace kforge
