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
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

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

// Appends to buf[count...] the slots s in [s0, s1) whose point (sx, sy, sz)[s] lies within
// reach2 (squared) of (xa, ya, za), except `self`; returns the new count. With AVX-512 a
// vector of candidates is tested at once and the hits packed with a register compress and
// written with one full-width store (buf needs kSlack entries of room past the last hit;
// on Zen 4 a compress straight to memory is microcoded and slow). NaN distances compare
// false either way.
constexpr int32_t kSlack = 16;

template <typename T>
int32_t AppendWithinScalar(const T* sx, const T* sy, const T* sz, int32_t s0, int32_t s1,
                           T xa, T ya, T za, T reach2, int32_t self, int32_t* buf,
                           int32_t count) {
  for (int32_t s = s0; s < s1; ++s) {
    const T dx = xa - sx[s], dy = ya - sy[s], dz = za - sz[s];
    const T r2 = dx * dx + dy * dy + dz * dz;
    buf[count] = s;                             // branch-free: kept only when within
    count += (r2 < reach2) & (s != self);
  }
  return count;
}

template <typename T>
int32_t AppendWithin(const T* sx, const T* sy, const T* sz, int32_t s0, int32_t s1, T xa,
                     T ya, T za, T reach2, int32_t self, int32_t* buf, int32_t count) {
  return AppendWithinScalar(sx, sy, sz, s0, s1, xa, ya, za, reach2, self, buf, count);
}

#if defined(__AVX512F__) && defined(__AVX512VL__)
template <>
int32_t AppendWithin<float>(const float* sx, const float* sy, const float* sz, int32_t s0,
                            int32_t s1, float xa, float ya, float za, float reach2,
                            int32_t self, int32_t* buf, int32_t count) {
  const __m512 vx = _mm512_set1_ps(xa), vy = _mm512_set1_ps(ya), vz = _mm512_set1_ps(za);
  const __m512 vr = _mm512_set1_ps(reach2);
  const __m512i vself = _mm512_set1_epi32(self);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int32_t s = s0; s < s1; s += 16) {
    const int32_t left = s1 - s;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    const __m512 dx = _mm512_sub_ps(vx, _mm512_maskz_loadu_ps(m, sx + s));
    const __m512 dy = _mm512_sub_ps(vy, _mm512_maskz_loadu_ps(m, sy + s));
    const __m512 dz = _mm512_sub_ps(vz, _mm512_maskz_loadu_ps(m, sz + s));
    const __m512 r2 = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(dx, dx), _mm512_mul_ps(dy, dy)),
                                    _mm512_mul_ps(dz, dz));
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(s), lane);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(m, r2, vr, _CMP_LT_OQ) &
                          _mm512_cmpneq_epi32_mask(idx, vself);
    _mm512_storeu_si512(buf + count, _mm512_maskz_compress_epi32(hit, idx));
    count += _mm_popcnt_u32(hit);
  }
  return count;
}

template <>
int32_t AppendWithin<double>(const double* sx, const double* sy, const double* sz, int32_t s0,
                             int32_t s1, double xa, double ya, double za, double reach2,
                             int32_t self, int32_t* buf, int32_t count) {
  const __m512d vx = _mm512_set1_pd(xa), vy = _mm512_set1_pd(ya), vz = _mm512_set1_pd(za);
  const __m512d vr = _mm512_set1_pd(reach2);
  const __m256i vself = _mm256_set1_epi32(self);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int32_t s = s0; s < s1; s += 8) {
    const int32_t left = s1 - s;
    const __mmask8 m = left >= 8 ? __mmask8(0xFF) : __mmask8((1u << left) - 1u);
    const __m512d dx = _mm512_sub_pd(vx, _mm512_maskz_loadu_pd(m, sx + s));
    const __m512d dy = _mm512_sub_pd(vy, _mm512_maskz_loadu_pd(m, sy + s));
    const __m512d dz = _mm512_sub_pd(vz, _mm512_maskz_loadu_pd(m, sz + s));
    const __m512d r2 = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(dx, dx), _mm512_mul_pd(dy, dy)),
                                     _mm512_mul_pd(dz, dz));
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(s), lane);
    const __mmask8 hit = _mm512_mask_cmp_pd_mask(m, r2, vr, _CMP_LT_OQ) &
                         _mm256_cmpneq_epi32_mask(idx, vself);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(buf + count),
                        _mm256_maskz_compress_epi32(hit, idx));
    count += _mm_popcnt_u32(hit);
  }
  return count;
}
#endif

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
    // Each cell of the caller's grid (at least `reach` wide) is split in F^d finer cells
    // (F = 2 unless that makes far more cells than particles), and a particle scans the
    // cells within R = F of its own along each axis: with F = 2 that is 5^3 cells of half
    // the width, 42% of the volume of the 3^3 full-width cells, so 42% of the distance
    // tests. Along the last axis the scanned cells are one contiguous run in cell order.
    const int64_t F = (8 * n_cells <= 16 * n + 1024) ? 2 : 1;
    int64_t fine[3] = {1, 1, 1};
    int64_t n_fine = 1;
    for (int64_t k = 0; k < d; ++k) fine[k] = F * grid[k];
    for (int64_t k = 0; k < 3; ++k) {
      if (fine[k] > kMaxIndex || n_fine > kMaxIndex / fine[k]) {
        return ffi::Error::InvalidArgument("simlib_neighbors: too many cells");
      }
      n_fine *= fine[k];
    }
    std::vector<int32_t> cell(n), start(n_fine + 1, 0), members(n), coarse_count(n_cells, 0);
    std::vector<T> wrapped(n * d);
    for (int64_t i = 0; i < n; ++i) {
      int64_t c = 0, cc = 0;
      for (int64_t k = 0; k < d; ++k) {
        T xk = x[i * d + k];
        if (periodic) xk = Wrap(xk, geo[2 * d + k]);
        wrapped[i * d + k] = xk;
        const T u = (xk - geo[k]) / geo[d + k];
        // F u is exact (a power of two), and floor(2u) / 2 = floor(u): the fine cell lies
        // inside the coarse one, which is the cell the pure-JAX build uses.
        const int64_t fk = CellCoordinate(static_cast<double>(u) * F, fine[k], periodic);
        c = c * fine[k] + fk;
        cc = cc * grid[k] + fk / F;
      }
      for (int64_t k = d; k < 3; ++k) c = c * fine[k];
      cell[i] = static_cast<int32_t>(c);      // in [0, n_fine) by construction
      start[c + 1]++;
      coarse_count[cc]++;                      // cc in [0, n_cells) likewise
    }
    for (int64_t c = 0; c < n_cells; ++c) {
      occupancy = coarse_count[c] > occupancy ? coarse_count[c] : occupancy;
    }
    for (int64_t c = 0; c < n_fine; ++c) start[c + 1] += start[c];
    // Coordinates in cell order (structure of arrays, zeros for absent axes), so each cell
    // and each run of cells along the last axis is a contiguous range.
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
    const T* sx = sorted[0].data();
    const T* sy = sorted[1].data();
    const T* sz = sorted[2].data();
    const int64_t R = F;
#pragma omp parallel reduction(max : max_count)
    {
      std::vector<int32_t> found(n + kSlack);   // candidate slots within reach, per thread
#pragma omp for schedule(dynamic, 64)
      for (int64_t si = 0; si < n; ++si) {      // particles in cell order: neighbouring
        const int64_t i = members[si];          // rows read the same cells
        int64_t ci[3];
        int64_t rest = cell[i];
        for (int64_t k = 2; k >= 0; --k) {
          ci[k] = rest % fine[k];
          rest /= fine[k];
        }
        // The distinct cells to scan along each axis: ci - R .. ci + R, clipped to the grid
        // in free space; in a periodic box wrapped, with the shift that brings the
        // wrapped cell's particles to their image next to particle i (so no minimum-image
        // correction per pair), or every cell once with minimum images when the box has
        // fewer than 2R + 1 cells along the axis. Sorted, so the last axis merges into runs.
        int64_t cells[3][5];
        T shift[3][5];
        int64_t n_along[3];
        bool min_image = false;
        for (int64_t k = 0; k < 3; ++k) {
          int64_t m = 0;
          if (fine[k] == 1) {
            cells[k][0] = 0;
            shift[k][0] = T(0);
            m = 1;
            min_image = min_image || periodic;   // a 1-cell periodic axis: any image
          } else if (periodic && fine[k] < 2 * R + 1) {
            for (int64_t c = 0; c < fine[k]; ++c) {
              cells[k][m] = c;
              shift[k][m++] = T(0);
            }
            min_image = true;
          } else {
            for (int64_t o = -R; o <= R; ++o) {
              int64_t c = ci[k] + o;
              T sh = T(0);
              if (periodic) {
                if (c < 0) { c += fine[k]; sh = box[k]; }
                if (c >= fine[k]) { c -= fine[k]; sh = -box[k]; }
              } else if (c < 0 || c >= fine[k]) {
                continue;
              }
              cells[k][m] = c;
              shift[k][m++] = sh;
            }
            for (int64_t p = 1; p < m; ++p)     // insertion sort of at most 5 cells
              for (int64_t q = p; q > 0 && cells[k][q - 1] > cells[k][q]; --q) {
                std::swap(cells[k][q], cells[k][q - 1]);
                std::swap(shift[k][q], shift[k][q - 1]);
              }
          }
          n_along[k] = m;
        }
        const T xi = sx[si], yi = sy[si], zi = sz[si];
        int32_t count = 0;
        int32_t* buf = found.data();
        const int32_t self = static_cast<int32_t>(si);
        for (int64_t a = 0; a < n_along[0]; ++a)
          for (int64_t b = 0; b < n_along[1]; ++b) {
            const int64_t base = (cells[0][a] * fine[1] + cells[1][b]) * fine[2];
            int64_t e = 0;
            while (e < n_along[2]) {
              int64_t f = e;
              while (f + 1 < n_along[2] && cells[2][f + 1] == cells[2][f] + 1 &&
                     shift[2][f + 1] == shift[2][f]) {
                ++f;
              }
              const int32_t s0 = start[base + cells[2][e]];
              const int32_t s1 = start[base + cells[2][f] + 1];
              if (min_image) {
                for (int32_t s = s0; s < s1; ++s) {
                  T dx = xi - sx[s], dy = yi - sy[s], dz = zi - sz[s];
                  // |dk| < box: one correction gives the minimum image
                  dx -= dx > T(0.5) * box[0] ? box[0] : T(0);
                  dx += dx < T(-0.5) * box[0] ? box[0] : T(0);
                  dy -= dy > T(0.5) * box[1] ? box[1] : T(0);
                  dy += dy < T(-0.5) * box[1] ? box[1] : T(0);
                  dz -= dz > T(0.5) * box[2] ? box[2] : T(0);
                  dz += dz < T(-0.5) * box[2] ? box[2] : T(0);
                  const T r2 = dx * dx + dy * dy + dz * dz;
                  buf[count] = s;               // branch-free: kept only when within
                  count += (r2 < reach2) & (s != self);   // false for NaN distances
                }
              } else {
                count = AppendWithin<T>(sx, sy, sz, s0, s1, xi + shift[0][a],
                                        yi + shift[1][b], zi + shift[2][e], reach2, self, buf,
                                        count);
              }
              e = f + 1;
            }
          }
        int32_t* row = out + i * capacity;
        const int64_t kept = count < capacity ? count : capacity;
        for (int64_t t = 0; t < kept; ++t) row[t] = members[buf[t]];
        for (int64_t t = kept; t < capacity; ++t) row[t] = static_cast<int32_t>(n);
        max_count = count > max_count ? count : max_count;
      }
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
