#include "cli/kernelbench_command.h"

#include <algorithm>
#include <array>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "check/checker.h"
#include "cli/loop_command.h"
#include "compile/compiler.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/json_file.h"
#include "core/run_info.h"
#include "device/backend.h"
#include "kernelbench/kernelbench_op.h"
#include "loop/journal.h"
#include "loop/workspace.h"
#include "tune/library.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

// KernelBench's thresholds: fast_p counts correct kernels faster than the reference by > p.
constexpr std::array<double, 4> kThresholds = {0, 1, 1.5, 2};

// The signature op's starter kernel for the device, its header naming the problem's op.
std::string problem_starter(const KernelBenchOp& op, const DeviceInfo& device, fs::path* library) {
  *library = device_starter(op.signature_op(), op.problem_dtype(), device);
  const std::string text = read_text_file(*library);
  const std::regex op_line(R"((\n\s*\*?\s*op:\s*)([A-Za-z0-9_:]+))");
  std::smatch m;
  if (!std::regex_search(text, m, op_line) || m[2].str() != op.signature_op().name()) {
    throw Error(
        fmt::format("{} has no 'op: {}' line", library->string(), op.signature_op().name()));
  }
  return m.prefix().str() + m[1].str() + std::string(op.name()) + m.suffix().str();
}

// A task folder for one problem (kept as it is when it exists already): the problem copied into
// WS/problems, task.json naming its op, and the journal started from the op's starter.
std::string make_task(const fs::path& problem_file, const fs::path& workspace,
                      const DeviceInfo& device) {
  const KernelBenchOp& op = load_kernelbench_problem(problem_file);
  const std::string name = problem_file.stem().string();
  const fs::path problems = workspace / "problems";
  fs::create_directories(problems);
  const fs::path copy = problems / problem_file.filename();
  if (!fs::exists(copy)) {
    fs::copy_file(problem_file, copy);
  } else if (read_text_file(copy) != read_text_file(problem_file)) {
    throw UsageError(fmt::format("{} differs from {}, which the workspace's task {} was made from",
                                 problem_file.string(), copy.string(), name));
  }
  const fs::path dir = workspace / name;
  if (fs::exists(dir / "task.json")) {
    fmt::print("task {}: {} (exists)\n", name, dir.string());
    return name;
  }
  fs::create_directories(dir);
  fs::path library;
  const std::string starter_text = problem_starter(op, device, &library);
  const fs::path starter = dir / fmt::format("starter{}", library.extension().string());
  write_text_atomically(starter, starter_text);
  TaskJournal::open(dir, starter);
  const nlohmann::json task = {{"op", op.name()},
                               {"shape", op.format_shape(op.problem_sizes())},
                               {"dtype", dtype_name(op.problem_dtype())},
                               {"kernelbench", fs::relative(copy, dir).string()},
                               {"signature_op", op.signature_op().name()},
                               {"starter", starter.filename().string()},
                               {"starter_from", library.filename().string()},
                               {"share", 0},
                               {"gain", 1}};
  write_json_atomically(dir / "task.json", task);
  fmt::print("task {}: {} ({} {} {}, checked against the problem's Model; starts from {})\n", name,
             dir.string(), op.name(), op.format_shape(op.problem_sizes()),
             dtype_name(op.problem_dtype()), library.filename().string());
  if (!op.identified().empty()) {
    fmt::print("  {} names no KFORGE_OP: {}, {}\n", copy.filename().string(),
               op.signature_op().name(), op.identified());
  }
  return name;
}

std::vector<fs::path> problem_files(const fs::path& folder) {
  if (!fs::is_directory(folder))
    throw UsageError(fmt::format("{} is not a folder of problems", folder.string()));
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file() && entry.path().extension() == ".py") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw UsageError(fmt::format("{} holds no .py problems", folder.string()));
  return files;
}

// The loop's proposer for one problem: scripted:DIR takes DIR/NAME (none when it is missing).
std::string proposer_for(const std::string& spec, const std::string& name) {
  if (!spec.starts_with("scripted:")) return spec;
  const fs::path edits = fs::path(spec.substr(9)) / name;
  return fs::is_directory(edits) ? "scripted:" + edits.string() : "";
}

struct Scored {
  ProblemScore eager;    // speedup against the Model in PyTorch eager
  ProblemScore compile;  // against the Model under torch.compile
  nlohmann::json record;
};

// A task's final kernel (its repository's file, the loop's best) through the five stages, then
// timed beside the problem's Model by one method.
Scored score_task(const std::string& name, const fs::path& kernel, const DeviceFlags& device,
                  double max_seconds) {
  Scored s;
  s.eager.name = s.compile.name = name;
  s.record = {{"problem", name}, {"kernel", kernel.string()}};
  KernelSession session(kernel.string(), device, false);
  const auto* op = dynamic_cast<const KernelBenchOp*>(&session.op);
  if (!op) throw Error(fmt::format("{}'s kernel names op {}", name, session.file.op));
  CheckOptions options;
  options.dtypes = {op->problem_dtype()};
  const CheckReport report = session.checker.check(session.file, options, nullptr);
  s.record["check"] = verdict_name(report.verdict);
  if (!report.passed()) {
    s.record["check_detail"] = report.detail;
    fmt::print("{}: final kernel {}: {}\n", name, verdict_name(report.verdict), report.detail);
    return s;
  }
  // The module the five stages ran (one dtype: the problem's).
  const ProblemTiming t = op->time(report.builds.front().module, max_seconds);
  if (!t.agrees_after_timing) {
    s.record["check"] = "WRONG";
    s.record["check_detail"] =
        fmt::format("after the timing its output is off by {:g} beyond ten times the tolerance",
                    t.excess_over_tolerance);
    fmt::print("{}: WRONG after the timing ({})\n", name,
               s.record["check_detail"].get<std::string>());
    return s;
  }
  s.eager.passed = s.compile.passed = true;
  s.eager.speedup = t.eager_us / t.kforge_us;
  s.compile.speedup = t.compile_us / t.kforge_us;
  s.record.update({{"kforge_us", t.kforge_us},
                   {"eager_us", t.eager_us},
                   {"compile_us", t.compile_us},
                   {"speedup_eager", s.eager.speedup},
                   {"speedup_compile", s.compile.speedup},
                   {"excess_over_tolerance", t.excess_over_tolerance},
                   {"device", t.device},
                   {"torch", t.torch_version},
                   {"shape", op->format_shape(op->problem_sizes())},
                   {"signature_op", op->signature_op().name()}});
  fmt::print("{}: PASS  kforge {:.2f} us  eager {:.2f} us ({:.2f}x)  compile {:.2f} us ({:.2f}x)\n",
             name, t.kforge_us, t.eager_us, s.eager.speedup, t.compile_us, s.compile.speedup);
  return s;
}

// What every task's score in a run is measured on: the device, the timing cap and kforge's
// commit. With each task's kernel and problem text it keys the score saved in the task folder
// (score.json): a run that finds the same key reuses it, so a run killed while scoring loses only
// the problem in hand, and a second run goes on from there. A kforge built from a modified tree
// has no commit that names its checks: its "kforge" is empty, and it scores everything again.
nlohmann::json run_score_key(const DeviceFlags& device, double max_seconds) {
  const DeviceInfo info = device_info_for(device, pick_backend(device, nullptr));
  const GitState kforge = git_state();
  return {{"device", info.name + " " + info.uuid},
          {"max_seconds", max_seconds},
          {"kforge", kforge.dirty || kforge.sha == "unknown" ? "" : kforge.sha}};
}

nlohmann::json task_score_key(nlohmann::json key, const fs::path& kernel, const fs::path& problem) {
  key["kernel"] = hash_hex(read_text_file(kernel));
  key["problem"] = hash_hex(read_text_file(problem));
  return key;
}

Scored score_saved(const std::string& name, const nlohmann::json& saved) {
  Scored s;
  s.eager.name = s.compile.name = name;
  s.record = saved.at("record");
  s.eager.passed = s.compile.passed = s.record.contains("kforge_us");
  s.eager.speedup = s.record.value("speedup_eager", 0.0);
  s.compile.speedup = s.record.value("speedup_compile", 0.0);
  return s;
}

}  // namespace

CLI::App* add_task_command(CLI::App& app, TaskFlags& flags, DeviceFlags& device) {
  auto* cmd = app.add_subcommand(
      "task", "Make a loop task from a KernelBench-format problem (docs/kernelbench.md)");
  cmd->add_option("--kernelbench", flags.kernelbench,
                  "A problem file: Model, get_inputs(), get_init_inputs() (and KFORGE_OP, the "
                  "kforge op it computes, where kforge cannot tell)")
      ->required();
  cmd->add_option("--workspace", flags.workspace, "The loop workspace to add the task to")
      ->required();
  add_device_flags(cmd, device);
  return cmd;
}

int cmd_task(const TaskFlags& flags, const DeviceFlags& device) {
  fs::create_directories(flags.workspace);
  add_kernelbench_folder(fs::path(flags.workspace) / "problems");
  make_task(flags.kernelbench, flags.workspace,
            device_info_for(device, pick_backend(device, nullptr)));
  return 0;
}

CLI::App* add_kernelbench_command(CLI::App& app, KernelBenchFlags& flags, DeviceFlags& device) {
  auto* cmd = app.add_subcommand(
      "kernelbench",
      "Run the loop over a folder of KernelBench-format problems and score fast_p against each "
      "problem's Model (eager and torch.compile), measured in the same run");
  cmd->add_option("problems", flags.problems, "A folder of problem files (.py)")->required();
  cmd->add_option("--workspace", flags.workspace, "The loop workspace (one task per problem)")
      ->required();
  cmd->add_option("--propose", flags.propose,
                  "A loop proposer (docs/loop.md); scripted:DIR takes DIR/NAME's edits for "
                  "problem NAME. Without it, the tasks' current kernels are scored");
  add_move_on_options(cmd, flags.rules);
  cmd->add_option("--max-seconds", flags.max_seconds,
                  "Timing cap per kernel and experiment, and per timed function in the score");
  cmd->add_option("--json", flags.json_path, "Write the scores as JSON ('-': stdout)");
  cmd->add_flag("--rescore", flags.rescore,
                "Score every task again (by default a task whose kernel, problem, device, "
                "timing cap and kforge commit are those of its saved score.json keeps that "
                "score)");
  add_device_flags(cmd, device);
  return cmd;
}

int cmd_kernelbench(const KernelBenchFlags& flags, const DeviceFlags& device,
                    const std::vector<std::string>& argv) {
  const fs::path workspace = flags.workspace;
  fs::create_directories(workspace);
  add_kernelbench_folder(workspace / "problems");
  const DeviceInfo info = device_info_for(device, pick_backend(device, nullptr));
  std::vector<std::string> names;
  // Problems kforge cannot take (no op of theirs, no op that computes their Model): each counts
  // as not solved, as KernelBench scores a problem without a working kernel; the others go on.
  std::vector<std::pair<std::string, std::string>> refused;
  for (const fs::path& file : problem_files(flags.problems)) {
    try {
      names.push_back(make_task(file, workspace, info));
    } catch (const UsageError& e) {
      refused.emplace_back(file.stem().string(), e.what());
      fmt::print("{}: refused: {}\n", file.stem().string(), e.what());
    }
  }

  if (!flags.propose.empty()) {
    for (const std::string& name : names) {
      LoopFlags loop;
      loop.workspace = workspace.string();
      loop.task = name;
      loop.propose = proposer_for(flags.propose, name);
      loop.rules = flags.rules;
      loop.max_seconds = flags.max_seconds;
      if (loop.propose.empty()) {
        fmt::print("{}: no edits for it in {}: scored as it stands\n", name, flags.propose);
        continue;
      }
      cmd_loop(loop, device);
    }
  }

  std::vector<ProblemScore> eager, compiled;
  nlohmann::json problems = nlohmann::json::array();
  std::map<std::string, fs::path> kernels;
  for (const TaskBest& best : workspace_bests(workspace))
    kernels[best.name] = best.kernel;
  const nlohmann::json run_key = run_score_key(device, flags.max_seconds);
  const bool reuse_scores = !flags.rescore && !run_key.at("kforge").get<std::string>().empty();
  for (const std::string& name : names) {
    Scored s;
    const fs::path saved_path = workspace / name / "score.json";
    try {
      const nlohmann::json key =
          task_score_key(run_key, kernels.at(name), workspace / "problems" / (name + ".py"));
      nlohmann::json saved;
      try {
        if (fs::exists(saved_path)) saved = read_json_file(saved_path);
      } catch (const std::exception&) {
        // An unreadable saved score is no score: the task is scored again.
      }
      if (reuse_scores && saved.is_object() && saved.value("key", nlohmann::json()) == key) {
        s = score_saved(name, saved);
        fmt::print("{}: scored earlier ({}), as {}\n", name, saved_path.string(),
                   s.record.value("check", "?"));
      } else {
        s = score_task(name, kernels.at(name), device, flags.max_seconds);
        write_json_atomically(saved_path, {{"key", key}, {"record", s.record}});
      }
    } catch (const std::exception& e) {
      // A problem kforge could not check or time counts as not solved; the others go on.
      s.eager.name = s.compile.name = name;
      s.record = {{"problem", name}, {"error", e.what()}};
      fmt::print("{}: not scored: {}\n", name, e.what());
    }
    eager.push_back(s.eager);
    compiled.push_back(s.compile);
    problems.push_back(std::move(s.record));
  }
  for (const auto& [name, why] : refused) {
    eager.push_back({name, false, 0});
    compiled.push_back({name, false, 0});
    problems.push_back({{"problem", name}, {"refused", why}});
  }
  nlohmann::json j = {
      {"problems", problems}, {"proposer", flags.propose}, {"run", run_metadata(argv)}};
  fmt::print(
      "\n{} problems, proposer {}\n| p | fast_p vs eager | fast_p vs torch.compile |\n"
      "|---|---|---|\n",
      names.size() + refused.size(), flags.propose.empty() ? "none" : flags.propose);
  for (const double p : kThresholds) {
    const double e = fast_p(eager, p);
    const double c = fast_p(compiled, p);
    j["fast_p"][fmt::format("{:g}", p)] = {{"eager", e}, {"compile", c}};
    fmt::print("| {:g} | {:.2f} | {:.2f} |\n", p, e, c);
  }
  write_json(j, flags.json_path);
  return 0;
}

}  // namespace kforge
