// Cell-list neighbour-list build, as an XLA FFI custom call for the CPU.
//
// Particles are binned into cells at least r_cut + skin wide (counting sort, O(n)); each
// particle then scans the 3^d cells around its own and keeps the first `capacity`
// neighbours within r_cut + skin (minimum image in a periodic box). The outputs match
// simlib's pure-JAX build (`_neighbors._build`), which is the reference for this kernel:
// the same neighbour set, padded with n, with the largest neighbour count and cell
// occupancy, so overflow is detected the same way.
//
// Memory safety, whatever the inputs: positions, cell geometry and box are run-time data
// and may be huge, infinite or NaN (a blown-up simulation), so no index is derived from
// them without range reduction in floating point first (a float -> integer conversion of
// NaN, inf or a value outside the integer's range is undefined behaviour and in practice
// gives a wild index). A non-finite coordinate is binned into cell 0 along its axis; it is
// at a NaN or infinite distance from every particle, so it gets no neighbours and is no
// one's neighbour. A finite coordinate far outside the box is wrapped exactly (fmod) in a
// periodic box and clamped to the edge cell in free space. Shapes and attributes are
// checked and reported as FFI errors (a Python exception), never trusted. The caller
// detects non-finite states itself (simulate's checks); this kernel only guarantees that
// they cannot corrupt memory. Built without -ffinite-math-only, so std::isfinite is kept.
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max() - 1;

// x wrapped into [0, box), or NaN when x or the box is not usable.
template <typename T>
T Wrap(T x, T box) {
  if (!(std::isfinite(box) && box > T(0)) || !std::isfinite(x)) {
    return std::numeric_limits<T>::quiet_NaN();
  }
  T w = x - box * std::floor(x / box);      // the usual formula (what the JAX build does)
  if (!(w >= T(0) && w < box)) {            // huge |x|: its rounding error exceeds the box
    w = std::fmod(x, box);                  // exact for finite x
    if (w < T(0)) w += box;
    if (!(w < box)) w = T(0);               // -tiny + box rounded up to box
  }
  return w;
}

// The cell along one axis of `g` cells for u = (x - origin) / cell size: wrapped in a
// periodic box, clamped in free space; 0 for NaN. Range-reduced in double before the cast.
int64_t CellCoordinate(double u, int64_t g, bool periodic) {
  if (std::isnan(u)) return 0;
  if (std::isinf(u)) return (periodic || u < 0) ? 0 : g - 1;
  const double f = std::floor(u);
  int64_t c;
  if (periodic) {
    const double r = std::fmod(f, static_cast<double>(g));   // exact, in (-g, g)
    c = static_cast<int64_t>(r);
    if (c < 0) c += g;
  } else {
    c = f < 0.0 ? 0 : (f >= static_cast<double>(g) ? g - 1 : static_cast<int64_t>(f));
  }
  return c < 0 ? 0 : (c >= g ? g - 1 : c);
}

}  // namespace

template <typename T, ffi::DataType DT>
static ffi::Error Build(ffi::Buffer<DT> positions, ffi::Buffer<DT> geometry,
                        ffi::ResultBuffer<ffi::S32> idx, ffi::ResultBuffer<ffi::S32> stats,
                        int64_t periodic_attr, int64_t g0, int64_t g1, int64_t g2,
                        double reach) {
  const auto dims = positions.dimensions();
  if (dims.size() != 2 || dims[1] < 1 || dims[1] > 3) {
    return ffi::Error::InvalidArgument("simlib_neighbors: positions must have shape (n, d), "
                                       "d in 1..3");
  }
  const int64_t n = dims[0], d = dims[1];
  if (n > kMaxIndex) {
    return ffi::Error::InvalidArgument("simlib_neighbors: too many particles for int32 indices");
  }
  const auto idims = idx->dimensions();
  if (idims.size() != 2 || idims[0] != n || idims[1] < 0) {
    return ffi::Error::InvalidArgument("simlib_neighbors: idx must have shape (n, capacity)");
  }
  if (geometry.element_count() < static_cast<size_t>(3 * d) || stats->element_count() < 2) {
    return ffi::Error::InvalidArgument("simlib_neighbors: geometry needs 3 d entries (origin, "
                                       "cell size, box) and stats 2");
  }
  const int64_t grid[3] = {g0, d > 1 ? g1 : 1, d > 2 ? g2 : 1};
  int64_t n_cells = 1;
  for (int64_t k = 0; k < 3; ++k) {
    if (grid[k] < 1 || grid[k] > kMaxIndex || n_cells > kMaxIndex / grid[k]) {
      return ffi::Error::InvalidArgument("simlib_neighbors: grid sizes must be >= 1 with fewer "
                                         "than 2^31 cells, got " + std::to_string(g0) + ", " +
                                         std::to_string(g1) + ", " + std::to_string(g2));
    }
    n_cells *= grid[k];
  }
  const bool periodic = periodic_attr != 0;
  const int64_t capacity = idims[1];
  // geometry: origin (d), cell size (d), box (d)
  const T* geo = geometry.typed_data();
  const T* x = positions.typed_data();
  const T reach2 = static_cast<T>(reach * reach);
  int32_t* out = idx->typed_data();
  int32_t max_count = 0, occupancy = 0;
  try {
    std::vector<int32_t> cell(n), start(n_cells + 1, 0), members(n);
    std::vector<T> wrapped(n * d);
    for (int64_t i = 0; i < n; ++i) {
      int64_t c = 0;
      for (int64_t k = 0; k < d; ++k) {
        T xk = x[i * d + k];
        if (periodic) xk = Wrap(xk, geo[2 * d + k]);
        wrapped[i * d + k] = xk;
        const T u = (xk - geo[k]) / geo[d + k];
        c = c * grid[k] + CellCoordinate(static_cast<double>(u), grid[k], periodic);
      }
      cell[i] = static_cast<int32_t>(c);      // in [0, n_cells) by construction
      start[c + 1]++;
    }
    for (int64_t c = 0; c < n_cells; ++c) {
      occupancy = start[c + 1] > occupancy ? start[c + 1] : occupancy;
      start[c + 1] += start[c];
    }
    // Coordinates in cell order (structure of arrays), so each cell is a contiguous run.
    std::vector<T> sorted[3];
    for (int64_t k = 0; k < 3; ++k) sorted[k].assign(n, T(0));
    {
      std::vector<int32_t> fill(start.begin(), start.end() - 1);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t s = fill[cell[i]]++;
        members[s] = static_cast<int32_t>(i);
        for (int64_t k = 0; k < d; ++k) sorted[k][s] = wrapped[i * d + k];
      }
    }
    T box[3] = {0, 0, 0};
    for (int64_t k = 0; k < d; ++k) box[k] = periodic ? geo[2 * d + k] : T(0);
    // The distinct neighbouring cells along each axis: -1, 0, +1, except in a periodic
    // box of 1 or 2 cells, where -1 and +1 name the same cell (or cell 0 itself).
    int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
    for (int64_t k = 0; k < d; ++k) {
      lo[k] = (periodic && grid[k] < 3) ? 0 : -1;
      hi[k] = (periodic && grid[k] < 2) ? 0 : 1;
    }
#pragma omp parallel for schedule(static) reduction(max : max_count)
    for (int64_t i = 0; i < n; ++i) {
      int64_t ci[3] = {0, 0, 0};
      int64_t rest = cell[i];
      for (int64_t k = d - 1; k >= 0; --k) {
        ci[k] = rest % grid[k];
        rest /= grid[k];
      }
      T xi[3] = {0, 0, 0};
      for (int64_t k = 0; k < d; ++k) xi[k] = wrapped[i * d + k];
      int32_t count = 0;
      int32_t* row = out + i * capacity;
      for (int64_t a = lo[0]; a <= hi[0]; ++a)
        for (int64_t b = lo[1]; b <= hi[1]; ++b)
          for (int64_t e = lo[2]; e <= hi[2]; ++e) {
            const int64_t off[3] = {a, b, e};
            int64_t c = 0;
            bool inside = true;
            for (int64_t k = 0; k < d; ++k) {
              int64_t ck = ci[k] + off[k];
              if (periodic) {
                ck = (ck + grid[k]) % grid[k];
              } else if (ck < 0 || ck >= grid[k]) {
                inside = false;
              }
              c = c * grid[k] + ck;
            }
            if (!inside) continue;
            for (int32_t s = start[c]; s < start[c + 1]; ++s) {
              T r2 = 0;
              for (int64_t k = 0; k < d; ++k) {
                T dk = xi[k] - sorted[k][s];
                if (periodic) {   // |dk| < box: one correction gives the minimum image
                  dk -= dk > T(0.5) * box[k] ? box[k] : T(0);
                  dk += dk < T(-0.5) * box[k] ? box[k] : T(0);
                }
                r2 += dk * dk;
              }
              const int32_t j = members[s];
              if (r2 < reach2 && j != i) {       // false for NaN distances
                if (count < capacity) row[count] = j;
                ++count;
              }
            }
          }
      for (int64_t s = count; s < capacity; ++s) row[s] = static_cast<int32_t>(n);
      max_count = count > max_count ? count : max_count;
    }
  } catch (const std::exception& err) {     // std::bad_alloc: never let it cross the FFI
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("simlib_neighbors: ") + err.what());
  }
  stats->typed_data()[0] = max_count;
  stats->typed_data()[1] = occupancy;
  return ffi::Error::Success();
}

#define SIMLIB_NEIGHBOR_HANDLER(NAME, T, DT)                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Build<T, DT>),                           \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<ffi::S32>>()               \
                                    .Ret<ffi::Buffer<ffi::S32>>()               \
                                    .Attr<int64_t>("periodic")                  \
                                    .Attr<int64_t>("g0")                        \
                                    .Attr<int64_t>("g1")                        \
                                    .Attr<int64_t>("g2")                        \
                                    .Attr<double>("reach"));

SIMLIB_NEIGHBOR_HANDLER(simlib_neighbors_f32, float, ffi::F32)
SIMLIB_NEIGHBOR_HANDLER(simlib_neighbors_f64, double, ffi::F64)
