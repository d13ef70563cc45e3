#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "device/backend.h"

namespace kforge {

std::string DeviceInfo::default_arch() const {
  if (backend != "cuda") return "host";
  // Hopper's architecture-specific features (wgmma, setmaxnreg) need the 'a' target.
  return fmt::format("sm_{}{}{}", cc_major, cc_minor, cc_major == 9 && cc_minor == 0 ? "a" : "");
}

Bindings DeviceInfo::limits() const {
  return {{"max_threads_per_block", max_threads_per_block},
          {"max_shared_per_block", max_shared_per_block},
          {"max_shared_per_sm", max_shared_per_sm},
          {"regs_per_sm", regs_per_sm},
          {"regs_per_block", regs_per_block},
          {"max_threads_per_sm", max_threads_per_sm},
          {"max_blocks_per_sm", max_blocks_per_sm},
          {"sm_count", sm_count},
          {"warp_size", warp_size},
          {"l2_bytes", l2_bytes},
          {"cc", cc_major * 10 + cc_minor}};
}

void to_json(nlohmann::json& j, const DeviceInfo& d) {
  j = {{"backend", d.backend},
       {"index", d.index},
       {"name", d.name},
       {"uuid", d.uuid},
       {"cc_major", d.cc_major},
       {"cc_minor", d.cc_minor},
       {"sm_count", d.sm_count},
       {"total_memory", d.total_memory},
       {"l2_bytes", d.l2_bytes},
       {"max_threads_per_block", d.max_threads_per_block},
       {"max_shared_per_block", d.max_shared_per_block},
       {"max_shared_per_sm", d.max_shared_per_sm},
       {"regs_per_sm", d.regs_per_sm},
       {"regs_per_block", d.regs_per_block},
       {"max_threads_per_sm", d.max_threads_per_sm},
       {"max_blocks_per_sm", d.max_blocks_per_sm},
       {"reserved_shared_per_block", d.reserved_shared_per_block},
       {"warp_size", d.warp_size},
       {"max_sm_clock_mhz", d.max_sm_clock_mhz},
       {"driver_version", d.driver_version},
       {"runtime_version", d.runtime_version}};
}

void from_json(const nlohmann::json& j, DeviceInfo& d) {
  j.at("backend").get_to(d.backend);
  j.at("index").get_to(d.index);
  j.at("name").get_to(d.name);
  j.at("uuid").get_to(d.uuid);
  j.at("cc_major").get_to(d.cc_major);
  j.at("cc_minor").get_to(d.cc_minor);
  j.at("sm_count").get_to(d.sm_count);
  j.at("total_memory").get_to(d.total_memory);
  j.at("l2_bytes").get_to(d.l2_bytes);
  j.at("max_threads_per_block").get_to(d.max_threads_per_block);
  j.at("max_shared_per_block").get_to(d.max_shared_per_block);
  j.at("max_shared_per_sm").get_to(d.max_shared_per_sm);
  j.at("regs_per_sm").get_to(d.regs_per_sm);
  j.at("regs_per_block").get_to(d.regs_per_block);
  j.at("max_threads_per_sm").get_to(d.max_threads_per_sm);
  j.at("max_blocks_per_sm").get_to(d.max_blocks_per_sm);
  j.at("reserved_shared_per_block").get_to(d.reserved_shared_per_block);
  j.at("warp_size").get_to(d.warp_size);
  j.at("max_sm_clock_mhz").get_to(d.max_sm_clock_mhz);
  j.at("driver_version").get_to(d.driver_version);
  j.at("runtime_version").get_to(d.runtime_version);
}

}  // namespace kforge
