// Frees a message written by an entry point of `csrc/` (see `messages.h`).

#include <cstdlib>

extern "C" void rlvr_free_message(char* message) { std::free(message); }
