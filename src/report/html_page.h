// The report's page: one self-contained HTML file (figures embedded as data URIs, no scripts or
// styles from elsewhere), so that it opens offline from wherever it is copied.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace kforge {

// `report` is collect_report()'s document plus "run" (run_metadata); `figures` the plotting
// helper's manifest. Numbers are printed with two decimals, as report.json has them.
std::string report_html(const nlohmann::json& report, const nlohmann::json& figures);

}  // namespace kforge
