// A profile in a few lines, for people: what ran, how long, what may be missing, and the kernels
// that took the most time.
#pragma once

#include <cstddef>
#include <string>

#include "profile/profile.h"

namespace kforge {

// Processes, kernels, total kernel time, GPU busy time, dropped records, warnings from the
// recording, and the `top` kernels by total time (short name, calls, total us, share of the
// kernel time, the op most of its calls were launched from).
std::string profile_summary(const Profile& profile, size_t top = 10);

}  // namespace kforge
