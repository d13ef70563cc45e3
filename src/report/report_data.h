// What `kforge report` draws, gathered into one JSON document (report.json): the tasks of a
// loop workspace with every experiment, a plan's op groups, verify's measured step times and
// the device's ceilings. The figures (src/report/plot/) and the HTML page read only this.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge {

struct ReportSources {
  std::filesystem::path workspace;  // a loop workspace: TASK/task.json + TASK/experiments.jsonl
  std::filesystem::path plan;       // `kforge plan --json`
  std::filesystem::path verify;     // `kforge verify` JSON
  std::filesystem::path ceilings;   // `kforge ceilings --json` (else the plan's, if any)
  std::filesystem::path tune_db;    // a `kforge tune` results database (SQLite)
};

// Sorts PATHs into sources by what they hold (a folder of tasks, a JSON file that is a plan, a
// verify result or ceilings, or a .sqlite results database). Throws UsageError for anything
// else.
ReportSources classify_report_paths(const std::vector<std::filesystem::path>& paths);

// The report's data. Per task: its op, shape, dtype, bytes and FLOPs per call (from the op's
// spec), start and best kept times, every experiment (number, verdict, kept, time) and the
// frontier of kept, passing experiments. A tune database adds one task per problem and device:
// its evaluations in the order they were recorded, the frontier of the best timed (passing)
// one so far, and as "kept" the evaluations that lowered it. Throws Error naming a file that
// cannot be read.
nlohmann::json collect_report(const ReportSources& sources);

}  // namespace kforge
