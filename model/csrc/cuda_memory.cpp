// libtorch's CUDA caching allocator, as far as tch does not bind it: give its cached blocks back
// to the device (`torch.cuda.empty_cache()`), and read or reset a device's allocation statistics
// (`torch.cuda.memory_allocated`, `max_memory_allocated`, `memory_reserved`,
// `reset_peak_memory_stats`).
//
// The allocator is reached through c10's registry (`c10::GetAllocator(kCUDA)`), which needs no
// CUDA header: libc10_cuda registers its allocator there when it is loaded. Without libtorch's
// CUDA half in the process the registry holds nothing for CUDA; with it and no GPU (or before
// CUDA's lazy initialisation) the allocator is registered but not initialised. Both are answered
// as such, never by calling into an allocator that has no devices (its statistics would throw on
// any device index). Every entry point catches C++ exceptions and returns them as a message.

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>

#include "messages.h"

namespace {

using rlvr::guarded;

// The CUDA allocator in c10's registry, or nullptr when libtorch's CUDA half is not loaded (or
// registered something that is not a device allocator). Unlike c10::getDeviceAllocator, which
// asserts, this never throws.
c10::DeviceAllocator* cuda_allocator() {
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
}

// The allocator's state: 0 none loaded, 1 loaded but not initialised, 2 initialised.
int state_of(c10::DeviceAllocator* allocator) {
  if (allocator == nullptr) return 0;
  return allocator->initialized() ? 2 : 1;
}

}  // namespace

extern "C" {

// *state = 0 (no CUDA allocator in this process), 1 (registered, not initialised: no GPU, or CUDA
// not used yet) or 2 (initialised).
int rlvr_cuda_allocator_state(int* state, char** error) {
  return guarded(error, [&] { *state = state_of(cuda_allocator()); });
}

// Gives the cached, unused blocks of every device back to CUDA when the allocator is
// initialised; *state as rlvr_cuda_allocator_state (the cache was emptied only for 2).
int rlvr_cuda_empty_cache(int* state, char** error) {
  return guarded(error, [&] {
    auto* allocator = cuda_allocator();
    *state = state_of(allocator);
    if (*state == 2) allocator->emptyCache();
  });
}

// Device `device`'s statistics (all pools): bytes allocated now and at the peak, bytes reserved
// (allocated plus cached) now and at the peak. Written only when *state is 2.
int rlvr_cuda_memory_stats(
    int device,
    int* state,
    int64_t* allocated,
    int64_t* peak_allocated,
    int64_t* reserved,
    int64_t* peak_reserved,
    char** error) {
  return guarded(error, [&] {
    auto* allocator = cuda_allocator();
    *state = state_of(allocator);
    if (*state != 2) return;
    auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[all].current;
    *peak_allocated = stats.allocated_bytes[all].peak;
    *reserved = stats.reserved_bytes[all].current;
    *peak_reserved = stats.reserved_bytes[all].peak;
  });
}

// Starts device `device`'s peaks again from its current figures, when *state is 2.
int rlvr_cuda_reset_peak(int device, int* state, char** error) {
  return guarded(error, [&] {
    auto* allocator = cuda_allocator();
    *state = state_of(allocator);
    if (*state == 2) allocator->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}


}  // extern "C"
