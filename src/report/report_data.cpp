#include "report/report_data.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_file.h"
#include "ops/registry.h"
#include "run/verdict.h"
#include "tune/results_db.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_workspace(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (fs::exists(entry.path() / "task.json")) return true;
  }
  return false;
}

std::vector<json> read_json_lines(const fs::path& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception& e) {
      throw Error(fmt::format("{}:{}: not a JSON record: {}", path.string(), number, e.what()));
    }
  }
  return out;
}

double number_or(const json& j, const char* key, double fallback = 0) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

// The bytes and FLOPs of one call of the task's problem, from its op's spec.
void add_cost(json& task) {
  const OpSpec* op = find_op(task.value("op", ""));
  const std::optional<DType> element = parse_dtype(task.value("dtype", ""));
  const std::string shape = task.value("shape", "");
  if (op == nullptr || !element || shape.empty()) return;
  const Cost cost = op->cost(op->parse_shape(shape), *element);
  task["bytes"] = cost.bytes;
  task["flops"] = cost.flops;
}

// One task: its experiments as points, the frontier of kept (hence passing) ones, and counts.
json collect_task(const fs::path& dir) {
  const json task = read_json_file(dir / "task.json");
  const std::vector<json> records = fs::exists(dir / "experiments.jsonl")
                                        ? read_json_lines(dir / "experiments.jsonl")
                                        : std::vector<json>{};
  const std::string op_name = task.value("op", "");
  const std::string shape = task.value("shape", "");
  const std::string dtype = task.value("dtype", "");
  json out = {{"name", dir.filename().string()},
              {"op", op_name},
              {"shape", shape},
              {"dtype", dtype},
              {"device", task.value("device", "")}};
  add_cost(out);

  // The start: the best kernel as the first experiment found it (its `best` timing).
  double start_us = 0;
  for (const auto& r : records) {
    if (r.contains("best") && r["best"].is_object()) {
      start_us = number_or(r["best"], "median_us");
      break;
    }
  }
  json points = json::array(), frontier = json::array();
  std::map<std::string, int> verdicts;
  int kept = 0;
  double best_us = start_us;
  if (start_us > 0) frontier.push_back({{"n", 0}, {"time_us", start_us}});
  for (const auto& r : records) {
    const int n = r.value("experiment", static_cast<int>(points.size()) + 1);
    const std::string verdict = r.value("verdict", "?");
    const bool is_kept = r.value("kept", false);
    const double time_us = number_or(r, "time_us");
    ++verdicts[verdict];
    json point = {{"n", n},
                  {"verdict", verdict},
                  {"kept", is_kept},
                  {"proposer", r.value("proposer", "")},
                  {"note", r.value("note", "")}};
    if (time_us > 0) point["time_us"] = time_us;
    points.push_back(point);
    if (is_kept && time_us > 0) {
      ++kept;
      best_us = best_us > 0 ? std::min(best_us, time_us) : time_us;
      frontier.push_back({{"n", n}, {"time_us", best_us}});
    }
  }
  out["start_us"] = start_us;
  out["best_us"] = best_us;
  out["speedup"] = start_us > 0 && best_us > 0 ? start_us / best_us : 1.0;
  out["experiments"] = records.size();
  out["kept"] = kept;
  out["verdicts"] = verdicts;
  out["points"] = points;
  out["frontier"] = frontier;
  return out;
}

// One task per (problem, device) of a tune database: every evaluation as a point, in the order
// recorded; the frontier is the best timed (hence passing) evaluation so far.
json collect_tune_db(const fs::path& path) {
  // ResultsDb brings an older database's schema up to date as it opens it: a report reads a
  // copy, so that the file it is given is left as it was.
  const fs::path copy_dir =
      fs::temp_directory_path() /
      fmt::format("kforge-report-{}-{}", ::getpid(), path.filename().string());
  fs::create_directories(copy_dir);
  struct RemoveDir {
    fs::path dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_copy{copy_dir};
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const fs::path from = path.string() + suffix;
    if (fs::exists(from)) {
      fs::copy_file(from, copy_dir / (path.filename().string() + suffix),
                    fs::copy_options::overwrite_existing);
    }
  }
  const ResultsDb db(copy_dir / path.filename());
  json tasks = json::array();
  for (const std::string& problem : db.problems()) {
    for (const std::string& device : db.devices_for(problem)) {
      // "softmax 8192x8192 bf16"
      const size_t first = problem.find(' '), last = problem.rfind(' ');
      json task = {{"name", fmt::format("{} on {}", problem, device)},
                   {"op", problem.substr(0, first)},
                   {"shape", first == last ? "" : problem.substr(first + 1, last - first - 1)},
                   {"dtype", first == last ? "" : problem.substr(last + 1)},
                   {"device", device},
                   {"source", "tune database"}};
      add_cost(task);
      json points = json::array(), frontier = json::array();
      std::map<std::string, int> verdicts;
      double start_us = 0, best_us = 0;
      int improved = 0, n = 0;
      for (const auto& e : db.evaluations(problem, device)) {
        ++n;
        const std::string verdict(verdict_name(e.verdict));
        ++verdicts[verdict];
        json point = {{"n", n}, {"verdict", verdict}, {"note", e.variant}};
        if (e.timed()) {
          const double us = e.stats.median * 1e3;
          point["time_us"] = us;
          if (start_us == 0) start_us = us;
          if (best_us == 0 || us < best_us) {
            best_us = us;
            ++improved;
            point["kept"] = true;
            frontier.push_back({{"n", n}, {"time_us", us}});
          }
        }
        points.push_back(point);
      }
      task["start_us"] = start_us;
      task["best_us"] = best_us;
      task["speedup"] = start_us > 0 && best_us > 0 ? start_us / best_us : 1.0;
      task["experiments"] = n;
      task["kept"] = improved;
      task["verdicts"] = verdicts;
      task["points"] = points;
      task["frontier"] = frontier;
      tasks.push_back(task);
    }
  }
  return tasks;
}

// The plan's groups with their kernel time, and what each becomes: verify's prediction for the
// swapped groups when a verify result is given, else the workspace's best kept kernel at the
// group's op and shape.
json collect_plan(const json& plan, const json& verify, const json& tasks) {
  json groups = json::array();
  double grouped_us = 0;
  for (const auto& g : plan.at("groups")) {
    const double time_us = number_or(g, "time_ns") / 1e3;
    grouped_us += time_us;
    json group = {{"name", g.value("name", g.value("op", "?"))},
                  {"op", g.value("op", "")},
                  {"shape", g.value("shape", "")},
                  {"calls", g.value("calls", 0)},
                  {"time_us", time_us}};
    const double calls = number_or(g, "calls");
    if (!verify.is_null()) {
      for (const auto& p :
           verify.value("predicted", json::object()).value("groups", json::array())) {
        if (p.value("group", "") == group["name"] && p.value("shape", "") == group["shape"]) {
          group["after_us"] =
              (number_or(p, "kforge_us_per_call") + number_or(p, "left_in_place_us_per_call")) *
              calls;
        }
      }
    } else {
      for (const auto& t : tasks) {
        if (t["op"] == group["op"] && t["shape"] == group["shape"] && t.value("best_us", 0.0) > 0) {
          group["after_us"] = t["best_us"].get<double>() * calls;
        }
      }
    }
    groups.push_back(group);
  }
  json out = {{"device", plan.value("device", "")},
              {"kernel_time_us", number_or(plan, "kernel_time_ns") / 1e3},
              {"other_us", number_or(plan, "kernel_time_ns") / 1e3 - grouped_us},
              {"groups", groups},
              {"after_source", verify.is_null() ? "the workspace's best kept kernels"
                                                : "kforge verify's per-group prediction"}};
  if (!verify.is_null()) {
    out["measured_speedup"] =
        verify.value("speedup", json::object()).value("eager_kforge_vs_eager", 0.0);
  }
  return out;
}

}  // namespace

ReportSources classify_report_paths(const std::vector<fs::path>& paths) {
  ReportSources s;
  for (const auto& p : paths) {
    if (is_workspace(p)) {
      s.workspace = p;
      continue;
    }
    if (fs::is_regular_file(p) && (p.extension() == ".sqlite" || p.extension() == ".db")) {
      s.tune_db = p;
      continue;
    }
    if (!fs::is_regular_file(p) || p.extension() != ".json") {
      throw UsageError(fmt::format(
          "{}: not a loop workspace (a folder of tasks), a tune database (.sqlite) or a plan, "
          "verify or ceilings JSON file",
          p.string()));
    }
    const json j = read_json_file(p);
    if (j.contains("groups") && j.contains("kernel_time_ns")) {
      s.plan = p;
    } else if (j.contains("step_ms") && j.contains("checks")) {
      s.verify = p;
    } else if (j.contains("ceilings") && j["ceilings"].contains("copy_gbps")) {
      s.ceilings = p;
    } else {
      throw UsageError(fmt::format("{}: not a plan, verify or ceilings JSON file", p.string()));
    }
  }
  return s;
}

json collect_report(const ReportSources& sources) {
  json report = {{"tasks", json::array()}};
  if (!sources.workspace.empty()) {
    std::vector<fs::path> dirs;
    for (const auto& entry : fs::directory_iterator(sources.workspace)) {
      if (fs::exists(entry.path() / "task.json")) dirs.push_back(entry.path());
    }
    std::sort(dirs.begin(), dirs.end());
    for (const auto& d : dirs)
      report["tasks"].push_back(collect_task(d));
    report["workspace"] = sources.workspace.string();
    if (!report["tasks"].empty()) report["device"] = report["tasks"][0]["device"];
  }
  if (!sources.tune_db.empty()) {
    if (!fs::is_regular_file(sources.tune_db)) {
      throw Error(fmt::format("{}: no such tune database", sources.tune_db.string()));
    }
    for (auto& t : collect_tune_db(sources.tune_db))
      report["tasks"].push_back(std::move(t));
    report["tune_db"] = sources.tune_db.string();
    if (!report.contains("device") && !report["tasks"].empty()) {
      report["device"] = report["tasks"][0]["device"];
    }
  }
  const json plan = sources.plan.empty() ? json() : read_json_file(sources.plan);
  const json verify = sources.verify.empty() ? json() : read_json_file(sources.verify);
  if (!plan.is_null()) {
    report["plan"] = collect_plan(plan, verify, report["tasks"]);
    report["plan"]["source"] = sources.plan.string();
    if (!report.contains("device")) report["device"] = plan.value("device", "");
  }
  if (!verify.is_null()) {
    report["verify"] = {{"source", sources.verify.string()},
                        {"model", verify.value("model", "")},
                        {"pass", verify.value("pass", false)},
                        {"step_ms", verify.value("step_ms", json::object())},
                        {"speedup", verify.value("speedup", json::object())}};
  }
  // Ceilings: the file given, else the plan's.
  if (!sources.ceilings.empty()) {
    const json c = read_json_file(sources.ceilings);
    report["ceilings"] = {{"copy_gbps", c["ceilings"].value("copy_gbps", 0.0)},
                          {"source", sources.ceilings.string()}};
    if (c["ceilings"].contains("matmul_tflops")) {
      report["ceilings"]["matmul_tflops"] = c["ceilings"]["matmul_tflops"];
    }
  } else if (!plan.is_null() && plan.contains("ceilings")) {
    report["ceilings"] = plan["ceilings"];
    report["ceilings"]["source"] = "the plan's ceilings";
  }
  return report;
}

}  // namespace kforge
