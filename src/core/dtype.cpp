#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kforge/elem_cpu.h"

namespace kforge {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::f32;
  if (name == "f64" || name == "fp64" || name == "float64" || name == "double") return DType::f64;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  return std::nullopt;
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
  }
  return 0;
}

kf_dtype to_abi(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return KF_DTYPE_F16;
    case DType::bf16:
      return KF_DTYPE_BF16;
    case DType::f32:
      return KF_DTYPE_F32;
    case DType::f64:
      return KF_DTYPE_F64;
    case DType::i32:
      return KF_DTYPE_I32;
    case DType::i64:
      return KF_DTYPE_I64;
  }
  return KF_DTYPE_F32;
}

bool is_floating(DType dtype) {
  return dtype != DType::i32 && dtype != DType::i64;
}

double dtype_max(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 65504.0;
    case DType::bf16:
      return 3.3895313892515355e38;
    case DType::f32:
      return std::numeric_limits<float>::max();
    case DType::f64:
      return std::numeric_limits<double>::max();
    case DType::i32:
      return std::numeric_limits<int32_t>::max();
    case DType::i64:
      return 9.2233720368547758e18;
  }
  return 0;
}

double dtype_min_normal(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 6.103515625e-05;
    case DType::bf16:
    case DType::f32:
      return std::numeric_limits<float>::min();
    case DType::f64:
      return std::numeric_limits<double>::min();
    default:
      return 1;
  }
}

double load_element(const std::byte* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::f16: {
      kf_f16 v;
      std::memcpy(&v.bits, data + 2 * i, 2);
      return kf_to_float(v);
    }
    case DType::bf16: {
      kf_bf16 v;
      std::memcpy(&v.bits, data + 2 * i, 2);
      return kf_to_float(v);
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, data + 8 * i, 8);
      return static_cast<double>(v);
    }
  }
  return 0;
}

void store_element(std::byte* data, DType dtype, size_t i, double v) {
  switch (dtype) {
    case DType::f16: {
      const kf_f16 h = kf_from_float<kf_f16>(static_cast<float>(v));
      std::memcpy(data + 2 * i, &h.bits, 2);
      return;
    }
    case DType::bf16: {
      const kf_bf16 h = kf_from_float<kf_bf16>(static_cast<float>(v));
      std::memcpy(data + 2 * i, &h.bits, 2);
      return;
    }
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(data + 4 * i, &f, 4);
      return;
    }
    case DType::f64:
      std::memcpy(data + 8 * i, &v, 8);
      return;
    case DType::i32: {
      const auto n = static_cast<int32_t>(v);
      std::memcpy(data + 4 * i, &n, 4);
      return;
    }
    case DType::i64: {
      const auto n = static_cast<int64_t>(v);
      std::memcpy(data + 8 * i, &n, 8);
      return;
    }
  }
}

void widen_to_double(const std::byte* data, DType dtype, std::span<double> out) {
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = load_element(data, dtype, i);
}

void fill_nan(std::byte* data, DType dtype, size_t count) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: {
      const uint16_t pattern = dtype == DType::f16 ? 0x7e00 : 0x7fc0;
      for (size_t i = 0; i < count; ++i)
        std::memcpy(data + 2 * i, &pattern, 2);
      return;
    }
    case DType::f32: {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (size_t i = 0; i < count; ++i)
        std::memcpy(data + 4 * i, &nan, 4);
      return;
    }
    case DType::f64: {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      for (size_t i = 0; i < count; ++i)
        std::memcpy(data + 8 * i, &nan, 8);
      return;
    }
    default:
      throw Error("fill_nan: integer tensors have no NaN");
  }
}

}  // namespace kforge
