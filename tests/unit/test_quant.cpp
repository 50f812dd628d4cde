// Quantized frozen weights (core/quant.h, core/ops/quant_linear.h): the code books against their published
// definitions (QLoRA's NF4 quantiles, bitsandbytes' FP4 and dynamic 8-bit codes), quantize -> dequantize against a
// from-the-definition reference for int8, NF4, FP4 and double quantization, the blob's sizes and header, the
// dequantizing kernel on tiles, the quantized GEMMs against dequantize-then-GEMM, and a LoRA layer over a 4-bit
// base: its gradients against central finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/io/safetensors.h"
#include "core/ops/copy.h"
#include "core/ops/linear.h"
#include "core/ops/quant_linear.h"
#include "core/quant.h"
#include "models/layers.h"
#include "models/llava.h"
#include "models/weights.h"

using namespace hr;
using namespace hr::core;
using namespace hr::models;

namespace {

std::vector<float> randoms(std::size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = d(rng);
  return v;
}

// The standard normal's quantile function, by bisection on its CDF.
double normal_ppf(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

QuantFormat fmt(QuantType t, bool dq = false) {
  QuantFormat f;
  f.type = t;
  f.double_quant = dq;
  return f;
}

// Dequantized values from the definitions: the block's absmax (double quantized: the 8-bit code of
// (absmax - mean) / absmax2 times absmax2 plus the mean), times the nearest code of w / absmax.
std::vector<float> reference(const std::vector<float>& w, int64_t rows, int64_t cols, const QuantFormat& f) {
  const int64_t n = rows * cols;
  std::vector<float> out(static_cast<std::size_t>(n));
  if (f.type == QuantType::Int8) {
    for (int64_t r = 0; r < rows; ++r) {
      float am = 0;
      for (int64_t c = 0; c < cols; ++c) am = std::max(am, std::fabs(w[std::size_t(r * cols + c)]));
      for (int64_t c = 0; c < cols; ++c) {
        const float q = am > 0 ? std::nearbyint(w[std::size_t(r * cols + c)] * 127.f / am) : 0.f;
        out[std::size_t(r * cols + c)] = q * am / 127.f;
      }
    }
    return out;
  }
  const auto& code = code4(f.type);
  const int64_t nb = (n + f.block - 1) / f.block;
  std::vector<float> am(static_cast<std::size_t>(nb), 0.f), used;
  for (int64_t i = 0; i < n; ++i)
    am[std::size_t(i / f.block)] = std::max(am[std::size_t(i / f.block)], std::fabs(w[std::size_t(i)]));
  used = am;
  if (f.double_quant) {
    double mean = 0;
    for (float a : am) mean += a;
    const float offset = float(mean / double(nb));
    const auto& dyn = dynamic_code8();
    for (int64_t c = 0; c * 256 < nb; ++c) {
      float am2 = 0;
      for (int64_t b = c * 256; b < std::min(nb, c * 256 + 256); ++b)
        am2 = std::max(am2, std::fabs(am[std::size_t(b)] - offset));
      for (int64_t b = c * 256; b < std::min(nb, c * 256 + 256); ++b) {
        const float x = am2 > 0 ? (am[std::size_t(b)] - offset) / am2 : 0.f;
        used[std::size_t(b)] = dyn[std::size_t(nearest_code(dyn.data(), 256, x))] * am2 + offset;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const float a = am[std::size_t(i / f.block)];
    const int q = nearest_code(code.data(), 16, a > 0 ? w[std::size_t(i)] / a : 0.f);
    out[std::size_t(i)] = code[std::size_t(q)] * used[std::size_t(i / f.block)];
  }
  return out;
}

Tensor host_blob(std::vector<uint8_t>& b) {
  return Tensor::wrap(b.data(), {int64_t(b.size())}, DType::U8, Device::host(), [] {});
}

}  // namespace

TEST(QuantCodes, Nf4IsQloraNormalQuantiles) {
  // bitsandbytes' create_normal_map(0.9677083): 8 positive quantiles from linspace(offset, 0.5, 9), 7 negative from
  // linspace(offset, 0.5, 8), zero, all divided by the largest.
  const double offset = 0.9677083;
  std::vector<double> v;
  for (int i = 0; i < 8; ++i) v.push_back(normal_ppf(offset + (0.5 - offset) * i / 8.0));
  for (int i = 0; i < 7; ++i) v.push_back(-normal_ppf(offset + (0.5 - offset) * i / 7.0));
  v.push_back(0);
  std::sort(v.begin(), v.end());
  const double top = v.back();
  const auto& nf4 = code4(QuantType::NF4);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(nf4[std::size_t(i)], v[std::size_t(i)] / top, 2e-7) << i;
}

TEST(QuantCodes, Fp4IsBitsandbytesE2m1) {
  // Sign in bit 3; magnitude bits 0b000..0b111 stand for 0, 0.0625, 8, 12, 4, 6, 2, 3 (over 12).
  const float mag[8] = {0, 0.0625f, 8, 12, 4, 6, 2, 3};
  const auto& fp4 = code4(QuantType::FP4);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(fp4[std::size_t(i)], (i & 8 ? -1.f : 1.f) * mag[i & 7] / 12.f) << i;
}

TEST(QuantCodes, DynamicCodeIsSymmetricWithZeroAndOne) {
  const auto& d = dynamic_code8();
  EXPECT_EQ(d[127], 0.f);
  EXPECT_EQ(d[255], 1.f);
  for (int i = 0; i < 255; ++i) EXPECT_EQ(d[std::size_t(i)], -d[std::size_t(254 - i)]) << i;
  for (int i = 1; i < 256; ++i) EXPECT_LT(d[std::size_t(i - 1)], d[std::size_t(i)]) << i;
  // The smallest magnitude: 1e-6 x the midpoint of [0.1, 1]; the largest below 1: the last midpoint of 65 points.
  EXPECT_FLOAT_EQ(d[128], 0.55e-6f);
  EXPECT_FLOAT_EQ(d[254], (1.f + (0.1f + 0.9f * 63.f / 64.f)) / 2.f);
}

TEST(Quant, RoundTripsMatchTheDefinitions) {
  // 5 x 37: blocks of 64 straddle rows and the last byte holds one element.
  const int64_t rows = 5, cols = 37;
  std::vector<float> w = randoms(std::size_t(rows * cols), 11, 0.05f);
  w[3] = 0.4f;  // an outlier: its block's other values use few codes
  for (int64_t c = 0; c < cols; ++c) w[std::size_t(2 * cols + c)] = 0.f;  // an all-zero row (int8's scale is 0)
  for (const QuantFormat& f : {fmt(QuantType::Int8), fmt(QuantType::NF4), fmt(QuantType::FP4),
                               fmt(QuantType::NF4, true), fmt(QuantType::FP4, true)}) {
    SCOPED_TRACE(f.describe());
    std::vector<uint8_t> blob = quantize(w.data(), rows, cols, f);
    const QuantLayout l = read_layout(blob.data(), int64_t(blob.size()), "w");
    EXPECT_EQ(l.rows, rows);
    EXPECT_EQ(l.cols, cols);
    EXPECT_EQ(l.bytes, int64_t(blob.size()));
    const std::vector<float> got = dequantize(blob.data(), l), want = reference(w, rows, cols, f);
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    // Worst error: half the widest gap between neighbouring codes times the block's absmax (int8: half a step).
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float gap = f.type == QuantType::Int8 ? 1.f / 127.f : f.type == QuantType::NF4 ? 0.2771f : 0.3334f;
      ASSERT_LE(std::fabs(got[i] - w[i]), 0.4f * gap / 2.f * 1.01f + 1e-3f) << i;
    }
  }
}

TEST(Quant, BlobSizesAreTheBitsAndTheConstants) {
  // 4096 x 4096 in NF4 with double quantization: 4 bits + 8 / 64 + 32 / (64 x 256) per parameter (QLoRA's 4.127).
  const QuantLayout l = QuantLayout::of(fmt(QuantType::NF4, true), 4096, 4096);
  const int64_t n = 4096 * 4096;
  EXPECT_EQ(l.bytes, kQuantHeaderBytes + n / 2 + n / 64 + 4 * (n / 64 / 256));
  EXPECT_NEAR(double(l.bytes - kQuantHeaderBytes) * 8 / double(n), 4.127, 1e-3);
  EXPECT_EQ(QuantLayout::of(fmt(QuantType::NF4), 4096, 4096).bytes, kQuantHeaderBytes + n / 2 + 4 * (n / 64));
  EXPECT_EQ(QuantLayout::of(fmt(QuantType::Int8), 4096, 11008).bytes, kQuantHeaderBytes + 4096 * 11008 + 4 * 4096);
  // A blob that is not one, or whose size disagrees with its header, is refused by name.
  std::vector<uint8_t> junk(64, 0);
  EXPECT_THROW(read_layout(junk.data(), 64, "layers.0.q_proj.weight"), Error);
  std::vector<float> w = randoms(64, 1);
  std::vector<uint8_t> blob = quantize(w.data(), 8, 8, fmt(QuantType::NF4));
  try {
    read_layout(blob.data(), int64_t(blob.size()) - 1, "layers.0.q_proj.weight");
    FAIL() << "a truncated blob was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.q_proj.weight"), std::string::npos) << e.what();
  }
  w[5] = std::nanf("");
  EXPECT_THROW(quantize(w.data(), 8, 8, fmt(QuantType::NF4)), Error);
}

TEST(Quant, KernelTilesMatchTheReference) {
  const int64_t rows = 7, cols = 150;
  const std::vector<float> w = randoms(std::size_t(rows * cols), 3, 0.1f);
  for (const QuantFormat& f : {fmt(QuantType::Int8), fmt(QuantType::NF4, true), fmt(QuantType::FP4)}) {
    SCOPED_TRACE(f.describe());
    std::vector<uint8_t> b = quantize(w.data(), rows, cols, f);
    const QuantLayout l = QuantLayout::of(f, rows, cols);
    const std::vector<float> full = dequantize(b.data(), l);
    const Tensor blob = host_blob(b).to(Device::cpu());
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor tile = Tensor::empty({3, 65}, dt, Device::cpu());
      dequantize_into(blob, l, 2, 51, tile);
      const std::vector<float> got = tile.to_floats();
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < 65; ++c) {
          const float want = full[std::size_t((2 + r) * cols + 51 + c)];
          ASSERT_EQ(got[std::size_t(r * 65 + c)], dt == DType::F32 ? want : to_f32(to_bf16(want))) << r << "," << c;
        }
    }
    Tensor too_far = Tensor::empty({3, 65}, DType::F32, Device::cpu());
    EXPECT_THROW(dequantize_into(blob, l, 5, 51, too_far), Error);
  }
}

TEST(Quant, QuantizedGemmsEqualDequantizeThenGemm) {
  const int64_t out = 48, in = 80, tokens = 6;
  const std::vector<float> w = randoms(std::size_t(out * in), 5, 0.05f), x = randoms(std::size_t(tokens * in), 6),
                           dy = randoms(std::size_t(tokens * out), 7), b = randoms(std::size_t(out), 8);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (const QuantFormat& f : {fmt(QuantType::NF4, true), fmt(QuantType::Int8)}) {
      std::vector<uint8_t> q = quantize(w.data(), out, in, f);
      const QuantLayout l = QuantLayout::of(f, out, in);
      const Tensor blob = host_blob(q).to(Device::cpu());
      const Tensor W = dequantize_weight(blob, l, dt);
      const Tensor X = Tensor::from_floats(x, {2, 3, in}, dt, Device::cpu());
      const Tensor DY = Tensor::from_floats(dy, {2, 3, out}, dt, Device::cpu());
      const Tensor bias = Tensor::from_floats(b, {out}, dt, Device::cpu());
      const std::vector<float> y_ref = linear_forward(X, W, bias).to_floats();
      LinearBackwardOptions o;
      o.weight_grads = false;
      const std::vector<float> dx_ref = linear_backward(DY, X, W, Bias::No, o).dx.to_floats();
      // Whole, and in tiles of 7 rows / 11 columns (tile bytes that do not divide the weight).
      for (int64_t tile : {kDequantTileBytes, int64_t(7 * in * dtype_size(dt)), int64_t(11 * out * dtype_size(dt))}) {
        const Tensor y = qlinear_forward(X, blob, l, bias, tile);
        const Tensor dx = qlinear_backward_dx(DY, blob, l, tile);
        EXPECT_EQ(y.shape(), (Shape{2, 3, out}));
        EXPECT_EQ(dx.shape(), (Shape{2, 3, in}));
        const std::vector<float> yg = y.to_floats(), dxg = dx.to_floats();
        const float tol = dt == DType::F32 ? 1e-5f : 2e-2f;
        for (std::size_t i = 0; i < yg.size(); ++i) ASSERT_NEAR(yg[i], y_ref[i], tol * (1 + std::fabs(y_ref[i]))) << i;
        for (std::size_t i = 0; i < dxg.size(); ++i)
          ASSERT_NEAR(dxg[i], dx_ref[i], tol * (1 + std::fabs(dx_ref[i]))) << i;
      }
    }
  }
}

TEST(Quant, LoraOverA4BitBaseMatchesFiniteDifferences) {
  // y = deq(W) x + s B A x: dx, dA and dB against central differences of sum(g * y) in double.
  const int64_t tokens = 3, in = 70, out = 9, r = 2;
  ParamStore store(Device::cpu(), DType::F32);
  store.add_group("layer", GroupKind::DecoderLayer);
  ParamStore::GroupScope scope(store, 0);
  LoraSpec spec;
  spec.r = r;
  spec.alpha = 6.f;
  spec.targets = {"q_proj"};
  spec.base_bits = 4;
  const Linear l = Linear::make(store, "model.layers.0.self_attn.q_proj", in, out, Bias::No, &spec);
  ASSERT_TRUE(l.quantized());
  EXPECT_FALSE(l.weight->trainable);
  EXPECT_EQ(l.weight->count(), out * in);
  EXPECT_EQ(l.in(), in);
  EXPECT_EQ(l.out(), out);
  const std::vector<float> W = randoms(std::size_t(out * in), 1, 0.1f), A = randoms(std::size_t(r * in), 2),
                           B = randoms(std::size_t(out * r), 3), x = randoms(std::size_t(tokens * in), 4),
                           g = randoms(std::size_t(tokens * out), 5);
  EXPECT_EQ(assign_param(*l.weight, Tensor::from_floats(W, {out, in}, DType::F32, Device::host())), "");
  EXPECT_NE(assign_param(*l.weight, Tensor::from_floats(W, {in, out}, DType::F32, Device::host())), "");
  copy_(l.lora_a->data, Tensor::from_floats(A, {r, in}, DType::F32, Device::host()));
  copy_(l.lora_b->data, Tensor::from_floats(B, {out, r}, DType::F32, Device::host()));
  const Tensor hb = l.weight->data.to(Device::host());
  const std::vector<float> Wq = dequantize(hb.data<uint8_t>(), l.weight->quant);
  const double s = 3.0;
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& As, const std::vector<double>& Bs) {
    double total = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double y = 0;
        for (int64_t i = 0; i < in; ++i) y += double(Wq[std::size_t(o * in + i)]) * xs[std::size_t(t * in + i)];
        for (int64_t k = 0; k < r; ++k) {
          double h = 0;
          for (int64_t i = 0; i < in; ++i) h += As[std::size_t(k * in + i)] * xs[std::size_t(t * in + i)];
          y += s * Bs[std::size_t(o * r + k)] * h;
        }
        total += double(g[std::size_t(t * out + o)]) * y;
      }
    return total;
  };
  const Tensor X = Tensor::from_floats(x, {tokens, in}, DType::F32, Device::cpu());
  const std::vector<float> y = l.forward(X).to_floats();
  const Tensor dx = l.backward(Tensor::from_floats(g, {tokens, out}, DType::F32, Device::cpu()), X);
  std::vector<double> xd(x.begin(), x.end()), Ad(A.begin(), A.end()), Bd(B.begin(), B.end());
  double fwd = 0;
  for (std::size_t i = 0; i < y.size(); ++i) fwd += double(g[i]) * double(y[i]);
  EXPECT_NEAR(fwd, loss(xd, Ad, Bd), 1e-3);
  auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double h = 1e-4, keep = v[i];
    v[i] = keep + h;
    const double up = loss(xd, Ad, Bd);
    v[i] = keep - h;
    const double down = loss(xd, Ad, Bd);
    v[i] = keep;
    return (up - down) / (2 * h);
  };
  const std::vector<float> dxv = dx.to_floats(), dA = l.lora_a->grad.to_floats(), dB = l.lora_b->grad.to_floats();
  for (std::size_t i = 0; i < xd.size(); i += 7) EXPECT_NEAR(dxv[i], fd(xd, i), 1e-3) << "dx " << i;
  for (std::size_t i = 0; i < Ad.size(); i += 5) EXPECT_NEAR(dA[i], fd(Ad, i), 1e-3) << "dA " << i;
  for (std::size_t i = 0; i < Bd.size(); ++i) EXPECT_NEAR(dB[i], fd(Bd, i), 1e-3) << "dB " << i;
  EXPECT_FALSE(l.weight->grad.defined());
}

namespace {
std::vector<uint8_t> bytes_of(const Param& p) {
  const Tensor h = p.data.to(Device::host()).contiguous();
  return {h.data<uint8_t>(), h.data<uint8_t>() + h.nbytes()};
}
}  // namespace

TEST(Quant, AQuantizedBaseSavesLoadsAndDequantizesByName) {
  LlavaConfig cfg = preset("tiny");
  cfg.llm.lora.r = 2;
  cfg.llm.lora.targets = {"q_proj"};
  cfg.llm.lora.base_bits = 4;
  LlavaConfig fcfg = cfg;
  fcfg.llm.lora.base_bits = 16;
  Llava q(cfg, Device::cpu(), DType::F32), f(fcfg, Device::cpu(), DType::F32);
  q.set_trainable({.projector = true, .llm = true});
  init_weights(q.params(), 7);
  init_weights(f.params(), 7);
  // Every linear layer of the decoder, adapted or not, and nothing else; frozen; counted as the weights they are.
  int quantized = 0;
  for (const auto& p : q.params().all()) {
    if (!p->quantized()) continue;
    ++quantized;
    EXPECT_NE(p->name.find("language_model.model.layers."), std::string::npos) << p->name;
    EXPECT_FALSE(p->trainable) << p->name;
  }
  EXPECT_EQ(quantized, 7 * cfg.llm.layers);
  EXPECT_EQ(q.params().count(), f.params().count());
  // The same draws as the model in full precision, quantized.
  const std::string name = "language_model.model.layers.1.mlp.down_proj.weight";
  Param* qw = q.params().find(name);
  Param* fw = f.params().find(name);
  const std::vector<float> w = fw->data.to_floats();
  EXPECT_EQ(bytes_of(*qw), quantize(w.data(), qw->quant.rows, qw->quant.cols, qw->quant.format));
  // Saved and loaded back: the same bytes.
  const std::string path = ::testing::TempDir() + "/quantized_base.safetensors";
  save_safetensors(path, named_weights(q.params()));
  const Checkpoint ckpt = Checkpoint::open(path);
  Llava q2(cfg, Device::cpu(), DType::F32);
  load_weights(q2.params(), ckpt);
  for (const auto& p : q.params().all()) {
    if (is_lora(*p)) continue;
    EXPECT_EQ(bytes_of(*p), bytes_of(*q2.params().find(p->name))) << p->name;
  }
  // Into the model in full precision (lora merge): dequantized.
  Llava f2(fcfg, Device::cpu(), DType::F32);
  load_weights(f2.params(), ckpt);
  const std::vector<uint8_t> blob = bytes_of(*qw);
  EXPECT_EQ(f2.params().find(name)->data.to_floats(), dequantize(blob.data(), qw->quant));
  // A full-precision checkpoint into the quantized model: quantized as it loads.
  const std::string fpath = ::testing::TempDir() + "/full_base.safetensors";
  save_safetensors(fpath, named_weights(f.params()));
  Llava q3(cfg, Device::cpu(), DType::F32);
  load_weights(q3.params(), Checkpoint::open(fpath));
  EXPECT_EQ(bytes_of(*q3.params().find(name)), blob);
  // Into a model quantized otherwise: refused, naming the tensor and both formats.
  LlavaConfig cfg8 = cfg;
  cfg8.llm.lora.base_bits = 8;
  Llava e(cfg8, Device::cpu(), DType::F32);
  try {
    load_weights(e.params(), ckpt);
    FAIL() << "a 4-bit base loaded into an 8-bit model";
  } catch (const Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find(name), std::string::npos) << m;
    EXPECT_NE(m.find("nf4 (block 64, double quant)"), std::string::npos) << m;
    EXPECT_NE(m.find("int8"), std::string::npos) << m;
  }
}
