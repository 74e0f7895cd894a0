// How the C++ entry points of `csrc/` hand errors to Rust: none may unwind across the boundary,
// so each runs its body in `guarded`, which turns a C++ exception into a malloc'd message that
// Rust reads and frees with `rlvr_free_message` (`messages.cpp`; `src/ffi.rs` on the Rust side).

#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>

namespace rlvr {

// A malloc'd copy of `text` (nullptr when out of memory).
inline char* copy_message(const char* text) {
  auto length = std::strlen(text);
  auto* out = static_cast<char*>(std::malloc(length + 1));
  if (out != nullptr) std::memcpy(out, text, length + 1);
  return out;
}

// Runs `body`; returns 0, or 1 with a malloc'd message in *error.
template <typename F>
int guarded(char** error, F body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    *error = copy_message(e.what());
    return 1;
  } catch (...) {
    *error = copy_message("unknown C++ exception");
    return 1;
  }
}

}  // namespace rlvr
