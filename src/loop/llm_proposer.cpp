#include "loop/llm_proposer.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/process.h"
#include "core/temp_directory.h"
#include "core/text.h"
#include "loop/brief.h"
#include "loop/chat_client.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

struct LlmConfig {
  ChatSettings chat;
  long budget_tokens = 0;  // per task; 0: none
  double budget_usd = 0;   // per task; 0: none
  double usd_per_million_prompt = 0;
  double usd_per_million_completion = 0;
  size_t recent_experiments = 10;
  fs::path playbook;
};

std::string env_or(const char* name, const std::string& otherwise) {
  const char* value = std::getenv(name);
  return value && *value ? value : otherwise;
}

LlmConfig read_config(const std::string& path) {
  nlohmann::json j = nlohmann::json::object();
  if (!path.empty()) {
    if (!fs::is_regular_file(path))
      throw UsageError(fmt::format("llm:CONFIG: cannot read {}", path));
    try {
      j = read_json_file(path);
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("llm:CONFIG: {} is not JSON: {}", path, e.what()));
    }
    if (!j.is_object()) throw UsageError(fmt::format("llm:CONFIG: {} is not an object", path));
    static const std::set<std::string> known = {"base_url",
                                                "model",
                                                "api_key_env",
                                                "api_key",
                                                "timeout_seconds",
                                                "max_attempts",
                                                "backoff_seconds",
                                                "max_backoff_seconds",
                                                "max_completion_tokens",
                                                "temperature",
                                                "budget_tokens",
                                                "budget_usd",
                                                "usd_per_million_prompt_tokens",
                                                "usd_per_million_completion_tokens",
                                                "recent_experiments",
                                                "playbook"};
    for (const auto& [key, value] : j.items()) {
      if (!known.count(key))
        throw UsageError(fmt::format("llm:CONFIG: {} has an unknown key '{}'", path, key));
    }
  }
  LlmConfig c;
  try {
    c.chat.base_url = j.value(
        "base_url",
        env_or("KFORGE_LLM_BASE_URL", env_or("OPENAI_BASE_URL", "https://api.openai.com/v1")));
    c.chat.model = j.value("model", env_or("KFORGE_LLM_MODEL", ""));
    const std::string key_env = j.value("api_key_env", "");
    c.chat.api_key = j.value(
        "api_key", key_env.empty() ? env_or("KFORGE_LLM_API_KEY", env_or("OPENAI_API_KEY", ""))
                                   : env_or(key_env.c_str(), ""));
    c.chat.timeout_seconds = j.value("timeout_seconds", c.chat.timeout_seconds);
    c.chat.max_attempts = j.value("max_attempts", c.chat.max_attempts);
    c.chat.backoff_seconds = j.value("backoff_seconds", c.chat.backoff_seconds);
    c.chat.max_backoff_seconds = j.value("max_backoff_seconds", c.chat.max_backoff_seconds);
    c.chat.max_completion_tokens = j.value("max_completion_tokens", 0);
    c.chat.temperature = j.value("temperature", -1.0);
    c.budget_tokens = j.value("budget_tokens", 0L);
    c.budget_usd = j.value("budget_usd", 0.0);
    c.usd_per_million_prompt = j.value("usd_per_million_prompt_tokens", 0.0);
    c.usd_per_million_completion = j.value("usd_per_million_completion_tokens", 0.0);
    c.recent_experiments = j.value("recent_experiments", size_t{10});
    c.playbook = j.value("playbook",
                         (default_include_dir().parent_path() / "docs" / "playbook.md").string());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(
        fmt::format("llm:CONFIG: {}: a value has the wrong type ({})", path, e.what()));
  }
  if (c.chat.model.empty()) {
    throw UsageError(
        "the llm proposer needs a model: set KFORGE_LLM_MODEL or \"model\" in llm:CONFIG.json");
  }
  if (c.chat.timeout_seconds <= 0 || c.chat.max_attempts < 1)
    throw UsageError("llm:CONFIG: timeout_seconds must be > 0 and max_attempts >= 1");
  return c;
}

// The fenced blocks of a Markdown text: (info string, body) in order.
std::vector<std::pair<std::string, std::string>> fenced_blocks(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> blocks;
  std::optional<std::pair<std::string, std::string>> open;
  for (const std::string& line : split_lines(text)) {
    const size_t indent = line.find_first_not_of(" \t");
    const bool fence = indent != std::string::npos && line.compare(indent, 3, "```") == 0;
    if (fence && !open) {
      std::string info = line.substr(indent + 3);
      info = info.substr(0, info.find_first_of(" \t\r"));
      open.emplace(info, "");
    } else if (fence) {
      blocks.push_back(*open);
      open.reset();
    } else if (open) {
      open->second += line + "\n";
    }
  }
  return blocks;
}

bool looks_like_diff(const std::string& info, const std::string& body) {
  if (info == "diff" || info == "patch") return true;
  return body.rfind("--- ", 0) == 0 || body.rfind("diff --git", 0) == 0 ||
         (body.find("\n+++ ") != std::string::npos && body.find("\n@@ ") != std::string::npos);
}

// The diff with its file headers naming `file_name` (a model names the file as it likes).
std::string with_file_headers(const std::string& diff, const std::string& file_name) {
  const std::vector<std::string> lines = split_lines(diff);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    // git's extended headers (modes, renames, copies, binary patches) could touch other files
    // of the scratch repository; only the hunks of the one file are applied.
    static const char* const dropped[] = {
        "diff --git",        "index ",        "old mode",         "new mode",
        "deleted file mode", "new file mode", "rename from",      "rename to",
        "copy from",         "copy to",       "similarity index", "dissimilarity index",
        "GIT binary patch",  "Binary files"};
    if (std::any_of(std::begin(dropped), std::end(dropped),
                    [&](const char* prefix) { return line.rfind(prefix, 0) == 0; }))
      continue;
    if (line.rfind("--- ", 0) == 0 && i + 1 < lines.size() && lines[i + 1].rfind("+++ ", 0) == 0) {
      out += fmt::format("--- a/{}\n+++ b/{}\n", file_name, file_name);
      ++i;
      continue;
    }
    out += line + "\n";
  }
  return out;
}

// Applies `diff` to `current` with git apply, in a scratch repository of its own.
ParsedReply apply_diff(const std::string& diff, const std::string& current,
                       const std::string& file_name) {
  const TempDirectory scratch("kforge-apply");
  const fs::path& dir = scratch.path();
  write_text_atomically(dir / file_name, current);
  write_text_atomically(dir / "reply.diff", with_file_headers(diff, file_name));
  const CommandResult init = run_command({"git", "-C", dir.string(), "init", "-q"});
  if (!init.ok()) throw Error("git init failed: " + init.output);
  const CommandResult applied = run_command(
      {"git", "-C", dir.string(), "apply", "--recount", "--whitespace=nowarn", "reply.diff"},
      std::chrono::seconds(30));
  if (!applied.ok()) {
    return {
        "", "",
        "the reply's diff does not apply to the current file: " + first_lines(applied.output, 4)};
  }
  return {read_text_file(dir / file_name), "", ""};
}

// The experiment's note: the reply's `Change:` line, else its first line of prose.
std::string reply_note(const std::string& reply) {
  std::string first;
  bool in_block = false;
  for (std::string line : split_lines(reply)) {
    const size_t start = line.find_first_not_of(" \t*#>-");
    if (start == std::string::npos) continue;
    line = line.substr(start);
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (in_block) continue;
    for (const char* tag : {"Change:", "change:", "CHANGE:"}) {
      if (line.rfind(tag, 0) == 0) {
        const std::string note = line.substr(std::string(tag).size());
        return note.substr(std::min(note.size(), note.find_first_not_of(" \t"))).substr(0, 200);
      }
    }
    if (first.empty()) first = line.substr(0, 200);
  }
  while (!first.empty() && (first.back() == '*' || first.back() == ' ' || first.back() == '\r'))
    first.pop_back();
  return first.empty() ? "llm proposal" : first;
}

std::string code_language(const fs::path& kernel_path) {
  return kernel_path.extension() == ".cu" || kernel_path.extension() == ".cuh" ? "cuda" : "cpp";
}

std::string system_prompt(const std::string& playbook) {
  return "You are a GPU kernel engineer in kforge's keep/revert experiment loop. You improve one "
         "kernel file, one experiment at a time. Each version you send is compiled, checked for "
         "correctness in five stages (a smoke test, a sweep of shapes, numerical stability, "
         "determinism, edge cases) against a reference, timed against the current best in the "
         "same run, and kept only if it is faster beyond both timings' noise and by more than "
         "1%. A kernel that skips work, remembers earlier answers, detects the harness, writes "
         "outside its outputs, uses other streams or threads, or prints is rejected.\n\n"
         "Reply with one line `Change: <what you changed and why it should be faster>`, then "
         "exactly one fenced code block: either the whole new kernel file, or a unified diff "
         "against the current file (```diff, with @@ hunks and three lines of context). Keep "
         "the file's `/* kforge ... */` header (op, backend, dtypes, `param:` tunables) valid; "
         "a tunable's default is the value used. Change one idea per experiment, so that its "
         "effect can be measured.\n\n" +
         playbook;
}

class LlmProposer final : public Proposer {
 public:
  explicit LlmProposer(LlmConfig config) : config_(std::move(config)) {
    if (!fs::is_regular_file(config_.playbook)) {
      throw UsageError(
          fmt::format("the llm proposer's playbook {} is missing (set \"playbook\" in "
                      "llm:CONFIG.json)",
                      config_.playbook.string()));
    }
    playbook_ = read_text_file(config_.playbook);
  }

  std::string_view name() const override { return "llm"; }

  std::optional<Proposal> next(const ProposalContext& context) override {
    const Spend spent = spend(context.history);
    if (config_.budget_tokens > 0 && spent.tokens >= config_.budget_tokens) {
      why_done_ = fmt::format("has spent the task's token budget ({} of {} tokens)", spent.tokens,
                              config_.budget_tokens);
      return std::nullopt;
    }
    if (config_.budget_usd > 0 && spent.usd >= config_.budget_usd) {
      why_done_ = fmt::format("has spent the task's budget (${:.4f} of ${:.4f})", spent.usd,
                              config_.budget_usd);
      return std::nullopt;
    }

    const std::string file_name = context.kernel_path.filename().string();
    const std::string brief =
        task_brief({context.task_name, context.task, context.ceilings, context.kernel_path,
                    context.history, context.rules, "", config_.recent_experiments});
    const std::string user = fmt::format(
        "{}\n## The kernel file now ({})\n\n```{}\n{}```\n\nSend the next experiment.\n", brief,
        file_name, code_language(context.kernel_path), context.current);
    const std::vector<ChatMessage> messages = {{"system", system_prompt(playbook_)},
                                               {"user", user}};
    context.progress(fmt::format("[{}] asking {} for experiment {}", context.task_name,
                                 config_.chat.model, context.history.size() + 1));
    const ChatReply reply = chat_completion(config_.chat, messages, [&](const std::string& line) {
      context.progress(fmt::format("[{}] {}", context.task_name, line));
    });

    Proposal p;
    const double cost =
        1e-6 * (static_cast<double>(reply.prompt_tokens) * config_.usd_per_million_prompt +
                static_cast<double>(reply.completion_tokens) * config_.usd_per_million_completion);
    p.fields["tokens"] = {{"prompt", reply.prompt_tokens}, {"completion", reply.completion_tokens}};
    p.fields["cost_usd"] = cost;
    p.fields["proposer_seconds"] = reply.seconds;
    p.fields["llm"] = {{"model", config_.chat.model},
                       {"attempts", reply.attempts},
                       {"http_status", reply.http_status},
                       {"prompt_chars", messages[0].content.size() + messages[1].content.size()}};
    if (reply.outcome != ChatReply::Outcome::kAnswered) {
      const bool malformed = reply.outcome == ChatReply::Outcome::kMalformed;
      p.failure_verdict = malformed ? "BAD_REPLY" : "NO_REPLY";
      p.failure = reply.error;
      p.source = reply.body;
      p.note = malformed ? "malformed reply" : "no reply";
      return p;
    }
    const std::string content = mask_secret(reply.content, config_.chat.api_key);
    ParsedReply parsed = parse_reply(content, context.current, file_name);
    p.note = parsed.note;
    if (!parsed.failure.empty()) {
      p.failure_verdict = "BAD_REPLY";
      p.failure = parsed.failure;
      p.source = content;
      return p;
    }
    p.source = std::move(parsed.source);
    return p;
  }

  std::string why_done() const override { return why_done_; }

 private:
  struct Spend {
    long tokens = 0;
    double usd = 0;
  };

  // What this proposer's experiments of the task cost, from the journal.
  static Spend spend(const std::vector<ExperimentRecord>& history) {
    Spend s;
    for (const ExperimentRecord& r : history) {
      if (r.proposer != "llm") continue;
      const nlohmann::json tokens = r.fields.value("tokens", nlohmann::json::object());
      s.tokens += tokens.value("prompt", 0L) + tokens.value("completion", 0L);
      s.usd += r.fields.value("cost_usd", 0.0);
    }
    return s;
  }

  LlmConfig config_;
  std::string playbook_;
  std::string why_done_ = "has no more proposals";
};

}  // namespace

ParsedReply parse_reply(const std::string& reply, const std::string& current,
                        const std::string& file_name) {
  const std::string note = reply_note(reply);
  const auto blocks = fenced_blocks(reply);
  const std::pair<std::string, std::string>* chosen = nullptr;
  for (const auto& block : blocks) {
    if (looks_like_diff(block.first, block.second)) {
      chosen = &block;
      break;
    }
    if (!chosen || block.second.size() > chosen->second.size()) chosen = &block;
  }
  std::string body;
  std::string info;
  if (chosen) {
    info = chosen->first;
    body = chosen->second;
  } else if (reply.find("/* kforge") != std::string::npos || looks_like_diff("", reply)) {
    body = reply;  // unfenced: the whole reply is the file or the diff
  } else {
    return {"", note, "the reply holds no fenced code block (a kernel file or a unified diff)"};
  }
  if (looks_like_diff(info, body)) {
    ParsedReply applied = apply_diff(body, current, file_name);
    applied.note = note;
    return applied;
  }
  if (body.find("/* kforge") == std::string::npos) {
    return {"", note,
            "the reply's code block is not a kernel file (no /* kforge header) nor a diff"};
  }
  return {body, note, ""};
}

std::unique_ptr<Proposer> make_llm_proposer(const std::string& config_path) {
  return std::make_unique<LlmProposer>(read_config(config_path));
}

}  // namespace kforge
