#include "loop/chat_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kforge {
namespace {

constexpr size_t kKeptBodyBytes = 64 * 1024;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlHandleDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct CurlListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

size_t append_body(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// Keeps the Retry-After header's seconds (the HTTP-date form is not used by these APIs).
size_t read_header(char* data, size_t size, size_t count, void* user) {
  const std::string line(data, size * count);
  const std::string name = "retry-after:";
  if (line.size() > name.size()) {
    std::string head = line.substr(0, name.size());
    std::transform(head.begin(), head.end(), head.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (head == name) {
      try {
        *static_cast<double*>(user) = std::stod(line.substr(name.size()));
      } catch (const std::exception&) {
        // Not a number of seconds: the backoff alone decides.
      }
    }
  }
  return size * count;
}

struct Attempt {
  CURLcode transport = CURLE_OK;
  std::string transport_error;
  long status = 0;
  std::string body;
  double retry_after = -1;
};

Attempt post_once(const ChatSettings& settings, const std::string& request) {
  Attempt a;
  std::unique_ptr<CURL, CurlHandleDeleter> curl(curl_easy_init());
  if (!curl) throw Error("libcurl could not start a request");
  std::string url = settings.base_url;
  while (!url.empty() && url.back() == '/')
    url.pop_back();
  url += "/chat/completions";
  curl_slist* raw_headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!settings.api_key.empty()) {
    raw_headers =
        curl_slist_append(raw_headers, ("Authorization: Bearer " + settings.api_key).c_str());
  }
  std::unique_ptr<curl_slist, CurlListDeleter> headers(raw_headers);
  char error_text[CURL_ERROR_SIZE] = {};
  CURL* h = curl.get();
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &a.body);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, read_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &a.retry_after);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM (worker threads)
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(settings.timeout_seconds * 1000));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min(settings.timeout_seconds, 30.0) * 1000));
  curl_easy_setopt(h, CURLOPT_USERAGENT, "kforge-loop");
  a.transport = curl_easy_perform(h);
  if (a.transport != CURLE_OK) {
    a.transport_error = error_text[0] ? error_text : curl_easy_strerror(a.transport);
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.status);
  }
  return a;
}

bool retryable_status(long status) {
  return status == 408 || status == 409 || status == 429 || status >= 500;
}

// The server's own error message from an OpenAI-style error body, else the body's start.
std::string server_message(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j.at("error");
    if (e.is_object() && e.contains("message") && e.at("message").is_string())
      return e.at("message").get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

nlohmann::json request_json(const ChatSettings& settings,
                            const std::vector<ChatMessage>& messages) {
  nlohmann::json request = {{"model", settings.model}, {"messages", nlohmann::json::array()}};
  for (const ChatMessage& m : messages)
    request["messages"].push_back({{"role", m.role}, {"content", m.content}});
  if (settings.max_completion_tokens > 0)
    request["max_completion_tokens"] = settings.max_completion_tokens;
  if (settings.temperature >= 0) request["temperature"] = settings.temperature;
  return request;
}

// Reads a 200 answer into `reply`: the first choice's message and the usage.
void read_completion(const std::string& body, ChatReply& reply) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    reply.outcome = ChatReply::Outcome::kMalformed;
    reply.error = "the answer is not JSON";
    return;
  }
  const auto usage = j.value("usage", nlohmann::json::object());
  if (usage.is_object()) {
    reply.prompt_tokens = usage.value("prompt_tokens", 0L);
    reply.completion_tokens = usage.value("completion_tokens", 0L);
  }
  const nlohmann::json* content = nullptr;
  if (j.contains("choices") && j.at("choices").is_array() && !j.at("choices").empty()) {
    const nlohmann::json& choice = j.at("choices").at(0);
    if (choice.is_object() && choice.contains("message") && choice.at("message").is_object() &&
        choice.at("message").contains("content"))
      content = &choice.at("message").at("content");
  }
  if (!content || !content->is_string()) {
    reply.outcome = ChatReply::Outcome::kMalformed;
    reply.error = "the answer holds no choices[0].message.content";
    return;
  }
  reply.outcome = ChatReply::Outcome::kAnswered;
  reply.content = content->get<std::string>();
}

}  // namespace

std::string mask_secret(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at))
    text.replace(at, secret.size(), "[key]");
  return text;
}

ChatReply chat_completion(const ChatSettings& settings, const std::vector<ChatMessage>& messages,
                          const ChatProgress& progress) {
  init_curl_once();
  const std::string request = request_json(settings, messages).dump();
  const auto started = std::chrono::steady_clock::now();
  ChatReply reply;
  double backoff = settings.backoff_seconds;
  const int attempts = std::max(1, settings.max_attempts);
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    Attempt a = post_once(settings, request);
    reply.attempts = attempt;
    reply.http_status = a.status;
    reply.body = mask_secret(a.body.substr(0, kKeptBodyBytes), settings.api_key);
    reply.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::string failure;
    if (a.transport != CURLE_OK) {
      failure = a.transport == CURLE_OPERATION_TIMEDOUT
                    ? fmt::format("no answer within {:.0f} s", settings.timeout_seconds)
                    : fmt::format("request failed: {}", a.transport_error);
    } else if (a.status == 200) {
      read_completion(a.body, reply);
      return reply;
    } else if (retryable_status(a.status)) {
      failure = fmt::format("HTTP {}: {}", a.status, server_message(a.body));
    } else {
      throw Error(mask_secret(
          fmt::format("the chat API at {} answered HTTP {}: {} (check the base URL, the model "
                      "'{}' and the API key)",
                      settings.base_url, a.status, server_message(a.body), settings.model),
          settings.api_key));
    }
    reply.outcome = ChatReply::Outcome::kNoAnswer;
    reply.error = mask_secret(failure, settings.api_key);
    if (attempt == attempts) break;
    double wait = std::min(backoff, settings.max_backoff_seconds);
    if (a.retry_after >= 0) wait = std::min(a.retry_after, settings.max_backoff_seconds);
    if (progress) {
      progress(fmt::format("{}; retrying in {:.1f} s (attempt {} of {})", reply.error, wait,
                           attempt + 1, attempts));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    backoff *= 2;
  }
  reply.error = fmt::format("{} (after {} attempts)", reply.error, reply.attempts);
  return reply;
}

}  // namespace kforge
