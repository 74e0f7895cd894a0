// What the worker's optimizer needs of libtorch that tch does not bind: AdamW's fused update
// (`torch.optim.AdamW(fused=True)`'s kernel, `aten::_fused_adamw_`), and setting a gradient to
// none (`zero_grad(set_to_none=True)`, PyTorch's default).
//
// Why the fused update: the single-tensor update is eight elementwise passes over each
// parameter's state, each a dispatch and a trip through memory (0.46 s a step for SmolLM2-135M
// on one CPU thread); the fused kernel reads and writes each element once, vectorised and
// threaded, on CPU and CUDA alike (0.067 s for the same update: scripts/bench/adamw.py, numbers
// in the README). Its results are PyTorch's own fused path's, which rounds differently from the
// single-tensor path (fused multiply-adds). It walks each tensor's memory in order: every tensor
// must be contiguous (`src/optimizer.rs` checks).
// Why none rather than zeros: the next backward pass then hands its gradient to the parameter
// as it is, where a zeroed one costs a pass writing zeros and another adding to them.
// Every entry point catches C++ exceptions and returns them as a message: none may unwind into
// Rust.

#include <ATen/ATen.h>
#include <ATen/ops/_fused_adamw.h>

#include <cstddef>
#include <vector>

#include "messages.h"

namespace {

std::vector<at::Tensor> tensors(const at::Tensor* const* handles, std::size_t count) {
  std::vector<at::Tensor> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) out.push_back(*handles[i]);
  return out;
}

}  // namespace

extern "C" {

// One AdamW update (decoupled weight decay, bias correction for update number `step`, counted
// from 1) of `count` float32 parameters in place, with their gradients and both moments, all on
// one device. Tensors are libtorch's `at::Tensor*` (what tch's handles are). Returns 0, or 1
// with a malloc'd message in *error.
int rlvr_fused_adamw(const at::Tensor* const* params, const at::Tensor* const* grads,
                     const at::Tensor* const* exp_avgs, const at::Tensor* const* exp_avg_sqs,
                     std::size_t count, double step, double lr, double beta1, double beta2,
                     double weight_decay, double eps, char** error) {
  return rlvr::guarded(error, [&] {
    if (count == 0) return;
    // PyTorch keeps each parameter's update count as a float32 scalar on its device; the kernel
    // only reads it, so one tensor serves every parameter.
    auto count_tensor = at::full({}, step, params[0]->options().dtype(at::kFloat));
    std::vector<at::Tensor> steps(count, count_tensor);
    at::_fused_adamw_(tensors(params, count), tensors(grads, count), tensors(exp_avgs, count),
                      tensors(exp_avg_sqs, count), {}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  });
}

// Sets the gradient of `tensor` (an `at::Tensor*`) to none. Returns 0, or 1 with a malloc'd
// message in *error.
int rlvr_clear_grad(const at::Tensor* tensor, char** error) {
  return rlvr::guarded(error, [&] { tensor->mutable_grad().reset(); });
}

}  // extern "C"
