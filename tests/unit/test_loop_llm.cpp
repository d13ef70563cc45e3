// The llm proposer against a local OpenAI-compatible server (tests/tools/chat_server.py) that
// answers with the replies of tests/data/llm/replies.json: one that improves the kernel, one
// that does not compile, one that is wrong, one that cheats, malformed JSON, a timeout, a 429
// then a success. The loop must keep, revert and log each, resume after a SIGKILL in the middle
// of an experiment, stop at the token budget, and never write the API key anywhere.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/process.h"
#include "loop/journal.h"
#include "loop/llm_proposer.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* const kSecret = "sk-test-SECRET-4242";

// A child process with its output in a file, killed (SIGKILL) when the object goes.
class Background {
 public:
  Background(const std::vector<std::string>& argv, const fs::path& output) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (const std::string& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Background() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Waits for the child to end by itself; its exit code (-1 if it was signaled).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

// The test server on a free port, serving `replies`.
class ChatServer {
 public:
  ChatServer(const fs::path& dir, const fs::path& replies)
      : log_(dir / "requests.jsonl"),
        process_({"python3", (test::source_root() / "tests" / "tools" / "chat_server.py").string(),
                  "--replies", replies.string(), "--port-file", (dir / "port").string(), "--log",
                  log_.string()},
                 dir / "server.out") {
    // Generous: on a loaded machine the interpreter alone can take seconds to start.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!fs::exists(dir / "port") && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    port_ = test::read_text(dir / "port");
  }
  std::string base_url() const { return "http://127.0.0.1:" + port_ + "/v1"; }
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_);
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line));
    return out;
  }

 private:
  fs::path log_;
  Background process_;
  std::string port_;
};

fs::path write_config(const fs::path& dir, const std::string& base_url) {
  const fs::path path = dir / "llm.json";
  std::ofstream(path) << nlohmann::json{
      {"base_url", base_url},
      {"model", "test-model"},
      {"api_key", kSecret},
      {"timeout_seconds", 2},  // well past a loaded machine's answer time, well short of a delay
      {"max_attempts", 2},
      {"backoff_seconds", 0.05},
      {"budget_tokens", 7500},
      {"usd_per_million_prompt_tokens", 2.0},
      {"usd_per_million_completion_tokens",
       8.0}}.dump(1);
  return path;
}

// Every file under `dir` that holds `text`.
std::vector<std::string> files_holding(const fs::path& dir, const std::string& text) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && test::read_text(entry.path()).find(text) != std::string::npos)
      found.push_back(entry.path().string());
  }
  return found;
}

TEST(LoopLlm, KeepsRevertsAndLogsEachRecordedReplyAndResumesAfterAKill) {
  const fs::path dir = test::temp_dir("loop-llm");
  const fs::path data = fs::path(test::test_data_dir()) / "llm";
  ChatServer server(dir, data / "replies.json");
  const fs::path config = write_config(dir, server.base_url());

  const fs::path ws = dir / "ws";
  const fs::path task = ws / "task-01-rmsnorm";
  fs::create_directories(task);
  std::ofstream(task / "task.json") << R"({"op": "rmsnorm", "shape": "256x512", "dtype": "f32"})";
  TaskJournal::open(task, data / "start.cpp");  // the task starts from the slowed starter

  const std::vector<std::string> argv = {test::kforge_binary(),
                                         "loop",
                                         ws.string(),
                                         "--backend",
                                         "cpu",
                                         "--max-seconds",
                                         "0.2",
                                         "--propose",
                                         "llm:" + config.string(),
                                         "--max-reverts",
                                         "0",
                                         "--target-speedup",
                                         "0",
                                         "--roofline",
                                         "0"};
  {  // Killed while experiment 2 is evaluated (its reply is being compiled).
    Background loop(argv, dir / "first.out");
    bool under_way = false;
    // A deadline, not a count of polls: the baseline and experiment 1 are compiled, checked
    // and timed first, which on a loaded machine takes minutes.
    const auto deadline = std::chrono::steady_clock::now() + 5min;
    while (!under_way && std::chrono::steady_clock::now() < deadline) {
      const auto pending = read_experiment_under_way(task);
      under_way = pending && pending->value("experiment", 0) == 2;
      if (!under_way) std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(under_way) << test::read_text(dir / "first.out");
    loop.kill();
  }
  ASSERT_EQ(read_finished_experiments(task).size(), 1u) << test::read_text(dir / "first.out");

  const CommandResult resumed = run_command(argv, std::chrono::minutes(5));
  ASSERT_TRUE(resumed.ok()) << resumed.output;
  EXPECT_NE(resumed.output.find("evaluating experiment 2 again"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find(
                "moving on: the llm proposer has spent the task's token budget (7500 of 7500"),
            std::string::npos)
      << resumed.output;

  const TaskJournal journal = TaskJournal::open(task);
  const std::vector<ExperimentRecord>& records = journal.records();
  ASSERT_EQ(records.size(), 7u) << resumed.output;
  EXPECT_EQ(records[0].verdict, "KEEP");
  EXPECT_EQ(records[0].note, "drop the busy-wait in the row loop");
  // Each record carries its proposal's diff against the best it was measured against.
  EXPECT_NE(records[0].fields.value("diff", "").find("-    for (volatile int spin = 0;"),
            std::string::npos)
      << records[0].fields.value("diff", "");
  EXPECT_EQ(records[1].verdict, "COMPILE_ERROR");
  EXPECT_EQ(records[1].note, "accumulate with a typo (resumed)");
  EXPECT_EQ(records[2].verdict, "WRONG");
  EXPECT_FALSE(
      records[2].fields["mismatches"].value("first_mismatches", nlohmann::json::array()).empty())
      << records[2].fields.dump();
  EXPECT_FALSE(records[3].kept) << records[3].verdict;  // the cheat
  EXPECT_NE(records[3].verdict, "REVERT") << "a cheat must fail a check, not lose on time";
  EXPECT_EQ(records[4].verdict, "BAD_REPLY");
  EXPECT_EQ(records[4].fields.value("failing_stage", ""), "propose");
  EXPECT_EQ(records[5].verdict, "NO_REPLY");
  EXPECT_NE(records[5].fields.value("detail", "").find("no answer within 2 s (after 2 attempts)"),
            std::string::npos)
      << records[5].fields.dump();
  EXPECT_EQ(records[6].verdict, "REVERT");
  EXPECT_EQ(records[6].fields["llm"].value("attempts", 0), 2);  // 429, then the answer
  for (const ExperimentRecord& r : records)
    EXPECT_EQ(r.proposer, "llm");
  // Tokens and cost are logged, also for the experiment evaluated again after the kill.
  EXPECT_EQ(records[1].fields["tokens"].value("prompt", 0), 1000);
  EXPECT_NEAR(records[1].fields.value("cost_usd", 0.0), 1000 * 2e-6 + 500 * 8e-6, 1e-12);
  EXPECT_EQ(records[4].fields["tokens"].value("prompt", -1), 0);

  // The kept file is the starter (the diff applied); the repository has two commits.
  EXPECT_EQ(test::read_text(journal.kernel_path()),
            test::read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp"));
  const CommandResult log =
      run_command({"git", "-C", (task / "repo").string(), "rev-list", "--count", "HEAD"});
  EXPECT_EQ(log.output, "2\n");
  std::ifstream tsv(task / "results.tsv");
  int lines = 0;
  for (std::string line; std::getline(tsv, line);)
    ++lines;
  EXPECT_EQ(lines, 8);  // header and 7 experiments

  // The server saw each request once (experiment 2 was not asked again), with the key sent.
  const std::vector<nlohmann::json> requests = server.requests();
  ASSERT_EQ(requests.size(), 9u);  // 5, 2 attempts of the timeout, the 429 and its retry
  EXPECT_EQ(requests[0].value("authorization", ""), std::string("Bearer ") + kSecret);
  const std::string prompt = requests[2]["messages"][1].value("content", "");
  EXPECT_NE(prompt.find("COMPILE_ERROR"), std::string::npos) << prompt;  // history
  EXPECT_NE(prompt.find("## The kernel file now"), std::string::npos) << prompt;
  const std::string after_wrong = requests[3]["messages"][1].value("content", "");
  EXPECT_NE(after_wrong.find("first mismatches: ["), std::string::npos) << after_wrong;
  EXPECT_NE(requests[0]["messages"][0].value("content", "").find("# Optimization playbook"),
            std::string::npos);

  // The key is nowhere: not in the workspace (the malformed reply echoed it), not in the output.
  EXPECT_EQ(files_holding(ws, kSecret), std::vector<std::string>{});
  EXPECT_EQ(resumed.output.find(kSecret), std::string::npos);
  EXPECT_FALSE(files_holding(ws, "key Bearer [key]").empty());
}

TEST(LoopLlm, AnAnswerNoRetryCanMendStopsTheLoopWithTheReasonAndLogsNothing) {
  const fs::path dir = test::temp_dir("loop-llm-401");
  std::ofstream(dir / "replies.json") << R"([{"status": 401, "raw":
    "{\"error\": {\"message\": \"Incorrect API key provided: {auth}\"}}"}])";
  ChatServer server(dir, dir / "replies.json");
  const fs::path ws = dir / "ws";
  fs::create_directories(ws / "task-01-rmsnorm");
  std::ofstream(ws / "task-01-rmsnorm" / "task.json")
      << R"({"op": "rmsnorm", "shape": "64x256", "dtype": "f32"})";
  const CommandResult r =
      run_command({test::kforge_binary(), "loop", ws.string(), "--backend", "cpu", "--propose",
                   "llm:" + write_config(dir, server.base_url()).string()});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("answered HTTP 401: Incorrect API key provided: Bearer [key]"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(kSecret), std::string::npos) << r.output;
  EXPECT_TRUE(read_finished_experiments(ws / "task-01-rmsnorm").empty());
  EXPECT_FALSE(read_experiment_under_way(ws / "task-01-rmsnorm").has_value());

  std::ofstream(dir / "bad.json") << R"({"model": "m", "temprature": 0.2})";
  const CommandResult typo =
      run_command({test::kforge_binary(), "loop", ws.string(), "--backend", "cpu", "--propose",
                   "llm:" + (dir / "bad.json").string()});
  EXPECT_FALSE(typo.ok());
  EXPECT_NE(typo.output.find("unknown key 'temprature'"), std::string::npos) << typo.output;
}

const std::string kFile = "/* kforge\n * op: rmsnorm\n */\nint a = 1;\nint b = 2;\nint c = 3;\n";

TEST(ParseReply, TakesAWholeFileOrADiffAndSaysWhyNot) {
  const ParsedReply whole =
      parse_reply("Change: set b to 5\n\n```cpp\n/* kforge\n * op: rmsnorm\n */\nint b = 5;\n```\n",
                  kFile, "k.cpp");
  EXPECT_EQ(whole.failure, "");
  EXPECT_EQ(whole.note, "set b to 5");
  EXPECT_EQ(whole.source, "/* kforge\n * op: rmsnorm\n */\nint b = 5;\n");

  // A diff naming another file is applied to the task's file.
  const ParsedReply diff = parse_reply(
      "**Raise b.**\n```diff\n--- a/src/other.cu\n+++ b/src/other.cu\n@@ -4,3 +4,3 @@\n int a = "
      "1;\n-int b = 2;\n+int b = 7;\n int c = 3;\n```\n",
      kFile, "k.cpp");
  EXPECT_EQ(diff.failure, "");
  EXPECT_EQ(diff.note, "Raise b.");
  EXPECT_NE(diff.source.find("int b = 7;"), std::string::npos) << diff.source;
  EXPECT_NE(diff.source.find("int c = 3;"), std::string::npos);

  // A diff's extended headers cannot rename the file or add another.
  const ParsedReply renaming = parse_reply(
      "```diff\ndiff --git a/k.cpp b/../evil.cpp\nrename from k.cpp\nrename to ../evil.cpp\n--- "
      "a/k.cpp\n+++ b/../evil.cpp\n@@ -4,3 +4,3 @@\n int a = 1;\n-int b = 2;\n+int b = 8;\n int c "
      "= "
      "3;\n```\n",
      kFile, "k.cpp");
  EXPECT_EQ(renaming.failure, "");
  EXPECT_NE(renaming.source.find("int b = 8;"), std::string::npos) << renaming.source;

  const ParsedReply stale = parse_reply(
      "```diff\n--- a/k.cpp\n+++ b/k.cpp\n@@ -4,2 +4,2 @@\n int a = 9;\n-int b = 2;\n+int b = "
      "7;\n```\n",
      kFile, "k.cpp");
  EXPECT_NE(stale.failure.find("does not apply"), std::string::npos) << stale.failure;

  EXPECT_NE(parse_reply("I would unroll the loop.", kFile, "k.cpp").failure.find("no fenced"),
            std::string::npos);
  EXPECT_NE(parse_reply("```\nint b = 5;\n```", kFile, "k.cpp").failure.find("not a kernel file"),
            std::string::npos);
}

}  // namespace
}  // namespace kforge
