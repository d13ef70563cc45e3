// The measurement's integrity rules without a GPU: physical limits, fresh inputs and digests,
// the sanitizer's report, the worker's fence (seccomp) and the containment of kforge's child
// processes on Ctrl-C.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "adversarial.h"
#include "bench/limits.h"
#include "check/sanitizer.h"
#include "core/fresh_fill.h"
#include "core/fresh_values.h"
#include "core/process.h"
#include "device/backend.h"
#include "ops/op_spec.h"
#include "run/case_tensors.h"
#include "run/sandbox.h"
#include "test_support.h"

#include <sqlite3.h>

namespace kforge {
namespace {

Ceilings h200_like() {
  Ceilings c;
  c.copy_gbps = 4200;
  c.matmul_tflops = 780;
  return c;
}

TEST(PhysicalLimits, RefusesTimesBeyondTheCopyCeiling) {
  // rmsnorm 8192x8192 bf16 moves 268 MB: about 64 us at 4200 GB/s.
  const Cost cost{2.0 * 8192 * 8192 * 2 + 8192 * 2, 4.0 * 8192 * 8192};
  const int64_t l2 = 60 << 20;
  EXPECT_FALSE(physical_limit_violation(cost, 66.9e-6, h200_like(), l2));
  EXPECT_FALSE(physical_limit_violation(cost, 55e-6, h200_like(), l2));  // within the margin
  const auto why = physical_limit_violation(cost, 1.82e-6, h200_like(), l2);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("1.82 us is faster than this device allows"), std::string::npos) << *why;
  EXPECT_NE(why->find("268451840 bytes"), std::string::npos) << *why;
  EXPECT_NE(why->find("4200 GB/s"), std::string::npos) << *why;
}

TEST(PhysicalLimits, ProblemsThatFitInCacheGetAWiderMargin) {
  const Cost cost{1 << 20, 0};  // 1 MiB: 0.25 us at 4200 GB/s
  const int64_t l2 = 60 << 20;
  EXPECT_FALSE(physical_limit_violation(cost, 0.12e-6, h200_like(), l2));
  EXPECT_TRUE(physical_limit_violation(cost, 0.05e-6, h200_like(), l2));
  EXPECT_TRUE(physical_limit_violation(cost, 0.12e-6, h200_like(), 0));  // no cache known
}

TEST(PhysicalLimits, RefusesTimesBeyondTheMatrixCeiling) {
  // matmul 4096^3: 137 GFLOP, 176 us at 780 TFLOP/s.
  const double flops = 2.0 * 4096 * 4096 * 4096;
  const Cost cost{3.0 * 4096 * 4096 * 2, flops};
  EXPECT_FALSE(physical_limit_violation(cost, 198e-6, h200_like(), 60 << 20));
  const auto why = physical_limit_violation(cost, 85e-6, h200_like(), 60 << 20);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("780 TFLOP/s"), std::string::npos) << *why;
  Ceilings no_matmul = h200_like();
  no_matmul.matmul_tflops.reset();
  EXPECT_FALSE(physical_limit_violation(cost, 85e-6, no_matmul, 60 << 20));
}

TEST(FreshValues, NormalIsCentredWithUnitSpreadAndIndicesStayInRange) {
  double sum = 0, sum_sq = 0;
  const int n = 1 << 18;
  for (int i = 0; i < n; ++i) {
    const double v = fresh::normal_at(42, static_cast<uint64_t>(i));
    sum += v;
    sum_sq += v * v;
    ASSERT_LE(std::abs(v), 3.47);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 1.0, 0.01);
  int special = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t v = fresh::index_at(7, static_cast<uint64_t>(i), 1000, -100, 1.0 / 16);
    if (v == -100) {
      ++special;
    } else {
      ASSERT_GE(v, 0);
      ASSERT_LT(v, 1000);
    }
  }
  EXPECT_NEAR(static_cast<double>(special) / n, 1.0 / 16, 0.005);
  // Different seeds, different values.
  EXPECT_NE(fresh::normal_at(1, 5), fresh::normal_at(2, 5));
}

TEST(FreshValues, ARowRedrawnAloneMatchesTheWholeTensorsValues) {
  std::vector<std::byte> whole(64 * 2), row(64 * 2);
  FreshInput rule;
  fill_fresh_host(whole.data(), DType::bf16, 0, 64, rule, 99);
  fill_fresh_host(row.data(), DType::bf16, 16, 32, rule, 99);
  EXPECT_EQ(0, std::memcmp(whole.data() + 32, row.data() + 32, 32));
}

TEST(FreshValues, TrapEntriesCopyAColumnFromAnotherRow) {
  for (const int64_t rows : {2, 3, 64}) {
    for (const int64_t row_length : {1, 32}) {
      for (uint64_t seed = 0; seed < 200; ++seed) {
        for (int j = 0; j < fresh::kTrapElements; ++j) {
          const fresh::TrapEntry e = fresh::trap_entry(fresh::mix(seed), j, rows, row_length);
          ASSERT_GE(e.from, 0);
          ASSERT_LT(e.from, rows * row_length);
          ASSERT_GE(e.to, 0);
          ASSERT_LT(e.to, rows * row_length);
          EXPECT_EQ(e.from % row_length, e.to % row_length) << "the same column";
          EXPECT_NE(e.from / row_length, e.to / row_length) << "another row";
        }
      }
    }
  }
}

// On the host, as the worker does on the device: a trap copies a few (cos, sin) entries of RoPE's
// kept tables from other positions, so every pair is still a rotation's, and the tables come back
// as they were.
TEST(FreshValues, ATrapChangesKeptTablesConsistentlyAndTheyComeBack) {
  const OpSpec* op = find_op("rotary_embedding");
  ASSERT_NE(op, nullptr);
  Sizes sizes = {{"batch", 1}, {"heads", 2}, {"seq_len", 64}, {"head_dim", 64}};
  op->complete_sizes(sizes);
  CaseTensors tensors(*op, sizes, DType::f32);
  tensors.generate_inputs(InputKind::normal, 7);
  const auto kept = tensors.kept_inputs();
  ASSERT_TRUE(kept[0].empty()) << "x is redrawn, not kept";
  ASSERT_FALSE(kept[1].empty());
  ASSERT_FALSE(kept[2].empty());
  const auto entries = [&](size_t input) {
    const HostTensor& t = tensors.inputs()[input];
    return std::vector<float>(reinterpret_cast<const float*>(t.data),
                              reinterpret_cast<const float*>(t.data) + t.numel());
  };
  const std::vector<float> cos_before = entries(1), sin_before = entries(2);
  tensors.apply_trap(12345);
  const std::vector<float> cos_after = entries(1), sin_after = entries(2);
  int changed = 0;
  for (size_t i = 0; i < cos_after.size(); ++i) {
    if (cos_after[i] != cos_before[i] || sin_after[i] != sin_before[i]) ++changed;
    EXPECT_NEAR(cos_after[i] * cos_after[i] + sin_after[i] * sin_after[i], 1.0, 1e-6) << i;
  }
  EXPECT_GT(changed, 0);
  EXPECT_LE(changed, fresh::kTrapElements);
  tensors.restore_kept_inputs(kept);
  EXPECT_EQ(entries(1), cos_before);
  EXPECT_EQ(entries(2), sin_before);
}

TEST(Digest, SeesEveryElementAndCountsPoison) {
  auto backend = make_cpu_backend();
  std::vector<float> y(1000, 1.0f);
  DeviceSpan span{y.data(), DType::f32, 1000};
  const Digest a = backend->digest({&span, 1});
  EXPECT_EQ(a.poisoned, 0);
  y[517] = 1.0000001f;
  const Digest b = backend->digest({&span, 1});
  EXPECT_NE(a.hash, b.hash);
  std::swap(y[0], y[517]);  // same values, other places: another digest
  EXPECT_NE(backend->digest({&span, 1}).hash, b.hash);
  backend->poison(span);
  y[3] = 0.0f;
  EXPECT_EQ(backend->digest({&span, 1}).poisoned, 999);
}

TEST(Sanitizer, ReadsFindingsFromTheToolsReport) {
  const std::string clean = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n";
  EXPECT_TRUE(read_sanitizer_output(clean, 0).clean);
  const std::string found =
      "========= COMPUTE-SANITIZER\n"
      "========= Invalid __global__ write of size 4 bytes\n"
      "=========     at oob_kernel+0x70\n"
      "kernel output that is not the tool's\n"
      "========= ERROR SUMMARY: 3 errors\n";
  const SanitizerVerdict v = read_sanitizer_output(found, 86);
  EXPECT_FALSE(v.clean);
  EXPECT_EQ(v.errors, 3);
  EXPECT_NE(v.summary.find("Invalid __global__ write"), std::string::npos);
  EXPECT_EQ(v.summary.find("kernel output"), std::string::npos);
  const std::string races =
      "========= Error: Race reported between Write access at k+0x10\n"
      "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n";
  EXPECT_EQ(read_sanitizer_output(races, 86).errors, 2);
  EXPECT_FALSE(read_sanitizer_output("no summary at all", 86).clean);
}

// A tuned winner runs the tools that have caught faults the five stages missed: synccheck among
// them, for a GEMM epilogue whose barrier ids ran past the hardware's (docs/integrity.md).
// Every winner tool is one `check --sanitize` runs too, and reports name them as prose does.
TEST(Sanitizer, AWinnersToolsIncludeSynccheckAndReadAsAList) {
  const auto& winner = winner_sanitizer_tools();
  const auto& all = all_sanitizer_tools();
  EXPECT_NE(std::find(winner.begin(), winner.end(), "synccheck"), winner.end());
  for (const auto& tool : winner)
    EXPECT_NE(std::find(all.begin(), all.end(), tool), all.end()) << tool;
  EXPECT_EQ(joined_tool_names(winner), "memcheck, racecheck and synccheck");
  EXPECT_EQ(joined_tool_names({"memcheck", "racecheck"}), "memcheck and racecheck");
  EXPECT_EQ(joined_tool_names({"initcheck"}), "initcheck");
  EXPECT_EQ(joined_tool_names({}), "");
}

// A child installs the worker's fence, then tries what a candidate might.
TEST(Sandbox, ForbidsNewProcessesAndSignalsToOthersButNotThreads) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!forbid_new_processes().empty()) _exit(10);
    if (fork() != -1 || errno != EPERM) _exit(11);
    char sh[] = "/bin/true";
    char* argv[] = {sh, nullptr};
    execv(sh, argv);  // returns only when it failed
    if (errno != EPERM) _exit(12);
    if (kill(getppid(), SIGKILL) != -1 || errno != EPERM) _exit(13);
    int ran = 0;
    std::thread([&] { ran = 1; }).join();
    if (ran != 1) _exit(15);
    if (kill(getpid(), 0) != 0) _exit(16);
    // Every refused call was seen (the last look clears it).
    if (!forbidden_attempt()) _exit(17);
    if (forbidden_attempt()) _exit(18);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "step " << WEXITSTATUS(status) << " of the fence failed";

  // glibc's system() spawns with every signal blocked, where the refusal cannot be handled: the
  // fenced process is ended by SIGSYS instead, and no shell ever runs.
  const pid_t spawner = fork();
  ASSERT_GE(spawner, 0);
  if (spawner == 0) {
    if (!forbid_new_processes().empty()) _exit(10);
    const int rc = std::system("true");
    _exit(rc == 0 ? 20 : 21);
  }
  waitpid(spawner, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS) << "status " << status;
}

// The count the CPU backend judges "work left running" by: a thread still running is counted
// until it ends, whatever it calls itself, and a joined thread never is, though the kernel lists
// it for a moment after the join returns (unloaded, about one count in a thousand right after a
// join saw it). The candidate files disguised_thread.cpp and hides_from_count.cpp try the count
// through the worker.
TEST(ThreadCount, CountsRunningThreadsAndNeverJoinedOnes) {
  const int alone = count_own_threads();
  ASSERT_GT(alone, 0);

  // A running thread is counted, one whose name spells out an exiting thread's stat fields too.
  std::atomic<bool> release{false};
  std::atomic<int> named{0};
  const auto run = [&](const char* name) {
    if (name) prctl(PR_SET_NAME, name, 0, 0, 0);
    ++named;
    while (!release)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::thread running(run, nullptr);
  std::thread disguised(run, ")R1+1+1+1+1+4\n");
  while (named < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(count_own_threads(), alone + 2);
  release = true;
  running.join();
  disguised.join();

  int over = 0;
  for (int i = 0; i < 10000; ++i) {
    {
      std::vector<std::jthread> pool;
      for (int t = 0; t < 2; ++t)
        pool.emplace_back([] {});
    }
    if (count_own_threads() != alone) ++over;
  }
  EXPECT_EQ(over, 0) << "joined threads counted " << over << " times in 10000";
}
// Ctrl-C on kforge ends its workers too, however busy they are.
TEST(Containment, CtrlCEndsEveryWorker) {
  const auto dir = test::temp_dir("ctrl-c");
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  const std::string kernel = test::test_data_dir() + "/faulty/infinite_loop.cpp";
  const pid_t kforge = fork();
  ASSERT_GE(kforge, 0);
  if (kforge == 0) {
    setpgid(0, 0);
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    const std::string binary = test::kforge_binary();
    execl(binary.c_str(), binary.c_str(), "check", kernel.c_str(), "--backend", "cpu", "--timeout",
          "300", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until its worker runs the kernel that never ends.
  const auto worker_of_kforge = [&] {
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      std::string cmdline = test::read_text(e.path() / "cmdline");
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      if (cmdline.find("__worker") != std::string::npos &&
          cmdline.find("--parent " + std::to_string(kforge) + " ") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!worker_of_kforge() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(worker_of_kforge()) << "no worker started";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(kforge, SIGINT);
  int status = 0;
  waitpid(kforge, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT);
  // The worker is gone as soon as kforge is (it was killed before kforge re-raised SIGINT).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(worker_of_kforge());
}

TEST(BenchCli, ATimeBeyondTheCeilingsIsInvalidWithTheArithmetic) {
  const auto dir = test::temp_dir("impossible");
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  // Ceilings far below what the CPU reaches: any honest time is then "impossible".
  std::ofstream(dir / "ceilings.json") << R"({"device": {"name": "test"}, "date": "2026-11-24",
             "ceilings": {"copy_gbps": 0.05, "matmul_tflops": null}})";
  const CommandResult r =
      run_command({test::kforge_binary(), "bench", test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp",
                   "--shape", "256x256", "--backend", "cpu", "--no-baseline", "--ceilings",
                   (dir / "ceilings.json").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(test::printed_verdict(r.output), "INVALID") << r.output;
  EXPECT_NE(r.output.find("is faster than this device allows"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0.05 GB/s"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// A results database written by an older timing method (here: rows edited to claim an
// impossible time and no method) is not trusted by a live tune: every variant is timed again.
TEST(ResultsDbIntegrity, RecordsOfAnotherTimingMethodAreTimedAgain) {
  const auto dir = test::temp_dir("method");
  ::setenv("KFORGE_CACHE_DIR", test::shared_module_cache().c_str(), 1);
  const std::string db = (dir / "results.sqlite").string();
  const std::vector<std::string> tune = {test::kforge_binary(),
                                         "tune",
                                         test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp",
                                         "--shape",
                                         "64x64",
                                         "--strategy",
                                         "exhaustive",
                                         "--no-final-check",
                                         "--backend",
                                         "cpu",
                                         "--db",
                                         db,
                                         "--json",
                                         (dir / "report.json").string()};
  const CommandResult first = run_command(tune, std::chrono::minutes(5));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &handle), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(handle, "UPDATE evaluations SET method = '', median_ms = 1e-9", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(handle);
  const CommandResult again = run_command(tune, std::chrono::minutes(5));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto report = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  EXPECT_EQ(report.at("from_database"), 0);
  EXPECT_GT(report.at("best").at("time_us").at("median").get<double>(), 1e-3);
}

}  // namespace
}  // namespace kforge
