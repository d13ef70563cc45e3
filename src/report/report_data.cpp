#include "report/report_data.h"

#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/temp_directory.h"
#include "loop/journal.h"
#include "loop/workspace.h"
#include "ops/registry.h"
#include "run/verdict.h"
#include "tune/results_db.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double number_or(const json& j, const char* key, double fallback = 0) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

// What a task is and how it stands, before its points.
struct TaskHead {
  std::string name, op, shape, dtype, device;
  double start_us = 0, best_us = 0;
};

// A task as the page and the figures read it: its problem with the bytes and FLOPs of one call
// (from its op's spec), start and best, every point (n, verdict, time_us when timed, kept), the
// verdict counts, and the frontier: the start, then each kept point's time.
json task_json(const TaskHead& h, const json& points) {
  json task = {{"name", h.name},
               {"op", h.op},
               {"shape", h.shape},
               {"dtype", h.dtype},
               {"device", h.device},
               {"start_us", h.start_us},
               {"best_us", h.best_us},
               {"speedup", h.start_us > 0 && h.best_us > 0 ? h.start_us / h.best_us : 1.0},
               {"experiments", points.size()},
               {"points", points}};
  const OpSpec* op = find_op(h.op);
  const std::optional<DType> element = parse_dtype(h.dtype);
  if (op != nullptr && element && !h.shape.empty()) {
    const Cost cost = op->cost(op->parse_shape(h.shape), *element);
    task["bytes"] = cost.bytes;
    task["flops"] = cost.flops;
  }
  std::map<std::string, int> verdicts;
  json frontier = json::array();
  if (h.start_us > 0) frontier.push_back({{"n", 0}, {"time_us", h.start_us}});
  int kept = 0;
  for (const auto& p : points) {
    ++verdicts[p.at("verdict").get<std::string>()];
    if (!p.value("kept", false) || !p.contains("time_us")) continue;
    ++kept;
    frontier.push_back({{"n", p["n"]}, {"time_us", p["time_us"]}});
  }
  task["kept"] = kept;
  task["verdicts"] = verdicts;
  task["frontier"] = frontier;
  return task;
}

// A loop workspace's tasks, with start and best as the loop itself counts them (the best is the
// last kept experiment's kernel: each was kept for beating the best before it).
json collect_workspace(const fs::path& workspace) {
  json tasks = json::array();
  for (const TaskBest& b : workspace_bests(workspace)) {
    json points = json::array();
    for (const ExperimentRecord& r : read_finished_experiments(workspace / b.name)) {
      json point = {{"n", r.number},
                    {"verdict", r.verdict},
                    {"kept", r.kept},
                    {"proposer", r.proposer},
                    {"note", r.note}};
      if (r.time_us > 0) point["time_us"] = r.time_us;
      points.push_back(point);
    }
    const TaskHead head{b.name,
                        std::string(b.task.op->name()),
                        b.task.op->format_shape(b.task.sizes),
                        std::string(dtype_name(b.task.dtype)),
                        b.device,
                        b.start_us,
                        b.best_us};
    tasks.push_back(task_json(head, points));
  }
  return tasks;
}

// One task per (problem, device) of a tune database: every evaluation as a point, in the order
// recorded; "kept" marks each timed (hence passing) evaluation that was a new best.
json collect_tune_db(const fs::path& path) {
  // ResultsDb brings an older database's schema up to date as it opens it: a report reads a
  // copy, so that the file it is given is left as it was.
  const TempDirectory copy("kforge-report");
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const fs::path from = path.string() + suffix;
    if (fs::exists(from)) fs::copy_file(from, copy.path() / (path.filename().string() + suffix));
  }
  const ResultsDb db(copy.path() / path.filename());
  json tasks = json::array();
  for (const std::string& problem : db.problems()) {
    for (const std::string& device : db.devices_for(problem)) {
      json points = json::array();
      double start_us = 0, best_us = 0;
      for (const auto& e : db.evaluations(problem, device)) {
        json point = {
            {"n", points.size() + 1}, {"verdict", verdict_name(e.verdict)}, {"note", e.variant}};
        if (e.timed()) {
          const double us = e.stats.median * 1e3;
          point["time_us"] = us;
          if (start_us == 0) start_us = us;
          if (best_us == 0 || us < best_us) {
            best_us = us;
            point["kept"] = true;
          }
        }
        points.push_back(point);
      }
      // The problem as the tuner names it: "softmax 8192x8192 bf16".
      const size_t first = problem.find(' '), last = problem.rfind(' ');
      const bool three_parts = first != last;
      const TaskHead head{fmt::format("{} on {}", problem, device),
                          problem.substr(0, first),
                          three_parts ? problem.substr(first + 1, last - first - 1) : "",
                          three_parts ? problem.substr(last + 1) : "",
                          device,
                          start_us,
                          best_us};
      json task = task_json(head, points);
      task["source"] = "tune database";
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
    if (fs::is_directory(p)) {  // its task folders are read (and their absence reported) later
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
    report["tasks"] = collect_workspace(sources.workspace);
    report["workspace"] = sources.workspace.string();
    report["device"] = report["tasks"][0]["device"];
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
