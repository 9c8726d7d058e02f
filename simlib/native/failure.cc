// The in-graph failure check of simlib/_errors.py as an XLA FFI custom call for the CPU:
// when a solve or simulation fails inside compiled code, this call returns an error whose
// text is the SolverError message, so XLA aborts the program and JAX raises it. Unlike a
// Python host callback, a custom call is named in the program by its target name alone,
// so programs that hold it can be stored in JAX's persistent compilation cache.
//
// Operands: a key (int32 scalar; 0 means no failure) and the message's values (scalars of
// any float or integer type). Attribute "table": the messages, one per key, as
// "<key>\x1f<template>" records separated by "\x1e". A template is plain text with fields
// {N} (operand N printed with 17 significant digits, "%.17g"), {N:d} (operand N as an
// integer), {N:r} (operand N as Python's repr(float) writes it: the shortest text that
// reads back to the same double), and {where:M,C} ("member <M> of <C>: " when operand C,
// the member count, is above 1, else nothing). Python renders the same templates when it
// runs the check itself (simlib/_errors.py, render), and the tests compare the two.
// Result: an int32 zero, which the caller adds to its outputs so the check stays alive.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Operand i of the remaining arguments as a double (false if it is not a numeric scalar).
bool Scalar(const ffi::RemainingArgs& args, size_t i, double* value) {
  if (i >= args.size()) return false;
  auto buffer = args.get<ffi::AnyBuffer>(i);
  if (!buffer.has_value() || buffer->element_count() != 1) return false;
  const void* p = buffer->untyped_data();
  switch (buffer->element_type()) {
    case ffi::DataType::F32: *value = *static_cast<const float*>(p); return true;
    case ffi::DataType::F64: *value = *static_cast<const double*>(p); return true;
    case ffi::DataType::S32: *value = *static_cast<const int32_t*>(p); return true;
    case ffi::DataType::S64: *value = double(*static_cast<const int64_t*>(p)); return true;
    case ffi::DataType::U32: *value = *static_cast<const uint32_t*>(p); return true;
    case ffi::DataType::PRED: *value = *static_cast<const bool*>(p) ? 1.0 : 0.0; return true;
    default: return false;
  }
}

std::string Shortest(double x) {  // Python's repr(float(x))
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char text[40];
  for (int digits = 0; digits <= 16; ++digits) {  // the fewest digits that read back as x
    std::snprintf(text, sizeof text, "%.*e", digits, x);
    if (std::strtod(text, nullptr) == x) break;
  }
  std::string e(text), out;
  if (e[0] == '-') { out = "-"; e.erase(0, 1); }
  size_t at = e.find('e');
  int exponent = std::atoi(e.c_str() + at + 1);
  std::string digits = e.substr(0, 1) + (at > 2 ? e.substr(2, at - 2) : "");
  digits.erase(digits.find_last_not_of('0') + 1);
  if (digits.empty()) digits = "0";
  if (exponent >= -4 && exponent < 16) {  // Python's repr: positional in this range
    if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
    if (digits.size() <= size_t(exponent) + 1) {
      return out + digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    }
    return out + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(text, sizeof text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + text;
}

std::string Render(std::string_view tpl, const ffi::RemainingArgs& args) {
  std::string out;
  size_t i = 0;
  while (i < tpl.size()) {
    size_t open = tpl.find('{', i);
    if (open == std::string_view::npos) { out.append(tpl.substr(i)); break; }
    out.append(tpl.substr(i, open - i));
    size_t close = tpl.find('}', open);
    if (close == std::string_view::npos) { out.append(tpl.substr(open)); break; }
    std::string field(tpl.substr(open + 1, close - open - 1));
    i = close + 1;
    char text[64];
    if (field.rfind("where:", 0) == 0) {
      size_t comma = field.find(',');
      double member = 0, count = 0;
      if (comma != std::string::npos &&
          Scalar(args, std::strtoul(field.c_str() + 6, nullptr, 10), &member) &&
          Scalar(args, std::strtoul(field.c_str() + comma + 1, nullptr, 10), &count) &&
          count > 1) {
        std::snprintf(text, sizeof text, "member %lld of %lld: ", (long long)member,
                      (long long)count);
        out += text;
      }
      continue;
    }
    size_t colon = field.find(':');
    std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    double value = 0;
    if (!Scalar(args, std::strtoul(field.c_str(), nullptr, 10), &value)) {
      out += "?";
    } else if (spec == "d") {
      std::snprintf(text, sizeof text, "%lld", (long long)value);
      out += text;
    } else if (spec == "r") {
      out += Shortest(value);
    } else {
      std::snprintf(text, sizeof text, "%.17g", value);
      out += text;
    }
  }
  return out;
}

ffi::Error Check(ffi::RemainingArgs args, ffi::Result<ffi::BufferR0<ffi::S32>> zero,
                 std::string_view table) {
  zero->typed_data()[0] = 0;
  double key = 0;
  if (!Scalar(args, 0, &key)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "simlib_failure_check: operand 0 must be a numeric scalar");
  }
  if (key == 0) return ffi::Error::Success();
  std::string wanted = std::to_string((long long)key) + "\x1f";
  size_t at = 0;
  while (at < table.size()) {
    size_t end = table.find('\x1e', at);
    if (end == std::string_view::npos) end = table.size();
    std::string_view record = table.substr(at, end - at);
    if (record.substr(0, wanted.size()) == wanted) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        Render(record.substr(wanted.size()), args));
    }
    at = end + 1;
  }
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "SolverError: failure code " + std::to_string((long long)key));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_failure_check, Check,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::S32>>()
                                  .Attr<std::string_view>("table"));
