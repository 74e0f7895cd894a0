// A linear layer (y = x Wᵀ + b) whose matrix products run on oneDNN instead of the BLAS that
// libtorch's `linear` calls for float32 on CPU, with its own backward, so training uses it too.
//
// Why: the pip build of libtorch 2.11 sends float32 `linear`/`matmul` on CPU to MKL, whose
// kernels on AMD processors are its AVX2 "zen" path; oneDNN (in the same libtorch) picks AVX-512
// kernels from the CPU's feature flags whoever made it. scripts/bench/cpu-matmul.py times both
// on SmolLM2's layer shapes (about 2× for a training step's products on the AMD EPYC, Zen 4,
// development machine; numbers in the README). The results are IEEE float32 products like
// MKL's, summed in another order (differences of float rounding only).
//
// The products call libtorch's own registered operator `mkldnn::_linear_pointwise` (what
// PyTorch's compiler uses for CPU linear layers) through the dispatcher, by name, so nothing
// here depends on libtorch's internal symbols. Every entry point catches C++ exceptions and
// returns them as a message: none may unwind into Rust.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>

#include "messages.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const c10::OperatorHandle& linear_pointwise_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  return op;
}

// x [M, K] · w [N, K]ᵀ (+ b [N]) on oneDNN; strided views are accepted as they are.
at::Tensor product(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  std::vector<c10::IValue> stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(b.has_value() ? c10::IValue(*b) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<c10::Scalar>>());
  stack.emplace_back(c10::IValue());
  linear_pointwise_op().callBoxed(&stack);
  return stack[0].toTensor();
}

struct OnednnLinear : public torch::autograd::Function<OnednnLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    auto rows = x.reshape({-1, x.size(-1)});
    ctx->save_for_backward({rows, w});
    ctx->saved_data["has_bias"] = b.has_value();
    auto shape = x.sizes().vec();
    shape.back() = w.size(0);
    return product(rows, w, b).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& rows = saved[0];
    const auto& w = saved[1];
    auto g = grads[0].reshape({-1, w.size(0)}).contiguous();
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      // g [M, N] · w [N, K] = g · (wᵀ [K, N])ᵀ
      auto shape = grads[0].sizes().vec();
      shape.back() = w.size(1);
      grad_x = product(g, w.t(), std::nullopt).view(shape);
    }
    if (ctx->needs_input_grad(1)) {
      // gᵀ [N, M] · rows [M, K] = gᵀ · (rowsᵀ [K, M])ᵀ
      grad_w = product(g.t(), rows.t(), std::nullopt);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      grad_b = g.sum(0);
    }
    return {grad_x, grad_w, grad_b};
  }
};

}  // namespace

extern "C" {

// Whether this libtorch has the oneDNN operator (and so whether `rlvr_onednn_linear` can work).
// On failure writes a malloc'd message to *error (free it with `rlvr_free_message`).
int rlvr_onednn_available(char** error) {
  return rlvr::guarded(error, [] { (void)linear_pointwise_op(); }) == 0 ? 1 : 0;
}

// *out = x · wᵀ (+ b), differentiable in x, w and b; x [..., K], w [N, K], b [N] or null.
// Tensors are libtorch's `at::Tensor*` (what tch's handles are). Returns 0, or 1 with a
// malloc'd message in *error.
int rlvr_onednn_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* b, at::Tensor** out,
                       char** error) {
  return rlvr::guarded(error, [&] {
    std::optional<at::Tensor> bias;
    if (b != nullptr) bias = *b;
    *out = new at::Tensor(OnednnLinear::apply(*x, *w, bias));
  });
}

}  // extern "C"
