// Direct-sum gravity with Plummer softening, as an XLA FFI custom call for the CPU.
//
//   F_i = G m_i sum_{j != i} m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^{3/2}
//   U   = -G sum_{i<j} m_i m_j / (|x_j - x_i|^2 + eps^2)^{1/2}
//
// Positions are copied into structure-of-arrays form so that the inner loop over j is a
// straight SIMD loop; rows i are shared between OpenMP threads. simlib's pure-JAX tiled
// sum is the reference that tests this kernel and the fallback where it cannot be built.
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

template <typename T, ffi::DataType DT>
static ffi::Error Gravity(ffi::Buffer<DT> positions, ffi::Buffer<DT> masses,
                          ffi::Buffer<DT> constants, ffi::ResultBuffer<DT> forces,
                          ffi::ResultBuffer<DT> energy) {
  const auto dims = positions.dimensions();
  if (dims.size() != 2 || dims[1] != 3) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "positions must have shape (n, 3)");
  }
  const int64_t n = dims[0];
  const T* x = positions.typed_data();
  const T* m = masses.typed_data();
  const T G = constants.typed_data()[0];
  const T eps2 = constants.typed_data()[1] * constants.typed_data()[1];
  std::vector<T> xs(n), ys(n), zs(n);
  for (int64_t i = 0; i < n; ++i) {
    xs[i] = x[3 * i];
    ys[i] = x[3 * i + 1];
    zs[i] = x[3 * i + 2];
  }
  T* f = forces->typed_data();
  double total = 0.0;
#pragma omp parallel for schedule(dynamic, 64) reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    const T xi = xs[i], yi = ys[i], zi = zs[i];
    T ax = 0, ay = 0, az = 0, pot = 0;
#pragma omp simd reduction(+ : ax, ay, az, pot)
    for (int64_t j = 0; j < n; ++j) {
      const T dx = xs[j] - xi, dy = ys[j] - yi, dz = zs[j] - zi;
      const bool self = (j == i);
      const T r2 = self ? T(1) : dx * dx + dy * dy + dz * dz + eps2;
      const T mj = self ? T(0) : m[j];
      const T inv = T(1) / std::sqrt(r2);
      const T w = mj * inv;
      const T s = w * inv * inv;
      ax += s * dx;
      ay += s * dy;
      az += s * dz;
      pot += w;
    }
    const T gm = G * m[i];
    f[3 * i] = gm * ax;
    f[3 * i + 1] = gm * ay;
    f[3 * i + 2] = gm * az;
    total += -0.5 * static_cast<double>(gm) * static_cast<double>(pot);
  }
  energy->typed_data()[0] = static_cast<T>(total);
  return ffi::Error::Success();
}

#define SIMLIB_GRAVITY_HANDLER(NAME, T, DT)                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Gravity<T, DT>),                         \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>());

SIMLIB_GRAVITY_HANDLER(simlib_gravity_f32, float, ffi::F32)
SIMLIB_GRAVITY_HANDLER(simlib_gravity_f64, double, ffi::F64)
