// The `llm` proposer: asks an OpenAI-compatible chat model (src/loop/chat_client.h) for the next
// version of the task's kernel file.
//
// The prompt: a system message (the loop's rules, the reply format and docs/playbook.md) and the
// task's brief (src/loop/brief.h: op, device and ceilings, roofline position, recent experiments
// with their failures and compiler errors) with the kernel file as it is now. The reply is a line
// `Change: ...` (the experiment's note) and one fenced block: the whole new file, or a unified
// diff against the current file (applied with `git apply`). A reply that gives neither, or whose
// diff does not apply, is logged as a BAD_REPLY experiment; no answer after the retries as
// NO_REPLY.
//
// Settings (`llm:CONFIG.json`, else the environment; every key optional but the model):
//   base_url        KFORGE_LLM_BASE_URL, else https://api.openai.com/v1
//   model           KFORGE_LLM_MODEL
//   api_key_env     the variable holding the key: KFORGE_LLM_API_KEY, else OPENAI_API_KEY
//   api_key         the key itself (prefer the environment)
//   timeout_seconds, max_attempts, backoff_seconds, max_backoff_seconds  (chat_client.h)
//   max_completion_tokens, temperature
//   budget_tokens, budget_usd   per task, counted from its journal (so a resumed loop counts
//                               what was spent before): the proposer stops when either is spent
//   usd_per_million_prompt_tokens, usd_per_million_completion_tokens   prices, for cost_usd
//   recent_experiments          experiments in the brief (default 10)
//   playbook                    a Markdown file (default docs/playbook.md of the source tree)
#pragma once

#include <memory>
#include <string>

#include "loop/proposer.h"

namespace kforge {

// `config_path` may be empty (environment only). UsageError for a bad file or no model.
std::unique_ptr<Proposer> make_llm_proposer(const std::string& config_path);

// A chat reply turned into the next version of `current` (the file named `file_name`): the
// source and the note, or `failure` saying why it could not be.
struct ParsedReply {
  std::string source;
  std::string note;
  std::string failure;
};
ParsedReply parse_reply(const std::string& reply, const std::string& current,
                        const std::string& file_name);

}  // namespace kforge
