// A client for OpenAI-compatible chat APIs (POST {base_url}/chat/completions), over libcurl.
//
// Transient failures are retried with exponential backoff: a transport error or timeout, and
// HTTP 408, 409, 429 and 5xx (a Retry-After header is honoured, up to the backoff cap). When the
// attempts run out, or the answer is not a chat completion (malformed JSON, no message), the
// reply says why and the caller logs it as a failed experiment. An answer no retry can mend
// (400, 401, 403, 404, ...) throws: the settings are wrong and every later call would fail too.
//
// The API key goes into the Authorization header and nowhere else; any text kept from a reply
// or an error has the key masked, in case a server echoes it.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kforge {

struct ChatSettings {
  std::string base_url;  // e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1
  std::string model;
  std::string api_key;  // may be empty (local servers)
  double timeout_seconds = 300;
  int max_attempts = 5;
  double backoff_seconds = 2;  // before the second attempt; doubled for each one after
  double max_backoff_seconds = 60;
  int max_completion_tokens = 0;  // 0: not sent
  double temperature = -1;        // < 0: not sent
};

struct ChatMessage {
  std::string role;  // "system", "user"
  std::string content;
};

struct ChatReply {
  enum class Outcome { kAnswered, kNoAnswer, kMalformed };
  Outcome outcome = Outcome::kNoAnswer;
  std::string content;  // the message, when answered
  std::string error;    // why not, otherwise (key masked)
  std::string body;     // the last response body as received, key masked, cut at 64 KiB
  long http_status = 0;
  int attempts = 0;
  double seconds = 0;  // wall time over all attempts
  long prompt_tokens = 0;
  long completion_tokens = 0;
};

// Progress lines while waiting ("HTTP 429; retrying in 2.0 s (attempt 2 of 5)").
using ChatProgress = std::function<void(const std::string&)>;

ChatReply chat_completion(const ChatSettings& settings, const std::vector<ChatMessage>& messages,
                          const ChatProgress& progress = {});

// `text` with every occurrence of `secret` replaced by "[key]" (unchanged when secret is empty).
std::string mask_secret(std::string text, const std::string& secret);

}  // namespace kforge
