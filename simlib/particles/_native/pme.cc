// Smooth particle-mesh Ewald: B-spline charge spreading and force gathering, as XLA FFI
// custom calls for the CPU (the FFT and the influence function stay in XLA).
//
//   u_ia   = x_ia K_a / L_a,   b_ia = floor(u_ia),   w_ia = u_ia - b_ia
//   theta_i(k) = prod_a M_p(w_ia + j_a),   k_a = (b_ia - j_a) mod K_a,   j_a = 0..p-1
//   Q(k)   = sum_i q_i theta_i(k)                                     (spreading)
//   phi_i  = sum_k theta_i(k) phi(k)              (= dE/dq_i for phi = dE/dQ, the potential)
//   F_ia   = -q_i (K_a / L_a) sum_k d theta_i(k)/d w_ia phi(k)        (gathering)
//
// M_p is the cardinal B-spline of order p, from M_2 by the recursion
// M_n(x) = [x M_{n-1}(x) + (n - x) M_{n-1}(x - 1)] / (n - 1), and its derivative
// M_p'(x) = M_{p-1}(x) - M_{p-1}(x - 1) (Essmann et al., J. Chem. Phys. 103, 8577 (1995),
// eqs. 4.1 and 4.6). The semantics (indices, weights, the order of the recursion's
// operations) are those of simlib's pure-JAX `PME.spread`, the reference the tests compare
// these kernels with and the fallback where they cannot be built.
//
// Threads: spreading gives each thread a slab of x-planes of the grid; every thread walks all
// particles in order and adds the stencil planes it owns, so each grid point receives its
// contributions in particle order whatever the thread count (the same bits on 1 or 8
// threads) and no two threads write the same point. Gathering is independent per particle.
//
// Memory safety: grid indices come from positions only after range reduction: a particle
// with a non-finite scaled coordinate is never indexed; spreading then fills the whole grid
// with NaN (the energy and every force become NaN, as in JAX where the NaN lands on some
// grid point), and gathering gives that particle NaN forces and potential. A finite
// coordinate is reduced into [0, K) in double precision before it becomes an index.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include <omp.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kMaxOrder = 8;

// The weights M_p(w + j), j = 0..p-1, for one coordinate (and, with D, their w-derivatives
// M_{p-1}(w + j) - M_{p-1}(w + j - 1)), by the recursion in the order simlib's
// `_bspline_weights` evaluates it (dividing by n - 1, as it does).
template <typename T, int P, bool D>
inline void WeightsExact(T w, T* m, T* dm) {
  T cur[kMaxOrder + 1];
  cur[0] = w;
  cur[1] = T(1) - w;
  for (int n = 3; n <= P; ++n) {
    if (D && n == P) {
      for (int j = 0; j < P; ++j) {
        const T lo = j < n - 1 ? cur[j] : T(0);
        const T hi = j > 0 ? cur[j - 1] : T(0);
        dm[j] = lo - hi;
      }
    }
    T next[kMaxOrder + 1];
    for (int j = 0; j < n; ++j) {
      const T prev_j = j < n - 1 ? cur[j] : T(0);
      const T prev_jm1 = j > 0 ? cur[j - 1] : T(0);
      next[j] = ((w + T(j)) * prev_j + (T(n) - w - T(j)) * prev_jm1) / T(n - 1);
    }
    for (int j = 0; j < n; ++j) cur[j] = next[j];
  }
  for (int j = 0; j < P; ++j) m[j] = cur[j];
}

// One particle's stencil: base indices (already reduced into [0, K)) and weights.
template <typename T, int P>
struct Stencil {
  int32_t base[3];
  T m[3][P];
  T dm[3][P];
  bool ok;
};

// u = x * (K / L) as JAX computes it (the scale in T), then floor and the reduced base.
template <typename T, int P, bool D>
inline void MakeStencil(const T* x, const T* scale, const int64_t* dims, Stencil<T, P>* s) {
  s->ok = true;
  for (int a = 0; a < 3; ++a) {
    const T u = x[a] * scale[a];
    if (!std::isfinite(u)) {
      s->ok = false;
      s->base[a] = 0;
      for (int j = 0; j < P; ++j) s->m[a][j] = s->dm[a][j] = T(0);
      continue;
    }
    const T fl = std::floor(u);
    const T w = u - fl;
    // floor(u) mod K in double (exact for |u| < 2^53; beyond, any in-range index will do:
    // the weights are those of w, and such a position is meaningless anyway)
    const double k = static_cast<double>(dims[a]);
    double b = std::fmod(static_cast<double>(fl), k);
    if (b < 0) b += k;
    int64_t bi = static_cast<int64_t>(b);
    if (bi < 0 || bi >= dims[a]) bi = 0;
    s->base[a] = static_cast<int32_t>(bi);
    WeightsExact<T, P, D>(w, s->m[a], s->dm[a]);
  }
}

template <typename T, int P>
void Spread(const T* x, const T* q, int64_t n, const T* scale, const int64_t* dims, T* grid) {
  const int64_t k1 = dims[0], k2 = dims[1], k3 = dims[2];
  const int64_t plane = k2 * k3;
  // One parallel region without inner barriers (threads that wait on each other lose most
  // on a loaded machine): every thread checks all positions itself, then fills its planes.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = k1 * t / nt, hi = k1 * (t + 1) / nt;    // this thread's x-planes
    bool bad = false;
    for (int64_t i = 0; i < 3 * n; ++i) bad |= !std::isfinite(x[i] * scale[i % 3]);
    T* mine = grid + lo * plane;
    const size_t count = static_cast<size_t>((hi - lo) * plane);
    if (bad) {
      std::fill(mine, mine + count, std::numeric_limits<T>::quiet_NaN());
    } else if (count > 0) {
      std::memset(mine, 0, sizeof(T) * count);
      for (int64_t i = 0; i < n; ++i) {
        // the x-planes of this particle's stencil first: skip it unless one is ours
        const T ux = x[3 * i] * scale[0];
        const double k = static_cast<double>(k1);
        double bx = std::fmod(static_cast<double>(std::floor(ux)), k);
        if (bx < 0) bx += k;
        const int64_t b0 = static_cast<int64_t>(bx);
        bool touches = false;
        for (int a = 0; a < P; ++a) {
          const int64_t gx = b0 - a < 0 ? b0 - a + k1 : b0 - a;
          touches |= gx >= lo && gx < hi;
        }
        if (!touches) continue;
        Stencil<T, P> s;
        MakeStencil<T, P, false>(x + 3 * i, scale, dims, &s);
        int64_t zi[P];
        for (int c = 0; c < P; ++c) {
          const int64_t z = s.base[2] - c;
          zi[c] = z < 0 ? z + k3 : z;
        }
        const T qi = q[i];
        for (int a = 0; a < P; ++a) {
          int64_t gx = s.base[0] - a;
          gx = gx < 0 ? gx + k1 : gx;
          if (gx < lo || gx >= hi) continue;
          const T qa = qi * s.m[0][a];
          T* pa = grid + gx * plane;
          for (int b = 0; b < P; ++b) {
            int64_t gy = s.base[1] - b;
            gy = gy < 0 ? gy + k2 : gy;
            const T qab = qa * s.m[1][b];
            T* row = pa + gy * k3;
#pragma GCC unroll 8
            for (int c = 0; c < P; ++c) row[zi[c]] += qab * s.m[2][c];
          }
        }
      }
    }
  }
}

template <typename T, int P>
void Gather(const T* x, const T* q, int64_t n, const T* scale, const int64_t* dims,
            const T* grid, T* f, T* pot) {
  const int64_t k1 = dims[0], k2 = dims[1], k3 = dims[2];
  const int64_t plane = k2 * k3;
  const T nan = std::numeric_limits<T>::quiet_NaN();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Stencil<T, P> s;
    MakeStencil<T, P, true>(x + 3 * i, scale, dims, &s);
    if (!s.ok) {
      f[3 * i] = f[3 * i + 1] = f[3 * i + 2] = nan;
      pot[i] = nan;
      continue;
    }
    int64_t zi[P];
    for (int c = 0; c < P; ++c) {
      const int64_t z = s.base[2] - c;
      zi[c] = z < 0 ? z + k3 : z;
    }
    T e = 0, gx = 0, gy = 0, gz = 0;
    for (int a = 0; a < P; ++a) {
      int64_t ix = s.base[0] - a;
      ix = ix < 0 ? ix + k1 : ix;
      const T* pa = grid + ix * plane;
      T ea = 0, ga_y = 0, ga_z = 0;
      for (int b = 0; b < P; ++b) {
        int64_t iy = s.base[1] - b;
        iy = iy < 0 ? iy + k2 : iy;
        const T* row = pa + iy * k3;
        T v = 0, vz = 0;
#pragma GCC unroll 8
        for (int c = 0; c < P; ++c) {
          const T g = row[zi[c]];
          v += s.m[2][c] * g;
          vz += s.dm[2][c] * g;
        }
        ea += s.m[1][b] * v;
        ga_y += s.dm[1][b] * v;
        ga_z += s.m[1][b] * vz;
      }
      e += s.m[0][a] * ea;
      gx += s.dm[0][a] * ea;
      gy += s.m[0][a] * ga_y;
      gz += s.m[0][a] * ga_z;
    }
    const T qi = q[i];
    pot[i] = e;
    f[3 * i] = -qi * scale[0] * gx;
    f[3 * i + 1] = -qi * scale[1] * gy;
    f[3 * i + 2] = -qi * scale[2] * gz;
  }
}

template <typename T>
using SpreadFn = void (*)(const T*, const T*, int64_t, const T*, const int64_t*, T*);
template <typename T>
using GatherFn = void (*)(const T*, const T*, int64_t, const T*, const int64_t*, const T*, T*,
                          T*);

template <typename T>
SpreadFn<T> SpreadFor(int64_t p) {
  switch (p) {
    case 3: return Spread<T, 3>;
    case 4: return Spread<T, 4>;
    case 5: return Spread<T, 5>;
    case 6: return Spread<T, 6>;
    case 7: return Spread<T, 7>;
    case 8: return Spread<T, 8>;
    default: return nullptr;
  }
}

template <typename T>
GatherFn<T> GatherFor(int64_t p) {
  switch (p) {
    case 3: return Gather<T, 3>;
    case 4: return Gather<T, 4>;
    case 5: return Gather<T, 5>;
    case 6: return Gather<T, 6>;
    case 7: return Gather<T, 7>;
    case 8: return Gather<T, 8>;
    default: return nullptr;
  }
}

// Shapes and the scale K_a / L_a (in T, as JAX computes it); an error names the problem.
template <typename T>
const char* Prepare(ffi::Span<const int64_t> xdims, size_t nq, size_t nbox, const T* box,
                    ffi::Span<const int64_t> gdims, int64_t order, int64_t dims[3],
                    T scale[3]) {
  if (xdims.size() != 2 || xdims[1] != 3) return "positions must have shape (n, 3)";
  if (nq != static_cast<size_t>(xdims[0])) return "charges must have shape (n,)";
  if (nbox != 3) return "box must have shape (3,)";
  if (gdims.size() != 3) return "the grid must be three-dimensional";
  if (order < 3 || order > kMaxOrder) return "order must be in [3, 8]";
  for (int a = 0; a < 3; ++a) {
    dims[a] = gdims[a];
    if (dims[a] < order || dims[a] > (int64_t(1) << 24)) {
      return "grid sizes must be in [order, 2^24]";
    }
    scale[a] = T(static_cast<double>(dims[a])) / box[a];
  }
  return nullptr;
}

}  // namespace

template <typename T, ffi::DataType DT>
static ffi::Error PmeSpread(ffi::Buffer<DT> positions, ffi::Buffer<DT> charges,
                            ffi::Buffer<DT> box, ffi::ResultBuffer<DT> grid, int64_t order) {
  int64_t dims[3];
  T scale[3];
  const char* err = Prepare<T>(positions.dimensions(), charges.element_count(),
                               box.element_count(), box.typed_data(), grid->dimensions(),
                               order, dims, scale);
  if (err != nullptr) {
    return ffi::Error::InvalidArgument(std::string("simlib_pme_spread: ") + err);
  }
  try {
    SpreadFor<T>(order)(positions.typed_data(), charges.typed_data(), positions.dimensions()[0],
                        scale, dims, grid->typed_data());
  } catch (const std::exception& e) {       // never let an exception cross the FFI
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("simlib_pme_spread: ") + e.what());
  }
  return ffi::Error::Success();
}

template <typename T, ffi::DataType DT>
static ffi::Error PmeGather(ffi::Buffer<DT> positions, ffi::Buffer<DT> charges,
                            ffi::Buffer<DT> box, ffi::Buffer<DT> grid,
                            ffi::ResultBuffer<DT> forces, ffi::ResultBuffer<DT> potential,
                            int64_t order) {
  int64_t dims[3];
  T scale[3];
  const char* err = Prepare<T>(positions.dimensions(), charges.element_count(),
                               box.element_count(), box.typed_data(), grid.dimensions(), order,
                               dims, scale);
  if (err != nullptr) {
    return ffi::Error::InvalidArgument(std::string("simlib_pme_gather: ") + err);
  }
  const size_t n = charges.element_count();
  if (forces->element_count() != 3 * n || potential->element_count() != n) {
    return ffi::Error::InvalidArgument("simlib_pme_gather: outputs must be (n, 3) and (n,)");
  }
  GatherFor<T>(order)(positions.typed_data(), charges.typed_data(), static_cast<int64_t>(n),
                      scale, dims, grid.typed_data(), forces->typed_data(),
                      potential->typed_data());
  return ffi::Error::Success();
}

#define SIMLIB_PME_SPREAD(NAME, T, DT)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (PmeSpread<T, DT>),                       \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Attr<int64_t>("order"));
#define SIMLIB_PME_GATHER(NAME, T, DT)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (PmeGather<T, DT>),                       \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Attr<int64_t>("order"));

SIMLIB_PME_SPREAD(simlib_pme_spread_f32, float, ffi::F32)
SIMLIB_PME_SPREAD(simlib_pme_spread_f64, double, ffi::F64)
SIMLIB_PME_GATHER(simlib_pme_gather_f32, float, ffi::F32)
SIMLIB_PME_GATHER(simlib_pme_gather_f64, double, ffi::F64)
