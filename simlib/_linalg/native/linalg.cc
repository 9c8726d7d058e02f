// Banded and sparse LU factorisations and solves for the implicit ODE solvers, as XLA FFI
// custom calls for the CPU (and two host functions for the symbolic sparse analysis,
// called through ctypes). The pure-JAX code in simlib/_linalg is the reference that tests
// these kernels; every array index read from data is checked against its bound first.
//
// Banded (simlib_band_lu, simlib_band_solve): Gaussian elimination with partial pivoting
// within the band, as LAPACK's gbtrf/gbtrs (Golub and Van Loan, Matrix Computations, 4th
// ed., 4.3.5). A is stored by rows, band[i, j] = A[i, i - lower + j], j < w = lower +
// upper + 1. Outputs: u[k, j] = U[k, k + j] (U's upper bandwidth grows to lower + upper,
// so w entries a row), mult[k, r] the multiplier of row k + 1 + r, piv[k] the offset of
// the row swapped with row k.
//
// Sparse (simlib_sparse_lu, simlib_sparse_solve): LU without pivoting on a fixed pattern
// F (CSR, columns sorted, the diagonal in every row), row by row in the IKJ order of
// Gaussian elimination (Saad, Iterative Methods for Sparse Linear Systems, 2nd ed., 2003,
// Algorithm 10.3): for each k < i in row i, l_ik = a_ik / u_kk and a_ij -= l_ik u_kj for
// j > k in row k, where j is in row i's pattern. With F the symbolic fill of A (from
// simlib_symbolic_*) this is the exact LU; with F = pattern(A) it is ILU(0) (updates
// outside the pattern are dropped). On a closed fill the rows k of one supernode chain are
// applied in groups (UpdateGroup) and up to 4 rows i of a chain are eliminated together
// (SparseLUBlocked): the same operations in the same order for each row, fewer passes
// over the memory. The fill-reducing ordering is applied outside.
//
// The pattern (fp, fi, diag, and position: where A's values go in F) is not a kernel
// operand: it is registered once from the host (simlib_sparse_register, through ctypes,
// checked there) under a 64-bit key, a hash of its contents, and the kernels take that key
// as an FFI attribute. So the compiled program holds no copy of the pattern (as constants,
// XLA kept several: 1.7 GB while compiling a 131,072-state problem), a pattern is checked
// once instead of at every call, and the same pattern compiled twice shares one entry. A
// key registered again must come with the same contents (else the registration fails);
// entries live until the process ends; a kernel called with a key unknown to this process
// fails with an error instead of running.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ------------------------------------------------------------------------------ banded
template <typename T>
void BandLU(const T* band, int64_t n, int64_t lower, int64_t w, T* u, T* mult,
            int32_t* piv) {
  // active window: rows k .. k + lower, columns k .. k + w - 1
  std::vector<T> win((lower + 1) * w, T(0));
  for (int64_t r = 0; r <= lower && r < n; ++r)
    for (int64_t j = 0; j < w; ++j) {
      const int64_t src = j - r + lower;  // A[r, j] = band[r, j - r + lower]
      if (src >= 0 && src < w && j < n) win[r * w + j] = band[r * w + src];
    }
  for (int64_t k = 0; k < n; ++k) {
    int64_t p = 0;
    T best = std::abs(win[0]);
    for (int64_t r = 1; r <= lower; ++r)
      if (std::abs(win[r * w]) > best) { best = std::abs(win[r * w]); p = r; }
    if (p != 0)
      for (int64_t j = 0; j < w; ++j) std::swap(win[j], win[p * w + j]);
    piv[k] = static_cast<int32_t>(p);
    for (int64_t j = 0; j < w; ++j) u[k * w + j] = win[j];
    const T pivot = win[0];
    const T inv = pivot == T(0) ? T(0) : T(1) / pivot;
    for (int64_t r = 1; r <= lower; ++r) {
      const T m = pivot == T(0) ? T(0) : win[r * w] * inv;
      mult[k * lower + r - 1] = m;
      for (int64_t j = 0; j < w; ++j) win[r * w + j] -= m * win[j];
    }
    // shift the window one row down and one column right; row k + lower + 1 enters
    for (int64_t r = 0; r < lower; ++r) {
      for (int64_t j = 0; j + 1 < w; ++j) win[r * w + j] = win[(r + 1) * w + j + 1];
      win[r * w + w - 1] = T(0);
    }
    const int64_t in = k + lower + 1;
    for (int64_t j = 0; j < w; ++j) {
      const int64_t col = in - lower + j;  // = k + 1 + j
      win[lower * w + j] = (in < n && col < n) ? band[in * w + j] : T(0);
    }
  }
}

// BandLU's forward sweep, P and L_k applied row by row, with the rows k .. k + LW of y
// held in registers (the general loop below reads each y back through memory, one store
// and one load on the chain per row). Rows past n are zero: their multipliers are zero.
template <typename T, int LW>
void BandForward(const T* mult, const int32_t* piv, int64_t n, T* y) {
  T v[LW + 1];  // v[r] = y[k + r]
  for (int r = 0; r <= LW; ++r) v[r] = r < n ? y[r] : T(0);
  for (int64_t k = 0; k < n; ++k) {
    const int32_t pk = piv[k];
    for (int r = 1; r <= LW; ++r)
      if (pk == r) std::swap(v[0], v[r]);
    const T* m = mult + k * LW;
    for (int r = 1; r <= LW; ++r) v[r] -= m[r - 1] * v[0];
    y[k] = v[0];
    for (int r = 0; r < LW; ++r) v[r] = v[r + 1];
    v[LW] = k + LW + 1 < n ? y[k + LW + 1] : T(0);
  }
}

// One row of a back substitution with the next U unknowns in registers (w[j] = x[k + 1 +
// j]): x_k = (t - sum_j a[j] w[j]) r, the farthest term first so that only the last waits
// on x[k + 1], r the pivot's reciprocal (computed off the chain); w then moves to x[k ..].
template <typename T, int U>
inline T BackRow(const T* a, T r, T t, T* w) {
  for (int j = U - 1; j >= 0; --j) t -= a[j] * w[j];
  t *= r;
  for (int j = U - 1; j > 0; --j) w[j] = w[j - 1];
  w[0] = t;
  return t;
}

// BandLU's back substitution U x = y (U's rows of width UW + 1; zero past column n - 1),
// x[k + 1 .. k + UW] in registers (BackRow).
template <typename T, int UW>
void BandBackward(const T* u, int64_t n, T* y) {
  T v[UW];  // v[j] = x[k + 1 + j]
  for (int j = 0; j < UW; ++j) v[j] = T(0);
  for (int64_t k = n - 1; k >= 0; --k)
    y[k] = BackRow<T, UW>(u + k * (UW + 1) + 1, T(1) / u[k * (UW + 1)], y[k], v);
}

// The register-window sweeps for lower <= 4 and w <= 9 (false: none for these widths)
template <typename T>
bool BandSweeps(const T* u, const T* mult, const int32_t* piv, int64_t n, int64_t lower,
                int64_t w, T* y) {
  if (lower < 1 || lower > 4 || w < 2 || w > 9) return false;
  switch (lower) {
    case 1: BandForward<T, 1>(mult, piv, n, y); break;
    case 2: BandForward<T, 2>(mult, piv, n, y); break;
    case 3: BandForward<T, 3>(mult, piv, n, y); break;
    default: BandForward<T, 4>(mult, piv, n, y); break;
  }
  switch (w - 1) {
    case 1: BandBackward<T, 1>(u, n, y); break;
    case 2: BandBackward<T, 2>(u, n, y); break;
    case 3: BandBackward<T, 3>(u, n, y); break;
    case 4: BandBackward<T, 4>(u, n, y); break;
    case 5: BandBackward<T, 5>(u, n, y); break;
    case 6: BandBackward<T, 6>(u, n, y); break;
    case 7: BandBackward<T, 7>(u, n, y); break;
    default: BandBackward<T, 8>(u, n, y); break;
  }
  return true;
}

template <typename T>
void BandSolve(const T* u, const T* mult, const int32_t* piv, const T* b, int64_t n,
               int64_t lower, int64_t w, bool transpose, T* x) {
  if (!transpose) {
    std::copy(b, b + n, x);
    if (BandSweeps(u, mult, piv, n, lower, w, x)) return;
  }
  std::vector<T> y(b, b + n);
  if (!transpose) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t p = k + piv[k];
      if (piv[k] != 0 && p < n) std::swap(y[k], y[p]);
      for (int64_t r = 1; r <= lower && k + r < n; ++r) y[k + r] -= mult[k * lower + r - 1] * y[k];
    }
    // the reciprocal first, off the chain through x; the terms from the farthest column
    // in, so that only the last waits on x[k + 1] (SparseSolve's ShortRow)
    for (int64_t k = n - 1; k >= 0; --k) {
      const T r = T(1) / u[k * w];
      T s = y[k];
      for (int64_t j = std::min<int64_t>(w - 1, n - 1 - k); j >= 1; --j) s -= u[k * w + j] * x[k + j];
      x[k] = s * r;
    }
    return;
  }
  // A^T = U^T L_0^T P_0 ... : U^T z = b, then z <- P_k L_k^-T z for k = n-1 .. 0
  for (int64_t k = 0; k < n; ++k) {
    T s = y[k];
    for (int64_t j = 1; j < w && k - j >= 0; ++j) s -= u[(k - j) * w + j] * y[k - j];
    y[k] = s / u[k * w];
  }
  for (int64_t k = n - 1; k >= 0; --k) {
    T s = y[k];
    for (int64_t r = 1; r <= lower && k + r < n; ++r) s -= mult[k * lower + r - 1] * y[k + r];
    y[k] = s;
    const int64_t p = k + piv[k];
    if (piv[k] != 0 && p < n) std::swap(y[k], y[p]);
  }
  for (int64_t k = 0; k < n; ++k) x[k] = y[k];
}

template <ffi::DataType DT>
ffi::Error BandLUHandler(ffi::Buffer<DT> band, ffi::Buffer<ffi::S32> lower_buf,
                         ffi::ResultBuffer<DT> u, ffi::ResultBuffer<DT> mult,
                         ffi::ResultBuffer<ffi::S32> piv) {
  using T = ffi::NativeType<DT>;
  const auto dims = band.dimensions();
  if (dims.size() < 2 || lower_buf.element_count() < 1)
    return ffi::Error::InvalidArgument("simlib_band_lu: band must be (..., n, w)");
  const int64_t n = dims[dims.size() - 2], w = dims[dims.size() - 1];
  const int64_t lower = lower_buf.typed_data()[0];
  if (lower < 0 || lower >= w) return ffi::Error::InvalidArgument("simlib_band_lu: bad lower");
  const int64_t batch = n * w == 0 ? 0 : static_cast<int64_t>(band.element_count()) / (n * w);
  if (u->element_count() != band.element_count() ||
      mult->element_count() != static_cast<size_t>(batch * n * lower) ||
      piv->element_count() != static_cast<size_t>(batch * n))
    return ffi::Error::InvalidArgument("simlib_band_lu: output shapes");
  try {
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
    for (int64_t b = 0; b < batch; ++b)
      BandLU<T>(band.typed_data() + b * n * w, n, lower, w, u->typed_data() + b * n * w,
                mult->typed_data() + b * n * lower, piv->typed_data() + b * n);
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, err.what());
  }
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error BandSolveHandler(ffi::Buffer<DT> u, ffi::Buffer<DT> mult, ffi::Buffer<ffi::S32> piv,
                            ffi::Buffer<DT> b, ffi::Buffer<ffi::S32> flags,
                            ffi::ResultBuffer<DT> x) {
  using T = ffi::NativeType<DT>;
  const auto dims = u.dimensions();
  if (dims.size() < 2 || flags.element_count() < 2)
    return ffi::Error::InvalidArgument("simlib_band_solve: u must be (..., n, w)");
  const int64_t n = dims[dims.size() - 2], w = dims[dims.size() - 1];
  const int64_t lower = flags.typed_data()[0];
  const bool transpose = flags.typed_data()[1] != 0;
  // the factors are batched like b, or shared by every right-hand side (a batch of one)
  const int64_t ub = n * w == 0 ? 0 : static_cast<int64_t>(u.element_count()) / (n * w);
  const int64_t batch = n == 0 ? 0 : static_cast<int64_t>(b.element_count()) / n;
  if (lower < 0 || lower >= w || (ub != batch && ub != 1) ||
      b.element_count() != static_cast<size_t>(batch * n) ||
      x->element_count() != static_cast<size_t>(batch * n) ||
      mult.element_count() != static_cast<size_t>(ub * n * lower) ||
      piv.element_count() != static_cast<size_t>(ub * n))
    return ffi::Error::InvalidArgument("simlib_band_solve: shapes");
  const int64_t us = ub == 1 ? 0 : 1;
  const int32_t* pv = piv.typed_data();
  for (size_t i = 0; i < piv.element_count(); ++i)
    if (pv[i] < 0 || pv[i] > lower)
      return ffi::Error::InvalidArgument("simlib_band_solve: pivot out of range");
  try {
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
    for (int64_t k = 0; k < batch; ++k)
      BandSolve<T>(u.typed_data() + us * k * n * w, mult.typed_data() + us * k * n * lower,
                   pv + us * k * n, b.typed_data() + k * n, n, lower, w, transpose,
                   x->typed_data() + k * n);
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, err.what());
  }
  return ffi::Error::Success();
}

// ------------------------------------------------------------------------------ sparse
// Member factorisations done by the two sparse LU handlers since the library was loaded
// (simlib_sparse_lu_count, through ctypes): what the tests count to check that a masked
// batch factorises only the members asked for.
std::atomic<int64_t> sparse_lu_count{0};

// The strict upper part of each row of F cut into runs of consecutive columns (fi[q0],
// fi[q0] + 1, ..., fi[q0] + len - 1 at q0 .. q0 + len - 1): the update of row i by row k
// then runs over contiguous slices of the work row, which the compiler vectorises, and
// reads no column index per entry. Nested dissection numbers each separator
// consecutively, so the rows that carry most of the work have long runs.
struct Runs {
  std::vector<int32_t> ptr, start, len;  // row k's runs: ptr[k] .. ptr[k + 1]
  Runs() = default;
  Runs(const int32_t* fp, const int32_t* fi, const int32_t* diag, int64_t n) : ptr(n + 1, 0) {
    for (int64_t k = 0; k < n; ++k) {
      for (int32_t q = diag[k] + 1; q < fp[k + 1]; ++q) {
        if (q > diag[k] + 1 && fi[q] == fi[q - 1] + 1) { ++len.back(); continue; }
        start.push_back(q);
        len.push_back(1);
      }
      ptr[k + 1] = static_cast<int32_t>(start.size());
    }
  }
};

// The strict lower part of each row cut into runs the same way (for the forward solve).
struct LowerRuns {
  std::vector<int32_t> ptr, start, len;
  LowerRuns() = default;
  LowerRuns(const int32_t* fp, const int32_t* fi, const int32_t* diag, int64_t n)
      : ptr(n + 1, 0) {
    for (int64_t k = 0; k < n; ++k) {
      for (int32_t q = fp[k]; q < diag[k]; ++q) {
        if (q > fp[k] && fi[q] == fi[q - 1] + 1) { ++len.back(); continue; }
        start.push_back(q);
        len.push_back(1);
      }
      ptr[k + 1] = static_cast<int32_t>(start.size());
    }
  }
};

// chain[k] = 1 where row k's strict upper part is {k + 1} and then row k + 1's strict upper
// part: rows k and k + 1 lie in one supernode (a chain of the elimination tree whose
// columns share their structure; Liu, Ng and Peyton, SIAM J. Matrix Anal. Appl. 14, 1993,
// 242-252). A row i that holds column k then holds k + 1 too (i > k + 1, by symmetry), and
// the updates of row i by rows k .. k + g - 1 of one chain touch the same columns past
// k + g - 1: the factorisation applies them in one pass over the work row (UpdateGroup).
std::vector<uint8_t> Chains(const int32_t* fp, const int32_t* fi, const int32_t* diag,
                            int64_t n) {
  std::vector<uint8_t> chain(n, 0);
  for (int64_t k = 0; k + 1 < n; ++k) {
    const int32_t cnt = fp[k + 1] - diag[k] - 1, cnt1 = fp[k + 2] - diag[k + 1] - 1;
    if (cnt < 1 || fi[diag[k] + 1] != k + 1 || cnt != cnt1 + 1) continue;
    chain[k] = std::equal(fi + diag[k] + 2, fi + fp[k + 1], fi + diag[k + 1] + 1) ? 1 : 0;
  }
  return chain;
}

// Row k's update of the work row w (row i), by runs. Closed: every column of row k's
// strict upper part is in row i's pattern (a closed fill, Pattern::closed), so no entry is
// checked; otherwise (ILU(0)) only the columns marked with row i are updated.
template <typename T, bool Closed>
inline void UpdateRow(T* w, const int32_t* m, int32_t ii, T lik, const T* lu,
                      const int32_t* fi, const Runs& runs, int32_t k) {
  for (int32_t r = runs.ptr[k]; r < runs.ptr[k + 1]; ++r) {
    const int32_t q0 = runs.start[r], len = runs.len[r], j0 = fi[q0];
    T* __restrict__ wj = w + j0;
    const T* __restrict__ u = lu + q0;
    if (Closed) {
#pragma omp simd
      for (int32_t t = 0; t < len; ++t) wj[t] -= lik * u[t];
    } else {
      const int32_t* mj = m + j0;
      for (int32_t t = 0; t < len; ++t) wj[t] -= (mj[t] == ii ? lik : T(0)) * u[t];
    }
  }
}

// The rows k .. k + G - 1 of one chain (chain[k .. k + G - 2]) update the work row w:
// l_ik = w_k / u_kk in turn, each applied at once to the columns k + 1 .. k + G - 1 inside
// the group, then to the shared columns past it (row k + G - 1's strict upper part) in one
// pass, w_j -= l_ik u_kj - ... - l_i,k+G-1 u_k+G-1,j in the order of the row-by-row
// elimination (same operations, same order; w read and written once instead of G times).
constexpr int32_t kGroup = 8;

template <typename T, int G>
inline void UpdateGroup(T* w, const T* lu, const int32_t* fi, const int32_t* diag,
                        const Runs& runs, int32_t k) {
  T l[G];
  const T* u[G];
  for (int a = 0; a < G; ++a) {
    const int32_t kk = k + a;
    const T ukk = lu[diag[kk]];
    l[a] = ukk == T(0) ? T(0) : w[kk] / ukk;
    w[kk] = l[a];
    for (int b = a + 1; b < G; ++b) w[k + b] -= l[a] * lu[diag[kk] + (b - a)];
    u[a] = lu + diag[kk] + (G - a);  // row kk at the first shared column
  }
  const int32_t last = k + G - 1, base = diag[last] + 1;
  for (int32_t r = runs.ptr[last]; r < runs.ptr[last + 1]; ++r) {
    const int32_t q0 = runs.start[r], len = runs.len[r], off = q0 - base;
    T* __restrict__ wj = w + fi[q0];
#pragma omp simd
    for (int32_t t = 0; t < len; ++t) {
      T s = wj[t];
      for (int a = 0; a < G; ++a) s -= l[a] * u[a][off + t];
      wj[t] = s;
    }
  }
}

// Row i's columns k at positions [p0, p1) of its L part, ascending, on a closed pattern:
// rows k .. k + g - 1 of one chain in a single pass (UpdateGroup), other rows alone.
template <typename T>
inline void EliminateRow(T* w, const T* lu, const int32_t* fi, const int32_t* diag,
                         const Runs& runs, const uint8_t* chain, int32_t p0, int32_t p1) {
  for (int32_t p = p0; p < p1; ++p) {
    const int32_t k = fi[p];
    int32_t g = 1;
    while (g < kGroup && p + g < p1 && chain[k + g - 1] && fi[p + g] == k + g) ++g;
    if (g > 1) {
      switch (g) {
        case 2: UpdateGroup<T, 2>(w, lu, fi, diag, runs, k); break;
        case 3: UpdateGroup<T, 3>(w, lu, fi, diag, runs, k); break;
        case 4: UpdateGroup<T, 4>(w, lu, fi, diag, runs, k); break;
        case 5: UpdateGroup<T, 5>(w, lu, fi, diag, runs, k); break;
        case 6: UpdateGroup<T, 6>(w, lu, fi, diag, runs, k); break;
        case 7: UpdateGroup<T, 7>(w, lu, fi, diag, runs, k); break;
        default: UpdateGroup<T, 8>(w, lu, fi, diag, runs, k); break;
      }
      p += g - 1;
      continue;
    }
    const T ukk = lu[diag[k]];
    const T lik = ukk == T(0) ? T(0) : w[k] / ukk;
    w[k] = lik;
    if (lik == T(0)) continue;
    UpdateRow<T, true>(w, nullptr, 0, lik, lu, fi, runs, k);
  }
}

// Rows [i0, i1) row by row; *info: one plus the first row with a zero or non-finite pivot.
template <typename T, bool Closed>
void SparseLUImpl(const T* a, const int32_t* fp, const int32_t* fi, const int32_t* diag,
                  const Runs& runs, const uint8_t* chain, int64_t n, T* lu,
                  std::vector<T>& work, std::vector<int32_t>& mark, int64_t i0, int64_t i1,
                  int32_t* info) {
  (void)n;
  T* w = work.data();
  int32_t* m = mark.data();
  for (int64_t i = i0; i < i1; ++i) {
    const int32_t ii = static_cast<int32_t>(i);
    for (int32_t p = fp[i]; p < fp[i + 1]; ++p) {
      w[fi[p]] = a[p];
      if (!Closed) m[fi[p]] = ii;
    }
    if (Closed) {
      EliminateRow<T>(w, lu, fi, diag, runs, chain, fp[i], diag[i]);
    } else {
      for (int32_t p = fp[i]; p < diag[i]; ++p) {  // k < i, ascending
        const int32_t k = fi[p];
        const T ukk = lu[diag[k]];
        const T lik = ukk == T(0) ? T(0) : w[k] / ukk;
        w[k] = lik;
        if (lik == T(0)) continue;
        // a_ij -= l_ik u_kj for the j of row k that row i's pattern holds (ILU(0) drops
        // the others)
        UpdateRow<T, false>(w, m, ii, lik, lu, fi, runs, k);
      }
    }
    for (int32_t p = fp[i]; p < fp[i + 1]; ++p) { lu[p] = w[fi[p]]; w[fi[p]] = T(0); }
    const T piv = lu[diag[i]];
    if (*info == 0 && (piv == T(0) || !std::isfinite(piv))) *info = static_cast<int32_t>(i + 1);
  }
}

// Rows k .. k + G - 1 of one chain applied to M work rows at once: each row's multipliers
// in turn (as UpdateGroup), then the shared columns in one pass that reads each u_kj once
// for the M rows (the same operations, in the same order, per row).
template <typename T, int G, int M>
inline void UpdateGroupRows(T* const* ws, const T* lu, const int32_t* fi, const int32_t* diag,
                            const Runs& runs, int32_t k) {
  T l[M][G];
  const T* u[G];
  for (int a = 0; a < G; ++a) u[a] = lu + diag[k + a] + (G - a);
  for (int r = 0; r < M; ++r) {
    T* w = ws[r];
    for (int a = 0; a < G; ++a) {
      const int32_t kk = k + a;
      const T ukk = lu[diag[kk]];
      l[r][a] = ukk == T(0) ? T(0) : w[kk] / ukk;
      w[kk] = l[r][a];
      for (int b = a + 1; b < G; ++b) w[k + b] -= l[r][a] * lu[diag[kk] + (b - a)];
    }
  }
  T* wr[M];
  for (int r = 0; r < M; ++r) wr[r] = ws[r];
  const int32_t last = k + G - 1, base = diag[last] + 1;
  for (int32_t q = runs.ptr[last]; q < runs.ptr[last + 1]; ++q) {
    const int32_t q0 = runs.start[q], len = runs.len[q], off = q0 - base, j0 = fi[q0];
#pragma omp simd
    for (int32_t t = 0; t < len; ++t) {
      T uv[G];
      for (int a = 0; a < G; ++a) uv[a] = u[a][off + t];
      for (int r = 0; r < M; ++r) {
        T s = wr[r][j0 + t];
        for (int a = 0; a < G; ++a) s -= l[r][a] * uv[a];
        wr[r][j0 + t] = s;
      }
    }
  }
}

template <typename T, int M>
inline void UpdateGroupRowsG(int32_t g, T* const* ws, const T* lu, const int32_t* fi,
                             const int32_t* diag, const Runs& runs, int32_t k) {
  switch (g) {
    case 1: UpdateGroupRows<T, 1, M>(ws, lu, fi, diag, runs, k); break;
    case 2: UpdateGroupRows<T, 2, M>(ws, lu, fi, diag, runs, k); break;
    case 3: UpdateGroupRows<T, 3, M>(ws, lu, fi, diag, runs, k); break;
    case 4: UpdateGroupRows<T, 4, M>(ws, lu, fi, diag, runs, k); break;
    case 5: UpdateGroupRows<T, 5, M>(ws, lu, fi, diag, runs, k); break;
    case 6: UpdateGroupRows<T, 6, M>(ws, lu, fi, diag, runs, k); break;
    case 7: UpdateGroupRows<T, 7, M>(ws, lu, fi, diag, runs, k); break;
    default: UpdateGroupRows<T, 8, M>(ws, lu, fi, diag, runs, k); break;
  }
}

constexpr int kRows = 4;  // rows of one chain eliminated together (SparseLUBlocked)

// The closed-pattern LU by blocks of up to kRows consecutive rows i .. i + b - 1 of one
// chain: row i + r holds columns i .. i + r - 1 as its last entries before the diagonal,
// and (on the 2-D grids, for 76-80% of the flops) mostly the same columns k < i as the
// other rows of the block. Those columns are eliminated from all the block's rows that
// hold them together, merged in increasing k (each row still sees its k in increasing
// order, with the same operations as row by row), so that each row of U above is read
// once for the block instead of once per row; then each row in turn takes its columns
// inside the block and is stored.
template <typename T>
int32_t SparseLUBlocked(const T* a, const int32_t* fp, const int32_t* fi, const int32_t* diag,
                        const Runs& runs, const uint8_t* chain, int64_t n, T* lu,
                        std::vector<T>& work, std::vector<int32_t>& mark) {
  int32_t info = 0;
  T* ws[kRows];
  for (int r = 0; r < kRows; ++r) ws[r] = work.data() + r * n;
  int64_t i = 0;
  while (i < n) {
    int b = 1;
    while (b < kRows && i + b < n && chain[i + b - 1] && diag[i + b] - b >= fp[i + b] &&
           fi[diag[i + b] - b] == i)
      ++b;
    if (b == 1) {  // the row alone
      SparseLUImpl<T, true>(a, fp, fi, diag, runs, chain, n, lu, work, mark, i, i + 1, &info);
      ++i;
      continue;
    }
    int32_t ptr[kRows], end[kRows];
    for (int r = 0; r < b; ++r) {
      const int64_t row = i + r;
      for (int32_t p = fp[row]; p < fp[row + 1]; ++p) ws[r][fi[p]] = a[p];
      ptr[r] = fp[row];
      end[r] = diag[row] - r;  // columns < i
    }
    const int32_t i32 = static_cast<int32_t>(i);
    for (;;) {
      int32_t k = i32;
      for (int r = 0; r < b; ++r)
        if (ptr[r] < end[r] && fi[ptr[r]] < k) k = fi[ptr[r]];
      if (k == i32) break;
      T* mem[kRows];
      int idx[kRows], m = 0;
      for (int r = 0; r < b; ++r)
        if (ptr[r] < end[r] && fi[ptr[r]] == k) { mem[m] = ws[r]; idx[m++] = r; }
      int32_t g = 1;
      while (g < kGroup && k + g < i32 && chain[k + g - 1]) {
        bool all = true;
        for (int q = 0; q < m && all; ++q) {
          const int32_t p = ptr[idx[q]] + g;
          all = p < end[idx[q]] && fi[p] == k + g;
        }
        if (!all) break;
        ++g;
      }
      switch (m) {
        case 1: UpdateGroupRowsG<T, 1>(g, mem, lu, fi, diag, runs, k); break;
        case 2: UpdateGroupRowsG<T, 2>(g, mem, lu, fi, diag, runs, k); break;
        case 3: UpdateGroupRowsG<T, 3>(g, mem, lu, fi, diag, runs, k); break;
        default: UpdateGroupRowsG<T, 4>(g, mem, lu, fi, diag, runs, k); break;
      }
      for (int q = 0; q < m; ++q) ptr[idx[q]] += g;
    }
    for (int r = 0; r < b; ++r) {  // columns i .. i + r - 1, then store the row
      const int64_t row = i + r;
      EliminateRow<T>(ws[r], lu, fi, diag, runs, chain, end[r], diag[row]);
      for (int32_t p = fp[row]; p < fp[row + 1]; ++p) { lu[p] = ws[r][fi[p]]; ws[r][fi[p]] = T(0); }
      const T piv = lu[diag[row]];
      if (info == 0 && (piv == T(0) || !std::isfinite(piv))) info = static_cast<int32_t>(row + 1);
    }
    i += b;
  }
  return info;
}

template <typename T>
int32_t SparseLU(const T* a, const int32_t* fp, const int32_t* fi, const int32_t* diag,
                 const Runs& runs, const uint8_t* chain, bool closed, int64_t n, T* lu,
                 std::vector<T>& work, std::vector<int32_t>& mark) {
  int32_t info = 0;
  if (closed) return SparseLUBlocked<T>(a, fp, fi, diag, runs, chain, n, lu, work, mark);
  SparseLUImpl<T, false>(a, fp, fi, diag, runs, chain, n, lu, work, mark, 0, n, &info);
  return info;
}

// sum_p lu[p] x[fi[p]] over p in [begin, end), in four partial sums: the rows of the
// factors are long, and one running sum would wait on each addition in turn
template <typename T>
inline T RowDot(const T* lu, const int32_t* fi, const T* x, int32_t begin, int32_t end) {
  T s0 = T(0), s1 = T(0), s2 = T(0), s3 = T(0);
  int32_t p = begin;
  for (; p + 3 < end; p += 4) {
    s0 += lu[p] * x[fi[p]];
    s1 += lu[p + 1] * x[fi[p + 1]];
    s2 += lu[p + 2] * x[fi[p + 2]];
    s3 += lu[p + 3] * x[fi[p + 3]];
  }
  for (; p < end; ++p) s0 += lu[p] * x[fi[p]];
  return (s0 + s1) + (s2 + s3);
}

// t - sum_p lu[p] x[fi[p]] over a short row, p from begin up (Down: from end - 1 down), as
// one chain of fused multiply-adds. The sweeps take a row's terms in the order the unknowns
// were solved, so that only the last term waits on the unknown just found: one multiply-add
// on the sweep's chain per row, where a sum formed apart (RowDot) and then subtracted puts
// its additions and the subtraction on it.
constexpr int32_t kShortRow = 4;

template <typename T, bool Down>
inline T ShortRow(const T* lu, const int32_t* fi, const T* x, int32_t begin, int32_t end, T t) {
  if (Down) {
    for (int32_t p = end - 1; p >= begin; --p) t -= lu[p] * x[fi[p]];
  } else {
    for (int32_t p = begin; p < end; ++p) t -= lu[p] * x[fi[p]];
  }
  return t;
}

// The same sum over a row cut into the runs [r0, r1) (columns consecutive within a run: no
// column index read per entry), where its runs are long enough to pay for their loops (on
// average kMinRun entries; else RowDot).
constexpr int32_t kMinRun = 8;

template <typename T>
inline T RunsDot(const T* lu, const int32_t* fi, const T* x, const int32_t* start,
                 const int32_t* len, int32_t r0, int32_t r1, int32_t begin, int32_t end) {
  if (end - begin < kMinRun * (r1 - r0)) return RowDot(lu, fi, x, begin, end);
  T s0 = T(0), s1 = T(0), s2 = T(0), s3 = T(0);
  for (int32_t r = r0; r < r1; ++r) {
    const T* __restrict__ a = lu + start[r];
    const T* __restrict__ y = x + fi[start[r]];
    const int32_t m = len[r];
    int32_t t = 0;
    for (; t + 3 < m; t += 4) {
      s0 += a[t] * y[t];
      s1 += a[t + 1] * y[t + 1];
      s2 += a[t + 2] * y[t + 2];
      s3 += a[t + 3] * y[t + 3];
    }
    for (; t < m; ++t) s0 += a[t] * y[t];
  }
  return (s0 + s1) + (s2 + s3);
}

// The widths (l, u) when F is a full band of at most kMaxBand each side: row i holds the
// columns max(0, i - l) .. min(n - 1, i + u), all of them; else (0, 0). A 1-D grid in
// reverse Cuthill-McKee order factorises into such a band (the 1-D Brusselator: (2, 2)).
constexpr int32_t kMaxBand = 4;

std::pair<int32_t, int32_t> BandShape(const int32_t* fp, const int32_t* fi, const int32_t* diag,
                                      int64_t n) {
  if (n < 2 * (kMaxBand + 1)) return {0, 0};
  const int32_t l = diag[n - 1] - fp[n - 1], u = fp[1] - diag[0] - 1;
  if (l < 1 || u < 1 || l > kMaxBand || u > kMaxBand) return {0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = std::max<int64_t>(0, i - l), last = std::min<int64_t>(n - 1, i + u);
    if (fp[i + 1] - fp[i] != last - first + 1 || fi[fp[i]] != first || fi[fp[i + 1] - 1] != last ||
        diag[i] - fp[i] != i - first)
      return {0, 0};  // (columns increase within a row: count, ends and diagonal fix them)
  }
  return {l, u};
}

// The two sweeps on a full band (BandShape) of widths L and U: a row's terms at fixed
// offsets, the last L (U) unknowns held in registers rather than read back through
// memory (where the general sweeps wait on a store and a load per row), the pivot's
// reciprocal off the chain. About 4x faster than the general sweeps on the 1-D
// Brusselator's (2, 2) band.
template <typename T, int L, int U>
void BandedSweeps(const T* lu, const int32_t* diag, int64_t n, T* x) {
  T w[L > U ? L : U];
  for (int64_t i = 0; i < L; ++i) {  // the first rows hold columns 0 .. i - 1
    T t = x[i];
    for (int64_t j = 0; j < i; ++j) t -= lu[diag[i] - i + j] * x[j];
    x[i] = t;
  }
  for (int j = 0; j < L; ++j) w[j] = x[j];  // w[j] = x[i - L + j]
  for (int64_t i = L; i < n; ++i) {
    const T* a = lu + diag[i] - L;
    T t = x[i];
    for (int j = 0; j < L; ++j) t -= a[j] * w[j];
    for (int j = 0; j + 1 < L; ++j) w[j] = w[j + 1];
    w[L - 1] = t;
    x[i] = t;
  }
  for (int64_t i = n - 1; i >= n - U; --i) {  // the last rows hold columns i + 1 .. n - 1
    const T r = T(1) / lu[diag[i]];
    T t = x[i];
    for (int64_t j = n - 1; j > i; --j) t -= lu[diag[i] + (j - i)] * x[j];
    x[i] = t * r;
  }
  for (int j = 0; j < U; ++j) w[j] = x[n - U + j];  // w[j] = x[i + 1 + j]
  for (int64_t i = n - U - 1; i >= 0; --i)
    x[i] = BackRow<T, U>(lu + diag[i] + 1, T(1) / lu[diag[i]], x[i], w);
}

template <typename T, int L>
bool BandedSweepsU(const T* lu, const int32_t* diag, int64_t n, int32_t u, T* x) {
  switch (u) {
    case 1: BandedSweeps<T, L, 1>(lu, diag, n, x); return true;
    case 2: BandedSweeps<T, L, 2>(lu, diag, n, x); return true;
    case 3: BandedSweeps<T, L, 3>(lu, diag, n, x); return true;
    case 4: BandedSweeps<T, L, 4>(lu, diag, n, x); return true;
    default: return false;
  }
}

// BandedSweeps for widths (l, u) up to kMaxBand; false where there is none
template <typename T>
bool BandedSolve(const T* lu, const int32_t* diag, int64_t n, int32_t l, int32_t u, T* x) {
  switch (l) {
    case 1: return BandedSweepsU<T, 1>(lu, diag, n, u, x);
    case 2: return BandedSweepsU<T, 2>(lu, diag, n, u, x);
    case 3: return BandedSweepsU<T, 3>(lu, diag, n, u, x);
    case 4: return BandedSweepsU<T, 4>(lu, diag, n, u, x);
    default: return false;
  }
}

template <typename T>
void SparseSolve(const T* lu, const int32_t* fp, const int32_t* fi, const int32_t* diag,
                 const Runs& upper, const LowerRuns& lower, int64_t n, const T* b,
                 bool transpose, T* x, int32_t band_lower = 0, int32_t band_upper = 0) {
  for (int64_t i = 0; i < n; ++i) x[i] = b[i];
  if (!transpose && band_lower > 0 && BandedSolve(lu, diag, n, band_lower, band_upper, x))
    return;
  if (!transpose) {
    const int32_t *ls = lower.start.data(), *ll = lower.len.data();
    const int32_t *us = upper.start.data(), *ul = upper.len.data();
    for (int64_t i = 0; i < n; ++i) {  // L y = b, unit lower
      const int32_t begin = fp[i], end = diag[i];
      x[i] = end - begin <= kShortRow
                 ? ShortRow<T, false>(lu, fi, x, begin, end, x[i])
                 : x[i] - RunsDot(lu, fi, x, ls, ll, lower.ptr[i], lower.ptr[i + 1], begin, end);
    }
    for (int64_t i = n - 1; i >= 0; --i) {  // U x = y
      const T r = T(1) / lu[diag[i]];  // off the chain through x
      const int32_t begin = diag[i] + 1, end = fp[i + 1];
      const T t = end - begin <= kShortRow
                      ? ShortRow<T, true>(lu, fi, x, begin, end, x[i])
                      : x[i] - RunsDot(lu, fi, x, us, ul, upper.ptr[i], upper.ptr[i + 1], begin, end);
      x[i] = t * r;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {  // U^T z = b, by columns of U^T (rows of U)
    x[i] /= lu[diag[i]];
    const T zi = x[i];
    for (int32_t p = diag[i] + 1; p < fp[i + 1]; ++p) x[fi[p]] -= lu[p] * zi;
  }
  for (int64_t i = n - 1; i >= 0; --i) {  // L^T x = z
    const T xi = x[i];
    for (int32_t p = fp[i]; p < diag[i]; ++p) x[fi[p]] -= lu[p] * xi;
  }
}

// A registered pattern: F's row pointers fp (n + 1), sorted columns fi (nnz), the diagonal's
// slots diag (n), and position (na): A's value j goes to F's slot position[j]. The arrays
// are not copied: the caller keeps them alive and unchanged for the life of the process
// (simlib/_linalg/_kernels.py holds them, read-only, in a module-level table).
struct Pattern {
  int64_t n = 0, nnz = 0, na = 0;
  const int32_t *fp = nullptr, *fi = nullptr, *diag = nullptr, *position = nullptr;
  Runs runs;  // of the factors' rows, built once at registration (not at every factorisation)
  LowerRuns lower;  // of the rows' strict lower parts (the forward solve)
  std::vector<uint8_t> chain;  // Chains(), for a closed pattern (else all zero)
  bool closed = false;  // elimination on F creates no entry outside F (Closed, at registration)
  int32_t band_lower = 0, band_upper = 0;  // BandShape(): a full narrow band, else 0
};

bool SameArray(const int32_t* a, const int32_t* b, int64_t size) {
  return a == b || std::memcmp(a, b, sizeof(int32_t) * static_cast<size_t>(size)) == 0;
}

std::mutex registry_mutex;
std::unordered_map<int64_t, std::shared_ptr<const Pattern>>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, std::shared_ptr<const Pattern>>();
  return *registry;  // never destroyed: kernels may run while the process exits
}

std::shared_ptr<const Pattern> FindPattern(int64_t key) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto it = Registry().find(key);
  return it == Registry().end() ? nullptr : it->second;
}

// fp non-decreasing from 0 to nnz, column indices in [0, n) and increasing within a row,
// diag[i] in row i with fi[diag[i]] == i, positions in [0, nnz): what the kernels index by
bool ValidPattern(const Pattern& p) {
  const int64_t n = p.n, nnz = p.nnz;
  if (n <= 0 || nnz <= 0 || p.fp[0] != 0 || p.fp[n] != nnz) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (p.fp[i + 1] < p.fp[i]) return false;
    if (p.diag[i] < p.fp[i] || p.diag[i] >= p.fp[i + 1] || p.fi[p.diag[i]] != i) return false;
    for (int32_t q = p.fp[i]; q < p.fp[i + 1]; ++q)
      if (p.fi[q] < 0 || p.fi[q] >= n || (q > p.fp[i] && p.fi[q] <= p.fi[q - 1])) return false;
  }
  for (int64_t j = 0; j < p.na; ++j)
    if (p.position[j] < 0 || p.position[j] >= nnz) return false;
  return true;
}

// Whether elimination on F (a valid pattern) stays inside F, so that the factorisation
// needs no check per entry. True when F is structurally symmetric and its order is a
// perfect elimination ordering of F's graph: for every k, the higher neighbours of k
// other than the first, p, are neighbours of p (Rose, Tarjan and Lueker, SIAM J. Comput.
// 5, 1976, 266-283: then the higher neighbours of every k form a clique, so row k's update
// of row i, for i and j both above k, finds j in row i). The symbolic fill of a symmetric
// pattern (simlib_symbolic_fill) has this property; ILU(0)'s pattern usually does not.
// O(nnz log) by binary searches in the sorted rows.
bool InRow(const int32_t* fp, const int32_t* fi, int32_t row, int32_t col) {
  return std::binary_search(fi + fp[row], fi + fp[row + 1], col);
}

bool ClosedPattern(const Pattern& p) {
  const int32_t *fp = p.fp, *fi = p.fi, *diag = p.diag;
  for (int64_t i = 0; i < p.n; ++i)
    for (int32_t q = fp[i]; q < fp[i + 1]; ++q)
      if (!InRow(fp, fi, fi[q], static_cast<int32_t>(i))) return false;
  for (int64_t k = 0; k < p.n; ++k) {
    const int32_t first = diag[k] + 1;
    if (first >= fp[k + 1]) continue;
    const int32_t parent = fi[first];
    for (int32_t q = first + 1; q < fp[k + 1]; ++q)
      if (!InRow(fp, fi, parent, fi[q])) return false;
  }
  return true;
}

ffi::Error Unknown(const char* who) {
  return ffi::Error::InvalidArgument(std::string(who) +
                                     ": sparse pattern not registered in this process");
}

template <ffi::DataType DT>
ffi::Error SparseLUHandler(ffi::Buffer<DT> a, ffi::ResultBuffer<DT> lu,
                           ffi::ResultBuffer<ffi::S32> info, int64_t key) {
  using T = ffi::NativeType<DT>;
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  if (!pat) return Unknown("simlib_sparse_lu");
  const int64_t n = pat->n, nnz = pat->nnz;
  if (a.element_count() % nnz != 0 || lu->element_count() != a.element_count())
    return ffi::Error::InvalidArgument("simlib_sparse_lu: shapes");
  const int64_t batch = static_cast<int64_t>(a.element_count()) / nnz;
  if (info->element_count() != static_cast<size_t>(batch))
    return ffi::Error::InvalidArgument("simlib_sparse_lu: info shape");
  const int32_t *fp = pat->fp, *fi = pat->fi, *diag = pat->diag;
  try {
    const Runs& runs = pat->runs;
#pragma omp parallel if (batch > 1)
    {
      std::vector<T> work(kRows * n, T(0));  // kRows work rows
      std::vector<int32_t> mark(n, -1);
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < batch; ++k) {
        std::fill(mark.begin(), mark.end(), -1);
        info->typed_data()[k] = SparseLU<T>(a.typed_data() + k * nnz, fp, fi, diag, runs,
                                            pat->chain.data(),
                                            pat->closed, n, lu->typed_data() + k * nnz,
                                            work, mark);
      }
    }
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, err.what());
  }
  sparse_lu_count += batch;
  return ffi::Error::Success();
}

// The masked batch: member k is refactorised (from A's values a[k], scattered into the
// fill pattern through position) where mask[k] != 0 and keeps its old factors otherwise.
// lu is aliased to old (input_output_aliases), so a kept member is not even copied; when
// XLA gives separate buffers, the kept members are copied. info[k] = 0 for a kept member,
// else as simlib_sparse_lu's, or n + 1 for a non-finite factor off the diagonal.
template <ffi::DataType DT>
ffi::Error SparseLUMaskedHandler(ffi::Buffer<DT> a, ffi::Buffer<DT> old,
                                 ffi::Buffer<ffi::S32> mask, ffi::ResultBuffer<DT> lu,
                                 ffi::ResultBuffer<ffi::S32> info, int64_t key) {
  using T = ffi::NativeType<DT>;
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  if (!pat) return Unknown("simlib_sparse_lu_masked");
  const int64_t n = pat->n, nnz = pat->nnz, na = pat->na;
  if (na == 0 || old.element_count() % nnz != 0 || lu->element_count() != old.element_count())
    return ffi::Error::InvalidArgument("simlib_sparse_lu_masked: shapes");
  const int64_t batch = static_cast<int64_t>(old.element_count()) / nnz;
  if (a.element_count() != static_cast<size_t>(batch * na) ||
      mask.element_count() != static_cast<size_t>(batch) ||
      info->element_count() != static_cast<size_t>(batch))
    return ffi::Error::InvalidArgument("simlib_sparse_lu_masked: batch shapes");
  const int32_t *fp = pat->fp, *fi = pat->fi, *diag = pat->diag;
  const int32_t* pos = pat->position;
  const bool aliased = lu->typed_data() == old.typed_data();
  int64_t done = 0;
  try {
    const Runs& runs = pat->runs;
#pragma omp parallel if (batch > 1) reduction(+ : done)
    {
      std::vector<T> work(kRows * n, T(0));  // kRows work rows
      std::vector<int32_t> mark(n, -1);
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < batch; ++k) {
        T* out = lu->typed_data() + k * nnz;
        if (mask.typed_data()[k] == 0) {
          if (!aliased) std::copy(old.typed_data() + k * nnz, old.typed_data() + (k + 1) * nnz,
                                  out);
          info->typed_data()[k] = 0;
          continue;
        }
        std::fill(out, out + nnz, T(0));
        const T* ak = a.typed_data() + k * na;
        for (int64_t j = 0; j < na; ++j) out[pos[j]] = ak[j];
        std::fill(mark.begin(), mark.end(), -1);
        // in place: row i's values are read into work before row i of the factors is
        // written, and rows k < i are already factors
        int32_t status = SparseLU<T>(out, fp, fi, diag, runs, pat->chain.data(), pat->closed,
                                     n, out, work, mark);
        if (status == 0)  // a non-finite factor off the diagonal: n + 1
          for (int64_t p = 0; p < nnz; ++p)
            if (!std::isfinite(out[p])) { status = static_cast<int32_t>(n + 1); break; }
        info->typed_data()[k] = status;
        ++done;
      }
    }
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, err.what());
  }
  sparse_lu_count += done;
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error SparseSolveHandler(ffi::Buffer<DT> lu, ffi::Buffer<DT> b, ffi::ResultBuffer<DT> x,
                              int64_t key, int64_t transpose) {
  using T = ffi::NativeType<DT>;
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  if (!pat) return Unknown("simlib_sparse_solve");
  const int64_t n = pat->n, nnz = pat->nnz;
  if (lu.element_count() % nnz != 0)
    return ffi::Error::InvalidArgument("simlib_sparse_solve: shapes");
  const int64_t lb = static_cast<int64_t>(lu.element_count()) / nnz;
  const int64_t batch = static_cast<int64_t>(b.element_count()) / n;
  if ((lb != batch && lb != 1) || b.element_count() != static_cast<size_t>(batch * n) ||
      x->element_count() != b.element_count())
    return ffi::Error::InvalidArgument("simlib_sparse_solve: b shape");
  const int64_t ls = lb == 1 ? 0 : 1;  // factors shared by every right-hand side
  const int32_t *fp = pat->fp, *fi = pat->fi, *diag = pat->diag;
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
  for (int64_t k = 0; k < batch; ++k)
    SparseSolve<T>(lu.typed_data() + ls * k * nnz, fp, fi, diag, pat->runs, pat->lower, n,
                   b.typed_data() + k * n, transpose != 0, x->typed_data() + k * n,
                   pat->band_lower, pat->band_upper);
  return ffi::Error::Success();
}

}  // namespace

// ------------------------------------------------------------------ symbolic (host, ctypes)
// The fill pattern of the LU of a matrix with symmetric pattern S (CSR, both triangles,
// the diagonal included): L's row i is the set of nodes reached from S's row i (k < i)
// going up the elimination tree to i (Liu, SIAM J. Matrix Anal. Appl. 11, 1990, 134-172;
// T. A. Davis, Direct Methods for Sparse Linear Systems, SIAM 2006, ch. 4). U's pattern is
// L's transposed. simlib_symbolic_count returns nnz(F) and writes the row pointers fp
// (n + 1); simlib_symbolic_fill writes the sorted columns. -1 on bad input.
namespace {
int64_t Symbolic(int64_t n, const int64_t* sp, const int64_t* si, int64_t* fp, int64_t* fi) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = sp[i]; p < sp[i + 1]; ++p)
      if (si[p] < 0 || si[p] >= n) return -1;
  std::vector<int64_t> parent(n, -1), ancestor(n, -1), mark(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = sp[i]; p < sp[i + 1]; ++p) {
      int64_t j = si[p];
      while (j != -1 && j < i) {
        const int64_t next = ancestor[j];
        ancestor[j] = i;
        if (next == -1) { parent[j] = i; break; }
        j = next;
      }
    }
  }
  std::vector<std::vector<int64_t>> lrows(n);
  std::vector<int64_t> ucount(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    mark[i] = i;
    for (int64_t p = sp[i]; p < sp[i + 1]; ++p) {
      for (int64_t j = si[p]; j != -1 && j < i && mark[j] != i; j = parent[j]) {
        mark[j] = i;
        lrows[i].push_back(j);
      }
    }
    std::sort(lrows[i].begin(), lrows[i].end());
    for (int64_t j : lrows[i]) ++ucount[j];
  }
  fp[0] = 0;
  for (int64_t i = 0; i < n; ++i) fp[i + 1] = fp[i] + int64_t(lrows[i].size()) + 1 + ucount[i];
  if (fi != nullptr) {
    std::vector<int64_t> next(n);
    for (int64_t i = 0; i < n; ++i) {
      int64_t q = fp[i];
      for (int64_t j : lrows[i]) fi[q++] = j;
      fi[q++] = i;
      next[i] = q;
    }
    for (int64_t i = 0; i < n; ++i)        // U row j gets i for every j in L row i (i > j),
      for (int64_t j : lrows[i]) fi[next[j]++] = i;  // in increasing i: sorted
  }
  return fp[n];
}
}  // namespace

// ------------------------------------------------------------- nested dissection (host)
// A fill-reducing symmetric ordering by nested dissection (A. George, SIAM J. Numer. Anal.
// 10, 1973, 345-363), with separators from rooted level structures (A. George and J. W. H.
// Liu, Computer Solution of Large Sparse Positive Definite Systems, Prentice-Hall 1981,
// ch. 4 and 8): for each connected subgraph, a breadth-first search from a
// pseudo-peripheral node (George and Liu, ACM TOMS 5, 1979, 284-299: restart from a node
// of least degree in the last level while the eccentricity grows) gives the levels
// L_0 .. L_e; the middle level L_j, j = ceil(e / 2), thinned to its nodes with a
// neighbour in L_{j+1}, separates the rest. The two sides are numbered first, the
// separator last, and each side is dissected in turn; subgraphs of at most `leaf` nodes
// (or of eccentricity below 2) keep their natural order. The graph S is symmetric (CSR,
// both triangles; self loops ignored). order[new] = old. Returns 0, or -1 on bad input.
namespace {
int64_t NestedDissection(int64_t n, const int64_t* sp, const int64_t* si, int64_t leaf,
                         int64_t* order) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = sp[i]; p < sp[i + 1]; ++p)
      if (si[p] < 0 || si[p] >= n) return -1;
  if (leaf < 1) leaf = 1;
  struct Task { std::vector<int64_t> nodes; int64_t lo; };
  std::vector<int64_t> tag(n, -1), level(n, -1), queue;
  queue.reserve(n);
  std::vector<Task> stack;
  stack.push_back({std::vector<int64_t>(n), 0});
  for (int64_t i = 0; i < n; ++i) stack.back().nodes[i] = i;
  int64_t next_tag = 0;
  auto number = [&](std::vector<int64_t>& nodes, int64_t lo) {
    std::sort(nodes.begin(), nodes.end());
    for (size_t k = 0; k < nodes.size(); ++k) order[lo + int64_t(k)] = nodes[k];
  };
  // breadth-first search from root within the tagged subgraph t; fills queue (in level
  // order) and level[]; returns the eccentricity of root
  auto bfs = [&](int64_t root, int64_t t) {
    queue.clear();
    queue.push_back(root);
    level[root] = 0;
    for (size_t h = 0; h < queue.size(); ++h) {
      const int64_t v = queue[h];
      for (int64_t p = sp[v]; p < sp[v + 1]; ++p) {
        const int64_t w = si[p];
        if (tag[w] == t && level[w] < 0) { level[w] = level[v] + 1; queue.push_back(w); }
      }
    }
    return level[queue.back()];
  };
  auto degree = [&](int64_t v, int64_t t) {
    int64_t d = 0;
    for (int64_t p = sp[v]; p < sp[v + 1]; ++p) d += (tag[si[p]] == t && si[p] != v);
    return d;
  };
  while (!stack.empty()) {
    Task task = std::move(stack.back());
    stack.pop_back();
    std::vector<int64_t>& nodes = task.nodes;
    const int64_t size = int64_t(nodes.size());
    if (size <= leaf) { number(nodes, task.lo); continue; }
    const int64_t t = next_tag++;
    for (int64_t v : nodes) { tag[v] = t; level[v] = -1; }
    int64_t root = nodes[0], ecc = bfs(root, t);
    if (int64_t(queue.size()) < size) {  // not connected: the root's component apart
      std::vector<int64_t> comp(queue.begin(), queue.end()), rest;
      rest.reserve(size - comp.size());
      for (int64_t v : nodes) if (level[v] < 0) rest.push_back(v);
      const int64_t csize = int64_t(comp.size());
      stack.push_back({std::move(comp), task.lo});
      stack.push_back({std::move(rest), task.lo + csize});
      continue;
    }
    for (int iter = 0; iter < 8; ++iter) {  // pseudo-peripheral root
      int64_t best = -1, best_deg = 0;
      for (int64_t h = int64_t(queue.size()) - 1; h >= 0 && level[queue[h]] == ecc; --h) {
        const int64_t d = degree(queue[h], t);
        if (best < 0 || d < best_deg) { best = queue[h]; best_deg = d; }
      }
      for (int64_t v : nodes) level[v] = -1;
      const int64_t e = bfs(best, t);
      if (e <= ecc) {  // no longer growing: back to the previous root's levels
        for (int64_t v : nodes) level[v] = -1;
        bfs(root, t);
        break;
      }
      root = best;
      ecc = e;
    }
    if (ecc < 2) { number(nodes, task.lo); continue; }
    const int64_t j = (ecc + 1) / 2;
    std::vector<int64_t> low, high, sep;
    for (int64_t v : nodes) {
      if (level[v] < j) { low.push_back(v); continue; }
      if (level[v] > j) { high.push_back(v); continue; }
      bool touches = false;
      for (int64_t p = sp[v]; p < sp[v + 1] && !touches; ++p)
        touches = tag[si[p]] == t && level[si[p]] == j + 1;
      (touches ? sep : low).push_back(v);
    }
    const int64_t lo = task.lo, nl = int64_t(low.size()), nh = int64_t(high.size());
    number(sep, lo + nl + nh);
    if (nl) stack.push_back({std::move(low), lo});
    if (nh) stack.push_back({std::move(high), lo + nl});
  }
  return 0;
}
}  // namespace

extern "C" int64_t simlib_nested_dissection(int64_t n, const int64_t* sp, const int64_t* si,
                                            int64_t leaf, int64_t* order) {
  try { return NestedDissection(n, sp, si, leaf, order); } catch (...) { return -1; }
}

extern "C" int64_t simlib_sparse_lu_count() { return sparse_lu_count.load(); }

// Registers a pattern under key (not copied: see Pattern). Returns 1 if added, 0 if the key
// already holds the same contents (the new arrays are not kept), -1 for a pattern that fails
// ValidPattern, -2 if the key holds a different pattern (a hash collision: nothing is
// replaced), -3 on failure.
extern "C" int64_t simlib_sparse_register(int64_t key, int64_t n, int64_t nnz,
                                          const int32_t* fp, const int32_t* fi,
                                          const int32_t* diag, int64_t na,
                                          const int32_t* position) {
  try {
    if (n <= 0 || nnz <= 0 || na < 0) return -1;
    auto pat = std::make_shared<Pattern>();
    pat->n = n;
    pat->nnz = nnz;
    pat->na = na;
    pat->fp = fp;
    pat->fi = fi;
    pat->diag = diag;
    pat->position = position;
    std::lock_guard<std::mutex> lock(registry_mutex);
    const auto it = Registry().find(key);
    if (it != Registry().end()) {
      const Pattern& q = *it->second;
      const bool same = q.n == n && q.nnz == nnz && q.na == na && SameArray(q.fp, fp, n + 1) &&
                        SameArray(q.fi, fi, nnz) && SameArray(q.diag, diag, n) &&
                        SameArray(q.position, position, na);
      return same ? 0 : -2;
    }
    if (!ValidPattern(*pat)) return -1;
    pat->runs = Runs(fp, fi, diag, n);
    pat->lower = LowerRuns(fp, fi, diag, n);
    pat->closed = ClosedPattern(*pat);
    std::tie(pat->band_lower, pat->band_upper) = BandShape(fp, fi, diag, n);
    pat->chain = pat->closed ? Chains(fp, fi, diag, n) : std::vector<uint8_t>(n, 0);
    Registry().emplace(key, std::move(pat));
    return 1;
  } catch (...) {
    return -3;
  }
}

// 1 if the pattern under key is closed (its factorisation checks no entry), 0 if not, -1 if
// no pattern is registered under key (for tests).
extern "C" int64_t simlib_sparse_pattern_closed(int64_t key) {
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  return pat ? static_cast<int64_t>(pat->closed) : -1;
}

// The number of rows k of the pattern under key that chain to row k + 1 (Chains: their
// updates go in groups), or -1 if no pattern is registered under key (for tests).
extern "C" int64_t simlib_sparse_pattern_chains(int64_t key) {
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  if (!pat) return -1;
  int64_t count = 0;
  for (uint8_t c : pat->chain) count += c;
  return count;
}

// 8 l + u for the band widths (l, u) the solves of the pattern under key take the banded
// sweeps with (0: the general sweeps), or -1 if no pattern is registered (for tests).
extern "C" int64_t simlib_sparse_pattern_band(int64_t key) {
  const std::shared_ptr<const Pattern> pat = FindPattern(key);
  return pat ? static_cast<int64_t>(8 * pat->band_lower + pat->band_upper) : -1;
}

// The number of registered patterns (for tests).
extern "C" int64_t simlib_sparse_pattern_count() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int64_t>(Registry().size());
}

extern "C" int64_t simlib_symbolic_count(int64_t n, const int64_t* sp, const int64_t* si,
                                         int64_t* fp) {
  try { return Symbolic(n, sp, si, fp, nullptr); } catch (...) { return -1; }
}

extern "C" int64_t simlib_symbolic_fill(int64_t n, const int64_t* sp, const int64_t* si,
                                        int64_t* fp, int64_t* fi) {
  try { return Symbolic(n, sp, si, fp, fi); } catch (...) { return -1; }
}

#define SIMLIB_LINALG_HANDLERS(SUFFIX, DT)                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_band_lu_##SUFFIX, BandLUHandler<DT>,           \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<ffi::S32>>());                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_band_solve_##SUFFIX, BandSolveHandler<DT>,     \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Ret<ffi::Buffer<DT>>());                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_sparse_lu_##SUFFIX, SparseLUHandler<DT>,       \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<ffi::S32>>()                       \
                                    .Attr<int64_t>("pattern"));                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_sparse_lu_masked_##SUFFIX,                    \
                                SparseLUMaskedHandler<DT>,                              \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<ffi::S32>>()                       \
                                    .Attr<int64_t>("pattern"));                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(simlib_sparse_solve_##SUFFIX, SparseSolveHandler<DT>, \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Arg<ffi::Buffer<DT>>()                             \
                                    .Ret<ffi::Buffer<DT>>()                             \
                                    .Attr<int64_t>("pattern")                           \
                                    .Attr<int64_t>("transpose"));

SIMLIB_LINALG_HANDLERS(f32, ffi::F32)
SIMLIB_LINALG_HANDLERS(f64, ffi::F64)
