// `kforge report PATH...`: what a loop workspace, a plan and a verify result show, as one
// self-contained HTML page with its figures beside it (src/report/).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kforge {

struct ReportFlags {
  std::vector<std::string> paths;  // a workspace folder and/or plan, verify, ceilings JSON files
  std::string out = "kforge-report";
};

CLI::App* add_report_command(CLI::App& app, ReportFlags& flags);
int cmd_report(const ReportFlags& flags, const std::vector<std::string>& argv);

}  // namespace kforge
