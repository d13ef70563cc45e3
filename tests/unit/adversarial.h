// The adversarial kernels of tests/data/adversarial, run through the kforge command line as a
// user (or an agent) would: `kforge check`, `kforge bench` and `kforge tune` with the op's
// library files. Each file names the verdicts it must get in a line
//
//   // expect: check=WRONG bench=WRONG|INVALID tune=loses
//
// ("tune=loses": the tune's winner is a library file and the adversarial variant is not OK;
// "tune=any": only that kforge survives the tune). Whatever the verdict, kforge itself must
// end normally (exit 0 or 1, never a crash or a hang), and no process a candidate started may
// outlive it.
#pragma once

#include <dirent.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "compile/kernel_file.h"
#include "core/process.h"
#include "test_support.h"

namespace kforge::test {

struct Expectation {
  std::set<std::string> check;
  std::set<std::string> bench;
  // "loses": every variant of the file is refused or wrong, and none wins; "not-best": some
  // variants may pass (one whose trick kforge has made harmless is an honest kernel), but none
  // is the tune's best; "any": the tune is not judged.
  std::string tune;
};

inline std::set<std::string> split_alternatives(const std::string& text) {
  std::set<std::string> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, '|'))
    out.insert(item);
  return out;
}

inline Expectation read_expectation(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  static const std::regex expect_re(R"(//\s*expect:\s*check=(\S+)\s+bench=(\S+)\s+tune=(\S+))");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, expect_re)) {
      const std::string tune = m[3];
      if (tune != "loses" && tune != "not-best" && tune != "any") {
        ADD_FAILURE() << file << ": tune=" << tune << " is not loses, not-best or any";
      }
      return {split_alternatives(m[1]), split_alternatives(m[2]), tune};
    }
  }
  ADD_FAILURE() << file << " has no '// expect: check=... bench=... tune=...' line";
  return {};
}

inline std::vector<std::filesystem::path> adversarial_files(const std::string& extension) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(test_data_dir()) /
                                                           "adversarial")) {
    if (e.path().extension() == extension) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The verdict kforge printed: "verdict: X" (check) or "verdict   X" (bench).
inline std::string printed_verdict(const std::string& output) {
  static const std::regex verdict_re(R"((^|\n)verdict:?\s+([A-Z_]+))");
  std::smatch m;
  return std::regex_search(output, m, verdict_re) ? m[2].str() : "NO VERDICT";
}

// Processes that a finished kforge run must not have left: workers whose kforge is gone, and
// the programs the adversarial kernels try to start (sleep 8639x).
inline std::vector<std::string> leftover_processes() {
  std::vector<std::string> left;
  DIR* proc = opendir("/proc");
  if (!proc) return left;
  static const std::regex parent_re(R"(--parent\s(\d+))");
  while (const dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::string cmdline = read_text(std::filesystem::path("/proc") / e->d_name / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    std::smatch m;
    if (cmdline.find("__worker") != std::string::npos && std::regex_search(cmdline, m, parent_re)) {
      if (::kill(static_cast<pid_t>(std::stol(m[1])), 0) != 0) left.push_back(cmdline);
    }
    if (cmdline.find("sleep 8639") != std::string::npos) left.push_back(cmdline);
  }
  closedir(proc);
  return left;
}

struct AdversarialRun {
  std::filesystem::path file;
  std::vector<std::string> check_args;  // e.g. {"--max-elements", "N"}
  std::string bench_shape;
  std::string tune_shape;
  std::vector<std::string> device_args;  // e.g. {"--backend", "cpu"}
  std::vector<std::string> tune_args;    // strategy and budget
};

// What kforge must do with one adversarial file, end to end.
inline void run_adversarial(const AdversarialRun& run) {
  const Expectation expect = read_expectation(run.file);
  const auto dir = temp_dir("adversarial-" + run.file.stem().string());
  ::setenv("KFORGE_CACHE_DIR", shared_module_cache().c_str(), 1);
  const KernelFile kernel = KernelFile::load(run.file);
  const auto kforge = [&](std::vector<std::string> args, std::chrono::minutes limit) {
    args.insert(args.begin(), kforge_binary());
    args.insert(args.end(), run.device_args.begin(), run.device_args.end());
    const CommandResult r = run_command(args, limit);
    EXPECT_FALSE(r.timed_out) << "kforge hung: " << r.output;
    EXPECT_EQ(r.signal, 0) << "kforge was killed: " << r.output;
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1)
        << "kforge did not end with a verdict (exit " << r.exit_code << "): " << r.output;
    const auto left = leftover_processes();
    EXPECT_TRUE(left.empty()) << "processes outlived kforge: " << left.front();
    return r;
  };

  std::vector<std::string> check = {"check", run.file.string(), "--dtype", "bf16"};
  check.insert(check.end(), run.check_args.begin(), run.check_args.end());
  const CommandResult checked = kforge(check, std::chrono::minutes(10));
  const std::string check_verdict = printed_verdict(checked.output);
  EXPECT_TRUE(expect.check.contains(check_verdict))
      << "kforge check gave " << check_verdict << "\n"
      << checked.output.substr(checked.output.size() > 3000 ? checked.output.size() - 3000 : 0);

  const CommandResult benched = kforge({"bench", run.file.string(), "--shape", run.bench_shape,
                                        "--dtype", "bf16", "--max-time", "1"},
                                       std::chrono::minutes(10));
  const std::string bench_verdict = printed_verdict(benched.output);
  EXPECT_TRUE(expect.bench.contains(bench_verdict)) << "kforge bench gave " << bench_verdict << "\n"
                                                    << benched.output;

  std::vector<std::string> tune = {"tune",
                                   kernel.op,
                                   "--also",
                                   run.file.string(),
                                   "--shape",
                                   run.tune_shape,
                                   "--dtype",
                                   "bf16",
                                   "--no-final-check",
                                   "--db",
                                   (dir / "results.sqlite").string(),
                                   "--json",
                                   (dir / "tune.json").string()};
  tune.insert(tune.end(), run.tune_args.begin(), run.tune_args.end());
  const CommandResult tuned = kforge(tune, std::chrono::minutes(10));
  // The record of what kforge said, for the test log.
  std::string winner = "(no report)";
  nlohmann::json report;
  if (std::filesystem::exists(dir / "tune.json")) {
    report = nlohmann::json::parse(std::ifstream(dir / "tune.json"));
    winner =
        report.at("best").is_null() ? "none" : report.at("best").at("variant").get<std::string>();
  }
  std::printf("verdicts %s: check %s, bench %s, tune winner %s\n", run.file.filename().c_str(),
              check_verdict.c_str(), bench_verdict.c_str(), winner.c_str());
  if (expect.tune == "any") return;
  ASSERT_TRUE(report.is_object()) << tuned.output;
  const std::string name = run.file.filename().string();
  bool evaluated = false;
  for (const auto& e : report.at("evaluations")) {
    if (e.at("variant").get<std::string>().rfind(name, 0) != 0) continue;
    evaluated = true;
    if (expect.tune == "loses") {
      EXPECT_NE(e.at("verdict"), "OK") << "the adversarial variant was timed: " << e.dump();
    }
  }
  EXPECT_TRUE(evaluated) << "the tune never tried the adversarial file\n" << tuned.output;
  ASSERT_FALSE(report.at("best").is_null()) << tuned.output;
  EXPECT_NE(report.at("best").at("variant").get<std::string>().rfind(name, 0), 0u)
      << "the adversarial file won the tune";
}

}  // namespace kforge::test
