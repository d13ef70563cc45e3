// The tuner's memory: one SQLite database of every variant evaluated, keyed by (variant,
// problem, device), with its verdict, the stage where it stopped, its resources and its timing
// with spread. Each evaluation is committed as soon as it is known (write-ahead log), so a tune
// killed at any point loses at most the evaluations in flight, and a tune run again answers
// from here instead of compiling and timing again. `kforge tune --replay` runs a strategy over
// these rows without a GPU.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/statistics.h"
#include "device/backend.h"
#include "run/verdict.h"

struct sqlite3;

namespace kforge {

struct EvaluationRecord {
  std::string variant_key;
  std::string problem;  // "rmsnorm 8192x8192 bf16"
  std::string device;   // device_key(): "NVIDIA H200 (cc 9.0)"
  std::string file;     // for people
  std::string variant;  // Variant::describe()
  nlohmann::json params = nlohmann::json::object();
  Verdict verdict = Verdict::ok;
  std::string stage;  // where it stopped: compile, resources, smoke, gate, timing; or timed
  std::string detail;
  int registers = 0;
  long long static_shared_bytes = 0;
  long long spill_bytes = 0;
  double occupancy = -1;  // theoretical, 0..1; -1 when unknown
  SampleStats stats;      // milliseconds; count == 0 unless timed
  double compile_seconds = 0;
  uint64_t seed = 0;
  std::string recorded_at;
  std::string git_sha;
  // The timing method the evaluation was made with (kMeasurementMethod); a live tune evaluates
  // again what another method recorded. Empty for records from before methods were named.
  std::string method;
  // The device (DeviceLane::name) the evaluation ran on, when several were in use; records
  // with one device key may come from several GPUs of that model.
  std::string ran_on;

  bool timed() const { return verdict == Verdict::ok && stats.count > 0; }
  // What strategies minimize: the median time, or +infinity for anything not timed.
  double cost() const;
};

// "NVIDIA H200 (cc 9.0)", "cpu: <model>": what makes timings comparable.
std::string device_key(const DeviceInfo& device);

struct TuneRecord {
  int64_t id = 0;
  std::string problem;
  std::string device;
  nlohmann::json settings;  // strategy, seed, budget, lookahead, files, command line
  std::string started_at;
  std::string finished_at;  // empty while running (or when it was killed)
  nlohmann::json summary;   // the winner and counts, when finished
};

class ResultsDb {
 public:
  // Opens (creating if needed) the database at `path`. Throws Error with SQLite's message.
  explicit ResultsDb(const std::filesystem::path& path);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  std::optional<EvaluationRecord> find(const std::string& variant_key, const std::string& problem,
                                       const std::string& device) const;
  // A problem of `op` at which the variant passed its final check on `device`, if any. Only
  // the same op: another op may take the same file against another reference (a KernelBench
  // problem checked against its own Model).
  std::optional<std::string> checked_at(const std::string& variant_key, const std::string& op,
                                        const std::string& device) const;
  // Inserts or replaces, and commits.
  void put(const EvaluationRecord& record);
  std::vector<EvaluationRecord> evaluations(const std::string& problem,
                                            const std::string& device) const;

  // The device a key stands for, as last recorded (replays need its limits).
  void put_device(const DeviceInfo& device);
  std::optional<DeviceInfo> find_device(const std::string& key) const;
  // Every problem with evaluations, in name order.
  std::vector<std::string> problems() const;
  // Devices with evaluations of `problem`, most evaluations first.
  std::vector<std::string> devices_for(const std::string& problem) const;

  int64_t begin_tune(const std::string& problem, const std::string& device,
                     const nlohmann::json& settings);
  void finish_tune(int64_t id, const nlohmann::json& summary);
  std::vector<TuneRecord> tunes(const std::string& problem) const;

  const std::filesystem::path& path() const { return path_; }

 private:
  void exec(const char* sql) const;

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
};

std::filesystem::path default_results_db();

}  // namespace kforge
