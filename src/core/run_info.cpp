#include "core/run_info.h"

#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/process.h"

namespace kforge {

namespace {

GitState read_git_state() {
  GitState g;
  if (const char* sha = std::getenv("KFORGE_GIT_SHA")) {
    g.sha = sha;
    const char* dirty = std::getenv("KFORGE_GIT_DIRTY");
    g.dirty = dirty && std::string(dirty) == "1";
    return g;
  }
  const CommandResult head =
      run_command({"git", "-C", KFORGE_SOURCE_DIR, "rev-parse", "HEAD"}, std::chrono::seconds(10));
  if (!head.ok()) return g;
  g.sha = head.output.substr(0, head.output.find('\n'));
  const CommandResult status =
      run_command({"git", "-C", KFORGE_SOURCE_DIR, "status", "--porcelain", "--untracked-files=no"},
                  std::chrono::seconds(10));
  g.dirty = status.ok() && !status.output.empty();
  return g;
}

}  // namespace

GitState git_state() {
  // Read once per process: records written during a run (every tuning evaluation) share it,
  // instead of each starting two git processes.
  static const GitState state = read_git_state();
  return state;
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json run_metadata(const std::vector<std::string>& command_line) {
  const GitState git = git_state();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return {{"kforge_git_sha", git.sha},
          {"kforge_git_dirty", git.dirty},
          {"command_line", fmt::format("{}", fmt::join(command_line, " "))},
          {"date", utc_timestamp()},
          {"host", host}};
}

}  // namespace kforge
