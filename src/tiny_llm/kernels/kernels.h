// Engine — the kernels' shared declarations: the course days' functions (qmm.cpp, week 2 day 6;
// step.cpp, week 2 day 7; attention.cpp, week 3 day 6) on plain float buffers, and the thread pool that runs them.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>

#include "mlx/types/half_types.h"

namespace tiny_llm {

using mlx::core::bfloat16_t;
using mlx::core::float16_t;

// A course day not written yet: Python sees `NotImplementedError("weekW-dayD: ...")`.
struct NotImplemented : std::logic_error {
  using std::logic_error::logic_error;
};

// What the kernels were compiled for ("AVX2+FMA", ...).
const char* simd();

// ---- week 2 day 6: the quantized matrix product (qmm.cpp) ----------------------------------
// W is `rows x K` in MLX's affine format: row r holds K * bits / 32 uint32 words, value k in
// bits `(k % per_word) * bits ...` of word `k / per_word` (lowest bits first), and stands
// for `scales[r, k / group_size] * q + biases[r, k / group_size]`. Scales and biases arrive
// as float here (`rows x K / group_size`).

// out[r, k] = the value W[r, k] stands for (out: rows x K).
void dequantize_rows(const uint32_t* w, const float* scales, const float* biases, int rows, int K,
                     int group_size, int bits, float* out);

// The decode product for a few rows of x (x: M x K), without unpacking W into memory:
// out[m * ldo + r] = sum_k x[m, k] * W[r, k], each weight made once and used for every row of
// x, with the very arithmetic of dequantize_rows + matmul_tile (so a row's result is the same
// bits alone or in a batch).
void qmv_rows(const float* x, int M, const uint32_t* w, const float* scales, const float* biases, int rows, int K,
              int group_size, int bits, float* out, int ldo);

// out[m * ldo + r] = dot(x[m, :], wt[r, :]) for m < M, r < rows (x: M x K, wt: rows x K).
void matmul_tile(const float* x, int M, const float* wt, int rows, int K, float* out, int ldo);

// ---- week 3 day 6: attention straight over pages (attention.cpp) ---------------------------
// Keys and values live in a pool `[slots, Hkv, D]`; a sequence's position s is in slot
// `pages[s / page_size] * page_size + s % page_size`.
template <typename T>  // the pool's element type: float, float16_t or bfloat16_t
struct PagedQuery {
  const float* q;      // G x L x D: the G query heads that share one key/value head, L positions
  int G, L, D, Dv;
  int start;           // the position of the first query; query i sees keys 0 .. start + i
  float scale;
  const T* keys;       // the pool's keys of this key/value head: slot s at keys + s * stride_k
  const T* values;     // likewise, Dv values per slot
  long stride_k, stride_v;
  const int32_t* pages;
  int page_size;
  float* out;          // G x L x Dv
};

// Softmax attention of every query in `a` over the keys it sees, read in place through the
// page list, with a running maximum and sum (one pass over the keys, no score matrix).
template <typename T>
void attend_paged(const PagedQuery<T>& a);

// ---- week 2 day 7: the step's overhead (step.cpp) -------------------------------------------
// One token's features at a time, in float; `ops.cpp` runs them inside one primitive per layer.

// h += delta (when delta is not null), then out = h / sqrt(mean(h * h) + eps) * weight (E features).
void add_rms_norm(float* h, const float* delta, const float* weight, int E, float eps, float* out);

// Rotates each of `heads` vectors of D features in x (heads x D) by one position's angles:
// cos[i], sin[i] for i < D / 2 turn the pair (2i, 2i + 1) when `traditional`, else (i, i + D/2).
void rope_rows(float* x, int heads, int D, const float* cos, const float* sin, bool traditional);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void swiglu(const float* gate, const float* up, int n, float* out);

// ---- shared helpers (ops.cpp) --------------------------------------------------------------
// dst[i] = src[i] as float for i < n (float16 by 8 at a time where the CPU converts them).
template <typename T>  // float, float16_t or bfloat16_t
void to_float(const T* src, int n, float* dst);

// ---- the thread pool -----------------------------------------------------------------------
int num_threads();
void set_num_threads(int n);
// Runs f(0) ... f(n - 1) on the pool's threads and the caller's; returns when all are done.
void parallel_for(int n, const std::function<void(int)>& f);

}  // namespace tiny_llm
