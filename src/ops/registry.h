// The op specs kforge knows. Adding an op: write its spec in one file and list its factory in
// registry.cpp.
#pragma once

#include <memory>

#include "ops/op_spec.h"

namespace kforge {

std::unique_ptr<OpSpec> make_rmsnorm_spec();
std::unique_ptr<OpSpec> make_softmax_spec();

}  // namespace kforge
