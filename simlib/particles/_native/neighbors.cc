// Cell-list neighbour-list build, as an XLA FFI custom call for the CPU.
//
// Particles are binned into cells at least r_cut + skin wide (counting sort, O(n)); each
// particle then scans the 3^d cells around its own and keeps the first `capacity`
// neighbours within r_cut + skin (minimum image in a periodic box). The outputs match
// simlib's pure-JAX build (`_neighbors._build`), which is the reference for this kernel:
// the same neighbour set, padded with n, with the largest neighbour count and cell
// occupancy, so overflow is detected the same way.
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

template <typename T, ffi::DataType DT>
static ffi::Error Build(ffi::Buffer<DT> positions, ffi::Buffer<DT> geometry,
                        ffi::ResultBuffer<ffi::S32> idx, ffi::ResultBuffer<ffi::S32> stats,
                        int64_t periodic, int64_t g0, int64_t g1, int64_t g2, double reach) {
  const auto dims = positions.dimensions();
  const int64_t n = dims[0], d = dims[1];
  const int64_t capacity = idx->dimensions()[1];
  const int64_t grid[3] = {g0, d > 1 ? g1 : 1, d > 2 ? g2 : 1};
  const int64_t n_cells = grid[0] * grid[1] * grid[2];
  // geometry: origin (d), cell size (d), box (d)
  const T* geo = geometry.typed_data();
  const T* x = positions.typed_data();
  const T reach2 = static_cast<T>(reach * reach);
  std::vector<int32_t> cell(n), start(n_cells + 1, 0), members(n);
  std::vector<T> wrapped(n * d);
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = 0;
    for (int64_t k = 0; k < d; ++k) {
      T xk = x[i * d + k];
      if (periodic) {
        const T box = geo[2 * d + k];
        xk -= box * std::floor(xk / box);
      }
      wrapped[i * d + k] = xk;
      int64_t ck = static_cast<int64_t>(std::floor((xk - geo[k]) / geo[d + k]));
      ck = ck < 0 ? (periodic ? ck + grid[k] : 0) : ck;
      ck = ck >= grid[k] ? (periodic ? ck - grid[k] : grid[k] - 1) : ck;
      c = c * grid[k] + ck;
    }
    cell[i] = static_cast<int32_t>(c);
    start[c + 1]++;
  }
  int32_t occupancy = 0;
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
  int32_t* out = idx->typed_data();
  int32_t max_count = 0;
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
    const int64_t span1 = d > 1 ? 3 : 1, span2 = d > 2 ? 3 : 1;
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t b = 0; b < span1; ++b)
        for (int64_t e = 0; e < span2; ++e) {
          const int64_t off[3] = {a - 1, span1 > 1 ? b - 1 : 0, span2 > 1 ? e - 1 : 0};
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
            if (r2 < reach2 && j != i) {
              if (count < capacity) row[count] = j;
              ++count;
            }
          }
        }
    for (int32_t s = count; s < capacity; ++s) row[s] = static_cast<int32_t>(n);
    max_count = count > max_count ? count : max_count;
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
