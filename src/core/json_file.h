// JSON files that readers never see half written.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

namespace kforge {

// Writes `j` to a temporary file beside `path` (named for this process, so concurrent writers
// do not share it), then renames it over `path`; creates missing parent folders. Throws Error
// naming the file when it cannot be written.
void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j,
                           int indent = 2);

}  // namespace kforge
