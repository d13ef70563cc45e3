#include "cli/report_command.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/process.h"
#include "core/run_info.h"
#include "report/html_page.h"
#include "report/report_data.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

// The figures are drawn by matplotlib (Debian's python3-matplotlib, which scripts/setup
// installs).
std::string python_with_matplotlib() {
  if (const auto python = find_python_with("matplotlib")) return *python;
  throw UsageError(
      "kforge report draws its figures with matplotlib, and no Python here has it: run "
      "scripts/setup (it installs python3-matplotlib) or set KFORGE_PYTHON to a python3 that "
      "does");
}

fs::path figures_script() {
  return default_include_dir().parent_path() / "src" / "report" / "plot" / "kforge_figures.py";
}

}  // namespace

CLI::App* add_report_command(CLI::App& app, ReportFlags& flags) {
  auto* cmd = app.add_subcommand(
      "report",
      "Draw what a loop workspace, a plan and a verify result show: one HTML page (opens "
      "offline) with SVG/PNG figures beside it");
  cmd->add_option("paths", flags.paths,
                  "A loop workspace folder, and/or `kforge plan --json`, verify and `kforge "
                  "ceilings --json` files")
      ->required();
  cmd->add_option("--out", flags.out, "Folder for index.html, report.json and the figures")
      ->capture_default_str();
  return cmd;
}

int cmd_report(const ReportFlags& flags, const std::vector<std::string>& argv) {
  std::vector<fs::path> paths(flags.paths.begin(), flags.paths.end());
  for (const auto& p : paths) {
    if (!fs::exists(p)) throw UsageError(fmt::format("{}: no such file or folder", p.string()));
  }
  const ReportSources sources = classify_report_paths(paths);
  nlohmann::json report = collect_report(sources);
  report["run"] = run_metadata(argv);
  if (report["tasks"].empty() && !report.contains("plan") && !report.contains("verify")) {
    throw UsageError("nothing to report: the workspace has no tasks");
  }
  const fs::path out = flags.out;
  fs::create_directories(out);
  write_json_atomically(out / "report.json", report);

  const std::string python = python_with_matplotlib();
  fmt::print(stderr, "drawing figures ({})\n", python);
  const CommandResult drawn =
      run_command({python, figures_script().string(), (out / "report.json").string(), out.string()},
                  std::chrono::minutes(5));
  if (!drawn.ok()) {
    throw Error(fmt::format("drawing the figures failed ({}):\n{}", figures_script().string(),
                            drawn.output));
  }
  const nlohmann::json figures = read_json_file(out / "figures.json");
  write_text_atomically(out / "index.html", report_html(report, figures));
  fmt::print("{}: {} tasks, {} figures{}{}\n", (out / "index.html").string(),
             report["tasks"].size(), figures.size(), report.contains("plan") ? ", the plan" : "",
             report.contains("verify") ? ", verify's step times" : "");
  return 0;
}

}  // namespace kforge
