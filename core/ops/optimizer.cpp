// Optimizer update ops: argument checks and dispatch.
#include "core/ops/optimizer.h"

#include <cmath>
#include <tuple>

#include "core/backend/dynamic_maps.h"
#include "core/ops/dispatch.h"

namespace hr::core {

namespace {
// One kernel reads every tensor of an update: on a GPU all of them are on that GPU, off a GPU none is on one.
void check_reachable(const char* op, const char* name, const Tensor& param, const Tensor& t) {
  if (!t.defined()) return;
  const bool gpu = param.device().type == DeviceType::CUDA;
  HR_CHECK(gpu ? t.device() == param.device() : t.device().type != DeviceType::CUDA, "[", op, "] ", name, " ",
           t.describe(), " is not where the update of ", param.describe(), " runs");
}

void check_common(const char* op, const Tensor& param, const Tensor& grad, const Tensor& master) {
  check_float(op, "param", param);
  check_shape(op, "grad", grad, param.shape());
  check_reachable(op, "grad", param, grad);
  check_reachable(op, "master", param, master);
  HR_CHECK(param.is_contiguous() && grad.is_contiguous(), "[", op, "] param and grad must be contiguous");
  if (master.defined()) {
    check_shape(op, "master", master, param.shape());
    HR_CHECK(master.dtype() == DType::F32, "[", op, "] master weights must be f32; got ", master.describe());
  } else {
    HR_CHECK(param.dtype() == DType::F32, "[", op, "] a ", dtype_name(param.dtype()),
             " parameter needs f32 master weights; got none");
  }
}
}  // namespace

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                  const AdamWHyper& h) {
  check_common("adamw", param, grad, master);
  check_shape("adamw", "exp_avg", m, param.shape());
  check_shape("adamw", "exp_avg_sq", v, param.shape());
  check_reachable("adamw", "exp_avg", param, m);
  check_reachable("adamw", "exp_avg_sq", param, v);
  launch("adamw", param.device(), &Kernels::adamw_update, param, grad, master, m, v, h);
}

const float* adam8bit_map(bool is_signed) {
  static constexpr float kSigned[256] = {HR_DYNAMIC_MAP_SIGNED}, kUnsigned[256] = {HR_DYNAMIC_MAP_UNSIGNED};
  return is_signed ? kSigned : kUnsigned;
}

Adam8bitScalars adam8bit_scalars(const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  return {float(-double(h.lr) / bc1), float(std::sqrt(1.0 - std::pow(double(h.beta2), double(h.step)))),
          float(1.0 - double(h.beta1)), float(1.0 - double(h.beta2)),
          float(1.0 - double(h.lr) * double(h.weight_decay))};
}

int64_t adam8bit_blocks(int64_t numel) {
  return (numel + kAdam8bitBlock - 1) / kAdam8bitBlock;
}

void adamw8bit_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& m_codes,
                      const Tensor& m_absmax, const Tensor& v_codes, const Tensor& v_absmax, const AdamWHyper& h) {
  const char* op = "adamw8bit";
  check_common(op, param, grad, master);
  const int64_t n = param.numel(), blocks = adam8bit_blocks(n);
  for (const auto& [name, t, dtype, numel] :
       {std::tuple<const char*, const Tensor*, DType, int64_t>{"state1", &m_codes, DType::U8, n},
        {"absmax1", &m_absmax, DType::F32, blocks},
        {"state2", &v_codes, DType::U8, n},
        {"absmax2", &v_absmax, DType::F32, blocks}}) {
    HR_CHECK(t->defined() && t->dtype() == dtype && t->numel() == numel && t->is_contiguous(), "[", op, "] ", name,
             " must be a contiguous ", dtype_name(dtype), " tensor of ", numel, " elements for ", param.describe(),
             "; got ", t->defined() ? t->describe() : std::string("none"));
    check_reachable(op, name, param, *t);
  }
  launch(op, param.device(), &Kernels::adamw8bit_update, param, grad, master, m_codes, m_absmax, v_codes, v_absmax, h);
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& momentum,
                const SgdHyper& h) {
  check_common("sgd", param, grad, master);
  if (h.momentum != 0.f) check_shape("sgd", "momentum_buffer", momentum, param.shape());
  check_reachable("sgd", "momentum_buffer", param, momentum);
  launch("sgd", param.device(), &Kernels::sgd_update, param, grad, master, momentum, h);
}

void adafactor_update(const Tensor& param, const Tensor& grad, const Tensor& master, const Tensor& row,
                      const Tensor& col, const AdafactorHyper& h) {
  check_common("adafactor", param, grad, master);
  if (col.defined()) {
    const int64_t cols = param.size(-1), rows = param.numel() / cols;
    check_shape("adafactor", "exp_avg_sq_row", row, {rows});
    check_shape("adafactor", "exp_avg_sq_col", col, {cols});
  } else {
    check_shape("adafactor", "exp_avg_sq", row, param.shape());
  }
  check_reachable("adafactor", "exp_avg_sq_row", param, row);
  check_reachable("adafactor", "exp_avg_sq_col", param, col);
  const int64_t cols = col.defined() ? param.size(-1) : 0, rows = cols ? param.numel() / cols : 0;
  Tensor workspace = allocate_workspace(
      col.defined() ? sizing_kernels(param.device()).column_sums_workspace_bytes(rows, cols) : 0, param.device());
  launch("adafactor", param.device(), &Kernels::adafactor_update, param, grad, master, row, col, h, workspace);
}

}  // namespace hr::core
