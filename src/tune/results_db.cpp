#include "tune/results_db.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>
#include <sqlite3.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/run_info.h"

namespace kforge {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS evaluations (
  variant_key TEXT NOT NULL,
  problem TEXT NOT NULL,
  device TEXT NOT NULL,
  file TEXT NOT NULL,
  variant TEXT NOT NULL,
  params TEXT NOT NULL,
  verdict TEXT NOT NULL,
  stage TEXT NOT NULL,
  detail TEXT NOT NULL,
  registers INTEGER NOT NULL,
  static_shared_bytes INTEGER NOT NULL,
  spill_bytes INTEGER NOT NULL,
  occupancy REAL NOT NULL,
  samples INTEGER NOT NULL,
  median_ms REAL NOT NULL,
  mean_ms REAL NOT NULL,
  min_ms REAL NOT NULL,
  max_ms REAL NOT NULL,
  p10_ms REAL NOT NULL,
  p90_ms REAL NOT NULL,
  rel_noise REAL NOT NULL,
  rel_stderr REAL NOT NULL,
  compile_seconds REAL NOT NULL,
  seed INTEGER NOT NULL,
  recorded_at TEXT NOT NULL,
  git_sha TEXT NOT NULL,
  method TEXT NOT NULL DEFAULT '',
  ran_on TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (variant_key, problem, device)
);
CREATE TABLE IF NOT EXISTS devices (
  key TEXT PRIMARY KEY,
  info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tunes (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  problem TEXT NOT NULL,
  device TEXT NOT NULL,
  settings TEXT NOT NULL,
  started_at TEXT NOT NULL,
  finished_at TEXT NOT NULL DEFAULT '',
  summary TEXT NOT NULL DEFAULT '{}'
);
)sql";

constexpr const char* kColumns =
    "variant_key, problem, device, file, variant, params, verdict, stage, detail, registers, "
    "static_shared_bytes, spill_bytes, occupancy, samples, median_ms, mean_ms, min_ms, max_ms, "
    "p10_ms, p90_ms, rel_noise, rel_stderr, compile_seconds, seed, recorded_at, git_sha, method, "
    "ran_on";

// A prepared statement, finalized on scope exit. add() binds the next parameter.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK) {
      throw Error(fmt::format("results database: {} (in: {})", sqlite3_errmsg(db), sql));
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& add(const std::string& v) {
    check(sqlite3_bind_text(stmt_, ++bound_, v.c_str(), static_cast<int>(v.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  Statement& add(long long v) {
    check(sqlite3_bind_int64(stmt_, ++bound_, v));
    return *this;
  }
  Statement& add(double v) {
    check(sqlite3_bind_double(stmt_, ++bound_, v));
    return *this;
  }
  // True while there is a row.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw Error(fmt::format("results database: {}", sqlite3_errmsg(db_)));
  }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  long long integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }

 private:
  void check(int rc) const {
    if (rc != SQLITE_OK) throw Error(fmt::format("results database: {}", sqlite3_errmsg(db_)));
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int bound_ = 0;  // parameters bound so far (SQLite counts from 1)
};

EvaluationRecord read_record(const Statement& s) {
  EvaluationRecord r;
  int c = 0;
  r.variant_key = s.text(c++);
  r.problem = s.text(c++);
  r.device = s.text(c++);
  r.file = s.text(c++);
  r.variant = s.text(c++);
  r.params = nlohmann::json::parse(s.text(c++));
  const std::string verdict = s.text(c++);
  r.verdict = parse_verdict(verdict).value_or(Verdict::crash);
  r.stage = s.text(c++);
  r.detail = s.text(c++);
  r.registers = static_cast<int>(s.integer(c++));
  r.static_shared_bytes = s.integer(c++);
  r.spill_bytes = s.integer(c++);
  r.occupancy = s.real(c++);
  r.stats.count = static_cast<size_t>(s.integer(c++));
  r.stats.median = s.real(c++);
  r.stats.mean = s.real(c++);
  r.stats.min = s.real(c++);
  r.stats.max = s.real(c++);
  r.stats.p10 = s.real(c++);
  r.stats.p90 = s.real(c++);
  r.stats.rel_noise = s.real(c++);
  r.stats.rel_stderr = s.real(c++);
  r.compile_seconds = s.real(c++);
  r.seed = static_cast<uint64_t>(s.integer(c++));
  r.recorded_at = s.text(c++);
  r.git_sha = s.text(c++);
  r.method = s.text(c++);
  r.ran_on = s.text(c++);
  return r;
}

}  // namespace

double EvaluationRecord::cost() const {
  return timed() ? stats.median : std::numeric_limits<double>::infinity();
}

std::string device_key(const DeviceInfo& device) {
  if (device.backend == "cpu") return fmt::format("cpu: {}", device.name);
  return fmt::format("{} (cc {}.{})", device.name, device.cc_major, device.cc_minor);
}

std::filesystem::path default_results_db() {
  if (const char* env = std::getenv("KFORGE_RESULTS_DB")) return env;
  return default_cache_dir() / "results.sqlite";
}

ResultsDb::ResultsDb(const std::filesystem::path& path) : path_(path) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    throw Error(fmt::format("cannot open results database {}: {}", path.string(), why));
  }
  // Several kforge processes may share the database: wait for a writer instead of failing.
  sqlite3_busy_timeout(db_, 10000);
  // WAL with NORMAL sync: a committed row survives the process being killed (it is in the log
  // the next open replays); only a power cut can lose the last commits.
  exec("PRAGMA journal_mode=WAL");
  exec("PRAGMA synchronous=NORMAL");
  exec(kSchema);
  // Databases written before evaluations named their timing method, or the device they ran on,
  // get the columns (empty).
  for (const char* column : {"method", "ran_on"}) {
    char* message = nullptr;
    sqlite3_exec(
        db_,
        fmt::format("ALTER TABLE evaluations ADD COLUMN {} TEXT NOT NULL DEFAULT ''", column)
            .c_str(),
        nullptr, nullptr, &message);
    sqlite3_free(message);  // "duplicate column" when it is there already
  }
}

ResultsDb::~ResultsDb() {
  sqlite3_close(db_);
}

void ResultsDb::exec(const char* sql) const {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string why = message ? message : "unknown error";
    sqlite3_free(message);
    throw Error(fmt::format("results database {}: {}", path_.string(), why));
  }
}

std::optional<EvaluationRecord> ResultsDb::find(const std::string& variant_key,
                                                const std::string& problem,
                                                const std::string& device) const {
  Statement s(db_, fmt::format("SELECT {} FROM evaluations WHERE variant_key = ? AND problem = ? "
                               "AND device = ?",
                               kColumns));
  s.add(variant_key).add(problem).add(device);
  if (!s.step()) return std::nullopt;
  return read_record(s);
}

std::optional<std::string> ResultsDb::checked_at(const std::string& variant_key,
                                                 const std::string& op,
                                                 const std::string& device) const {
  // A problem key starts with its op's name and a space ("softmax 64x128 f32"); compared as a
  // prefix, not with LIKE, whose '_' would match any character of an op's name.
  const std::string prefix = op + " ";
  Statement s(db_,
              "SELECT problem FROM evaluations WHERE variant_key = ? AND device = ? AND "
              "stage = 'checked' AND substr(problem, 1, ?) = ? ORDER BY recorded_at LIMIT 1");
  s.add(variant_key).add(device).add(static_cast<long long>(prefix.size())).add(prefix);
  if (!s.step()) return std::nullopt;
  return s.text(0);
}

void ResultsDb::put(const EvaluationRecord& r) {
  Statement s(db_, fmt::format("INSERT OR REPLACE INTO evaluations ({}) VALUES ({})", kColumns,
                               "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                               "?, ?, ?, ?, ?, ?"));
  s.add(r.variant_key).add(r.problem).add(r.device).add(r.file).add(r.variant);
  s.add(r.params.dump()).add(std::string(verdict_name(r.verdict))).add(r.stage).add(r.detail);
  s.add(static_cast<long long>(r.registers)).add(r.static_shared_bytes).add(r.spill_bytes);
  s.add(r.occupancy).add(static_cast<long long>(r.stats.count)).add(r.stats.median);
  s.add(r.stats.mean).add(r.stats.min).add(r.stats.max).add(r.stats.p10).add(r.stats.p90);
  s.add(r.stats.rel_noise).add(r.stats.rel_stderr).add(r.compile_seconds);
  s.add(static_cast<long long>(r.seed));
  s.add(r.recorded_at.empty() ? utc_timestamp() : r.recorded_at);
  s.add(r.git_sha.empty() ? git_state().sha : r.git_sha);
  s.add(r.method).add(r.ran_on);
  s.step();  // autocommit: durable once this returns
}

std::vector<EvaluationRecord> ResultsDb::evaluations(const std::string& problem,
                                                     const std::string& device) const {
  Statement s(db_, fmt::format("SELECT {} FROM evaluations WHERE problem = ? AND device = ? "
                               "ORDER BY rowid",
                               kColumns));
  s.add(problem).add(device);
  std::vector<EvaluationRecord> out;
  while (s.step())
    out.push_back(read_record(s));
  return out;
}

void ResultsDb::put_device(const DeviceInfo& device) {
  Statement s(db_, "INSERT OR REPLACE INTO devices (key, info) VALUES (?, ?)");
  s.add(device_key(device)).add(nlohmann::json(device).dump());
  s.step();
}

std::optional<DeviceInfo> ResultsDb::find_device(const std::string& key) const {
  Statement s(db_, "SELECT info FROM devices WHERE key = ?");
  s.add(key);
  if (!s.step()) return std::nullopt;
  return nlohmann::json::parse(s.text(0)).get<DeviceInfo>();
}

std::vector<std::string> ResultsDb::problems() const {
  Statement s(db_, "SELECT DISTINCT problem FROM evaluations ORDER BY problem");
  std::vector<std::string> out;
  while (s.step())
    out.push_back(s.text(0));
  return out;
}

std::vector<std::string> ResultsDb::devices_for(const std::string& problem) const {
  Statement s(db_,
              "SELECT device FROM evaluations WHERE problem = ? GROUP BY device "
              "ORDER BY COUNT(*) DESC, device");
  s.add(problem);
  std::vector<std::string> out;
  while (s.step())
    out.push_back(s.text(0));
  return out;
}

int64_t ResultsDb::begin_tune(const std::string& problem, const std::string& device,
                              const nlohmann::json& settings) {
  Statement s(db_, "INSERT INTO tunes (problem, device, settings, started_at) VALUES (?, ?, ?, ?)");
  s.add(problem).add(device).add(settings.dump()).add(utc_timestamp());
  s.step();
  return sqlite3_last_insert_rowid(db_);
}

void ResultsDb::finish_tune(int64_t id, const nlohmann::json& summary) {
  Statement s(db_, "UPDATE tunes SET finished_at = ?, summary = ? WHERE id = ?");
  s.add(utc_timestamp()).add(summary.dump()).add(static_cast<long long>(id));
  s.step();
}

std::vector<TuneRecord> ResultsDb::tunes(const std::string& problem) const {
  Statement s(db_,
              "SELECT id, problem, device, settings, started_at, finished_at, summary FROM tunes "
              "WHERE problem = ? ORDER BY id");
  s.add(problem);
  std::vector<TuneRecord> out;
  while (s.step()) {
    out.push_back({s.integer(0), s.text(1), s.text(2), nlohmann::json::parse(s.text(3)), s.text(4),
                   s.text(5), nlohmann::json::parse(s.text(6))});
  }
  return out;
}

}  // namespace kforge
