#include "check/sanitizer.h"

#include <cstdlib>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "core/process.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

// compute-sanitizer's exit code when it found errors (any value not used otherwise).
constexpr int kFindingsExitCode = 86;
// Lines of findings kept for the report.
constexpr int kSummaryLines = 24;

}  // namespace

const std::vector<std::string>& all_sanitizer_tools() {
  static const std::vector<std::string> tools = {"memcheck", "racecheck", "synccheck", "initcheck"};
  return tools;
}

// synccheck belongs here: a GEMM epilogue whose named barrier ids ran past the hardware's last
// (15) computed right answers in every stage and passed memcheck and racecheck; synccheck alone
// stopped it (docs/integrity.md).
const std::vector<std::string>& winner_sanitizer_tools() {
  static const std::vector<std::string> tools = {"memcheck", "racecheck", "synccheck"};
  return tools;
}

std::string joined_tool_names(const std::vector<std::string>& tools) {
  std::string text;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) text += i + 1 == tools.size() ? " and " : ", ";
    text += tools[i];
  }
  return text;
}

std::optional<fs::path> find_compute_sanitizer() {
  if (const auto found = find_on_path("compute-sanitizer")) return fs::path(*found);
  for (const char* dir : {"/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer"}) {
    const fs::path candidate = fs::path(dir) / "compute-sanitizer";
    if (fs::exists(candidate)) return candidate;
  }
  return std::nullopt;
}

std::vector<std::string> sanitizer_launcher(const fs::path& sanitizer, const std::string& tool) {
  return {sanitizer.string(),
          "--tool",
          tool,
          "--error-exitcode",
          std::to_string(kFindingsExitCode),
          "--print-limit",
          "20",
          "--show-backtrace",
          "device"};
}

SanitizerVerdict read_sanitizer_output(const std::string& output, int exit_code) {
  SanitizerVerdict v;
  static const std::regex errors_re(R"(ERROR SUMMARY:\s*(\d+) error)");
  static const std::regex race_re(R"(RACECHECK SUMMARY:.*\((\d+) error)");
  std::smatch m;
  if (std::regex_search(output, m, errors_re)) v.errors = std::stoi(m[1]);
  if (std::regex_search(output, m, race_re)) v.errors = std::max(v.errors, std::stoi(m[1]));
  v.clean = v.errors == 0 && exit_code != kFindingsExitCode;
  if (v.clean) return v;
  // The tool prefixes its own lines with "========="; keep the first findings.
  std::stringstream lines(output);
  std::string line;
  int kept = 0;
  while (std::getline(lines, line) && kept < kSummaryLines) {
    if (line.rfind("=========", 0) != 0) continue;
    v.summary += line + "\n";
    ++kept;
  }
  if (v.summary.empty()) v.summary = fmt::format("exit code {}", exit_code);
  return v;
}

}  // namespace kforge
