/* The plain C contender of benchmarks/particles.py: direct-sum softened gravity,
 *   f_i = G m_i sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^{3/2},
 * one OpenMP parallel loop over rows i, a SIMD loop over j on structure-of-arrays copies,
 * forces only (the j = i term is zero by the softening). Built by particles.py with
 * cc -O3 -fopenmp -fno-math-errno -march=native. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define GRAVITY(NAME, T, SQRT)                                                        \
  int NAME(const T* x, const T* m, T G, T eps, long n, T* f) {                        \
    T* xs = (T*)malloc(3 * (size_t)n * sizeof(T) + 1);                                \
    if (!xs) return 1;                                                                \
    T *ys = xs + n, *zs = xs + 2 * n;                                                 \
    for (long i = 0; i < n; ++i) {                                                    \
      xs[i] = x[3 * i]; ys[i] = x[3 * i + 1]; zs[i] = x[3 * i + 2];                   \
    }                                                                                 \
    const T e2 = eps * eps;                                                           \
    _Pragma("omp parallel for schedule(static)")                                      \
    for (long i = 0; i < n; ++i) {                                                    \
      const T xi = xs[i], yi = ys[i], zi = zs[i];                                     \
      T ax = 0, ay = 0, az = 0;                                                       \
      _Pragma("omp simd reduction(+ : ax, ay, az)")                                   \
      for (long j = 0; j < n; ++j) {                                                  \
        const T dx = xs[j] - xi, dy = ys[j] - yi, dz = zs[j] - zi;                    \
        const T inv = (T)1 / SQRT(dx * dx + dy * dy + dz * dz + e2);                  \
        const T s = m[j] * inv * inv * inv;                                           \
        ax += s * dx; ay += s * dy; az += s * dz;                                     \
      }                                                                               \
      f[3 * i] = G * m[i] * ax; f[3 * i + 1] = G * m[i] * ay; f[3 * i + 2] = G * m[i] * az; \
    }                                                                                 \
    free(xs);                                                                         \
    return 0;                                                                         \
  }

GRAVITY(gravity_f32, float, sqrtf)
GRAVITY(gravity_f64, double, sqrt)

int max_threads(void) { return omp_get_max_threads(); }
