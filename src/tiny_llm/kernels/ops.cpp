// Engine — the kernels as MLX primitives (`eval_cpu` only) and their Python module
// `tiny_llm.kernels._ext`: activations, scales and pool entries of float32, float16 or
// bfloat16 are turned into float rows here, the course days' functions do the arithmetic,
// and the work is cut into pieces for the thread pool.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "kernels.h"
#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "mlx/version.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace nb::literals;

namespace tiny_llm {
namespace {

// ---- rows of any float dtype as float ------------------------------------------------------

// float16 <-> float by 8 with F16C where the build has it; bfloat16 is the top half of a float.
void load_row(const void* base, mx::Dtype dt, long offset, int n, float* dst) {
  switch (dt) {
    case mx::float32:
      std::memcpy(dst, static_cast<const float*>(base) + offset, sizeof(float) * n);
      break;
    case mx::float16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
      int i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      const float16_t* h = reinterpret_cast<const float16_t*>(s);
      for (; i < n; ++i) dst[i] = static_cast<float>(h[i]);
      break;
    }
    default: {  // bfloat16 (checked when the op is built)
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
      for (int i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &bits, sizeof(float));
      }
    }
  }
}

void store_row(const float* src, mx::Dtype dt, void* base, long offset, int n) {
  switch (dt) {
    case mx::float32:
      std::memcpy(static_cast<float*>(base) + offset, src, sizeof(float) * n);
      break;
    case mx::float16: {
      float16_t* d = static_cast<float16_t*>(base) + offset;
      int i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = static_cast<float16_t>(src[i]);
      break;
    }
    default: {
      bfloat16_t* d = static_cast<bfloat16_t*>(base) + offset;
      for (int i = 0; i < n; ++i) d[i] = static_cast<bfloat16_t>(src[i]);
    }
  }
}

// An input's elements in row-major order whatever its strides (a transposed or sliced x needs
// no copy in the graph): `load` turns elements first .. first + n - 1 into floats.
struct Source {
  const void* p;
  mx::Dtype dt;
  bool contiguous;
  mx::Shape shape;
  mx::Strides strides;

  Source() : p(nullptr), dt(mx::float32), contiguous(true) {}
  explicit Source(const mx::array& a)
      : p(a.data<void>()), dt(a.dtype()), contiguous(a.flags().row_contiguous), shape(a.shape()),
        strides(a.strides()) {}

  void load(long first, int n, float* dst) const {
    if (contiguous) return load_row(p, dt, first, n, dst);
    const int nd = static_cast<int>(shape.size());
    std::vector<int> index(nd);
    long rest = first, offset = 0;
    for (int d = nd - 1; d >= 0; --d) {
      index[d] = static_cast<int>(rest % shape[d]);
      rest /= shape[d];
      offset += index[d] * strides[d];
    }
    for (int i = 0; i < n; ++i) {
      load_row(p, dt, offset, 1, dst + i);
      for (int d = nd - 1; d >= 0; --d) {  // the next element: carry like an odometer
        offset += strides[d];
        if (++index[d] < shape[d]) break;
        offset -= strides[d] * shape[d];
        index[d] = 0;
      }
    }
  }
};

bool is_float(mx::Dtype dt) { return dt == mx::float32 || dt == mx::float16 || dt == mx::bfloat16; }

// f(T{}) with T the C++ type of a float dtype: float, float16_t or bfloat16_t.
template <typename F>
void by_dtype(mx::Dtype dt, F f) {
  switch (dt) {
    case mx::float32: f(float{}); break;
    case mx::float16: f(float16_t{}); break;
    default: f(bfloat16_t{});
  }
}

// ---- matrix products -----------------------------------------------------------------------

// One projection's weight W [N, K] as stored: quantized in MLX's affine format (`bits` > 0:
// packed `w`, `scales` and `biases` [N, K / group_size]) or float (`bits` == 0), and its bias.
struct Linear {
  const void* w = nullptr;
  mx::Dtype wt = mx::float32;
  const void *scales = nullptr, *biases = nullptr;
  mx::Dtype st = mx::float32;
  int N = 0, K = 0, group_size = 0, bits = 0;
  const void* bias = nullptr;  // [N], or none
  mx::Dtype bt = mx::float32;
};

// Rows of W per piece of work: few for prefill (a tile of them stays in cache while every row
// of x passes), more for decode (each piece must be worth waking a thread for).
constexpr int DECODE_ROWS = 17;  // below this many rows of x, the decode path
constexpr int TILE_ROWS = 16, DECODE_TILE_ROWS = 64;

int piece_rows(int M) { return M < DECODE_ROWS ? DECODE_TILE_ROWS : TILE_ROWS; }

// One piece of `x [M, K] @ W.T (+ bias)`, on the calling thread: out[m * ldo + r] for rows
// n0 .. n0 + rows - 1 of W. Decode unpacks W in registers only (week 2 day 6's qmv_rows);
// prefill unpacks a tile of W once and uses it for every row of x. Both give the same bits.
void product_piece(const Linear& L, const float* x, int M, int n0, int rows, float* out, int ldo) {
  thread_local std::vector<float> tile, s, b;
  const int K = L.K;
  if (L.bits) {
    const int G = K / L.group_size, words = K * L.bits / 32;
    const long first = static_cast<long>(n0) * G;
    // float32 scales are read where they are; others are turned into float for the piece.
    const float *sp = static_cast<const float*>(L.scales) + first, *bp = static_cast<const float*>(L.biases) + first;
    if (L.st != mx::float32) {
      s.resize(static_cast<size_t>(rows) * G), b.resize(static_cast<size_t>(rows) * G);
      load_row(L.scales, L.st, first, rows * G, s.data());
      load_row(L.biases, L.st, first, rows * G, b.data());
      sp = s.data(), bp = b.data();
    }
    const uint32_t* w = static_cast<const uint32_t*>(L.w) + static_cast<long>(n0) * words;
    if (M < DECODE_ROWS) {
      qmv_rows(x, M, w, sp, bp, rows, K, L.group_size, L.bits, out, ldo);
    } else {
      tile.resize(static_cast<size_t>(rows) * K);
      dequantize_rows(w, sp, bp, rows, K, L.group_size, L.bits, tile.data());
      matmul_tile(x, M, tile.data(), rows, K, out, ldo);
    }
  } else {
    const float* wp = static_cast<const float*>(L.w) + static_cast<long>(n0) * K;
    if (L.wt != mx::float32) {
      tile.resize(static_cast<size_t>(rows) * K);
      load_row(L.w, L.wt, static_cast<long>(n0) * K, rows * K, tile.data());
      wp = tile.data();
    }
    matmul_tile(x, M, wp, rows, K, out, ldo);
  }
  if (L.bias) {  // in float, before the one rounding to the output's dtype
    s.resize(rows);
    load_row(L.bias, L.bt, n0, rows, s.data());
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < rows; ++r) out[static_cast<long>(m) * ldo + r] += s[r];
  }
}

// A product `out [M, N] = x [M, K] @ W.T (+ bias)` in `out`'s dtype, for any layout of x.
struct Product {
  Source x;
  mx::Dtype xt;
  void* out;
  int M;
  Linear w;
};

void run_product(const Product& p) {
  std::vector<float> x(static_cast<size_t>(p.M) * p.w.K);
  p.x.load(0, p.M * p.w.K, x.data());
  const int NB = piece_rows(p.M), N = p.w.N;
  parallel_for((N + NB - 1) / NB, [&](int t) {
    thread_local std::vector<float> o;
    const int n0 = t * NB, rows = std::min(NB, N - n0);
    o.resize(static_cast<size_t>(p.M) * NB);
    product_piece(p.w, x.data(), p.M, n0, rows, o.data(), NB);
    for (int m = 0; m < p.M; ++m) store_row(o.data() + m * NB, p.xt, p.out, static_cast<long>(m) * N + n0, rows);
  });
}

// ---- the primitives ------------------------------------------------------------------------

class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only; tiny_llm.kernels uses MLX's op on a GPU");
  }

 protected:
  // The output's memory, and the encoder the work is queued on (after the inputs' work).
  mx::cpu::CommandEncoder& prepare(const std::vector<mx::array>& inputs, mx::array& out) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    return enc;
  }
};

class QuantizedMatmul : public CpuPrimitive {
 public:
  QuantizedMatmul(mx::Stream s, int group_size, int bits) : CpuPrimitive(s), group_size_(group_size), bits_(bits) {}
  const char* name() const override { return "TinyLLMQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    auto& enc = prepare(inputs, out);
    const auto &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    const int K = x.shape(-1);
    Linear L{w.data<void>(), w.dtype(), scales.data<void>(), biases.data<void>(), scales.dtype(),
             out.shape(-1), K, group_size_, bits_};
    if (inputs.size() > 4) L.bias = inputs[4].data<void>(), L.bt = inputs[4].dtype();
    Product p{Source(x), x.dtype(), out.data<void>(), static_cast<int>(x.size() / K), L};
    enc.dispatch([p] { run_product(p); });
  }

 private:
  int group_size_, bits_;
};

class Matmul : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;
  const char* name() const override { return "TinyLLMMatmul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    auto& enc = prepare(inputs, out);
    const auto &x = inputs[0], &w = inputs[1];
    const int K = x.shape(-1);
    Linear L{w.data<void>(), w.dtype()};
    L.N = out.shape(-1), L.K = K;
    if (inputs.size() > 2) L.bias = inputs[2].data<void>(), L.bt = inputs[2].dtype();
    Product p{Source(x), x.dtype(), out.data<void>(), static_cast<int>(x.size() / K), L};
    enc.dispatch([p] { run_product(p); });
  }
};

struct Attention {
  Source q;
  const void *keys, *values;
  mx::Dtype qt, kt;
  const int32_t *pages, *starts;  // a pool's page lists [B, n_pages] and first positions [B]
  void* out;
  int B, Hq, Hkv, L, D, Dv, n_pages, page_size;
  float scale;
  bool dense;       // keys/values [B, Hkv, S, D] (a KVCache's buffers) instead of a pool [slots, Hkv, D]
  int dense_start;  // dense: every row's first query position
};

template <typename T>
void run_attention(const Attention& a) {
  const int G = a.Hq / a.Hkv;
  parallel_for(a.B * a.Hkv, [&](int t) {
    const int b = t / a.Hkv, h = t % a.Hkv;
    thread_local std::vector<float> q, o;
    const long first = (static_cast<long>(b) * a.Hq + static_cast<long>(h) * G) * a.L;  // the group's first query row
    q.resize(static_cast<size_t>(G) * a.L * a.D), o.resize(static_cast<size_t>(G) * a.L * a.Dv);
    a.q.load(first * a.D, G * a.L * a.D, q.data());
    // A pool: slot s of head h at s * Hkv * D + h * D. A dense cache is one page of S
    // positions per (row, head): page b * Hkv, head h at h * S * D, position s at s * D.
    const int32_t dense_page = b * a.Hkv;
    const long S = a.page_size;
    PagedQuery<T> pq{q.data(), G, a.L, a.D, a.Dv, a.dense ? a.dense_start : a.starts[b], a.scale,
                     static_cast<const T*>(a.keys) + h * (a.dense ? S * a.D : a.D),
                     static_cast<const T*>(a.values) + h * (a.dense ? S * a.Dv : a.Dv),
                     a.dense ? a.D : static_cast<long>(a.Hkv) * a.D, a.dense ? a.Dv : static_cast<long>(a.Hkv) * a.Dv,
                     a.dense ? &dense_page : a.pages + static_cast<long>(b) * a.n_pages, a.page_size, o.data()};
    attend_paged(pq);
    store_row(o.data(), a.qt, a.out, first * a.Dv, G * a.L * a.Dv);
  });
}

class PagedAttention : public CpuPrimitive {
 public:
  PagedAttention(mx::Stream s, int page_size, float scale, bool dense = false, int dense_start = 0)
      : CpuPrimitive(s), page_size_(page_size), scale_(scale), dense_(dense), dense_start_(dense_start) {}
  const char* name() const override { return "TinyLLMPagedAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const PagedAttention&>(other);
    return page_size_ == o.page_size_ && scale_ == o.scale_ && dense_ == o.dense_ && dense_start_ == o.dense_start_;
  }
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    auto& enc = prepare(inputs, out);
    const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
    Attention a{Source(q), k.data<void>(), v.data<void>(), q.dtype(), k.dtype(),
                dense_ ? nullptr : inputs[3].data<int32_t>(), dense_ ? nullptr : inputs[4].data<int32_t>(),
                out.data<void>(), q.shape(0), q.shape(1), k.shape(1), q.shape(2), q.shape(3), v.shape(-1),
                dense_ ? 1 : inputs[3].shape(1), dense_ ? k.shape(2) : page_size_, scale_, dense_, dense_start_};
    enc.dispatch([a] { by_dtype(a.kt, [&](auto t) { run_attention<decltype(t)>(a); }); });
  }

 private:
  int page_size_;
  float scale_;
  bool dense_;
  int dense_start_;
};

// ---- one decoder layer of a decode step (week 2 day 7) -------------------------------------

// What one decoder layer is, fixed when the model is loaded: sizes, RoPE's layout, and how each
// of its seven projections is stored (q, k, v, o, gate, up, down: bits 0 = float weights).
struct LayerSpec {
  int E = 0, I = 0, Hq = 0, Hkv = 0, D = 0;
  float eps = 1e-6f, scale = 1.0f;
  bool traditional = false;
  std::vector<int> bits, group_size;  // per projection
  std::vector<bool> has_bias;         // per projection
  bool final_norm = false;            // the model's last layer: its output goes through the final norm
  float final_eps = 1e-6f;

  bool operator==(const LayerSpec& o) const {
    return E == o.E && I == o.I && Hq == o.Hq && Hkv == o.Hkv && D == o.D && eps == o.eps && scale == o.scale &&
           traditional == o.traditional && bits == o.bits && group_size == o.group_size && has_bias == o.has_bias &&
           final_norm == o.final_norm && final_eps == o.final_eps;
  }
};

// Where the new keys go and what attention reads: a page pool `[slots, Hkv, D]` with each row's
// page list, or a KVCache's buffers `[B, Hkv, S, D]`.
struct Store {
  void *keys = nullptr, *values = nullptr;
  mx::Dtype dt = mx::float32;
  bool paged = false;
  const int32_t* pages = nullptr;  // paged: [B, n_pages]
  int n_pages = 0, page_size = 1;
  int S = 0;  // dense: the buffers' positions
  int Hkv = 0, D = 0;

  long slot(int b, int pos) const {  // in units of Hkv * D elements (paged) or D elements (dense)
    return paged ? static_cast<long>(pages[static_cast<long>(b) * n_pages + pos / page_size]) * page_size + pos % page_size
                 : static_cast<long>(pos);
  }
  long offset(int b, int h, int pos) const {  // element offset of (row b, head h, position pos)
    return paged ? (slot(b, pos) * Hkv + h) * D : ((static_cast<long>(b) * Hkv + h) * S + pos) * D;
  }
};

struct LayerRun {
  LayerSpec spec;
  Source h;
  mx::Dtype ht = mx::float32;
  void* out = nullptr;
  int B = 0;
  Store store;
  const int32_t* positions = nullptr;  // [B]: each row's new position
  const float *cos = nullptr, *sin = nullptr;  // [P, D / 2]
  const float *norm1 = nullptr, *norm2 = nullptr, *final_norm = nullptr;
  Linear lin[7];             // q, k, v, o, gate, up, down
  bool paged_attention = true;  // week 3 day 6 is written: attention over pages by attend_paged
};

// Every piece of one or more products over the same x, for one parallel_for: (projection, n0).
void run_products(const LayerRun& r, std::initializer_list<int> which, const float* x, float* const* outs) {
  const int NB = piece_rows(r.B);
  std::vector<std::pair<int, int>> pieces;
  for (int j : which)
    for (int n0 = 0; n0 < r.lin[j].N; n0 += NB) pieces.emplace_back(j, n0);
  parallel_for(static_cast<int>(pieces.size()), [&](int t) {
    const auto [j, n0] = pieces[t];
    const Linear& L = r.lin[j];
    product_piece(L, x, r.B, n0, std::min(NB, L.N - n0), outs[j] + n0, L.N);
  });
}

// Rounds values through the activations' dtype, as MLX's ops would store them between primitives.
void round_to(mx::Dtype dt, float* p, long n) {
  if (dt == mx::float32) return;
  thread_local std::vector<uint16_t> tmp;
  tmp.resize(n);
  store_row(p, dt, tmp.data(), 0, static_cast<int>(n));
  load_row(tmp.data(), dt, 0, static_cast<int>(n), p);
}

// One new query per head over a row's positions, read through `Store`, for a starter that has
// not written week 3 day 6 yet: the scores, their softmax, the weighted sum of the values.
// h += delta, rounded to the activations' dtype as MLX's add would store it (n values). The
// norm that follows reads the rounded sum, so the sum is made here rather than in add_rms_norm.
void add_residual(float* h, const float* delta, long n, mx::Dtype dt) {
  for (long i = 0; i < n; ++i) h[i] += delta[i];
  round_to(dt, h, n);
}

template <typename T>
void attend_plain(const Store& s, int b, int hh, const float* q, int G, int n, float scale, float* out) {
  std::vector<float> p(n);
  for (int g = 0; g < G; ++g) {
    const float* qg = q + static_cast<long>(g) * s.D;
    float top = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      const T* k = static_cast<const T*>(s.keys) + s.offset(b, hh, j);
      float dot = 0.0f;
      for (int d = 0; d < s.D; ++d) dot += qg[d] * static_cast<float>(k[d]);
      p[j] = dot * scale, top = std::max(top, p[j]);
    }
    for (int j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - top));
    float* o = out + static_cast<long>(g) * s.D;
    std::fill(o, o + s.D, 0.0f);
    for (int j = 0; j < n; ++j) {
      const T* v = static_cast<const T*>(s.values) + s.offset(b, hh, j);
      for (int d = 0; d < s.D; ++d) o[d] += p[j] / sum * static_cast<float>(v[d]);
    }
  }
}

template <typename T>
void run_layer(const LayerRun& r) {
  const LayerSpec& c = r.spec;
  const int B = r.B, E = c.E, D = c.D, Hq = c.Hq, Hkv = c.Hkv, G = Hq / Hkv, half = D / 2;
  std::vector<float> h(static_cast<size_t>(B) * E), xn(h.size()), q(static_cast<size_t>(B) * Hq * D),
      k(static_cast<size_t>(B) * Hkv * D), v(k.size()), o(q.size()), proj(h.size()),
      gate(static_cast<size_t>(B) * c.I), up(gate.size());
  r.h.load(0, B * E, h.data());
  // Attention: norm, q/k/v in one round of pieces, RoPE, the new keys and values into the cache.
  for (int b = 0; b < B; ++b) add_rms_norm(h.data() + b * E, nullptr, r.norm1, E, c.eps, xn.data() + b * E);
  round_to(r.ht, xn.data(), xn.size());
  float* qkv[3] = {q.data(), k.data(), v.data()};
  run_products(r, {0, 1, 2}, xn.data(), qkv);
  for (int b = 0; b < B; ++b) {
    const long pos = r.positions[b];
    rope_rows(q.data() + static_cast<long>(b) * Hq * D, Hq, D, r.cos + pos * half, r.sin + pos * half, c.traditional);
    rope_rows(k.data() + static_cast<long>(b) * Hkv * D, Hkv, D, r.cos + pos * half, r.sin + pos * half, c.traditional);
    for (int hh = 0; hh < Hkv; ++hh) {
      const long at = r.store.offset(b, hh, r.positions[b]), from = (static_cast<long>(b) * Hkv + hh) * D;
      store_row(k.data() + from, r.store.dt, r.store.keys, at, D);
      store_row(v.data() + from, r.store.dt, r.store.values, at, D);
    }
  }
  round_to(r.ht, q.data(), q.size());
  // Attention of each row's G query heads per key/value head over its positions, in place.
  parallel_for(B * Hkv, [&](int t) {
    const int b = t / Hkv, hh = t % Hkv;
    const int32_t zero = 0;
    const Store& s = r.store;
    const long first = (static_cast<long>(b) * Hq + static_cast<long>(hh) * G) * D;
    if (!r.paged_attention)
      return attend_plain<T>(s, b, hh, q.data() + first, G, r.positions[b] + 1, c.scale, o.data() + first);
    const T* keys = static_cast<const T*>(s.keys);
    const T* values = static_cast<const T*>(s.values);
    PagedQuery<T> pq{q.data() + (static_cast<long>(b) * Hq + static_cast<long>(hh) * G) * D, G, 1, D, D,
                     r.positions[b], c.scale,
                     keys + (s.paged ? static_cast<long>(hh) * D : (static_cast<long>(b) * Hkv + hh) * s.S * D),
                     values + (s.paged ? static_cast<long>(hh) * D : (static_cast<long>(b) * Hkv + hh) * s.S * D),
                     s.paged ? static_cast<long>(Hkv) * D : D, s.paged ? static_cast<long>(Hkv) * D : D,
                     s.paged ? s.pages + static_cast<long>(b) * s.n_pages : &zero, s.paged ? s.page_size : s.S,
                     o.data() + (static_cast<long>(b) * Hq + static_cast<long>(hh) * G) * D};
    attend_paged(pq);
  });
  round_to(r.ht, o.data(), o.size());
  float* po[4] = {nullptr, nullptr, nullptr, proj.data()};
  run_products(r, {3}, o.data(), po);
  round_to(r.ht, proj.data(), proj.size());
  // The MLP: residual + norm, gate and up in one round of pieces, SwiGLU, down.
  add_residual(h.data(), proj.data(), B * E, r.ht);
  for (int b = 0; b < B; ++b) add_rms_norm(h.data() + b * E, nullptr, r.norm2, E, c.eps, xn.data() + b * E);
  round_to(r.ht, xn.data(), xn.size());
  float* gu[6] = {nullptr, nullptr, nullptr, nullptr, gate.data(), up.data()};
  run_products(r, {4, 5}, xn.data(), gu);
  swiglu(gate.data(), up.data(), static_cast<int>(gate.size()), gate.data());
  round_to(r.ht, gate.data(), gate.size());
  float* pd[7] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, proj.data()};
  run_products(r, {6}, gate.data(), pd);
  round_to(r.ht, proj.data(), proj.size());
  add_residual(h.data(), proj.data(), B * E, r.ht);
  for (int b = 0; b < B; ++b) {
    float* hb = h.data() + b * E;
    if (r.final_norm) {
      add_rms_norm(hb, nullptr, r.final_norm, E, c.final_eps, xn.data() + b * E);
      std::memcpy(hb, xn.data() + b * E, sizeof(float) * E);
    }
  }
  store_row(h.data(), r.ht, r.out, 0, B * E);
}

bool day_done(const std::string& day);

class DecodeLayer : public CpuPrimitive {
 public:
  DecodeLayer(mx::Stream s, LayerSpec spec, bool paged, int page_size)
      : CpuPrimitive(s), spec_(std::move(spec)), paged_(paged), page_size_(page_size),
        paged_attention_(day_done("week3-day6")) {}
  const char* name() const override { return "TinyLLMDecodeLayer"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const DecodeLayer&>(other);
    return spec_ == o.spec_ && paged_ == o.paged_ && page_size_ == o.page_size_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape(), inputs[1].shape(), inputs[2].shape()};
  }

  // inputs: h, keys, values, pages (paged) or a placeholder, positions [B], cos, sin, norm1,
  // norm2, then each projection's arrays (w [, scales, biases] [, bias]), then the final norm.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    auto& enc = prepare(inputs, out);
    // The cache's new keys and values are its old buffers with each row's new position
    // written: the new arrays share the old ones' memory (no copy). An older array of the
    // cache sees the write only at positions past its rows' lengths, which it never reads.
    // (A buffer that is not one dense block, which the caches never make, is copied first.)
    std::vector<std::pair<Source, int>> copies;  // (the old buffer, which output)
    for (int i = 1; i <= 2; ++i) {
      const auto& in = inputs[i];
      if (in.flags().row_contiguous && in.data_size() == in.size()) {
        outputs[i].copy_shared_buffer(in);
      } else {
        outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
        copies.emplace_back(Source(in), i);
      }
      enc.set_output_array(outputs[i]);
    }
    LayerRun r;
    r.spec = spec_;
    r.h = Source(inputs[0]);
    r.ht = inputs[0].dtype();
    r.out = out.data<void>();
    r.B = inputs[0].shape(0);
    const auto& keys = outputs[1];
    Store& st = r.store;
    st.keys = outputs[1].data<void>(), st.values = outputs[2].data<void>();
    st.dt = keys.dtype(), st.paged = paged_;
    st.pages = paged_ ? inputs[3].data<int32_t>() : nullptr, st.n_pages = paged_ ? inputs[3].shape(1) : 0;
    st.page_size = page_size_, st.S = paged_ ? 0 : keys.shape(2), st.Hkv = spec_.Hkv, st.D = spec_.D;
    r.positions = inputs[4].data<int32_t>();
    r.paged_attention = paged_attention_;
    r.cos = inputs[5].data<float>(), r.sin = inputs[6].data<float>();
    r.norm1 = inputs[7].data<float>(), r.norm2 = inputs[8].data<float>();
    size_t i = 9;
    const int N[7] = {spec_.Hq * spec_.D, spec_.Hkv * spec_.D, spec_.Hkv * spec_.D, spec_.E, spec_.I, spec_.I, spec_.E};
    const int K[7] = {spec_.E, spec_.E, spec_.E, spec_.Hq * spec_.D, spec_.E, spec_.E, spec_.I};
    for (int j = 0; j < 7; ++j) {
      Linear& L = r.lin[j];
      L.N = N[j], L.K = K[j], L.bits = spec_.bits[j], L.group_size = spec_.group_size[j];
      L.w = inputs[i].data<void>(), L.wt = inputs[i].dtype(), ++i;
      if (L.bits) {
        L.scales = inputs[i].data<void>(), L.st = inputs[i].dtype(), ++i;
        L.biases = inputs[i].data<void>(), ++i;
      }
      if (spec_.has_bias[j]) L.bias = inputs[i].data<void>(), L.bt = inputs[i].dtype(), ++i;
    }
    r.final_norm = spec_.final_norm ? inputs[i].data<float>() : nullptr;
    enc.dispatch([r, copies] {
      std::vector<float> chunk(4096);
      for (const auto& [src, i] : copies) {  // through float, a chunk at a time: exact for every float dtype
        void* dst = i == 1 ? r.store.keys : r.store.values;
        long n = 1;
        for (int d : src.shape) n *= d;
        for (long first = 0; first < n; first += 4096) {
          const int len = static_cast<int>(std::min<long>(4096, n - first));
          src.load(first, len, chunk.data());
          store_row(chunk.data(), r.store.dt, dst, first, len);
        }
      }
      by_dtype(r.store.dt, [&](auto t) { run_layer<decltype(t)>(r); });
    });
  }

 private:
  LayerSpec spec_;
  bool paged_;
  int page_size_;
  bool paged_attention_;
};

// ---- building the ops ----------------------------------------------------------------------

void probe(const std::string& day);

// A day's functions must be written before a graph uses them: a starter's stub would
// otherwise throw on MLX's stream thread, where nothing can catch it. Checked once per day,
// here, when the op is built (its NotImplementedError reaches Python at once).
void ensure(const std::string& day) {
  static std::atomic<bool> week2{false}, week2_7{false}, week3{false};
  std::atomic<bool>& done = day == "week2-day6" ? week2 : day == "week2-day7" ? week2_7 : week3;
  if (!done.load()) {
    probe(day);
    done.store(true);
  }
}

// Whether a day's functions are written (a starter's stubs throw NotImplemented), asked once.
bool day_done(const std::string& day) {
  try {
    ensure(day);
    return true;
  } catch (const NotImplemented&) {
    return false;
  }
}

mx::Stream cpu_stream(mx::StreamOrDevice s) {
  mx::Stream stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu)
    throw std::invalid_argument("tiny_llm kernels run on a CPU stream; use MLX's op on a GPU");
  return stream;
}

// Weights are evaluated and contiguous already: no node. Anything else is made contiguous in
// the graph (a no-op at run time when it already is).
mx::array contiguous(const mx::array& a, mx::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                           std::optional<mx::array> bias, int group_size, int bits, mx::StreamOrDevice s) {
  const mx::Stream stream = cpu_stream(s);
  ensure("week2-day6");
  check(x.ndim() >= 1 && is_float(x.dtype()), "x must be a float32, float16 or bfloat16 array");
  check(w.ndim() == 2 && w.dtype() == mx::uint32, "w must be a uint32 array [N, K * bits / 32]");
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(group_size == 32 || group_size == 64 || group_size == 128, "group_size must be 32, 64 or 128");
  const int K = x.shape(-1), N = w.shape(0);
  check(K % group_size == 0 && w.shape(1) == K * bits / 32, "w does not match x's last axis");
  check(scales.shape() == mx::Shape{N, K / group_size} && biases.shape() == scales.shape() &&
            is_float(scales.dtype()) && biases.dtype() == scales.dtype(),
        "scales and biases must be float arrays [N, K / group_size] of one dtype");
  std::vector<mx::array> inputs{x, contiguous(w, stream), contiguous(scales, stream), contiguous(biases, stream)};
  if (bias) {
    check(bias->shape() == mx::Shape{N} && is_float(bias->dtype()), "bias must be a float array [N]");
    inputs.push_back(contiguous(*bias, stream));
  }
  mx::Shape shape = x.shape();
  shape.back() = N;
  return mx::array(shape, x.dtype(), std::make_shared<QuantizedMatmul>(stream, group_size, bits), inputs);
}

mx::array matmul(const mx::array& x, const mx::array& w, std::optional<mx::array> bias, mx::StreamOrDevice s) {
  const mx::Stream stream = cpu_stream(s);
  ensure("week2-day6");
  check(x.ndim() >= 1 && is_float(x.dtype()), "x must be a float32, float16 or bfloat16 array");
  check(w.ndim() == 2 && is_float(w.dtype()) && w.shape(1) == x.shape(-1), "w must be a float array [N, K]");
  std::vector<mx::array> inputs{x, contiguous(w, stream)};
  if (bias) {
    check(bias->shape() == mx::Shape{w.shape(0)} && is_float(bias->dtype()), "bias must be a float array [N]");
    inputs.push_back(contiguous(*bias, stream));
  }
  mx::Shape shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, x.dtype(), std::make_shared<Matmul>(stream), inputs);
}

mx::array paged_attention(const mx::array& q, const mx::array& keys, const mx::array& values, const mx::array& pages,
                          const mx::array& starts, int page_size, float scale, mx::StreamOrDevice s) {
  const mx::Stream stream = cpu_stream(s);
  ensure("week3-day6");
  check(q.ndim() == 4 && is_float(q.dtype()), "q must be a float array [B, Hq, L, D]");
  check(keys.ndim() == 3 && values.ndim() == 3 && is_float(keys.dtype()) && values.dtype() == keys.dtype() &&
            keys.shape(0) == values.shape(0) && keys.shape(1) == values.shape(1) && keys.shape(2) == q.shape(3),
        "keys and values must be float arrays [slots, Hkv, D] of one dtype");
  check(q.shape(1) % keys.shape(1) == 0, "the query heads must be a multiple of the key/value heads");
  check(pages.ndim() == 2 && pages.dtype() == mx::int32 && pages.shape(0) == q.shape(0), "pages must be int32 [B, n]");
  check(starts.ndim() == 1 && starts.dtype() == mx::int32 && starts.shape(0) == q.shape(0), "starts must be int32 [B]");
  check(page_size >= 1, "page_size must be at least 1");
  std::vector<mx::array> inputs{q, contiguous(keys, stream), contiguous(values, stream), contiguous(pages, stream),
                                contiguous(starts, stream)};
  mx::Shape shape = q.shape();
  shape.back() = values.shape(2);
  return mx::array(shape, q.dtype(), std::make_shared<PagedAttention>(stream, page_size, scale), inputs);
}

// Attention over a KVCache's buffers `[B, Hkv, S, D]`, of which the first `start + L`
// positions hold keys: row b's query i sees positions 0 .. start + i.
mx::array dense_attention(const mx::array& q, const mx::array& keys, const mx::array& values, int start, float scale,
                          mx::StreamOrDevice s) {
  const mx::Stream stream = cpu_stream(s);
  ensure("week3-day6");
  check(q.ndim() == 4 && is_float(q.dtype()), "q must be a float array [B, Hq, L, D]");
  check(keys.ndim() == 4 && values.ndim() == 4 && is_float(keys.dtype()) && values.dtype() == keys.dtype() &&
            keys.shape(0) == q.shape(0) && values.shape(0) == q.shape(0) && keys.shape(1) == values.shape(1) &&
            keys.shape(2) == values.shape(2) && keys.shape(3) == q.shape(3),
        "keys and values must be float arrays [B, Hkv, S, D] of one dtype");
  check(q.shape(1) % keys.shape(1) == 0, "the query heads must be a multiple of the key/value heads");
  check(start >= 0 && start + q.shape(2) <= keys.shape(2), "start + L must be within the buffers' positions");
  std::vector<mx::array> inputs{q, contiguous(keys, stream), contiguous(values, stream)};
  mx::Shape shape = q.shape();
  shape.back() = values.shape(3);
  return mx::array(shape, q.dtype(), std::make_shared<PagedAttention>(stream, 1, scale, true, start), inputs);
}

// One decoder layer of a decode step as one primitive: `h [B, 1, E]` -> (the layer's output
// `[B, 1, E]`, the keys and values with row b's new position `positions[b]` written). `keys`
// and `values` are a page pool `[slots, Hkv, D]` (with `pages [B, n]`) or a KVCache's buffers
// `[B, Hkv, S, D]` (pages: None); `cos`/`sin [P, D / 2]` hold RoPE's angles of positions
// 0 .. P - 1. `weights`: norm1, norm2, each projection's arrays as `spec` says, the final norm.
std::vector<mx::array> decode_layer(const mx::array& h, const mx::array& keys, const mx::array& values,
                                    std::optional<mx::array> pages, const mx::array& positions, const mx::array& cos,
                                    const mx::array& sin, const std::vector<mx::array>& weights, const LayerSpec& spec,
                                    int page_size, mx::StreamOrDevice s) {
  const mx::Stream stream = cpu_stream(s);
  ensure("week2-day6");
  ensure("week2-day7");
  check(h.ndim() == 3 && h.shape(1) == 1 && h.shape(2) == spec.E && is_float(h.dtype()), "h must be a float array [B, 1, E]");
  const int B = h.shape(0);
  const bool paged = pages.has_value();
  check(is_float(keys.dtype()) && values.dtype() == keys.dtype() && keys.shape() == values.shape(),
        "keys and values must be float arrays of one dtype and shape");
  if (paged) {
    check(keys.ndim() == 3 && keys.shape(1) == spec.Hkv && keys.shape(2) == spec.D, "a pool must be [slots, Hkv, D]");
    check(pages->ndim() == 2 && pages->dtype() == mx::int32 && pages->shape(0) == B, "pages must be int32 [B, n]");
    check(page_size >= 1, "page_size must be at least 1");
  } else {
    check(keys.ndim() == 4 && keys.shape(0) == B && keys.shape(1) == spec.Hkv && keys.shape(3) == spec.D,
          "a KVCache's buffers must be [B, Hkv, S, D]");
  }
  check(positions.ndim() == 1 && positions.dtype() == mx::int32 && positions.shape(0) == B, "positions must be int32 [B]");
  check(cos.ndim() == 2 && cos.dtype() == mx::float32 && cos.shape(1) == spec.D / 2 && sin.shape() == cos.shape() &&
            sin.dtype() == mx::float32,
        "cos and sin must be float32 [P, D / 2]");
  size_t expected = 2 + (spec.final_norm ? 1 : 0);
  for (int j = 0; j < 7; ++j) expected += (spec.bits[j] ? 3 : 1) + (spec.has_bias[j] ? 1 : 0);
  check(weights.size() == expected, "weights do not match the layer's spec");
  std::vector<mx::array> inputs{h, keys, values,
                                paged ? contiguous(*pages, stream) : positions, contiguous(positions, stream),
                                contiguous(cos, stream), contiguous(sin, stream)};
  for (const auto& w : weights) inputs.push_back(contiguous(w, stream));
  return mx::array::make_arrays({h.shape(), keys.shape(), values.shape()}, {h.dtype(), keys.dtype(), values.dtype()},
                                std::make_shared<DecodeLayer>(stream, spec, paged, page_size), inputs);
}

LayerSpec layer_spec(int E, int I, int Hq, int Hkv, int D, float eps, float scale, bool traditional,
                     std::vector<int> bits, std::vector<int> group_size, std::vector<bool> has_bias, bool final_norm,
                     float final_eps) {
  check(E > 0 && I > 0 && Hq > 0 && Hkv > 0 && D > 0 && D % 2 == 0 && Hq % Hkv == 0, "bad layer sizes");
  check(bits.size() == 7 && group_size.size() == 7 && has_bias.size() == 7, "seven projections: q, k, v, o, gate, up, down");
  for (int j = 0; j < 7; ++j)
    check(bits[j] == 0 || ((bits[j] == 4 || bits[j] == 8) && (group_size[j] == 32 || group_size[j] == 64 || group_size[j] == 128)),
          "a projection is float (bits 0) or 4/8-bit in groups of 32, 64 or 128");
  return LayerSpec{E, I, Hq, Hkv, D, eps, scale, traditional, std::move(bits), std::move(group_size),
                   std::move(has_bias), final_norm, final_eps};
}

// Runs a day's functions on a few numbers, at once and on this thread, so that a day not
// written yet is found before any graph is built (its error would otherwise surface on
// MLX's stream thread).
void probe(const std::string& day) {
  if (day == "week2-day6") {
    std::vector<uint32_t> w(4, 0x76543210u);  // 1 row of 32 4-bit values
    std::vector<float> s{1.0f}, b{0.0f}, x(32, 1.0f), out(32), y(1);
    dequantize_rows(w.data(), s.data(), b.data(), 1, 32, 32, 4, out.data());
    qmv_rows(x.data(), 1, w.data(), s.data(), b.data(), 1, 32, 32, 4, y.data(), 1);
    matmul_tile(x.data(), 1, out.data(), 1, 32, y.data(), 1);
  } else if (day == "week2-day7") {
    std::vector<float> h(4, 1.0f), w(4, 1.0f), out(4), c(2, 1.0f), z(2, 0.0f);
    add_rms_norm(h.data(), nullptr, w.data(), 4, 1e-6f, out.data());
    rope_rows(h.data(), 1, 4, c.data(), z.data(), false);
    swiglu(h.data(), w.data(), 4, out.data());
  } else if (day == "week3-day6") {
    std::vector<float> q(4, 1.0f), kv(4, 1.0f), out(4);
    std::vector<int32_t> pages{0};
    PagedQuery<float> a{q.data(), 1, 1, 4, 4, 0, 1.0f, kv.data(), kv.data(), 4, 4, pages.data(), 1, out.data()};
    attend_paged(a);
  } else {
    throw std::invalid_argument("no kernel belongs to " + day);
  }
}


}  // namespace

template <typename T>
void to_float(const T* src, int n, float* dst) {
  constexpr mx::Dtype dt = std::is_same_v<T, float> ? mx::float32 : std::is_same_v<T, float16_t> ? mx::float16 : mx::bfloat16;
  load_row(src, dt, 0, n, dst);
}
template void to_float<float>(const float*, int, float*);
template void to_float<float16_t>(const float16_t*, int, float*);
template void to_float<bfloat16_t>(const bfloat16_t*, int, float*);

}  // namespace tiny_llm

NB_MODULE(_ext, m) {
  using namespace tiny_llm;
  nb::module_::import_("mlx.core");  // the array type's bindings, and libmlx loaded first
  m.doc() = "tiny-llm's CPU kernels as MLX primitives (use tiny_llm.kernels, which checks arguments)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const NotImplemented& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  m.def("quantized_matmul", &quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a, "bias"_a = nb::none(),
        "group_size"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("matmul", &matmul, "x"_a, "w"_a, "bias"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none());
  m.def("paged_attention", &paged_attention, "q"_a, "keys"_a, "values"_a, "pages"_a, "starts"_a, "page_size"_a,
        "scale"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("dense_attention", &dense_attention, "q"_a, "keys"_a, "values"_a, "start"_a, "scale"_a, nb::kw_only(),
        "stream"_a = nb::none());
  nb::class_<LayerSpec>(m, "LayerSpec");
  m.def("layer_spec", &layer_spec, "E"_a, "I"_a, "Hq"_a, "Hkv"_a, "D"_a, "eps"_a, "scale"_a, "traditional"_a, "bits"_a,
        "group_size"_a, "has_bias"_a, "final_norm"_a, "final_eps"_a);
  m.def("decode_layer", &decode_layer, "h"_a, "keys"_a, "values"_a, "pages"_a.none(), "positions"_a, "cos"_a, "sin"_a,
        "weights"_a, "spec"_a, "page_size"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("probe", &probe, "day"_a);
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.attr("simd") = std::string(simd());
  m.attr("mlx_version") = std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) + "." +
                          std::to_string(MLX_VERSION_PATCH);  // the headers built against
}
