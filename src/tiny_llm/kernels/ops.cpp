// Engine — the kernels as MLX primitives (`eval_cpu` only) and their Python module
// `tiny_llm.kernels._ext`: activations, scales and pool entries of float32, float16 or
// bfloat16 are turned into float rows here, the course days' functions do the arithmetic,
// and the work is cut into pieces for the thread pool.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

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

// ---- matrix products -----------------------------------------------------------------------

// A product `out [M, N] = x [M, K] @ W.T (+ bias)` whatever W's storage: `fill` writes rows
// n0 .. n0 + rows - 1 of W as float into `tile` (or returns a pointer to them as they are).
struct Product {
  Source x;
  mx::Dtype xt;
  const void* bias;  // nullptr: none
  mx::Dtype bt;
  void* out;
  int M, N, K;
};

// Rows of W per piece of work: few for prefill (a tile of them stays in cache while every row
// of x passes), more for decode (each piece must be worth waking a thread for).
constexpr int DECODE_ROWS = 4;  // below this many rows of x, the decode path
constexpr int TILE_ROWS = 16, DECODE_TILE_ROWS = 64;

// out[r] += bias[n0 + r] (in float, before the one rounding to the output's dtype).
void add_bias(const Product& p, int n0, int rows, float* out) {
  if (!p.bias) return;
  thread_local std::vector<float> b;
  b.resize(rows);
  load_row(p.bias, p.bt, n0, rows, b.data());
  for (int r = 0; r < rows; ++r) out[r] += b[r];
}

template <typename Fill>
void run_tiled(const Product& p, const std::vector<float>& x, Fill fill) {
  const int NB = p.M < DECODE_ROWS ? DECODE_TILE_ROWS : TILE_ROWS;
  const int pieces = (p.N + NB - 1) / NB;
  parallel_for(pieces, [&](int t) {
    thread_local std::vector<float> tile, o;
    const int n0 = t * NB, rows = std::min(NB, p.N - n0);
    tile.resize(static_cast<size_t>(NB) * p.K);
    o.resize(static_cast<size_t>(p.M) * NB);
    const float* w = fill(n0, rows, tile.data());
    matmul_tile(x.data(), p.M, w, rows, p.K, o.data(), NB);
    for (int m = 0; m < p.M; ++m) {
      add_bias(p, n0, rows, o.data() + m * NB);
      store_row(o.data() + m * NB, p.xt, p.out, static_cast<long>(m) * p.N + n0, rows);
    }
  });
}

std::vector<float> rows_as_float(const Product& p) {
  std::vector<float> x(static_cast<size_t>(p.M) * p.K);
  p.x.load(0, p.M * p.K, x.data());
  return x;
}

struct Quantized {
  const uint32_t* w;
  const void *scales, *biases;
  mx::Dtype st;
  int group_size, bits;
};

void run_quantized(const Product& p, const Quantized& q) {
  const std::vector<float> x = rows_as_float(p);
  const int G = p.K / q.group_size, words = p.K * q.bits / 32;
  if (p.M >= DECODE_ROWS) {  // prefill: unpack a tile of W once, use it for every row of x
    run_tiled(p, x, [&](int n0, int rows, float* tile) {
      thread_local std::vector<float> s, b;
      s.resize(static_cast<size_t>(rows) * G), b.resize(static_cast<size_t>(rows) * G);
      load_row(q.scales, q.st, static_cast<long>(n0) * G, rows * G, s.data());
      load_row(q.biases, q.st, static_cast<long>(n0) * G, rows * G, b.data());
      dequantize_rows(q.w + static_cast<long>(n0) * words, s.data(), b.data(), rows, p.K, q.group_size, q.bits, tile);
      return static_cast<const float*>(tile);
    });
    return;
  }
  // decode: unpack in registers only. float32 scales are read where they are; others are
  // turned into float a piece at a time (they are as many bytes as 4-bit weights).
  const int NB = DECODE_TILE_ROWS, pieces = (p.N + NB - 1) / NB;
  parallel_for(pieces, [&](int t) {
    thread_local std::vector<float> s, b, o;
    const int n0 = t * NB, rows = std::min(NB, p.N - n0);
    const long first = static_cast<long>(n0) * G;
    const float *sp = static_cast<const float*>(q.scales) + first, *bp = static_cast<const float*>(q.biases) + first;
    if (q.st != mx::float32) {
      s.resize(static_cast<size_t>(rows) * G), b.resize(static_cast<size_t>(rows) * G);
      load_row(q.scales, q.st, first, rows * G, s.data());
      load_row(q.biases, q.st, first, rows * G, b.data());
      sp = s.data(), bp = b.data();
    }
    o.resize(NB);
    for (int m = 0; m < p.M; ++m) {
      qmv_rows(x.data() + static_cast<size_t>(m) * p.K, q.w + static_cast<long>(n0) * words, sp, bp, rows, p.K,
               q.group_size, q.bits, o.data());
      add_bias(p, n0, rows, o.data());
      store_row(o.data(), p.xt, p.out, static_cast<long>(m) * p.N + n0, rows);
    }
  });
}

void run_float(const Product& p, const void* w, mx::Dtype wt) {
  const std::vector<float> x = rows_as_float(p);
  run_tiled(p, x, [&](int n0, int rows, float* tile) {
    if (wt == mx::float32) return static_cast<const float*>(w) + static_cast<long>(n0) * p.K;
    load_row(w, wt, static_cast<long>(n0) * p.K, rows * p.K, tile);
    return static_cast<const float*>(tile);
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
    const bool has_bias = inputs.size() > 4;
    const int K = x.shape(-1);
    Product p{Source(x), x.dtype(), has_bias ? inputs[4].data<void>() : nullptr,
              has_bias ? inputs[4].dtype() : x.dtype(), out.data<void>(), static_cast<int>(x.size() / K),
              out.shape(-1), K};
    Quantized q{w.data<uint32_t>(), scales.data<void>(), biases.data<void>(), scales.dtype(), group_size_, bits_};
    enc.dispatch([p, q] { run_quantized(p, q); });
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
    const bool has_bias = inputs.size() > 2;
    const int K = x.shape(-1);
    Product p{Source(x), x.dtype(), has_bias ? inputs[2].data<void>() : nullptr,
              has_bias ? inputs[2].dtype() : x.dtype(), out.data<void>(), static_cast<int>(x.size() / K),
              out.shape(-1), K};
    const void* wp = w.data<void>();
    const mx::Dtype wt = w.dtype();
    enc.dispatch([p, wp, wt] { run_float(p, wp, wt); });
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
    enc.dispatch([a] {
      switch (a.kt) {
        case mx::float32: run_attention<float>(a); break;
        case mx::float16: run_attention<float16_t>(a); break;
        default: run_attention<bfloat16_t>(a);
      }
    });
  }

 private:
  int page_size_;
  float scale_;
  bool dense_;
  int dense_start_;
};

// ---- building the ops ----------------------------------------------------------------------

void probe(const std::string& day);

// A day's functions must be written before a graph uses them: a starter's stub would
// otherwise throw on MLX's stream thread, where nothing can catch it. Checked once per day,
// here, when the op is built (its NotImplementedError reaches Python at once).
void ensure(const std::string& day) {
  static std::atomic<bool> week2{false}, week3{false};
  std::atomic<bool>& done = day == "week2-day6" ? week2 : week3;
  if (!done.load()) {
    probe(day);
    done.store(true);
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

// Runs a day's functions on a few numbers, at once and on this thread, so that a day not
// written yet is found before any graph is built (its error would otherwise surface on
// MLX's stream thread).
void probe(const std::string& day) {
  if (day == "week2-day6") {
    std::vector<uint32_t> w(4, 0x76543210u);  // 1 row of 32 4-bit values
    std::vector<float> s{1.0f}, b{0.0f}, x(32, 1.0f), out(32), y(1);
    dequantize_rows(w.data(), s.data(), b.data(), 1, 32, 32, 4, out.data());
    qmv_rows(x.data(), w.data(), s.data(), b.data(), 1, 32, 32, 4, y.data());
    matmul_tile(x.data(), 1, out.data(), 1, 32, y.data(), 1);
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
  m.def("probe", &probe, "day"_a);
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.attr("simd") = std::string(simd());
  m.attr("mlx_version") = std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) + "." +
                          std::to_string(MLX_VERSION_PATCH);  // the headers built against
}
