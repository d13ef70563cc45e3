// `kforge report` on a recorded loop workspace, plan and verify result: the page opens in a real
// headless browser (Chromium), every figure decodes, and the numbers the page shows are the
// ones the experiment logs hold.
#include <fstream>
#include <map>
#include <regex>

#include <sqlite3.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "core/process.h"
#include "test_support.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data(const std::string& name) {
  return fs::path(test::test_data_dir()) / "report" / name;
}

CommandResult kforge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::kforge_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, std::chrono::minutes(5));
}

// Chromium from Debian (scripts/setup installs it), or $KFORGE_BROWSER.
std::string browser() {
  if (const char* env = std::getenv("KFORGE_BROWSER")) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (run_command({"sh", "-c", fmt::format("command -v {}", name)}).ok()) return name;
  }
  return "";
}

// The DOM after the page's scripts ran, as a headless browser renders it.
std::string rendered_dom(const fs::path& page) {
  const std::string chrome = browser();
  if (chrome.empty()) {
    ADD_FAILURE() << "no Chromium: run scripts/setup (it installs the chromium package)";
    return "";
  }
  const CommandResult r = run_command(
      {chrome, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
       "--dump-dom", "file://" + fs::absolute(page).string()},
      std::chrono::minutes(2));
  EXPECT_TRUE(r.ok()) << r.output;
  return r.output;
}

// `text` matched literally inside a regular expression.
std::string literal(const std::string& text) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(text, special, R"(\$&)");
}

// What the experiment logs say, computed here independently of kforge: per task, the number of
// experiments, kept ones and the best kernel's time (the last kept one: each was kept for
// beating the best before it, as `kforge loop --status` counts).
struct LoggedTask {
  int experiments = 0, kept = 0;
  double start_us = 0, best_us = 0;
};

LoggedTask read_log(const fs::path& task_dir) {
  LoggedTask t;
  std::ifstream in(task_dir / "experiments.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json r = json::parse(line);
    ++t.experiments;
    if (t.start_us == 0 && r.contains("best")) t.start_us = r["best"]["median_us"];
    if (r.value("kept", false)) {
      ++t.kept;
      t.best_us = r["time_us"];
    }
  }
  if (t.best_us == 0) t.best_us = t.start_us;
  return t;
}

TEST(ReportCli, WritesAPageTheBrowserShowsWithTheLogsNumbers) {
  const fs::path out = test::temp_dir("report") / "out";
  const CommandResult r =
      kforge({"report", data("ws").string(), data("plan.json").string(),
              data("verify.json").string(), data("ceilings.json").string(), "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json figures = read_json_file(out / "figures.json");
  std::map<std::string, int> kinds;
  for (const auto& f : figures) {
    ++kinds[f["figure"].get<std::string>()];
    EXPECT_GT(fs::file_size(out / f["svg"].get<std::string>()), 1000u) << f["svg"];
    EXPECT_GT(fs::file_size(out / f["png"].get<std::string>()), 1000u) << f["png"];
  }
  EXPECT_EQ(kinds["progress"], 2);  // one per task
  EXPECT_EQ(kinds["roofline"], 1);
  EXPECT_EQ(kinds["waterfall"], 1);

  const std::string dom = rendered_dom(out / "index.html");
  // Every figure decoded in the browser (the page counts them after load).
  EXPECT_NE(dom.find(fmt::format("data-figures=\"{}\" data-figures-loaded=\"{}\"", figures.size(),
                                 figures.size())),
            std::string::npos)
      << dom.substr(0, 2000);

  // The task rows show what the logs hold.
  for (const auto& entry : fs::directory_iterator(data("ws"))) {
    const std::string name = entry.path().filename().string();
    const LoggedTask logged = read_log(entry.path());
    const std::regex row("<tr data-task=\"" + literal(name) +
                         "\">.*?<td class=\"start\">([0-9.]+)</td><td class=\"best\">([0-9.]+)"
                         "</td><td class=\"speedup\">([0-9.]+)</td><td>([0-9]+)</td><td>"
                         "([0-9]+)</td>");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(dom, m, row)) << name;
    EXPECT_EQ(m[1].str(), fmt::format("{:.2f}", logged.start_us)) << name;
    EXPECT_EQ(m[2].str(), fmt::format("{:.2f}", logged.best_us)) << name;
    EXPECT_EQ(m[3].str(), fmt::format("{:.2f}", logged.start_us / logged.best_us)) << name;
    EXPECT_EQ(std::stoi(m[4].str()), logged.experiments) << name;
    EXPECT_EQ(std::stoi(m[5].str()), logged.kept) << name;
  }
  // Verify's step times, as the verify result has them.
  const json verify = read_json_file(data("verify.json"));
  for (const auto& [mode, ms] : verify["step_ms"].items()) {
    EXPECT_NE(dom.find(fmt::format("<td>{}</td><td>{:.2f}</td>", mode, ms.get<double>())),
              std::string::npos)
        << mode;
  }
}

// A tune's results database as input: one row per problem, its evaluations counted and its
// best time as SQLite holds them (read here with SQLite directly).
TEST(ReportCli, ShowsATuneDatabase) {
  const fs::path dir = test::temp_dir("report-tune");
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  const std::string db = (dir / "results.sqlite").string();
  CommandResult r =
      kforge({"tune", test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp", "--shape", "64x64",
              "--backend", "cpu", "--strategy", "exhaustive", "--no-final-check", "--db", db});
  ::unsetenv("KFORGE_CACHE_DIR");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string before = test::read_text(db);
  r = kforge({"report", db, "--out", (dir / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::read_text(db) == before) << "the report changed the database it read";

  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &handle), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(handle,
                               "SELECT problem, device, count(*), min(CASE WHEN samples > 0 AND "
                               "verdict = 'OK' THEN median_ms END) FROM evaluations GROUP BY 1, 2",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  const std::string name =
      fmt::format("{} on {}", reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)),
                  reinterpret_cast<const char*>(sqlite3_column_text(stmt, 1)));
  const int evaluations = sqlite3_column_int(stmt, 2);
  const double best_us = sqlite3_column_double(stmt, 3) * 1e3;
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE);  // one problem on one device
  sqlite3_finalize(stmt);
  sqlite3_close(handle);

  const std::string dom = rendered_dom(dir / "out" / "index.html");
  EXPECT_NE(dom.find("data-figures=\"1\" data-figures-loaded=\"1\""), std::string::npos);
  const std::regex row("<tr data-task=\"" + literal(name) +
                       "\">.*?<td class=\"best\">([0-9.]+)</td><td class=\"speedup\">[0-9.]+"
                       "</td><td>([0-9]+)</td>");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, row)) << name << "\n" << dom.substr(0, 3000);
  EXPECT_EQ(m[1].str(), fmt::format("{:.2f}", best_us));
  EXPECT_EQ(std::stoi(m[2].str()), evaluations);
}

TEST(ReportCli, RefusesWhatItCannotRead) {
  const fs::path dir = test::temp_dir("report-bad");
  std::ofstream(dir / "other.json") << R"({"something": 1})";
  CommandResult r =
      kforge({"report", (dir / "other.json").string(), "--out", (dir / "o").string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not a plan, verify or ceilings JSON file"), std::string::npos)
      << r.output;
  r = kforge({"report", (dir / "missing").string(), "--out", (dir / "o").string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no such file or folder"), std::string::npos) << r.output;
  fs::create_directories(dir / "empty");
  r = kforge({"report", (dir / "empty").string(), "--out", (dir / "o").string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace kforge
