// Tunes on several devices, with CPU backend slots standing in for GPUs: the same winner as on
// one, every variant evaluated and recorded exactly once, also when a worker is killed in the
// middle or a lane is lost for good. The tuned file (tests/data/pool/bowl_cpu.cpp) has one
// variant about three times as fast as its nearest neighbours, so its winner does not depend on
// noise. The tests run alone (RUN_SERIAL) and compile every variant before timing any: timings
// on both cores of a two-core machine must not also share them with compilers or other tests.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/process.h"
#include "ops/op_spec.h"
#include "pool/device_pool.h"
#include "test_support.h"
#include "tune/tuner.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

const fs::path kBowl = test::source_root() / "tests" / "data" / "pool" / "bowl_cpu.cpp";
constexpr size_t kVariants = 25;  // A x B: 5 x 5

bool two_cores() {
  return sysconf(_SC_NPROCESSORS_ONLN) >= 2;
}

// Worker processes whose parent is `parent`, with their command lines.
std::map<pid_t, std::string> workers_of(pid_t parent) {
  std::map<pid_t, std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::string cmdline = test::read_text(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("__worker") != std::string::npos) found[std::stoi(name)] = cmdline;
  }
  return found;
}

// Compiles every variant of the bowl into the module cache at `cache`, so that a tune using it
// times without compilers running beside it.
void warm_module_cache(const fs::path& cache) {
  CompilerOptions options;
  options.cache_dir = cache;
  const Compiler compiler(options);
  const KernelFile file = KernelFile::load(kBowl);
  std::vector<Variant> variants;
  for (long long a = 0; a < 5; ++a) {
    for (long long b = 0; b < 5; ++b)
      variants.push_back(Variant::make(file, {{"A", a}, {"B", b}}, DType::f32, "host"));
  }
  for (const CompileResult& r : compiler.compile_all(file, variants))
    ASSERT_TRUE(r.ok) << r.log;
}

std::vector<std::string> tune_command(const fs::path& dir, const std::string& db,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {test::kforge_binary(),
                                   "tune",
                                   kBowl.string(),
                                   "--shape",
                                   "64x64",
                                   "--dtype",
                                   "f32",
                                   "--strategy",
                                   "exhaustive",
                                   "--backend",
                                   "cpu",
                                   "--no-final-check",
                                   "--db",
                                   (dir / db).string(),
                                   "--json",
                                   (dir / (db + ".json")).string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<EvaluationRecord> recorded(const fs::path& db) {
  return ResultsDb(db).evaluations("rmsnorm 64x64 f32", device_key(cpu_device_info()));
}

// Every variant once, every one timed (the bowl has no failing variant), and the lanes'
// evaluation counts adding up to the variants: nothing lost, nothing done twice.
void expect_each_variant_once(const nlohmann::json& report,
                              const std::vector<EvaluationRecord>& rows) {
  EXPECT_EQ(report.at("evaluated"), kVariants);
  EXPECT_EQ(report.at("valid"), kVariants);
  std::set<std::string> keys;
  for (const auto& r : rows) {
    keys.insert(r.variant_key);
    EXPECT_TRUE(r.timed()) << r.variant << ": " << r.detail;
  }
  EXPECT_EQ(keys.size(), kVariants);
  EXPECT_EQ(rows.size(), kVariants);
  size_t by_lanes = 0;
  for (const auto& lane : report.at("lanes"))
    by_lanes += lane.at("evaluations").get<size_t>();
  EXPECT_EQ(by_lanes, kVariants) << report.at("lanes").dump();
  EXPECT_EQ(report.at("best").at("params"), (nlohmann::json{{"A", 2}, {"B", 3}}));
}

TEST(DevicePool, ParsesDeviceLists) {
  EXPECT_EQ(parse_device_list("0", "cpu"), std::vector<int>{0});
  EXPECT_EQ(parse_device_list("all", "cpu").size(),
            static_cast<size_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_THROW(parse_device_list("0,0", "cpu"), UsageError);
  EXPECT_THROW(parse_device_list("0,x", "cpu"), UsageError);
  EXPECT_THROW(parse_device_list("-1", "cpu"), UsageError);
  EXPECT_THROW(parse_device_list("100000", "cpu"), UsageError);
  EXPECT_THROW(parse_device_list("", "cpu"), UsageError);
}

// A worker dies with its parent (PR_SET_PDEATHSIG), and the kernel's parent is the thread that
// spawned it. A lane's thread restarts workers and ends before the tune's last timings on that
// lane; a worker it started must not die with it.
TEST(DevicePool, AWorkerOutlivesTheThreadThatStartedIt) {
  WorkerClient worker(WorkerOptions{"cpu", 0, test::kforge_binary()});
  std::thread([&] { worker.device(); }).join();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const WorkerReply reply = worker.request({{"op", "hello"}}, std::chrono::seconds(30));
  EXPECT_TRUE(reply.ok()) << reply.detail;
  EXPECT_EQ(worker.workers_started(), 1);
}

// One slot and two slots tune the same space: the same winner, each variant once, both slots
// used, and each record says where it ran.
TEST(DevicePool, SeveralCpuSlotsFindTheSameWinnerAsOne) {
  if (!two_cores()) GTEST_SKIP() << "needs two CPU cores";
  const fs::path dir = test::temp_dir("pool-same-winner");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  warm_module_cache(dir / "cache");
  const CommandResult one = run_command(tune_command(dir, "one", {}), std::chrono::minutes(10));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const CommandResult two =
      run_command(tune_command(dir, "two", {"--devices", "0,1"}), std::chrono::minutes(10));
  ASSERT_EQ(two.exit_code, 0) << two.output;

  const auto one_report = nlohmann::json::parse(std::ifstream(dir / "one.json"));
  const auto two_report = nlohmann::json::parse(std::ifstream(dir / "two.json"));
  expect_each_variant_once(one_report, recorded(dir / "one"));
  expect_each_variant_once(two_report, recorded(dir / "two"));
  EXPECT_EQ(two_report.at("best").at("variant_key"), one_report.at("best").at("variant_key"));

  ASSERT_EQ(two_report.at("lanes").size(), 2u);
  std::set<std::string> ran_on;
  for (const auto& r : recorded(dir / "two"))
    ran_on.insert(r.ran_on);
  EXPECT_EQ(ran_on, (std::set<std::string>{"cpu:0", "cpu:1"}));
  // The calibration timed the defaults on both slots and says whether they agreed.
  ASSERT_TRUE(two_report.at("calibration").is_object()) << two_report.dump(1);
  EXPECT_EQ(two_report.at("calibration").at("lanes").size(), 2u);
  EXPECT_TRUE(one_report.at("calibration").is_null());  // one lane: nothing to calibrate
}

// A worker killed from outside in the middle of a tune costs one repeated evaluation: the
// tune ends normally with every variant recorded once and timed, not one recorded as a crash.
TEST(DevicePool, AKilledWorkerCostsARepeatNotALostEvaluation) {
  if (!two_cores()) GTEST_SKIP() << "needs two CPU cores";
  const fs::path dir = test::temp_dir("pool-killed-worker");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  warm_module_cache(dir / "cache");
  const std::vector<std::string> argv = tune_command(dir, "db", {"--devices", "0,1"});
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    freopen((dir / "tune.out").c_str(), "w", stdout);
    freopen((dir / "tune.err").c_str(), "w", stderr);
    execv(args[0], args.data());
    _exit(127);
  }
  bool killed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!fs::exists(dir / "db") || recorded(dir / "db").size() < 5) continue;
    const auto workers = workers_of(pid);
    if (workers.empty()) continue;
    ::kill(workers.begin()->first, SIGKILL);
    killed = true;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed) << test::read_text(dir / "tune.err");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << test::read_text(dir / "tune.err");

  const auto report = nlohmann::json::parse(std::ifstream(dir / "db.json"));
  expect_each_variant_once(report, recorded(dir / "db"));
  // The kill ended a request in flight, or the next one sent to the dead worker.
  EXPECT_GE(report.at("retried").get<int>(), 1) << test::read_text(dir / "tune.out");
  for (const auto& lane : report.at("lanes"))
    EXPECT_FALSE(lane.at("lost").get<bool>()) << lane.dump();
}

// A lane that can no longer start a worker (a GPU fallen off the bus) is dropped, and the
// evaluation it had in hand goes to the other lane: the tune ends with every variant once.
// Lane 1's launcher refuses to start its worker once a marker file exists.
TEST(DevicePool, ALostLaneHandsItsWorkToTheOthers) {
  if (!two_cores()) GTEST_SKIP() << "needs two CPU cores";
  const fs::path dir = test::temp_dir("pool-lost-lane");
  const fs::path marker = dir / "lane-1-lost";
  CompilerOptions compile;
  compile.cache_dir = dir / "cache";
  const Compiler compiler(compile);
  warm_module_cache(dir / "cache");
  WorkerOptions base;
  base.executable = test::kforge_binary();
  base.launcher = {"/bin/sh", "-c",
                   "for a; do [ \"$prev\" = --cpu-core ] && core=$a; prev=$a; done; "
                   "[ \"$core\" = 1 ] && [ -e '" +
                       marker.string() + "' ] && exit 3; exec \"$@\"",
                   "sh"};
  DevicePool devices("cpu", {0, 1}, compiler, base);
  ResultsDb db(dir / "results.sqlite");
  const KernelFile file = KernelFile::load(kBowl);
  const OpSpec& op = *find_op("rmsnorm");
  const TuneProblem problem{&op, op.parse_shape("64x64"), DType::f32};
  TuneOptions options;
  options.strategy = "exhaustive";
  options.final_check = false;
  options.lookahead = 4;  // work is left for lane 1 to fail on after the marker appears

  bool lost = false;
  const auto on_progress = [&](const TuneProgress& p) {
    if (lost || p.evaluated < 5) return;
    std::ofstream(marker) << "lost\n";
    for (const auto& [pid, cmdline] : workers_of(getpid())) {
      if (cmdline.find("--cpu-core 1") != std::string::npos) ::kill(pid, SIGKILL);
    }
    lost = true;
  };
  Tuner tuner(db, &compiler, &devices);
  const TuneReport report = tuner.tune({&file}, problem, options, on_progress);
  ASSERT_TRUE(lost);
  const nlohmann::json j = report.to_json(3);
  expect_each_variant_once(j, db.evaluations(problem.key(), report.device));
  ASSERT_EQ(j.at("lanes").size(), 2u);
  EXPECT_FALSE(j.at("lanes")[0].at("lost").get<bool>());
  EXPECT_TRUE(j.at("lanes")[1].at("lost").get<bool>()) << j.at("lanes").dump();
  EXPECT_NE(j.at("lanes")[1].at("lost_reason").get<std::string>().find("did not start"),
            std::string::npos)
      << j.at("lanes").dump();
  EXPECT_TRUE(devices.lane(1).lost);
}

}  // namespace
}  // namespace kforge
