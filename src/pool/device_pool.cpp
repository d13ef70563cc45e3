#include "pool/device_pool.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "tune/results_db.h"

namespace kforge {
namespace {

int devices_present(const std::string& backend) {
  if (backend == "cuda") return static_cast<int>(list_cuda_devices().size());
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string lane_name(const DeviceInfo& device, int index) {
  if (device.backend == "cuda") return fmt::format("cuda:{} ({})", index, device.uuid);
  return fmt::format("cpu:{}", index);
}

}  // namespace

std::vector<int> parse_device_list(const std::string& text, const std::string& backend) {
  const int present = devices_present(backend);
  const std::string what = backend == "cuda" ? "CUDA device(s)" : "CPU core(s)";
  std::vector<int> indices;
  if (text == "all") {
    for (int i = 0; i < present; ++i)
      indices.push_back(i);
    if (indices.empty()) throw UsageError(fmt::format("--devices all: no {} present", what));
    return indices;
  }
  std::set<int> seen;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    int index = -1;
    try {
      size_t used = 0;
      index = std::stoi(item, &used);
      if (used != item.size()) index = -1;
    } catch (const std::exception&) {
    }
    if (index < 0) {
      throw UsageError(
          fmt::format("--devices '{}': expected indices joined by commas (0,1) or 'all'", text));
    }
    if (index >= present) {
      throw UsageError(
          fmt::format("--devices {}: index {} but only {} {} present", text, index, present, what));
    }
    if (!seen.insert(index).second)
      throw UsageError(fmt::format("--devices {}: {} is named twice", text, index));
    indices.push_back(index);
    begin = end + 1;
  }
  return indices;
}

DevicePool::DevicePool(const std::string& backend, const std::vector<int>& indices,
                       const Compiler& compiler, const WorkerOptions& base)
    : backend_(backend) {
  if (indices.empty()) throw UsageError("a device pool needs at least one device");
  for (const int index : indices) {
    auto lane = std::make_unique<DeviceLane>();
    lane->index = index;
    WorkerOptions options = base;
    options.backend = backend;
    options.device = backend == "cuda" ? index : 0;
    // One slot runs where the scheduler puts it, as always; several are kept apart.
    options.cpu_core = backend == "cpu" && indices.size() > 1 ? index : -1;
    lane->worker = std::make_unique<WorkerClient>(options);
    const DeviceInfo& device = lane->worker->device();
    if (lanes_.empty()) {
      device_ = device;
    } else if (device_key(device) != device_key(device_)) {
      throw UsageError(fmt::format(
          "device {} is a {}, device {} a {}: timings of different models are not compared; "
          "give --devices of one model",
          indices.front(), device_key(device_), index, device_key(device)));
    }
    lane->name = lane_name(device, index);
    lane->checker = std::make_unique<Checker>(compiler, *lane->worker);
    lanes_.push_back(std::move(lane));
  }
}

std::vector<DeviceLane*> DevicePool::live_lanes() {
  std::vector<DeviceLane*> out;
  for (auto& lane : lanes_) {
    if (!lane->lost) out.push_back(lane.get());
  }
  return out;
}

DeviceLane& DevicePool::first_live() {
  for (auto& lane : lanes_) {
    if (!lane->lost) return *lane;
  }
  std::string why;
  for (const auto& lane : lanes_)
    why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", lane->name, lane->lost_reason);
  throw Error(fmt::format("every device was lost ({})", why));
}

bool DevicePool::probe(DeviceLane& lane) {
  if (lane.lost) return false;
  lane.worker->restart();
  try {
    lane.worker->device();
    return true;
  } catch (const std::exception& e) {
    lane.lost = true;
    lane.lost_reason = e.what();
    return false;
  }
}

}  // namespace kforge
