// Course: week 2 day 7 — the step's overhead: the small pieces of a decoder layer as plain loops.
//
// On the CPU, `mx.fast.rms_norm` and `mx.fast.rope` are each a dozen MLX primitives, and every
// primitive costs ~10 us to build and run however little it computes. Here they are three
// loops over one token's features; `ops.cpp` calls them, with week 2 day 6's products and week
// 3 day 6's attention, inside ONE primitive per decoder layer (`decode_layer`), so a decode
// step is a few dozen primitives instead of thousands.
#include <cmath>

#include "kernels.h"

namespace tiny_llm {

void add_rms_norm(float* h, const float* delta, const float* weight, int E, float eps, float* out) {
  // BEGIN SOLUTION week2-day7
  float squares = 0.0f;
  for (int i = 0; i < E; ++i) {
    if (delta) h[i] += delta[i];
    squares += h[i] * h[i];
  }
  const float inv = 1.0f / std::sqrt(squares / static_cast<float>(E) + eps);
  for (int i = 0; i < E; ++i) out[i] = h[i] * inv * weight[i];
  // END SOLUTION
}

void rope_rows(float* x, int heads, int D, const float* cos, const float* sin, bool traditional) {
  // BEGIN SOLUTION week2-day7
  const int half = D / 2;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<long>(h) * D;
    for (int i = 0; i < half; ++i) {
      // traditional: the pairs (2i, 2i + 1); otherwise the halves (i, i + D/2).
      float& a = traditional ? v[2 * i] : v[i];
      float& b = traditional ? v[2 * i + 1] : v[i + half];
      const float x1 = a, x2 = b;
      a = x1 * cos[i] - x2 * sin[i];
      b = x1 * sin[i] + x2 * cos[i];
    }
  }
  // END SOLUTION
}

void swiglu(const float* gate, const float* up, int n, float* out) {
  // BEGIN SOLUTION week2-day7
  for (int i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  // END SOLUTION
}

}  // namespace tiny_llm
