// Files (JSON or text) that readers never see half written.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace kforge {

// Writes `j` to a temporary file beside `path` (named for this process, so concurrent writers
// do not share it), then renames it over `path`; creates missing parent folders. Throws Error
// naming the file when it cannot be written.
void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j,
                           int indent = 2);

// The JSON document in `path`; throws Error naming the file when it cannot be read or parsed.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The whole text of `path`; throws Error naming the file when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

// The same for text, written as given.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace kforge
