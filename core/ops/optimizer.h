// Fused optimizer updates (AdamW, SGD with momentum, Adafactor) as element-wise ops over one parameter.
// States are f32; a low-precision parameter keeps an f32 master copy that the update writes first.
#pragma once

#include "core/ops/params.h"

namespace hr::core {

struct AdamWHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // multiplies the gradient first: unscaling (1/loss scale) times clipping
};

// param, grad: any float dtype, same shape. master: f32 or undefined (then param must be f32 and is updated
// in place). m, v: f32. Decoupled weight decay: p -= lr * wd * p.
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h);

// 8-bit AdamW, bitsandbytes' AdamW8bit (block-wise): both moments kept as 8-bit codes of the dynamic maps
// (backend/dynamic_maps.h; signed for exp_avg, unsigned for exp_avg_sq), each block of kAdam8bitBlock elements
// scaled by its own absolute maximum. Per element, in f32: the moments decoded, updated as AdamW's, the parameter
// stepped (p = p * (1 - lr * wd) - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)); then per block the new absolute
// maxima and the codes nearest to each moment over its block's maximum. m_codes, v_codes: u8 of param's numel;
// m_absmax, v_absmax: f32, one per block (the last may be partial).
constexpr int64_t kAdam8bitBlock = 256;
int64_t adam8bit_blocks(int64_t numel);
// The 256 values of the signed (first moment) or unsigned (second moment) map, ascending.
const float* adam8bit_map(bool is_signed);
// The update's scalars as bitsandbytes forms them (in double, then used in f32), for both back-ends: the step
// -lr / (1 - beta1^t), sqrt(1 - beta2^t), the moments' weights 1 - beta1 and 1 - beta2, the decay 1 - lr * wd.
struct Adam8bitScalars {
  float neg_step, bc2_sqrt, a1, a2, decay;
};
Adam8bitScalars adam8bit_scalars(const AdamWHyper& h);
void adamw8bit_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m_codes,
                      const Tensor& m_absmax, const Tensor& v_codes, const Tensor& v_absmax, const AdamWHyper& h);

struct SgdHyper {
  float lr = 1e-2f, momentum = 0.9f, weight_decay = 0.f, grad_scale = 1.f;
  bool nesterov = false;
};
// momentum: f32 buffer or undefined when momentum is 0.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h);

struct AdafactorHyper {
  float lr = 1e-3f, beta2 = 0.999f, eps1 = 1e-30f, clip_threshold = 1.f, weight_decay = 0.f, grad_scale = 1.f;
  int64_t step = 1;
};
// 2-D (or more: leading dims folded into rows) parameters keep factored second moments: row (rows) and col
// (cols) f32; 1-D parameters keep a full v (same shape, f32) passed as `row` with `col` undefined.
void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h);

}  // namespace hr::core
