// Course: week 3 day 6 — attention straight over pages, flash-style: keys and values are read
// where the page pool keeps them, a tile at a time, with a running maximum and sum per query.
//
// `ops.cpp` cuts the work into (row, key/value head) pieces, gives each piece the queries of
// the heads that share that key/value head, and runs the pieces on the thread pool.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.h"

namespace tiny_llm {

template <typename T>
void attend_paged(const PagedQuery<T>& a) {
  // BEGIN SOLUTION week3-day6
  constexpr int TILE = 32;  // keys per tile: converted to float once, used by every query
  const int Q = a.G * a.L, n_keys = a.start + a.L;  // the last query sees n_keys keys
  std::vector<float> run_max(Q, -INFINITY), run_sum(Q, 0.0f), acc(static_cast<size_t>(Q) * a.Dv, 0.0f);
  std::vector<float> kt(static_cast<size_t>(TILE) * a.D), vt(static_cast<size_t>(TILE) * a.Dv), s(TILE);
  for (int t0 = 0; t0 < n_keys; t0 += TILE) {
    const int tn = std::min(TILE, n_keys - t0);
    for (int j = 0; j < tn; ++j) {  // the tile's keys and values, found through the page list
      const int pos = t0 + j;
      const long slot = static_cast<long>(a.pages[pos / a.page_size]) * a.page_size + pos % a.page_size;
      const T* k = a.keys + slot * a.stride_k;
      const T* v = a.values + slot * a.stride_v;
      to_float(k, a.D, kt.data() + j * a.D);
      to_float(v, a.Dv, vt.data() + j * a.Dv);
    }
    for (int q = 0; q < Q; ++q) {
      const int i = q % a.L;  // query position start + i sees keys 0 .. start + i
      const int n = std::min(tn, a.start + i + 1 - t0);
      if (n <= 0) continue;
      const float* qv = a.q + static_cast<long>(q) * a.D;
      float tile_max = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const float* k = kt.data() + j * a.D;
        float dot = 0.0f;
        for (int d = 0; d < a.D; ++d) dot += qv[d] * k[d];
        s[j] = dot * a.scale;
        tile_max = std::max(tile_max, s[j]);
      }
      // Rescale what was summed so far to the new maximum, then add this tile.
      const float new_max = std::max(run_max[q], tile_max);
      const float correction = std::exp(run_max[q] - new_max);
      float* o = acc.data() + static_cast<long>(q) * a.Dv;
      float sum = run_sum[q] * correction;
      for (int d = 0; d < a.Dv; ++d) o[d] *= correction;
      for (int j = 0; j < n; ++j) {
        const float p = std::exp(s[j] - new_max);
        sum += p;
        const float* v = vt.data() + j * a.Dv;
        for (int d = 0; d < a.Dv; ++d) o[d] += p * v[d];
      }
      run_max[q] = new_max;
      run_sum[q] = sum;
    }
  }
  for (int q = 0; q < Q; ++q)
    for (int d = 0; d < a.Dv; ++d) a.out[static_cast<long>(q) * a.Dv + d] = acc[static_cast<long>(q) * a.Dv + d] / run_sum[q];
  // END SOLUTION
}

template void attend_paged<float>(const PagedQuery<float>&);
template void attend_paged<float16_t>(const PagedQuery<float16_t>&);
template void attend_paged<bfloat16_t>(const PagedQuery<bfloat16_t>&);

}  // namespace tiny_llm
