// Lennard-Jones 12-6 energy and forces over a neighbour list, as an XLA FFI custom call for
// the CPU.
//
//   u(r) = 4 eps [(sigma/r)^12 - (sigma/r)^6] - s u_c,   u_c = u(r_c) without the shift
//   F_i  = sum_j 24 eps [2 (sigma/r)^12 - (sigma/r)^6] (x_i - x_j) / r^2       (r < r_c)
//   U    = 1/2 sum_i sum_j u(r_ij)
//   W    = 1/2 sum_i sum_j r_ij . f_ij = 1/2 sum_i sum_j 24 eps [2 (sigma/r)^12 - (sigma/r)^6]
//   W_aa = 1/2 sum_i sum_j r_ij,a f_ij,a                        (a = x, y, z; `diagonal`)
//
// (W, the pair virial, is the pressure's share of the forces, P = (2K + W) / (3V), and
// W_aa the diagonal of the virial tensor, P_aa = (2K_aa + W_aa) / V, for an orthorhombic
// barostat; both come out of the same pass over the pairs, so a constant-pressure step
// visits its pairs once. The diagonal is summed only by the simlib_lj_diag targets (a
// separate instantiation of the loops), so the plain force call pays nothing for it.)
// (Lennard-Jones, Proc. R. Soc. A 106, 463 (1924); truncation and shift as in Allen &
// Tildesley, Computer Simulation of Liquids, 2nd ed. (2017), section 1.6.) The list is the
// full one simlib builds (`neighbor_list`: both (i, j) and (j, i), rows padded with n), so
// every row is independent: OpenMP threads share the rows and never write the same force,
// and no Newton's-third-law scatter is needed. The inner loop over a row's slots is one
// straight SIMD loop (`omp simd`: gathers of the neighbour coordinates, selects for the
// masks). Parameters: `sigma` and `epsilon` are one value (mode 0) or one per particle
// mixed by Lorentz-Berthelot, sigma_ij = (sigma_i + sigma_j) / 2 and
// eps_ij = sqrt(eps_i eps_j) (mode 1); the shift is then per pair. The semantics are those
// of simlib's pure-JAX pair energy (`PairEnergy._neighbor_pass` with `lennard_jones`),
// which is the reference that tests this kernel and the fallback where it cannot be built:
// a slot counts when its index is a particle (0 <= j < n) and r^2 < r_c^2; the minimum
// image is d - L rint(d / L) in a periodic box.
//
// Memory safety: the only indices read from data are the neighbour indices, and a slot
// whose index is not in [0, n) reads particle i's own coordinates instead and is masked
// out; no index is ever derived from a position. Sizes are checked against n first
// (mismatches are FFI errors, i.e. Python exceptions). NaN, infinite or huge positions
// give non-finite results, never a stray access: a particle with a listed neighbour at a
// non-finite displacement gets a NaN force (all three components, where JAX's
// where(mask, c, 0) * dx makes only the affected components NaN) and that pair's energy is
// masked to 0, as in JAX; two atoms at the same place give r = 0 and so a non-finite
// energy and forces (0 * inf), as the pure-JAX kernel does: simulate's checks report
// them. A pair at r^2 = 0 is never skipped or clamped here.
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <typename T, bool Periodic, bool Mixed, bool Diag>
void Rows(const T* x, const int32_t* idx, int64_t n, int64_t cap, const T* sig, const T* eps,
          const T* box, T rc2, bool shift, T* f, double& energy_out, double* virial_out) {
  const T bx = Periodic ? box[0] : T(1), by = Periodic ? box[1] : T(1),
          bz = Periodic ? box[2] : T(1);
  const T ibx = T(1) / bx, iby = T(1) / by, ibz = T(1) / bz;
  const T inv_rc2 = T(1) / rc2;
  // Mode 0: the pair parameters and the shift are the same for every pair.
  const T sig0 = sig[0], eps0 = eps[0];
  const T c20 = sig0 * sig0 * inv_rc2, c60 = c20 * c20 * c20;
  const T shift0 = shift ? T(4) * eps0 * (c60 * c60 - c60) : T(0);
  const int32_t n32 = static_cast<int32_t>(n);
  // Coordinates as structure of arrays, so a slot's neighbour is three 32-bit-index gathers.
  std::vector<T> soa(3 * n);
  T* xs = soa.data();
  T* ys = xs + n;
  T* zs = ys + n;
  // Row energies, summed in row order afterwards: the same bits whatever thread ran which
  // rows (an OpenMP reduction adds the threads' partial sums in an unspecified order, and
  // a checkpointed run must resume bit-identically).
  std::vector<double> row_energy(n), row_virial(n), row_diag(Diag ? 3 * n : 0);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      xs[i] = x[3 * i]; ys[i] = x[3 * i + 1]; zs[i] = x[3 * i + 2];
    }
    std::vector<int32_t> inside(Mixed && cap > 0 ? cap : 1);   // per thread
    std::vector<unsigned char> flag(Mixed && cap > 0 ? cap : 1);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* row = idx + i * cap;
      const int32_t self = static_cast<int32_t>(i);
      const T xi = xs[i], yi = ys[i], zi = zs[i];
      T fx = 0, fy = 0, fz = 0, u = 0, w = 0, wx = 0, wy = 0, wz = 0, bad = 0;
      if constexpr (Mixed) {
        const T si = sig[i], ei = eps[i];
        // Per-particle parameters: the mixing (a square root) makes a slot dear, so the
        // row's neighbours within the cutoff are found first (a SIMD loop of distances),
        // compacted, and the pair terms evaluated for them only: the same pairs, selects
        // and NaN rule as below, in two passes.
        unsigned char* fl = flag.data();
#pragma omp simd reduction(+ : bad)
        for (int64_t s = 0; s < cap; ++s) {
          const int32_t j = row[s];
          const bool valid = static_cast<uint32_t>(j) < static_cast<uint32_t>(n32);
          const int32_t jj = valid ? j : self;   // never an index from outside [0, n)
          T dx = xi - xs[jj], dy = yi - ys[jj], dz = zi - zs[jj];
          if (Periodic) {
            dx -= bx * std::rint(dx * ibx);
            dy -= by * std::rint(dy * iby);
            dz -= bz * std::rint(dz * ibz);
          }
          const T r2 = dx * dx + dy * dy + dz * dz;
          fl[s] = valid & (r2 < rc2);            // false for NaN distances
          bad += (std::isfinite(dx) & std::isfinite(dy) & std::isfinite(dz)) ? T(0) : T(1);
        }
        int64_t m = 0;
        int32_t* in = inside.data();
        for (int64_t s = 0; s < cap; ++s) {      // branch-free compaction
          in[m] = row[s];
          m += fl[s];
        }
#pragma omp simd reduction(+ : fx, fy, fz, u, w, wx, wy, wz)
        for (int64_t t = 0; t < m; ++t) {
          const int32_t j = in[t];               // in [0, n): checked above
          T dx = xi - xs[j], dy = yi - ys[j], dz = zi - zs[j];
          if (Periodic) {
            dx -= bx * std::rint(dx * ibx);
            dy -= by * std::rint(dy * iby);
            dz -= bz * std::rint(dz * ibz);
          }
          const T r2 = dx * dx + dy * dy + dz * dz;
          const T sg = T(0.5) * (si + sig[j]);
          const T ep = std::sqrt(ei * eps[j]);
          const T c2 = sg * sg * inv_rc2, c6 = c2 * c2 * c2;
          const T sh = shift ? T(4) * ep * (c6 * c6 - c6) : T(0);
          const T inv2 = T(1) / r2;
          const T s2 = sg * sg * inv2;
          const T s6 = s2 * s2 * s2;
          const T c = T(24) * ep * (T(2) * s6 * s6 - s6) * inv2;
          fx += c * dx;
          fy += c * dy;
          fz += c * dz;
          u += T(4) * ep * (s6 * s6 - s6) - sh;
          w += c * r2;
          if constexpr (Diag) {
            wx += c * dx * dx;
            wy += c * dy * dy;
            wz += c * dz * dz;
          }
        }
      } else {
#pragma omp simd reduction(+ : fx, fy, fz, u, w, wx, wy, wz, bad)
        for (int64_t s = 0; s < cap; ++s) {
          const int32_t j = row[s];
          const bool valid = static_cast<uint32_t>(j) < static_cast<uint32_t>(n32);
          const int32_t jj = valid ? j : self;     // never an index from outside [0, n)
          T dx = xi - xs[jj], dy = yi - ys[jj], dz = zi - zs[jj];
          if (Periodic) {
            dx -= bx * std::rint(dx * ibx);
            dy -= by * std::rint(dy * iby);
            dz -= bz * std::rint(dz * ibz);
          }
          const T r2 = dx * dx + dy * dy + dz * dz;
          const bool in = valid & (r2 < rc2);      // false for NaN distances
          const T sg = sig0, ep = eps0, sh = shift0;   // mode 0 (mixing: the branch above)
          const T inv2 = T(1) / r2;                // r = 0: inf, then NaN (selected out
                                                   // for padding slots, which read i)
          const T s2 = sg * sg * inv2;
          const T s6 = s2 * s2 * s2;
          const T pu = T(4) * ep * (s6 * s6 - s6) - sh;
          const T c = T(24) * ep * (T(2) * s6 * s6 - s6) * inv2;
          fx += in ? c * dx : T(0);
          fy += in ? c * dy : T(0);
          fz += in ? c * dz : T(0);
          u += in ? pu : T(0);
          w += in ? c * r2 : T(0);
          if constexpr (Diag) {
            wx += in ? c * dx * dx : T(0);
            wy += in ? c * dy * dy : T(0);
            wz += in ? c * dz * dz : T(0);
          }
          // A neighbour at a non-finite displacement is outside the cutoff (r2 is NaN or
          // inf), so the selects drop it, where JAX's where(mask, c, 0) * dx is NaN: count
          // them, and the row's force is NaN (its pair energy stays masked to 0, as in JAX).
          bad += (std::isfinite(dx) & std::isfinite(dy) & std::isfinite(dz)) ? T(0) : T(1);
        }
      }
      constexpr T nan = std::numeric_limits<T>::quiet_NaN();
      f[3 * i] = bad == T(0) ? fx : nan;
      f[3 * i + 1] = bad == T(0) ? fy : nan;
      f[3 * i + 2] = bad == T(0) ? fz : nan;
      row_energy[i] = static_cast<double>(u);
      row_virial[i] = static_cast<double>(w);
      if constexpr (Diag) {
        row_diag[3 * i] = static_cast<double>(wx);
        row_diag[3 * i + 1] = static_cast<double>(wy);
        row_diag[3 * i + 2] = static_cast<double>(wz);
      }
    }
  }
  double total = 0.0, virial = 0.0, diag[3] = {0.0, 0.0, 0.0};
  for (int64_t i = 0; i < n; ++i) total += row_energy[i];
  for (int64_t i = 0; i < n; ++i) virial += row_virial[i];
  if constexpr (Diag) {
    for (int64_t i = 0; i < n; ++i) {
      diag[0] += row_diag[3 * i];
      diag[1] += row_diag[3 * i + 1];
      diag[2] += row_diag[3 * i + 2];
    }
  }
  energy_out = 0.5 * total;
  virial_out[0] = 0.5 * virial;
  for (int k = 0; k < 3; ++k) virial_out[k + 1] = 0.5 * diag[k];
}

// The four instantiations of the loops for one dtype and one `diagonal`.
template <typename T, bool Diag>
void Dispatch(bool periodic, bool mixed, const T* x, const int32_t* nb, int64_t n, int64_t cap,
              const T* sg, const T* ep, const T* bx, T rc2, bool sh, T* out, double& e,
              double* vir) {
  if (periodic) {
    if (mixed) Rows<T, true, true, Diag>(x, nb, n, cap, sg, ep, bx, rc2, sh, out, e, vir);
    else Rows<T, true, false, Diag>(x, nb, n, cap, sg, ep, bx, rc2, sh, out, e, vir);
  } else {
    if (mixed) Rows<T, false, true, Diag>(x, nb, n, cap, sg, ep, bx, rc2, sh, out, e, vir);
    else Rows<T, false, false, Diag>(x, nb, n, cap, sg, ep, bx, rc2, sh, out, e, vir);
  }
}

}  // namespace

// Diag = false: `virial` is the scalar W (target simlib_lj_f32/f64); Diag = true: it is the
// diagonal (W_xx, W_yy, W_zz) (target simlib_lj_diag_f32/f64).
template <typename T, ffi::DataType DT, bool Diag>
static ffi::Error LennardJones(ffi::Buffer<DT> positions, ffi::Buffer<ffi::S32> neighbors,
                               ffi::Buffer<DT> sigma, ffi::Buffer<DT> epsilon,
                               ffi::Buffer<DT> box, ffi::ResultBuffer<DT> forces,
                               ffi::ResultBuffer<DT> energy, ffi::ResultBuffer<DT> virial,
                               double r_cut, int64_t shift,
                               int64_t periodic) {
  const auto dims = positions.dimensions();
  if (dims.size() != 2 || dims[1] != 3) {
    return ffi::Error::InvalidArgument("simlib_lj: positions must have shape (n, 3)");
  }
  const int64_t n = dims[0];
  const auto ndims = neighbors.dimensions();
  if (ndims.size() != 2 || ndims[0] != n || ndims[1] < 0 ||
      n > static_cast<int64_t>(INT32_MAX)) {
    return ffi::Error::InvalidArgument("simlib_lj: neighbors must have shape (n, capacity)");
  }
  const size_t ns = sigma.element_count(), ne = epsilon.element_count();
  const bool mixed = ns == static_cast<size_t>(n) && n > 1;
  if (ns != ne || !(ns == 1 || ns == static_cast<size_t>(n)) || box.element_count() < 3 ||
      forces->element_count() != static_cast<size_t>(3 * n) || energy->element_count() < 1 ||
      (Diag ? virial->element_count() != 3 : virial->element_count() < 1)) {
    return ffi::Error::InvalidArgument("simlib_lj: need sigma and epsilon both (1,) or both "
                                       "(n,), box (3,), forces (n, 3), a scalar energy and "
                                       "a scalar virial (its diagonal (3,) for simlib_lj_diag)");
  }
  if (!(r_cut > 0.0) || !std::isfinite(r_cut)) {
    return ffi::Error::InvalidArgument("simlib_lj: r_cut must be positive and finite");
  }
  T* vout = virial->typed_data();
  if (n == 0) {
    energy->typed_data()[0] = T(0);
    for (int k = 0; k < (Diag ? 3 : 1); ++k) vout[k] = T(0);
    return ffi::Error::Success();
  }
  const T rc2 = static_cast<T>(r_cut * r_cut);
  const int64_t cap = ndims[1];
  double e = 0.0, vir[4] = {0.0, 0.0, 0.0, 0.0};
  try {
    const T* x = positions.typed_data();
    const int32_t* nb = neighbors.typed_data();
    const T* sg = sigma.typed_data();
    const T* ep = epsilon.typed_data();
    const T* bx = box.typed_data();
    T* out = forces->typed_data();
    const bool sh = shift != 0;
    Dispatch<T, Diag>(periodic != 0, mixed, x, nb, n, cap, sg, ep, bx, rc2, sh, out, e, vir);
  } catch (const std::exception& err) {     // never let an exception cross the FFI
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, std::string("simlib_lj: ") + err.what());
  }
  energy->typed_data()[0] = static_cast<T>(e);
  if constexpr (Diag) {
    for (int k = 0; k < 3; ++k) vout[k] = static_cast<T>(vir[k + 1]);
  } else {
    vout[0] = static_cast<T>(vir[0]);
  }
  return ffi::Error::Success();
}

#define SIMLIB_LJ_HANDLER(NAME, T, DT, DIAG)                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (LennardJones<T, DT, DIAG>),              \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<ffi::S32>>()               \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Attr<double>("r_cut")                      \
                                    .Attr<int64_t>("shift")                     \
                                    .Attr<int64_t>("periodic"));

SIMLIB_LJ_HANDLER(simlib_lj_f32, float, ffi::F32, false)
SIMLIB_LJ_HANDLER(simlib_lj_f64, double, ffi::F64, false)
SIMLIB_LJ_HANDLER(simlib_lj_diag_f32, float, ffi::F32, true)
SIMLIB_LJ_HANDLER(simlib_lj_diag_f64, double, ffi::F64, true)
