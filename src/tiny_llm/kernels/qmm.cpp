// Course: week 2 day 6 — your own quantized matrix product: unpack, scale and add the bias of
// each group in registers, and reuse every unpacked weight for many rows of activations.
//
// Three functions on plain float buffers; `ops.cpp` turns them into an MLX primitive (dtypes,
// threads, the graph). Each has a portable loop, which is always right, and an AVX2/FMA path
// for x86 machines that have it (compiled when the build targets such a CPU).
//
// Every output is computed by the same arithmetic whichever path makes it: the weight
// `fma(q, s, b)`, then 8 running sums `fma(x, w, sum)` over k = 0, 8, 16, ..., added up
// in one fixed order, then the features past the last multiple of 8 one by one. So a row
// of x gets the same bits alone (decode), in a batch, or in a prompt: a seeded request
// draws the same tokens whether it runs alone or with others.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TINY_LLM_AVX2 1
#endif

namespace tiny_llm {

const char* simd() {
#ifdef TINY_LLM_AVX2
  return "AVX2+FMA";
#elif defined(__ARM_NEON)
  return "NEON (compiler-vectorised loops)";
#else
  return "portable C++";
#endif
}

#ifdef TINY_LLM_AVX2
static inline float hsum(__m256 v) {  // the sum of a register's 8 floats
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 consecutive integers of a row as floats: one word of 4-bit values, two words of 8-bit ones.
static inline __m256 unpack8(const uint32_t* w, int bits) {
  if (bits == 4) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(*w)), shifts);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
  }
  __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));  // bits == 8
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}
#endif

// The integer at place k of a row (any bits that divide 32).
static inline float unpack1(const uint32_t* row, int k, int bits) {
  int per_word = 32 / bits;
  return static_cast<float>((row[k / per_word] >> ((k % per_word) * bits)) & ((1u << bits) - 1));
}

#ifdef TINY_LLM_AVX2
// The weights 8 consecutive integers stand for: s * q + b.
static inline __m256 weights8(const uint32_t* w, int bits, __m256 s, __m256 b) {
  return _mm256_fmadd_ps(unpack8(w, bits), s, b);
}

// sum_k x[k] * w[k] as every path computes it: 8 running sums, then the rest one by one.
static inline float finish(__m256 sums, const float* x, const float* w, int k, int K) {
  float s = hsum(sums);
  for (; k < K; ++k) s = std::fma(x[k], w[k], s);
  return s;
}
#endif

// The portable path's dot product (one loop for every output, so every output alike).
[[maybe_unused]] static float dot(const float* x, const float* w, int K) {
  float s = 0.0f;
  for (int k = 0; k < K; ++k) s += x[k] * w[k];
  return s;
}

void dequantize_rows(const uint32_t* w, const float* scales, const float* biases, int rows, int K,
                     int group_size, int bits, float* out) {
  // BEGIN SOLUTION week2-day6
  const int words = K * bits / 32, groups = K / group_size;
  for (int r = 0; r < rows; ++r) {
    const uint32_t* row = w + static_cast<long>(r) * words;
    float* o = out + static_cast<long>(r) * K;
    for (int g = 0; g < groups; ++g) {
      const float s = scales[r * groups + g], b = biases[r * groups + g];
      int k = g * group_size;
      const int end = k + group_size;
#ifdef TINY_LLM_AVX2
      if (bits == 4 || bits == 8) {
        const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
        for (; k + 8 <= end; k += 8) _mm256_storeu_ps(o + k, weights8(row + k * bits / 32, bits, vs, vb));
      }
      for (; k < end; ++k) o[k] = std::fma(unpack1(row, k, bits), s, b);
#else
      for (; k < end; ++k) o[k] = unpack1(row, k, bits) * s + b;
#endif
    }
  }
  // END SOLUTION
}

void qmv_rows(const float* x, int M, const uint32_t* w, const float* scales, const float* biases, int rows, int K,
              int group_size, int bits, float* out, int ldo) {
  // BEGIN SOLUTION week2-day6
  const int words = K * bits / 32, groups = K / group_size;
  int r = 0;
#ifdef TINY_LLM_AVX2
  // Four rows at a time, unpacked in registers only: four independent running sums keep the
  // multiply-add units busy while each row's weights are made from its integers. The bit
  // width is a constant inside (`Bits`): the word pointers step by constants, no branch.
  auto four_rows = [&](auto Bits, int r) {
    constexpr int step = decltype(Bits)::value / 4;  // words per 8 values
    const uint32_t* p[4];
    for (int j = 0; j < 4; ++j) p[j] = w + static_cast<long>(r + j) * words;
    const float* s = scales + static_cast<long>(r) * groups;
    const float* b = biases + static_cast<long>(r) * groups;
    // Ask for the next four rows now: memory answers while these four are multiplied (the
    // hardware's own prefetcher does not see far enough ahead over rows this short).
    const char* next = reinterpret_cast<const char*>(w + static_cast<long>(r + 4) * words);
    for (long byte = 0; byte < 4L * words * 4; byte += 64) _mm_prefetch(next + byte, _MM_HINT_T0);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int g = 0; g < groups; ++g) {
      const __m256 s0 = _mm256_set1_ps(s[g]), s1 = _mm256_set1_ps(s[groups + g]),
                   s2 = _mm256_set1_ps(s[2 * groups + g]), s3 = _mm256_set1_ps(s[3 * groups + g]);
      const __m256 b0 = _mm256_set1_ps(b[g]), b1 = _mm256_set1_ps(b[groups + g]),
                   b2 = _mm256_set1_ps(b[2 * groups + g]), b3 = _mm256_set1_ps(b[3 * groups + g]);
      const float* xg = x + g * group_size;
      for (int i = 0; i < group_size; i += 8) {
        const __m256 xv = _mm256_loadu_ps(xg + i);
        a0 = _mm256_fmadd_ps(xv, weights8(p[0], Bits, s0, b0), a0);
        a1 = _mm256_fmadd_ps(xv, weights8(p[1], Bits, s1, b1), a1);
        a2 = _mm256_fmadd_ps(xv, weights8(p[2], Bits, s2, b2), a2);
        a3 = _mm256_fmadd_ps(xv, weights8(p[3], Bits, s3, b3), a3);
        p[0] += step, p[1] += step, p[2] += step, p[3] += step;
      }
    }
    out[r] = hsum(a0), out[r + 1] = hsum(a1), out[r + 2] = hsum(a2), out[r + 3] = hsum(a3);  // K: 8k
  };
  // Several rows of x (a batch decoding together): one row of W at a time, each of its
  // weights made once and multiplied with every row of x, one running sum per row of x.
  // `Rows` rows of x at once (a constant: the sums stay in registers).
  auto one_row = [&](auto Bits, auto Rows, int r, int m0) {
    constexpr int step = decltype(Bits)::value / 4, R = decltype(Rows)::value;
    const uint32_t* p = w + static_cast<long>(r) * words;
    const char* next = reinterpret_cast<const char*>(p + words);
    for (long byte = 0; byte < 4L * words; byte += 64) _mm_prefetch(next + byte, _MM_HINT_T0);
    __m256 a[R];
    for (int j = 0; j < R; ++j) a[j] = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      const __m256 sg = _mm256_set1_ps(scales[static_cast<long>(r) * groups + g]);
      const __m256 bg = _mm256_set1_ps(biases[static_cast<long>(r) * groups + g]);
      for (int i = 0; i < group_size; i += 8, p += step) {
        const __m256 wv = weights8(p, Bits, sg, bg);
        const float* xk = x + static_cast<long>(m0) * K + g * group_size + i;
        for (int j = 0; j < R; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(xk + static_cast<long>(j) * K), wv, a[j]);
      }
    }
    for (int j = 0; j < R; ++j) out[static_cast<long>(m0 + j) * ldo + r] = hsum(a[j]);  // K: 8k
  };
  auto rows_of = [&](auto Bits) {
    if (M == 1) {
      for (; r + 4 <= rows; r += 4) four_rows(Bits, r);
      return;
    }
    for (; r < rows; ++r)
      for (int m0 = 0; m0 < M; m0 += 8) {
        switch (std::min(8, M - m0)) {
          case 1: one_row(Bits, std::integral_constant<int, 1>{}, r, m0); break;
          case 2: one_row(Bits, std::integral_constant<int, 2>{}, r, m0); break;
          case 3: one_row(Bits, std::integral_constant<int, 3>{}, r, m0); break;
          case 4: one_row(Bits, std::integral_constant<int, 4>{}, r, m0); break;
          case 5: one_row(Bits, std::integral_constant<int, 5>{}, r, m0); break;
          case 6: one_row(Bits, std::integral_constant<int, 6>{}, r, m0); break;
          case 7: one_row(Bits, std::integral_constant<int, 7>{}, r, m0); break;
          default: one_row(Bits, std::integral_constant<int, 8>{}, r, m0);
        }
      }
  };
  if (bits == 4) rows_of(std::integral_constant<int, 4>{});
  if (bits == 8) rows_of(std::integral_constant<int, 8>{});
#endif
  // The rows left (all of them on the portable path): unpack a row, then the common product.
  thread_local std::vector<float> values;
  values.resize(K);
  for (; r < rows; ++r) {
    dequantize_rows(w + static_cast<long>(r) * words, scales + r * groups, biases + r * groups, 1, K, group_size,
                    bits, values.data());
    matmul_tile(x, M, values.data(), 1, K, out + r, ldo);
  }
  // END SOLUTION
}

void matmul_tile(const float* x, int M, const float* wt, int rows, int K, float* out, int ldo) {
  // BEGIN SOLUTION week2-day6
  int m = 0;
#ifdef TINY_LLM_AVX2
  // Four rows of x against two rows of the tile at a time: 8 running sums in registers, and
  // each value loaded from memory is used 2 or 4 times.
  for (; m + 4 <= M; m += 4) {
    const float* x0 = x + static_cast<long>(m) * K;
    const float *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
    int r = 0;
    for (; r + 2 <= rows; r += 2) {
      const float* w0 = wt + static_cast<long>(r) * K;
      const float* w1 = w0 + K;
      __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
             a30 = a00, a31 = a00;
      int k = 0;
      for (; k + 8 <= K; k += 8) {
        __m256 b0 = _mm256_loadu_ps(w0 + k), b1 = _mm256_loadu_ps(w1 + k), a;
        a = _mm256_loadu_ps(x0 + k), a00 = _mm256_fmadd_ps(a, b0, a00), a01 = _mm256_fmadd_ps(a, b1, a01);
        a = _mm256_loadu_ps(x1 + k), a10 = _mm256_fmadd_ps(a, b0, a10), a11 = _mm256_fmadd_ps(a, b1, a11);
        a = _mm256_loadu_ps(x2 + k), a20 = _mm256_fmadd_ps(a, b0, a20), a21 = _mm256_fmadd_ps(a, b1, a21);
        a = _mm256_loadu_ps(x3 + k), a30 = _mm256_fmadd_ps(a, b0, a30), a31 = _mm256_fmadd_ps(a, b1, a31);
      }
      const __m256 sums[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j)
          out[static_cast<long>(m + i) * ldo + r + j] = finish(sums[i][j], x0 + i * K, w0 + j * K, k, K);
    }
    for (; r < rows; ++r)  // an odd last row of the tile
      for (int i = 0; i < 4; ++i) {
        const float* xi = x0 + i * K;
        const float* w0 = wt + static_cast<long>(r) * K;
        __m256 acc = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(xi + k), _mm256_loadu_ps(w0 + k), acc);
        out[static_cast<long>(m + i) * ldo + r] = finish(acc, xi, w0, k, K);
      }
  }
  for (; m < M; ++m) {  // the rows of x left, one at a time, the same arithmetic
    const float* xm = x + static_cast<long>(m) * K;
    for (int r = 0; r < rows; ++r) {
      const float* w0 = wt + static_cast<long>(r) * K;
      __m256 acc = _mm256_setzero_ps();
      int k = 0;
      for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(xm + k), _mm256_loadu_ps(w0 + k), acc);
      out[static_cast<long>(m) * ldo + r] = finish(acc, xm, w0, k, K);
    }
  }
#else
  for (; m < M; ++m)
    for (int r = 0; r < rows; ++r)
      out[static_cast<long>(m) * ldo + r] = dot(x + static_cast<long>(m) * K, wt + static_cast<long>(r) * K, K);
#endif
  // END SOLUTION
}

}  // namespace tiny_llm
