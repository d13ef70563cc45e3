// What every record carries about where it came from: kforge's git SHA (and whether the tree
// was dirty), the command line, the date, the host.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge {

struct GitState {
  std::string sha = "unknown";
  bool dirty = false;
};

// $KFORGE_GIT_SHA if set (e.g. a build carried to another machine), else `git` in the source
// tree kforge was built from; read once per process.
GitState git_state();
std::string utc_timestamp();  // ISO 8601
nlohmann::json run_metadata(const std::vector<std::string>& command_line);

}  // namespace kforge
