#include "device/ceilings.h"

#include <chrono>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"
#include "core/run_info.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

Ceilings from_record(const nlohmann::json& record, bool from_cache) {
  Ceilings c;
  c.raw = record;
  c.copy_gbps = record.at("ceilings").at("copy_gbps");
  const auto& mm = record.at("ceilings").at("matmul_tflops");
  if (!mm.is_null()) c.matmul_tflops = mm.get<double>();
  c.measured_at = record.value("date", "");
  c.from_cache = from_cache;
  return c;
}

}  // namespace

Ceilings device_ceilings(WorkerClient& worker, const fs::path& cache_dir, bool refresh,
                         const std::function<void(const std::string&)>& progress) {
  const DeviceInfo& device = worker.device();
  // One file per physical device and driver: a new driver can move the numbers.
  const std::string id = std::regex_replace(
      fmt::format("{}-{}-{}", device.backend, device.uuid, device.driver_version),
      std::regex("[^A-Za-z0-9._-]"), "_");
  const fs::path path = cache_dir / "ceilings" / (id + ".json");
  if (!refresh && fs::exists(path)) {
    std::ifstream in(path);
    try {
      return from_record(nlohmann::json::parse(in), true);
    } catch (const std::exception&) {
      // A damaged cache entry is measured again below.
    }
  }
  if (progress) progress(fmt::format("measuring ceilings of {} (once per device)...", device.name));
  const WorkerReply reply = worker.request({{"op", "ceilings"}}, std::chrono::minutes(5));
  if (!reply.ok()) throw Error(fmt::format("measuring ceilings failed: {}", reply.detail));
  nlohmann::json record = {
      {"device", device}, {"ceilings", reply.body.at("ceilings")}, {"date", utc_timestamp()}};
  write_json_atomically(path, record);
  return from_record(record, false);
}

Ceilings read_ceilings_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read ceilings file {}", path.string()));
  try {
    Ceilings c = from_record(nlohmann::json::parse(in), false);
    if (c.copy_gbps <= 0) throw Error("copy_gbps is not positive");
    return c;
  } catch (const std::exception& e) {
    throw UsageError(
        fmt::format("{} is not a ceilings record as `kforge ceilings --json` writes "
                    "({})",
                    path.string(), e.what()));
  }
}

std::optional<Ceilings> cached_ceilings_by_name(const fs::path& cache_dir,
                                                std::string_view device_name) {
  std::optional<Ceilings> newest;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cache_dir / "ceilings", ec)) {
    if (entry.path().extension() != ".json") continue;
    try {
      std::ifstream in(entry.path());
      const nlohmann::json record = nlohmann::json::parse(in);
      if (record.at("device").at("name").get<std::string>() != device_name) continue;
      Ceilings c = from_record(record, true);
      // ISO dates compare as text.
      if (!newest || c.measured_at > newest->measured_at) newest = std::move(c);
    } catch (const std::exception&) {
      // Damaged or foreign files are not ceilings.
    }
  }
  return newest;
}

}  // namespace kforge
