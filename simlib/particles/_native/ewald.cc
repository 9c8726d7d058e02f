// The real-space Ewald pair sum over a neighbour list, as an XLA FFI custom call for the CPU.
//
//   g(r)  = erfc(alpha r) / r
//   U     = 1/2 sum_i sum_j q_i q_j g(r_ij)                    (r_ij < r_c, listed pairs)
//   F_i   = q_i sum_j q_j [g(r) + 2 alpha/sqrt(pi) exp(-alpha^2 r^2)] (x_i - x_j) / r^2
//   phi_i = sum_j q_j g(r_ij)                                  (= dU/dq_i)
//   dU/dL_a  = 1/2 sum_i sum_j c_ij d_a n_a,   c_ij = the force coefficient above, q_i q_j
//              included, n_a = rint((x_i - x_j)_a / L_a) the image shift (partial derivative
//              at fixed positions: the minimum image is d_a = (x_i - x_j)_a - L_a n_a)
//   dU/dalpha = -1/2 sum_i sum_j q_i q_j 2/sqrt(pi) exp(-alpha^2 r^2)
//
// (Ewald, Ann. Phys. 369, 253 (1921); Allen & Tildesley, Computer Simulation of Liquids,
// 2nd ed. (2017), section 6.2.) The outputs are what the first derivatives of U with respect
// to every input need, so one pass serves the energy, the forces, dU/dq, the virial (the box
// derivative) and dU/dalpha. The list is the full one simlib builds (both (i, j) and (j, i),
// rows padded with n): rows are independent, OpenMP threads share them and never write the
// same output, and every row sum is made in row order, so the results do not depend on
// which thread ran which rows. The semantics are those of simlib's pure-JAX pair kernel
// (`PairEnergy._neighbor_pass` with the Ewald pair term), the reference the tests compare
// this kernel with and the fallback where it cannot be built: a slot counts when its index
// is a particle (0 <= j < n) and r^2 < r_c^2; the minimum image is d - L rint(d / L).
//
// erfc: erfc(x) = exp(-x^2) erfcx(x), with erfcx(x) = exp(x^2) erfc(x) as a Chebyshev series
// in s = (2 - x)/(2 + x), which maps x in [0, inf) onto (-1, 1] (the change of variable of
// Numerical Recipes, 3rd ed., section 6.2.2; the coefficients here were computed for this
// file by Chebyshev-Gauss quadrature at 40 digits with mpmath), truncated and evaluated in
// powers of s; relative error 6e-16 for x < 6 (float64), 3e-7 (float32). exp(y) for y <= 0:
// y = k ln2 + r, |r| <= ln2/2, a Taylor polynomial of r (degree 13 / 7) times 2^k built in
// the exponent bits; y below the smallest normal's exponent gives 0. Both are plain
// arithmetic with short dependency chains, so the slot loop is one
// SIMD loop (the C library's erfc and exp are not vectorised without -ffast-math).
//
// Memory safety, as in lj.cc: the only indices read from data are the neighbour indices; a
// slot whose index is not in [0, n) reads particle i's own data and is masked out; no index
// is derived from a position. NaN, infinite or huge positions give non-finite results,
// never a stray access: a row with a listed neighbour at a non-finite displacement gets NaN
// forces, potential and box derivative (its pair energy is masked to 0, as in JAX).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// erfcx(x) = sum_k a_k s^k, s = (2 - x)/(2 + x): the Chebyshev series of erfcx in s
// truncated to 28 terms (float64) or 13 (float32) and rewritten in powers of s (the power
// coefficients' absolute values sum to 1.02, so the rewriting loses nothing to cancellation).
// Maximum relative error, against mpmath, of the evaluation below in the format itself:
// 6e-16 for x < 6 and 5e-15 up to x = 26.6 (float64, where exp(-x^2) underflows); 3e-7 for
// x < 6 and 7e-7 up to 9.3 (float32).
constexpr double kErfcx64[28] = {
    2.5539567631050575e-1, 4.2718584741395839e-1, 2.4165819424246559e-1,
    7.8978581015733439e-2, 3.7328924043952337e-3, -6.9974617393062556e-3,
    -8.4714325328791722e-4, 9.8197703041971417e-4, 4.3555653837886278e-5,
    -1.7436123545424448e-4, 2.7524718514933489e-5, 2.7580464905564699e-5,
    -1.3960740925801469e-5, -1.3938441655585136e-6, 3.7470084736575337e-6,
    -1.1922501949557004e-6, -4.0601623458139763e-7, 4.9974138997626405e-7,
    -1.5108185201238984e-7, -6.1362254972666886e-8, 8.981211214214335e-8,
    -2.8735144934207328e-8, -2.1099840742468203e-8, 1.7177291205735645e-8,
    2.0111300971639535e-9, -4.0846068784163115e-9, 3.0705773182706043e-11,
    4.0742950842701037e-10,
};
constexpr double kErfcx32[13] = {
    2.5539567653928825e-1, 4.2718585636850527e-1, 2.4165817139128656e-1,
    7.8978330374153414e-2, 3.7332673347250788e-3, -6.9954608867136931e-3,
    -8.4947230256086812e-4, 9.7516373173473632e-4, 5.0556773059055288e-5,
    -1.632422016426402e-4, 1.6393225662023401e-5, 1.9353292101815916e-5,
    -4.5931633251454831e-6,
};

// 1/d! for the Taylor polynomial of exp.
constexpr double kInvFactorial[14] = {
    1.0, 1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320,
    1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800};

template <typename T> struct Prec;
template <> struct Prec<double> {
  static constexpr int kTerms = 28, kExpDegree = 13;
  static constexpr const double* kErfcx = kErfcx64;
  using Bits = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;   // fdlibm's split of ln 2
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kMinExp = -708.0;                       // exp(y) = 0 below
};
template <> struct Prec<float> {
  static constexpr int kTerms = 13, kExpDegree = 7;
  static constexpr const double* kErfcx = kErfcx32;
  using Bits = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
  static constexpr float kLn2Hi = 6.9314575195e-01f;              // 12 bits, k*hi exact
  static constexpr float kLn2Lo = 1.4286067653e-06f;
  static constexpr float kMinExp = -87.0f;
};

// exp(y) for y <= 0 (NaN and y < kMinExp: garbage or 0, selected by the caller / here).
template <typename T>
inline T ExpNonpositive(T y) {
  using P = Prec<T>;
  using Bits = typename P::Bits;
  const bool under = y < T(P::kMinExp);
  y = under ? T(0) : y;
  const T k = std::rint(y * T(1.4426950408889634));
  const T r = (y - k * T(P::kLn2Hi)) - k * T(P::kLn2Lo);
  // Taylor polynomial of exp(r) as even + odd parts in r^2: two short dependency chains.
  const T r2 = r * r;
  T even = 0, odd = 0;
#pragma GCC unroll 16
  for (int d = P::kExpDegree - (P::kExpDegree % 2); d >= 0; d -= 2) {
    even = even * r2 + T(kInvFactorial[d]);
  }
#pragma GCC unroll 16
  for (int d = P::kExpDegree - 1 + (P::kExpDegree % 2); d >= 1; d -= 2) {
    odd = odd * r2 + T(kInvFactorial[d]);
  }
  const T p = even + r * odd;
  // 2^k: k + 2^mantissa + bias has k + bias in its low bits; shift them into the exponent.
  const T magic = k + (T(Bits(1) << P::kMantissa) + T(P::kBias));
  Bits bits;
  std::memcpy(&bits, &magic, sizeof(T));
  bits <<= P::kMantissa;
  T scale;
  std::memcpy(&scale, &bits, sizeof(T));
  return under ? T(0) : p * scale;
}

// erfcx(x) = exp(x^2) erfc(x) for x >= 0: the power series in s as four interleaved
// Horner chains in s^4 (a short dependency chain; the slot loop is latency-bound otherwise).
template <typename T>
inline T Erfcx(T x) {
  using P = Prec<T>;
  const T s = (T(2) - x) / (T(2) + x);
  const T s2 = s * s, s4 = s2 * s2;
  T chain[4];
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    T acc = 0;
    const int top = m + 4 * ((P::kTerms - 1 - m) / 4);
#pragma GCC unroll 8
    for (int k = top; k >= m; k -= 4) acc = acc * s4 + T(P::kErfcx[k]);
    chain[m] = acc;
  }
  return (chain[0] + s * chain[1]) + s2 * (chain[2] + s * chain[3]);
}

struct Sums {
  double energy, gx, gy, gz, galpha;
};

template <typename T>
void Rows(const T* x, const int32_t* idx, int64_t n, int64_t cap, const T* q, const T* box,
          T alpha, T rc2, T* f, T* phi, std::vector<Sums>& rows) {
  const T bx = box[0], by = box[1], bz = box[2];
  const T ibx = T(1) / bx, iby = T(1) / by, ibz = T(1) / bz;
  const T two_alpha_pi = T(2) * alpha * T(0.56418958354775628695);   // 2 alpha / sqrt(pi)
  const T alpha2 = alpha * alpha;
  const int32_t n32 = static_cast<int32_t>(n);
  std::vector<T> soa(3 * n);
  T* xs = soa.data();
  T* ys = xs + n;
  T* zs = ys + n;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      xs[i] = x[3 * i]; ys[i] = x[3 * i + 1]; zs[i] = x[3 * i + 2];
    }
    // Per thread: the row's in-cutoff neighbours, compacted, so the erfc and exp are
    // evaluated for them only (about half the listed slots: the skin and the padding).
    std::vector<int32_t> inside(cap > 0 ? cap : 1);
    std::vector<unsigned char> flag(cap > 0 ? cap : 1);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* row = idx + i * cap;
      const int32_t self = static_cast<int32_t>(i);
      const T xi = xs[i], yi = ys[i], zi = zs[i], qi = q[i];
      T bad = 0;
      unsigned char* fl = flag.data();
      // 1. which slots are particles within the cutoff (one SIMD loop of distances)
#pragma omp simd reduction(+ : bad)
      for (int64_t s = 0; s < cap; ++s) {
        const int32_t j = row[s];
        const bool valid = static_cast<uint32_t>(j) < static_cast<uint32_t>(n32);
        const int32_t jj = valid ? j : self;     // never an index from outside [0, n)
        T dx = xi - xs[jj], dy = yi - ys[jj], dz = zi - zs[jj];
        dx -= bx * std::rint(dx * ibx);
        dy -= by * std::rint(dy * iby);
        dz -= bz * std::rint(dz * ibz);
        const T r2 = dx * dx + dy * dy + dz * dz;
        fl[s] = valid & (r2 < rc2);              // false for NaN distances
        // A neighbour at a non-finite displacement is outside the cutoff, where JAX's
        // where(mask, c, 0) * dx is NaN: count them; the row's outputs are then NaN.
        bad += (std::isfinite(dx) & std::isfinite(dy) & std::isfinite(dz)) ? T(0) : T(1);
      }
      // 2. compact them (branch-free)
      int64_t m = 0;
      int32_t* in = inside.data();
      for (int64_t s = 0; s < cap; ++s) {
        in[m] = row[s];
        m += fl[s];
      }
      // 3. the pair terms of the compacted neighbours (one SIMD loop, no masks)
      T fx = 0, fy = 0, fz = 0, pot = 0, gx = 0, gy = 0, gz = 0, ga = 0;
#pragma omp simd reduction(+ : fx, fy, fz, pot, gx, gy, gz, ga)
      for (int64_t t = 0; t < m; ++t) {
        const int32_t j = in[t];                 // in [0, n): checked in step 1
        T dx = xi - xs[j], dy = yi - ys[j], dz = zi - zs[j];
        const T nx = std::rint(dx * ibx), ny = std::rint(dy * iby), nz = std::rint(dz * ibz);
        dx -= bx * nx;
        dy -= by * ny;
        dz -= bz * nz;
        const T r2 = dx * dx + dy * dy + dz * dz;
        const T r = std::sqrt(r2);
        const T inv_r = T(1) / r;                // r = 0: inf, then NaN, as in JAX
        const T gauss = ExpNonpositive(-alpha2 * r2);
        const T g = gauss * Erfcx(alpha * r) * inv_r;   // erfc(alpha r) / r
        const T qj = q[j];
        const T qq = qi * qj;
        const T c = qq * (g + two_alpha_pi * gauss) * inv_r * inv_r;
        fx += c * dx;
        fy += c * dy;
        fz += c * dz;
        pot += qj * g;
        gx += c * dx * nx;
        gy += c * dy * ny;
        gz += c * dz * nz;
        ga += qq * gauss;
      }
      constexpr T nan = std::numeric_limits<T>::quiet_NaN();
      const bool ok = bad == T(0);
      f[3 * i] = ok ? fx : nan;
      f[3 * i + 1] = ok ? fy : nan;
      f[3 * i + 2] = ok ? fz : nan;
      phi[i] = ok ? pot : nan;
      const double dnan = std::numeric_limits<double>::quiet_NaN();
      rows[i] = Sums{static_cast<double>(qi) * static_cast<double>(pot),
                     ok ? static_cast<double>(gx) : dnan, ok ? static_cast<double>(gy) : dnan,
                     ok ? static_cast<double>(gz) : dnan, static_cast<double>(ga)};
    }
  }
}

// The real-space Ewald sum fused with Lennard-Jones 12-6 over the same list and cutoff, for
// rigid-water force fields (one pass over the pairs where two kernels would make two):
//   U_c = sum_{i<j} q_i q_j g(r),   U_lj = sum_{i<j} 4 eps [(s/r)^12 - (s/r)^6]
//         (minus the same at r_c when shift), s = (sigma_i + sigma_j)/2,
//         eps = sqrt(eps_i eps_j) (Lorentz-Berthelot),
//   F_i = k F_c,i + F_lj,i  (F_c as in Rows; F_lj = 24 eps [2 (s/r)^12 - (s/r)^6] d / r^2).
// Each pair is evaluated once, from the row of its lower index (the list is the full,
// symmetric one simlib builds, so row i holds every j > i in its cutoff), and its force is
// added to both atoms (Newton's third law): half the erfc and exp of Rows. So that the sums
// do not depend on the threads, the rows are cut into kBlocks fixed blocks of consecutive
// rows, each block is one task that adds its pairs in row and slot order into a force
// buffer of its own, and the buffers are summed in block order. The same slots, masks,
// minimum image and NaN rule as Rows (a row with a listed neighbour at a non-finite
// displacement gets NaN forces; the symmetric list gives that neighbour NaN forces too).
// A row whose eps_i is 0 (a hydrogen) skips the Lennard-Jones terms (they are 0).
constexpr int64_t kBlocks = 16;

template <typename T>
void RowsLJ(const T* x, const int32_t* idx, int64_t n, int64_t cap, const T* q, const T* sig,
            const T* eps, const T* box, T alpha, T k, T rc2, bool shift, T* f,
            std::vector<double>& row_c, std::vector<double>& row_lj) {
  const T bx = box[0], by = box[1], bz = box[2];
  const T ibx = T(1) / bx, iby = T(1) / by, ibz = T(1) / bz;
  const T two_alpha_pi = T(2) * alpha * T(0.56418958354775628695);   // 2 alpha / sqrt(pi)
  const T alpha2 = alpha * alpha;
  const T inv_rc2 = T(1) / rc2;
  const int32_t n32 = static_cast<int32_t>(n);
  const int64_t blocks = n < kBlocks ? 1 : kBlocks;
  std::vector<T> soa(3 * n);
  T* xs = soa.data();
  T* ys = xs + n;
  T* zs = ys + n;
  std::vector<T> acc(static_cast<size_t>(blocks) * 3 * n, T(0));   // per block: x, y, z rows
  std::vector<unsigned char> row_ok(n);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      xs[i] = x[3 * i]; ys[i] = x[3 * i + 1]; zs[i] = x[3 * i + 2];
    }
    const size_t c1 = static_cast<size_t>(cap > 0 ? cap : 1);
    std::vector<int32_t> inside(c1);
    std::vector<unsigned char> flag(c1);
    std::vector<T> coef(c1), ddx(c1), ddy(c1), ddz(c1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      T* ax = acc.data() + static_cast<size_t>(b) * 3 * n;
      T* ay = ax + n;
      T* az = ay + n;
      const int64_t lo = b * n / blocks, hi = (b + 1) * n / blocks;
      for (int64_t i = lo; i < hi; ++i) {
        const int32_t* row = idx + i * cap;
        const int32_t self = static_cast<int32_t>(i);
        const T xi = xs[i], yi = ys[i], zi = zs[i], qi = q[i], si = sig[i], ei = eps[i];
        T bad = 0;
        unsigned char* fl = flag.data();
#pragma omp simd reduction(+ : bad)
        for (int64_t s = 0; s < cap; ++s) {
          const int32_t j = row[s];
          const bool valid = static_cast<uint32_t>(j) < static_cast<uint32_t>(n32);
          const int32_t jj = valid ? j : self;   // never an index from outside [0, n)
          T dx = xi - xs[jj], dy = yi - ys[jj], dz = zi - zs[jj];
          dx -= bx * std::rint(dx * ibx);
          dy -= by * std::rint(dy * iby);
          dz -= bz * std::rint(dz * ibz);
          const T r2 = dx * dx + dy * dy + dz * dz;
          fl[s] = valid & (j > self) & (r2 < rc2);   // each pair once, from its lower index
          bad += (std::isfinite(dx) & std::isfinite(dy) & std::isfinite(dz)) ? T(0) : T(1);
        }
        int64_t m = 0;
        int32_t* in = inside.data();
        for (int64_t s = 0; s < cap; ++s) {
          in[m] = row[s];
          m += fl[s];
        }
        T* cf = coef.data();
        T* ex = ddx.data();
        T* ey = ddy.data();
        T* ez = ddz.data();
        T pot = 0;
#pragma omp simd reduction(+ : pot)
        for (int64_t t = 0; t < m; ++t) {
          const int32_t j = in[t];
          T dx = xi - xs[j], dy = yi - ys[j], dz = zi - zs[j];
          dx -= bx * std::rint(dx * ibx);
          dy -= by * std::rint(dy * iby);
          dz -= bz * std::rint(dz * ibz);
          const T r2 = dx * dx + dy * dy + dz * dz;
          const T r = std::sqrt(r2);
          const T inv_r = T(1) / r;
          const T gauss = ExpNonpositive(-alpha2 * r2);
          const T g = gauss * Erfcx(alpha * r) * inv_r;
          const T qj = q[j];
          cf[t] = k * qi * qj * (g + two_alpha_pi * gauss) * inv_r * inv_r;
          ex[t] = dx; ey[t] = dy; ez[t] = dz;
          pot += qj * g;
        }
        T u = 0;
        if (ei != T(0)) {                        // Lennard-Jones: the same compacted pairs
#pragma omp simd reduction(+ : u)
          for (int64_t t = 0; t < m; ++t) {
            const int32_t j = in[t];
            const T r2 = ex[t] * ex[t] + ey[t] * ey[t] + ez[t] * ez[t];
            const T sg = T(0.5) * (si + sig[j]);
            const T ep = std::sqrt(ei * eps[j]);
            const T c2 = sg * sg * inv_rc2, c6 = c2 * c2 * c2;
            const T sh = shift ? T(4) * ep * (c6 * c6 - c6) : T(0);
            const T inv2 = T(1) / r2;
            const T s2 = sg * sg * inv2;
            const T s6 = s2 * s2 * s2;
            cf[t] += T(24) * ep * (T(2) * s6 * s6 - s6) * inv2;
            u += T(4) * ep * (s6 * s6 - s6) - sh;
          }
        }
        T fx = 0, fy = 0, fz = 0;
        for (int64_t t = 0; t < m; ++t) {        // the reactions, in slot order
          const int32_t j = in[t];
          const T cx = cf[t] * ex[t], cy = cf[t] * ey[t], cz = cf[t] * ez[t];
          fx += cx; fy += cy; fz += cz;
          ax[j] -= cx; ay[j] -= cy; az[j] -= cz;
        }
        ax[i] += fx; ay[i] += fy; az[i] += fz;
        row_ok[i] = bad == T(0);
        row_c[i] = static_cast<double>(qi) * static_cast<double>(pot);
        row_lj[i] = static_cast<double>(u);
      }
    }
    constexpr T nan = std::numeric_limits<T>::quiet_NaN();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {            // the blocks' buffers, in block order
      T sx = 0, sy = 0, sz = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const T* ax = acc.data() + static_cast<size_t>(b) * 3 * n;
        sx += ax[i]; sy += ax[n + i]; sz += ax[2 * n + i];
      }
      const bool ok = row_ok[i] != 0;
      f[3 * i] = ok ? sx : nan;
      f[3 * i + 1] = ok ? sy : nan;
      f[3 * i + 2] = ok ? sz : nan;
    }
  }
}

// The shape checks both real-space kernels make first: positions (n, 3) and a neighbour
// list (n, capacity), with n within int32. Success, or the error naming the kernel `name`
// and the argument.
template <ffi::DataType DT>
ffi::Error CheckPairShapes(const std::string& name, const ffi::Buffer<DT>& positions,
                           const ffi::Buffer<ffi::S32>& neighbors) {
  const auto dims = positions.dimensions();
  if (dims.size() != 2 || dims[1] != 3) {
    return ffi::Error::InvalidArgument(name + ": positions must have shape (n, 3)");
  }
  const auto ndims = neighbors.dimensions();
  if (ndims.size() != 2 || ndims[0] != dims[0] || ndims[1] < 0 ||
      dims[0] > static_cast<int64_t>(INT32_MAX)) {
    return ffi::Error::InvalidArgument(name + ": neighbors must have shape (n, capacity)");
  }
  return ffi::Error::Success();
}

}  // namespace

template <typename T, ffi::DataType DT>
static ffi::Error EwaldReal(ffi::Buffer<DT> positions, ffi::Buffer<ffi::S32> neighbors,
                            ffi::Buffer<DT> charges, ffi::Buffer<DT> box,
                            ffi::Buffer<DT> alpha, ffi::ResultBuffer<DT> energy,
                            ffi::ResultBuffer<DT> forces, ffi::ResultBuffer<DT> phi,
                            ffi::ResultBuffer<DT> box_grad, ffi::ResultBuffer<DT> alpha_grad,
                            double r_cut) {
  if (ffi::Error bad = CheckPairShapes<DT>("simlib_ewald", positions, neighbors);
      bad.failure()) {
    return bad;
  }
  const int64_t n = positions.dimensions()[0];
  const auto ndims = neighbors.dimensions();
  const size_t un = static_cast<size_t>(n);
  if (charges.element_count() != un || box.element_count() != 3 ||
      alpha.element_count() != 1 || energy->element_count() != 1 ||
      forces->element_count() != 3 * un || phi->element_count() != un ||
      box_grad->element_count() != 3 || alpha_grad->element_count() != 1) {
    return ffi::Error::InvalidArgument("simlib_ewald: need charges (n,), box (3,), alpha (), "
                                       "and outputs (), (n, 3), (n,), (3,), ()");
  }
  if (!(r_cut > 0.0) || !std::isfinite(r_cut)) {
    return ffi::Error::InvalidArgument("simlib_ewald: r_cut must be positive and finite");
  }
  T* e_out = energy->typed_data();
  T* g_out = box_grad->typed_data();
  T* a_out = alpha_grad->typed_data();
  if (n == 0) {
    e_out[0] = T(0); g_out[0] = g_out[1] = g_out[2] = T(0); a_out[0] = T(0);
    return ffi::Error::Success();
  }
  const double two_over_sqrt_pi = 1.1283791670955126;
  try {
    std::vector<Sums> rows(un);
    Rows<T>(positions.typed_data(), neighbors.typed_data(), n, ndims[1],
            charges.typed_data(), box.typed_data(), alpha.typed_data()[0],
            static_cast<T>(r_cut * r_cut), forces->typed_data(), phi->typed_data(), rows);
    Sums total{0, 0, 0, 0, 0};
    for (const Sums& s : rows) {            // row order: the same bits on any thread count
      total.energy += s.energy; total.gx += s.gx; total.gy += s.gy; total.gz += s.gz;
      total.galpha += s.galpha;
    }
    e_out[0] = static_cast<T>(0.5 * total.energy);
    g_out[0] = static_cast<T>(0.5 * total.gx);
    g_out[1] = static_cast<T>(0.5 * total.gy);
    g_out[2] = static_cast<T>(0.5 * total.gz);
    a_out[0] = static_cast<T>(-0.5 * two_over_sqrt_pi * total.galpha);
  } catch (const std::exception& err) {     // never let an exception cross the FFI
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("simlib_ewald: ") + err.what());
  }
  return ffi::Error::Success();
}

#define SIMLIB_EWALD_HANDLER(NAME, T, DT)                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (EwaldReal<T, DT>),                       \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<ffi::S32>>()               \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Attr<double>("r_cut"));

SIMLIB_EWALD_HANDLER(simlib_ewald_f32, float, ffi::F32)
SIMLIB_EWALD_HANDLER(simlib_ewald_f64, double, ffi::F64)

template <typename T, ffi::DataType DT>
static ffi::Error EwaldLJ(ffi::Buffer<DT> positions, ffi::Buffer<ffi::S32> neighbors,
                          ffi::Buffer<DT> charges, ffi::Buffer<DT> sigma,
                          ffi::Buffer<DT> epsilon, ffi::Buffer<DT> box, ffi::Buffer<DT> alpha,
                          ffi::Buffer<DT> coulomb, ffi::ResultBuffer<DT> energy_c,
                          ffi::ResultBuffer<DT> energy_lj, ffi::ResultBuffer<DT> forces,
                          double r_cut, int64_t shift) {
  if (ffi::Error bad = CheckPairShapes<DT>("simlib_ewald_lj", positions, neighbors);
      bad.failure()) {
    return bad;
  }
  const int64_t n = positions.dimensions()[0];
  const auto ndims = neighbors.dimensions();
  const size_t un = static_cast<size_t>(n);
  if (charges.element_count() != un || sigma.element_count() != un ||
      epsilon.element_count() != un || box.element_count() != 3 ||
      alpha.element_count() != 1 || coulomb.element_count() != 1 ||
      energy_c->element_count() != 1 || energy_lj->element_count() != 1 ||
      forces->element_count() != 3 * un) {
    return ffi::Error::InvalidArgument(
        "simlib_ewald_lj: need charges, sigma, epsilon (n,), box (3,), alpha (), "
        "coulomb (), and outputs (), (), (n, 3)");
  }
  if (!(r_cut > 0.0) || !std::isfinite(r_cut)) {
    return ffi::Error::InvalidArgument("simlib_ewald_lj: r_cut must be positive and finite");
  }
  T* ec_out = energy_c->typed_data();
  T* elj_out = energy_lj->typed_data();
  if (n == 0) {
    ec_out[0] = T(0); elj_out[0] = T(0);
    return ffi::Error::Success();
  }
  try {
    std::vector<double> row_c(un), row_lj(un);
    RowsLJ<T>(positions.typed_data(), neighbors.typed_data(), n, ndims[1],
              charges.typed_data(), sigma.typed_data(), epsilon.typed_data(),
              box.typed_data(), alpha.typed_data()[0], coulomb.typed_data()[0],
              static_cast<T>(r_cut * r_cut), shift != 0, forces->typed_data(), row_c, row_lj);
    double total_c = 0.0, total_lj = 0.0;
    for (int64_t i = 0; i < n; ++i) total_c += row_c[i];      // row order: deterministic
    for (int64_t i = 0; i < n; ++i) total_lj += row_lj[i];
    ec_out[0] = static_cast<T>(total_c);                    // each pair once
    elj_out[0] = static_cast<T>(total_lj);
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("simlib_ewald_lj: ") + err.what());
  }
  return ffi::Error::Success();
}

#define SIMLIB_EWALD_LJ_HANDLER(NAME, T, DT)                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (EwaldLJ<T, DT>),                         \
                                ffi::Ffi::Bind()                                \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<ffi::S32>>()               \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Arg<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Ret<ffi::Buffer<DT>>()                     \
                                    .Attr<double>("r_cut")                      \
                                    .Attr<int64_t>("shift"));

SIMLIB_EWALD_LJ_HANDLER(simlib_ewald_lj_f32, float, ffi::F32)
SIMLIB_EWALD_LJ_HANDLER(simlib_ewald_lj_f64, double, ffi::F64)
