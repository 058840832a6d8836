// One decode step of a bfloat16 Llama decoder on a CPU with AVX-512 BF16: every row's next-token logits from its
// last token, its keys and values written into the KV cache in place. Built on first use by
// ziprl/policy/cpu/fused_decode.py.
//
// Matrix products multiply at most 8 rows at a time against weights packed as [N/16][K/2][16][2] bf16 (pack_into):
// each 64-byte load of weights feeds 8 rows' _mm512_dpbf16_ps, with no horizontal sums, so a step streams the weights
// once at batch <= 8. Activations, norms, RoPE, softmax and residuals are float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using bf16 = uint16_t;

inline float to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline __m512 load16(const bf16* p) {  // 16 bf16 -> float32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

inline void store16(bf16* p, __m512 v) {  // float32 -> 16 bf16, round to nearest even
  _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v));
}

inline __m512 round_bf16(__m512 v) {  // v rounded to bf16 and back, as a bf16 tensor holds it
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

inline __m512 exp16(__m512 x) {  // e^x (Cephes expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp)
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// acc[m][t] += x[m, kp-pair] . w[t-th 16 columns, kp-pair] over all K/2 pairs; x rows are ldx pairs apart
template <int M, int T>
inline void tile(const uint32_t* x, int64_t ldx, const uint32_t* w, int64_t kps, float* out) {
  __m512 acc[M][T];
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < T; ++t) acc[m][t] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kps; ++kp) {
    __m512bh wv[T];
    for (int t = 0; t < T; ++t) wv[t] = (__m512bh)_mm512_loadu_si512(w + (t * kps + kp) * 16);
    for (int m = 0; m < M; ++m) {
      __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + kp]));
      for (int t = 0; t < T; ++t) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], xv, wv[t]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + (m * T + t) * 16, acc[m][t]);
}

template <int T>
void tile_rows(int m, const uint32_t* x, int64_t ldx, const uint32_t* w, int64_t kps, float* out) {
  switch (m) {
    case 1: return tile<1, T>(x, ldx, w, kps, out);
    case 2: return tile<2, T>(x, ldx, w, kps, out);
    case 3: return tile<3, T>(x, ldx, w, kps, out);
    case 4: return tile<4, T>(x, ldx, w, kps, out);
    case 5: return tile<5, T>(x, ldx, w, kps, out);
    case 6: return tile<6, T>(x, ldx, w, kps, out);
    case 7: return tile<7, T>(x, ldx, w, kps, out);
    default: return tile<8, T>(x, ldx, w, kps, out);
  }
}

// y[M, N] = x[M, K] (bf16) @ W^T, W packed [N/16][K/2][16][2]; float32 out, added to y when accumulate
void matmul(const bf16* x, int64_t M, int64_t K, const torch::Tensor& packed, float* y, bool accumulate) {
  constexpr int T = 2;
  const int64_t nt = packed.size(0), kps = K / 2, n = nt * 16;
  TORCH_CHECK(packed.size(1) == kps, "bf16_decode: packed weight has K/2 = ", packed.size(1), ", input K = ", K);
  const auto* xp = reinterpret_cast<const uint32_t*>(x);
  const auto* w = reinterpret_cast<const uint32_t*>(packed.data_ptr());
  const int64_t groups = (nt + T - 1) / T;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    alignas(64) float acc[8 * T * 16];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t t0 = g * T;
      const int tt = static_cast<int>(std::min<int64_t>(T, nt - t0));
      for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const int mm = static_cast<int>(std::min<int64_t>(8, M - m0));
        if (tt == T) tile_rows<T>(mm, xp + m0 * kps, kps, w + t0 * kps * 16, kps, acc);
        else tile_rows<1>(mm, xp + m0 * kps, kps, w + t0 * kps * 16, kps, acc);
        for (int m = 0; m < mm; ++m) {
          float* row = y + (m0 + m) * n + t0 * 16;
          const float* src = acc + m * tt * 16;
          if (accumulate) for (int j = 0; j < tt * 16; ++j) row[j] += src[j];
          else std::memcpy(row, src, sizeof(float) * tt * 16);
        }
      }
    }
  });
}

// out[m] = bf16(x[m] / rms(x[m]) * weight); H a multiple of 16
void rms_norm(const float* x, int64_t M, int64_t H, const torch::Tensor& weight, double eps, bf16* out) {
  const auto* w = reinterpret_cast<const bf16*>(weight.data_ptr());
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * H;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < H; i += 16) ss = _mm512_fmadd_ps(_mm512_loadu_ps(r + i), _mm512_loadu_ps(r + i), ss);
    const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / H + static_cast<float>(eps)));
    for (int64_t i = 0; i < H; i += 16)
      store16(out + m * H + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i), scale), load16(w + i)));
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
// mask keeps; keys / values [cap, hd] bf16, q [group, hd] float32, out [group, hd] bf16 (hd a multiple of 16)
void attend(const float* q, int64_t group, int64_t hd, const bf16* keys, const bf16* values, const int64_t* mask,
            int64_t ctx, float scale, std::vector<float>& p, bf16* out) {
  const int64_t nv = hd / 16, stride = (ctx + 15) / 16 * 16;
  p.assign(group * stride, -INFINITY);
  for (int64_t c = 0; c < ctx; ++c) {
    if (!mask[c]) continue;
    __m512 k[16];
    for (int64_t v = 0; v < nv; ++v) k[v] = load16(keys + c * hd + v * 16);
    for (int64_t j = 0; j < group; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t v = 0; v < nv; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * hd + v * 16), k[v], acc);
      p[j * stride + c] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
  std::vector<float> total(group, 0.0f);
  for (int64_t j = 0; j < group; ++j) {
    float* row = p.data() + j * stride;
    const float top = *std::max_element(row, row + ctx);
    for (int64_t c = 0; c < stride; c += 16)
      _mm512_storeu_ps(row + c, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), _mm512_set1_ps(top))));
  }
  std::vector<__m512> o(group * nv, _mm512_setzero_ps());
  for (int64_t c = 0; c < ctx; ++c) {
    if (!mask[c]) continue;
    __m512 v[16];
    for (int64_t i = 0; i < nv; ++i) v[i] = load16(values + c * hd + i * 16);
    for (int64_t j = 0; j < group; ++j) {
      const float e = p[j * stride + c];
      total[j] += e;
      const __m512 ev = _mm512_set1_ps(e);
      for (int64_t i = 0; i < nv; ++i) o[j * nv + i] = _mm512_fmadd_ps(ev, v[i], o[j * nv + i]);
    }
  }
  for (int64_t j = 0; j < group; ++j) {
    const __m512 inv = _mm512_set1_ps(1.0f / total[j]);
    for (int64_t i = 0; i < nv; ++i) store16(out + j * hd + i * 16, _mm512_mul_ps(o[j * nv + i], inv));
  }
}

// Weights `w`: [embed bf16 [V, H], final norm, LM head packed, then per layer: input norm, q+k+v packed, o packed,
// post-attention norm, gate+up packed, down packed]
constexpr int kPerLayer = 6;

// dims: hidden, heads, kv heads, head dim, intermediate, vocab. Rows b feed tokens[b] at positions[b]; mask
// [B, length + 1] marks the cache columns each row attends to (its own new one, column `length`, included).
torch::Tensor step(const std::vector<torch::Tensor>& w, const torch::Tensor& inv_freq, std::vector<int64_t> dims,
                   double eps, double attention_scaling, const torch::Tensor& tokens, const torch::Tensor& positions,
                   const torch::Tensor& mask, const std::vector<torch::Tensor>& keys,
                   const std::vector<torch::Tensor>& values, int64_t length) {
  TORCH_CHECK(dims.size() == 6, "bf16_decode: dims are hidden, heads, kv heads, head dim, intermediate, vocab");
  const int64_t H = dims[0], heads = dims[1], kv_heads = dims[2], hd = dims[3], inter = dims[4], vocab = dims[5];
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(static_cast<int64_t>(w.size()) == 3 + kPerLayer * layers && values.size() == keys.size(),
              "bf16_decode: ", w.size(), " weights for ", layers, " layers");
  TORCH_CHECK(hd % 16 == 0 && hd <= 256 && H % 16 == 0 && inter % 16 == 0,
              "bf16_decode: widths must be multiples of 16 (head dim <= 256)");
  const int64_t B = tokens.size(0), nq = heads * hd, nkv = kv_heads * hd, width = nq + 2 * nkv;
  const int64_t group = heads / kv_heads, ctx = length + 1, half = hd / 2;
  TORCH_CHECK(mask.size(0) == B && mask.size(1) == ctx, "bf16_decode: mask must be [B, length + 1]");
  const auto* tok = tokens.data_ptr<int64_t>();
  const auto* pos = positions.data_ptr<int64_t>();
  const auto* msk = mask.data_ptr<int64_t>();
  const auto* freq = inv_freq.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(tok[b] >= 0 && tok[b] < w[0].size(0) && pos[b] >= 0, "bf16_decode: row ", b, " has token ", tok[b],
                " (vocabulary ", w[0].size(0), ") at position ", pos[b]);
    TORCH_CHECK(msk[b * ctx + length], "bf16_decode: row ", b, "'s mask leaves out its own new column");
  }

  std::vector<float> x(B * H), qkv(B * width), gu(B * 2 * inter), cosb(B * half), sinb(B * half);
  std::vector<bf16> xn(B * std::max(H, nq)), act(B * inter);
  const auto* embed = reinterpret_cast<const bf16*>(w[0].data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < H; ++i) x[b * H + i] = to_float(embed[tok[b] * H + i]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos[b]) * freq[i];
      cosb[b * half + i] = std::cos(a) * static_cast<float>(attention_scaling);
      sinb[b * half + i] = std::sin(a) * static_cast<float>(attention_scaling);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t l = 0; l < layers; ++l) {
    const torch::Tensor* lw = &w[3 + kPerLayer * l];
    auto* kc = reinterpret_cast<bf16*>(keys[l].data_ptr());
    auto* vc = reinterpret_cast<bf16*>(values[l].data_ptr());
    const int64_t cap = keys[l].size(2);
    TORCH_CHECK(length < cap && keys[l].size(0) == B && values[l].sizes() == keys[l].sizes() &&
                    keys[l].scalar_type() == torch::kBFloat16 && values[l].scalar_type() == torch::kBFloat16,
                "bf16_decode: layer ", l, "'s bf16 KV cache has no room at column ", length, " for ", B, " rows");
    rms_norm(x.data(), B, H, lw[0], eps, xn.data());
    matmul(xn.data(), B, H, lw[1], qkv.data(), false);
    for (int64_t b = 0; b < B; ++b) {  // q, k, v as bf16 projections give them; RoPE on q and k
      float* row = qkv.data() + b * width;
      for (int64_t i = 0; i < width; i += 16) _mm512_storeu_ps(row + i, round_bf16(_mm512_loadu_ps(row + i)));
      for (int64_t h = 0; h < heads + kv_heads; ++h) rope(row + h * hd, hd, &cosb[b * half], &sinb[b * half]);
      for (int64_t i = 0; i < nq; i += 16) _mm512_storeu_ps(row + i, round_bf16(_mm512_loadu_ps(row + i)));
      for (int64_t h = 0; h < kv_heads; ++h)  // the new key and value, into cache column `length`
        for (int64_t i = 0; i < hd; i += 16) {
          store16(kc + ((b * kv_heads + h) * cap + length) * hd + i, _mm512_loadu_ps(row + nq + h * hd + i));
          store16(vc + ((b * kv_heads + h) * cap + length) * hd + i, _mm512_loadu_ps(row + nq + nkv + h * hd + i));
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
    for (int64_t b = 0; b < B; ++b)  // act = bf16(silu(gate) * up), each factor a bf16 as the model rounds them
      for (int64_t i = 0; i < inter; i += 16) {
        const __m512 g = round_bf16(_mm512_loadu_ps(&gu[b * 2 * inter + i]));
        const __m512 u = round_bf16(_mm512_loadu_ps(&gu[b * 2 * inter + inter + i]));
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        store16(&act[b * inter + i], _mm512_mul_ps(round_bf16(silu), u));
      }
    matmul(act.data(), B, inter, lw[5], x.data(), true);  // down projection, added to the residual
  }
  rms_norm(x.data(), B, H, w[1], eps, xn.data());
  auto logits = torch::empty({B, vocab}, torch::kFloat32);
  matmul(xn.data(), B, H, w[2], logits.data_ptr<float>(), false);
  return logits;
}

// weight [n, K] bf16 (contiguous) written into packed [N/16][K/2][16][2] from block row `start` on
void pack_into(torch::Tensor packed, const torch::Tensor& weight, int64_t start) {
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous() && packed.is_contiguous(),
              "bf16_decode: pack_into takes contiguous bf16 tensors");
  const int64_t n = weight.size(0), kps = weight.size(1) / 2;
  TORCH_CHECK(n % 16 == 0 && weight.size(1) % 2 == 0 && packed.size(1) == kps && start + n / 16 <= packed.size(0),
              "bf16_decode: a [", n, ", ", weight.size(1), "] weight does not fit the packed layout at ", start);
  const auto* src = reinterpret_cast<const uint32_t*>(weight.data_ptr());
  auto* dst = reinterpret_cast<uint32_t*>(packed.data_ptr()) + start * kps * 16;
  at::parallel_for(0, n / 16, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t j = 0; j < 16; ++j) {
        const uint32_t* row = src + (b * 16 + j) * kps;
        uint32_t* out = dst + b * kps * 16 + j;
        for (int64_t kp = 0; kp < kps; ++kp) out[kp * 16] = row[kp];
      }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_into", &pack_into, "a bf16 weight into the packed layout, from a block row on");
  m.def("step", &step, "one decode step of a bf16 Llama decoder: [B, V] float32 logits; keys/values written in place");
}
