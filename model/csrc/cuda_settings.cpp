// libtorch's process-wide numerics settings that tch does not bind: whether CUDA may run float32
// matrix products on TF32 tensor cores, and whether only deterministic algorithms may run.
//
// They live in at::globalContext() (libtorch_cpu), so they can be set and read on a machine
// without a GPU; TF32 then changes nothing. TF32 goes through the cuBLAS flag that
// `torch.backends.cuda.matmul.allow_tf32` sets, which keeps libtorch's older and newer precision
// settings in agreement (mixing them makes libtorch throw when it reads them). Every entry point
// catches C++ exceptions and returns them as a message: none may unwind into Rust.

#include <ATen/Context.h>

#include "messages.h"

namespace {

using rlvr::guarded;

}  // namespace

extern "C" {

// Allows (1) or forbids (0) TF32 for float32 matrix products on CUDA (cuBLAS).
int rlvr_set_tf32(int allow, char** error) {
  return guarded(error, [&] { at::globalContext().setAllowTF32CuBLAS(allow != 0); });
}

// *allowed = whether TF32 is allowed for float32 matrix products on CUDA.
int rlvr_tf32(int* allowed, char** error) {
  return guarded(error, [&] { *allowed = at::globalContext().allowTF32CuBLAS() ? 1 : 0; });
}

// Makes operations without a deterministic implementation throw (1), or allows them (0).
int rlvr_set_deterministic(int on, char** error) {
  return guarded(error, [&] { at::globalContext().setDeterministicAlgorithms(on != 0, /*warn_only=*/false); });
}

// *on = whether only deterministic algorithms may run.
int rlvr_deterministic(int* on, char** error) {
  return guarded(error, [&] { *on = at::globalContext().deterministicAlgorithms() ? 1 : 0; });
}


}  // extern "C"
