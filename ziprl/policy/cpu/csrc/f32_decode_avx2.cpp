// One decode step of a float32 Llama decoder on a CPU with AVX2 and FMA (no AVX-512: AMD Zen 3, Intel client chips):
// every row's next-token logits from its last token, its keys and values written into the KV cache in place. Built on
// first use by ziprl/policy/cpu/fused_decode.py, with -mavx2 -mfma only. The float32 twin of bf16_decode.cpp.
//
// Matrix products multiply at most 8 rows at a time against weights packed as [N/8][K][8][1] float32 (pack_into): each
// 32-byte load of weights holds 8 output columns of one input and feeds up to 8 rows' FMAs, with no horizontal sums,
// so a step streams the weights once at batch <= 8. Each output is one FMA chain over K in order, whatever the batch:
// a row's numbers do not depend on the rows beside it.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline __m256 exp8(__m256 x) {  // e^x (Cephes expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp)
  // clamped so that 2^n stays a normal float: e^-87 (1.6e-38) stands for anything smaller
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(two_n));
}

// Weights are prefetched this many floats (4 KB) ahead of the loads: at 8 rows a load feeds 8 FMAs, too slow a stream
// for the hardware prefetcher alone (a batch-8 product ran 1.4x faster with it, near the memory's rate).
constexpr int64_t kPrefetch = 1024;

// y[m, t-th 8 columns] (+)= x[m, :] . w[t-th 8 columns, :] over all K; x rows ldx apart, y rows ldy apart.
// M * T accumulators <= 8 (with the T weight vectors and a broadcast, within AVX2's 16 registers). The loops over m
// and t are unrolled before GCC places the accumulators: without the pragmas it kept them in registers but also
// stored all of them to the stack on every k, halving the kernel's speed.
template <int M, int T>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy, bool accumulate) {
  __m256 acc[M][T];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[m][t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 wv[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) wv[t] = _mm256_loadu_ps(w + (t * K + k) * 8);
    if ((k & 1) == 0)  // a 64-byte line per two k
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        _mm_prefetch(reinterpret_cast<const char*>(w + (t * K + k) * 8 + kPrefetch), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[m][t] = _mm256_fmadd_ps(xv, wv[t], acc[m][t]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float* out = y + m * ldy + t * 8;
      _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(_mm256_loadu_ps(out), acc[m][t]) : acc[m][t]);
    }
}

// `tiles` blocks of 8 columns for `m` (1..8) rows: T blocks a pass, as many as 8 accumulators allow
template <int M>
void tiles_of(const float* x, int64_t ldx, const float* w, int64_t K, int64_t tiles, float* y, int64_t ldy,
              bool accumulate) {
  constexpr int T = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  int64_t t = 0;
  for (; t + T <= tiles; t += T) tile<M, T>(x, ldx, w + t * K * 8, K, y + t * 8, ldy, accumulate);
  for (; t < tiles; ++t) tile<M, 1>(x, ldx, w + t * K * 8, K, y + t * 8, ldy, accumulate);
}

void rows_of(int m, const float* x, int64_t ldx, const float* w, int64_t K, int64_t tiles, float* y, int64_t ldy,
             bool accumulate) {
  switch (m) {
    case 1: return tiles_of<1>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 2: return tiles_of<2>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 3: return tiles_of<3>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 4: return tiles_of<4>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 5: return tiles_of<5>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 6: return tiles_of<6>(x, ldx, w, K, tiles, y, ldy, accumulate);
    case 7: return tiles_of<7>(x, ldx, w, K, tiles, y, ldy, accumulate);
    default: return tiles_of<8>(x, ldx, w, K, tiles, y, ldy, accumulate);
  }
}

// y[M, N] = x[M, K] @ W^T, W packed [N/8][K][8][1]; added to y when accumulate
void matmul(const float* x, int64_t M, int64_t K, const torch::Tensor& packed, float* y, bool accumulate) {
  constexpr int64_t G = 4;  // blocks of 8 columns a task
  const int64_t nt = packed.size(0), n = nt * 8;
  TORCH_CHECK(packed.size(1) == K, "f32_decode_avx2: packed weight has K = ", packed.size(1), ", input K = ", K);
  const auto* w = packed.data_ptr<float>();
  at::parallel_for(0, (nt + G - 1) / G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t t0 = g * G, tiles = std::min(G, nt - t0);
      for (int64_t m0 = 0; m0 < M; m0 += 8)
        rows_of(static_cast<int>(std::min<int64_t>(8, M - m0)), x + m0 * K, K, w + t0 * K * 8, K, tiles,
                y + m0 * n + t0 * 8, n, accumulate);
    }
  });
}

// out[m] = x[m] / rms(x[m]) * weight; H a multiple of 8
void rms_norm(const float* x, int64_t M, int64_t H, const torch::Tensor& weight, double eps, float* out) {
  const auto* w = weight.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * H;
    __m256 ss = _mm256_setzero_ps();
    for (int64_t i = 0; i < H; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(r + i), ss);
    const __m256 scale = _mm256_set1_ps(1.0f / std::sqrt(hsum(ss) / H + static_cast<float>(eps)));
    for (int64_t i = 0; i < H; i += 8)
      _mm256_storeu_ps(out + m * H + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + i), scale),
                                                      _mm256_loadu_ps(w + i)));
  }
}

// rotate-half RoPE of one head vector in place, from its row's cos / sin tables (d/2 each)
void rope(float* v, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * cos[i] - x2 * sin[i];
    v[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

// softmax(q k^T * scale) v of one row's `group` query heads that share one key/value head, over the cache columns its
// mask keeps; keys / values [cap, hd], q and out [group, hd] (hd a multiple of 8, <= 256): each key and value read once
void attend(const float* q, int64_t group, int64_t hd, const float* keys, const float* values, const int64_t* mask,
            int64_t ctx, float scale, std::vector<float>& p, float* out) {
  const int64_t nv = hd / 8, stride = (ctx + 7) / 8 * 8;
  p.assign(group * stride, -INFINITY);
  for (int64_t c = 0; c < ctx; ++c) {
    if (!mask[c]) continue;
    __m256 k[32];
    for (int64_t v = 0; v < nv; ++v) k[v] = _mm256_loadu_ps(keys + c * hd + v * 8);
    for (int64_t j = 0; j < group; ++j) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t v = 0; v < nv; ++v) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * hd + v * 8), k[v], acc);
      p[j * stride + c] = hsum(acc) * scale;
    }
  }
  std::vector<float> total(group, 0.0f);
  for (int64_t j = 0; j < group; ++j) {
    float* row = p.data() + j * stride;
    const float top = *std::max_element(row, row + ctx);
    for (int64_t c = 0; c < stride; c += 8)
      _mm256_storeu_ps(row + c, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c), _mm256_set1_ps(top))));
  }
  std::vector<__m256> o(group * nv, _mm256_setzero_ps());
  for (int64_t c = 0; c < ctx; ++c) {
    if (!mask[c]) continue;
    __m256 v[32];
    for (int64_t i = 0; i < nv; ++i) v[i] = _mm256_loadu_ps(values + c * hd + i * 8);
    for (int64_t j = 0; j < group; ++j) {
      const float e = p[j * stride + c];
      total[j] += e;
      const __m256 ev = _mm256_set1_ps(e);
      for (int64_t i = 0; i < nv; ++i) o[j * nv + i] = _mm256_fmadd_ps(ev, v[i], o[j * nv + i]);
    }
  }
  for (int64_t j = 0; j < group; ++j) {
    const __m256 inv = _mm256_set1_ps(1.0f / total[j]);
    for (int64_t i = 0; i < nv; ++i) _mm256_storeu_ps(out + j * hd + i * 8, _mm256_mul_ps(o[j * nv + i], inv));
  }
}

// Weights `w`: [embed [V, H], final norm, LM head packed, then per layer: input norm, q+k+v packed, o packed,
// post-attention norm, gate+up packed, down packed], all float32
constexpr int kPerLayer = 6;

// dims: hidden, heads, kv heads, head dim, intermediate, vocab. Rows b feed tokens[b] at positions[b]; mask
// [B, length + 1] marks the cache columns each row attends to (its own new one, column `length`, included).
torch::Tensor step(const std::vector<torch::Tensor>& w, const torch::Tensor& inv_freq, std::vector<int64_t> dims,
                   double eps, double attention_scaling, const torch::Tensor& tokens, const torch::Tensor& positions,
                   const torch::Tensor& mask, const std::vector<torch::Tensor>& keys,
                   const std::vector<torch::Tensor>& values, int64_t length) {
  TORCH_CHECK(dims.size() == 6, "f32_decode_avx2: dims are hidden, heads, kv heads, head dim, intermediate, vocab");
  const int64_t H = dims[0], heads = dims[1], kv_heads = dims[2], hd = dims[3], inter = dims[4], vocab = dims[5];
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(static_cast<int64_t>(w.size()) == 3 + kPerLayer * layers && values.size() == keys.size(),
              "f32_decode_avx2: ", w.size(), " weights for ", layers, " layers");
  for (const auto& t : w)
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous(), "f32_decode_avx2: weights must be float32");
  TORCH_CHECK(hd % 8 == 0 && hd <= 256 && H % 8 == 0 && inter % 8 == 0,
              "f32_decode_avx2: widths must be multiples of 8 (head dim <= 256)");
  const int64_t B = tokens.size(0), nq = heads * hd, nkv = kv_heads * hd, width = nq + 2 * nkv;
  const int64_t group = heads / kv_heads, ctx = length + 1, half = hd / 2;
  TORCH_CHECK(mask.size(0) == B && mask.size(1) == ctx, "f32_decode_avx2: mask must be [B, length + 1]");
  const auto* tok = tokens.data_ptr<int64_t>();
  const auto* pos = positions.data_ptr<int64_t>();
  const auto* msk = mask.data_ptr<int64_t>();
  const auto* freq = inv_freq.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(tok[b] >= 0 && tok[b] < w[0].size(0) && pos[b] >= 0, "f32_decode_avx2: row ", b, " has token ",
                tok[b], " (vocabulary ", w[0].size(0), ") at position ", pos[b]);
    TORCH_CHECK(msk[b * ctx + length], "f32_decode_avx2: row ", b, "'s mask leaves out its own new column");
  }

  std::vector<float> x(B * H), xn(B * std::max(H, nq)), qkv(B * width), gu(B * 2 * inter), act(B * inter);
  std::vector<float> cosb(B * half), sinb(B * half);
  const auto* embed = w[0].data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(&x[b * H], embed + tok[b] * H, sizeof(float) * H);
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos[b]) * freq[i];
      cosb[b * half + i] = std::cos(a) * static_cast<float>(attention_scaling);
      sinb[b * half + i] = std::sin(a) * static_cast<float>(attention_scaling);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t l = 0; l < layers; ++l) {
    const torch::Tensor* lw = &w[3 + kPerLayer * l];
    const int64_t cap = keys[l].size(2);
    TORCH_CHECK(length < cap && keys[l].size(0) == B && values[l].sizes() == keys[l].sizes() &&
                    keys[l].scalar_type() == torch::kFloat32 && values[l].scalar_type() == torch::kFloat32,
                "f32_decode_avx2: layer ", l, "'s float32 KV cache has no room at column ", length, " for ", B,
                " rows");
    auto* kc = keys[l].data_ptr<float>();
    auto* vc = values[l].data_ptr<float>();
    rms_norm(x.data(), B, H, lw[0], eps, xn.data());
    matmul(xn.data(), B, H, lw[1], qkv.data(), false);
    for (int64_t b = 0; b < B; ++b) {  // RoPE on q and k; the new key and value into cache column `length`
      float* row = qkv.data() + b * width;
      for (int64_t h = 0; h < heads + kv_heads; ++h) rope(row + h * hd, hd, &cosb[b * half], &sinb[b * half]);
      for (int64_t h = 0; h < kv_heads; ++h) {
        std::memcpy(kc + ((b * kv_heads + h) * cap + length) * hd, row + nq + h * hd, sizeof(float) * hd);
        std::memcpy(vc + ((b * kv_heads + h) * cap + length) * hd, row + nq + nkv + h * hd, sizeof(float) * hd);
      }
    }
    at::parallel_for(0, B * kv_heads, 1, [&](int64_t t0, int64_t t1) {  // a task per (row, kv head)
      std::vector<float> p;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / kv_heads, g = t % kv_heads;
        attend(qkv.data() + b * width + g * group * hd, group, hd, kc + (b * kv_heads + g) * cap * hd,
               vc + (b * kv_heads + g) * cap * hd, msk + b * ctx, ctx, scale, p, xn.data() + b * nq + g * group * hd);
      }
    });
    matmul(xn.data(), B, nq, lw[2], x.data(), true);  // o projection, added to the residual
    rms_norm(x.data(), B, H, lw[3], eps, xn.data());
    matmul(xn.data(), B, H, lw[4], gu.data(), false);
    for (int64_t b = 0; b < B; ++b)  // act = silu(gate) * up
      for (int64_t i = 0; i < inter; i += 8) {
        const __m256 g = _mm256_loadu_ps(&gu[b * 2 * inter + i]);
        const __m256 u = _mm256_loadu_ps(&gu[b * 2 * inter + inter + i]);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(&act[b * inter + i], _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u));
      }
    matmul(act.data(), B, inter, lw[5], x.data(), true);  // down projection, added to the residual
  }
  rms_norm(x.data(), B, H, w[1], eps, xn.data());
  auto logits = torch::empty({B, vocab}, torch::kFloat32);
  matmul(xn.data(), B, H, w[2], logits.data_ptr<float>(), false);
  return logits;
}

// weight [n, K] float32 (contiguous) written into packed [N/8][K][8][1] from block row `start` on
void pack_into(torch::Tensor packed, const torch::Tensor& weight, int64_t start) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 && packed.scalar_type() == torch::kFloat32 &&
                  weight.is_contiguous() && packed.is_contiguous(),
              "f32_decode_avx2: pack_into takes contiguous float32 tensors");
  const int64_t n = weight.size(0), K = weight.size(1);
  TORCH_CHECK(n % 8 == 0 && packed.size(1) == K && start + n / 8 <= packed.size(0),
              "f32_decode_avx2: a [", n, ", ", K, "] weight does not fit the packed layout at ", start);
  const auto* src = weight.data_ptr<float>();
  auto* dst = packed.data_ptr<float>() + start * K * 8;
  at::parallel_for(0, n / 8, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t j = 0; j < 8; ++j) {
        const float* row = src + (b * 8 + j) * K;
        float* out = dst + b * K * 8 + j;
        for (int64_t k = 0; k < K; ++k) out[k * 8] = row[k];
      }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_into", &pack_into, "a float32 weight into the packed layout, from a block row on");
  m.def("step", &step, "one decode step of a float32 Llama decoder: [B, V] float32 logits; keys/values written in place");
}
