#include "report/html_page.h"

#include <algorithm>

#include <fmt/format.h>

namespace kforge {
namespace {

using nlohmann::json;

std::string escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return "—";
  return fmt::format("{:.2f}", it->get<double>());
}

std::string task_table(const json& tasks) {
  std::string rows;
  for (const auto& t : tasks) {
    std::string verdicts;
    for (const auto& [v, n] : t["verdicts"].items())
      verdicts += fmt::format("{}{} {}", verdicts.empty() ? "" : ", ", v, n.get<int>());
    rows += fmt::format(
        "<tr data-task=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"start\">{}"
        "</td><td class=\"best\">{}</td><td class=\"speedup\">{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        escape(t["name"].get<std::string>()), escape(t["name"].get<std::string>()),
        escape(t["op"].get<std::string>()), escape(t["shape"].get<std::string>()),
        escape(t["dtype"].get<std::string>()), num(t, "start_us"), num(t, "best_us"),
        num(t, "speedup"), t["experiments"].get<int>(), t["kept"].get<int>(), escape(verdicts));
  }
  const bool has_tunes = std::any_of(tasks.begin(), tasks.end(), [](const json& t) {
    return t.value("source", "") == "tune database";
  });
  const std::string tune_note =
      has_tunes ? "<p>For a tune database's problems: start is the first timed evaluation, best "
                  "the fastest timed (passing) one, and kept the evaluations that were a new "
                  "best.</p>\n"
                : "";
  return fmt::format(
      "<h2>Tasks</h2>\n{}<table id=\"tasks\"><tr><th>task</th><th>op</th><th>shape</th><th>dtype"
      "</th><th>start µs</th><th>best kept µs</th><th>speedup</th><th>experiments</th><th>kept"
      "</th><th>verdicts</th></tr>\n{}</table>\n",
      tune_note, rows);
}

std::string plan_table(const json& plan) {
  std::string rows;
  for (const auto& g : plan["groups"]) {
    rows += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                        escape(g["name"].get<std::string>()), escape(g["shape"].get<std::string>()),
                        g["calls"].get<int>(), num(g, "time_us"), num(g, "after_us"));
  }
  return fmt::format(
      "<h2>Plan</h2>\n<p>Kernel time of one step: {} µs ({} µs outside the groups below).</p>\n"
      "<table id=\"plan\"><tr><th>group</th><th>shape</th><th>calls</th><th>time µs</th>"
      "<th>with kforge µs</th></tr>\n{}</table>\n",
      num(plan, "kernel_time_us"), num(plan, "other_us"), rows);
}

std::string verify_table(const json& verify) {
  std::string rows;
  for (const auto& [mode, ms] : verify["step_ms"].items()) {
    rows += fmt::format("<tr><td>{}</td><td>{:.2f}</td></tr>\n", escape(mode), ms.get<double>());
  }
  return fmt::format(
      "<h2>Verify ({}: {})</h2>\n<table id=\"verify\"><tr><th>step</th><th>ms</th></tr>\n{}"
      "</table>\n",
      escape(verify.value("model", "")), verify.value("pass", false) ? "outputs pass" : "FAILED",
      rows);
}

}  // namespace

std::string report_html(const json& report, const json& figures) {
  const json run = report.value("run", json::object());
  std::string body;
  body += fmt::format(
      "<h1>kforge report</h1>\n<p class=\"meta\">Device: {}. Written {} by kforge {}{}: "
      "<code>{}</code></p>\n",
      escape(report.value("device", "?")), escape(run.value("date", "")),
      escape(run.value("kforge_git_sha", "unknown")),
      run.value("kforge_git_dirty", false) ? " (dirty tree)" : "",
      escape(run.value("command_line", "")));
  if (!report["tasks"].empty()) body += task_table(report["tasks"]);
  if (report.contains("plan")) body += plan_table(report["plan"]);
  if (report.contains("verify")) body += verify_table(report["verify"]);
  body += "<h2>Figures</h2>\n";
  for (const auto& f : figures) {
    body += fmt::format(
        "<figure id=\"{}\"><img src=\"{}\" alt=\"{}\"><figcaption><b>{}</b> {} "
        "(<a href=\"{}\">SVG</a>, <a href=\"{}\">PNG</a>)</figcaption></figure>\n",
        escape(f["name"].get<std::string>()), f["data_uri"].get<std::string>(),
        escape(f["title"].get<std::string>()), escape(f["title"].get<std::string>()),
        escape(f["caption"].get<std::string>()), escape(f["svg"].get<std::string>()),
        escape(f["png"].get<std::string>()));
  }
  // The page counts its own figures once they have loaded, so that a headless browser's DOM
  // tells whether every one decoded.
  constexpr const char* kScript =
      "<script>window.addEventListener('load', () => {"
      " const images = [...document.querySelectorAll('figure img')];"
      " document.body.dataset.figures = images.length;"
      " document.body.dataset.figuresLoaded ="
      " images.filter(i => i.complete && i.naturalWidth > 0).length; });</script>";
  constexpr const char* kStyle =
      "<style>body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
      "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
      "text-align:right}td:first-child,th:first-child{text-align:left}figure{margin:1.5em 0}"
      "img{max-width:100%}.meta{color:#555}</style>";
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kforge report"
      "</title>{}</head>\n<body>\n{}{}\n</body></html>\n",
      kStyle, body, kScript);
}

}  // namespace kforge
