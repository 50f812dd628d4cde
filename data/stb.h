// headroom's build of stb_image (PNG and JPEG decoders only) and stb_image_write, compiled in data/stb.cpp from
// Debian's headers. Debian's libstb.so is built with assertions on, and stb_image 2.27 asserts on input it has
// not validated (a corrupt JPEG's Huffman codes): one bad file in a dataset would abort the training process.
// Here a failed stb assertion throws StbAssertion instead, and a DecodeScope frees whatever stb had allocated on
// its thread when the exception unwinds through it.
#pragma once

#include <cstddef>

#include "core/check.h"

namespace hr::data::stb {

class StbAssertion : public Error {
 public:
  explicit StbAssertion(const char* expression);
  const char* expression() const { return expression_; }

 private:
  const char* expression_;
};

// Every stb allocation made on this thread while the scope lives and not freed by stb is freed when it ends:
// nothing stb returns may outlive the scope. Scopes do not nest.
class DecodeScope {
 public:
  DecodeScope();
  ~DecodeScope();
  DecodeScope(const DecodeScope&) = delete;
  DecodeScope& operator=(const DecodeScope&) = delete;
};

// Bytes stb holds on this thread now (tests).
std::size_t live_bytes();

[[noreturn]] void assertion_failed(const char* expression);
void* allocate(std::size_t bytes);
void* reallocate(void* p, std::size_t bytes);
void release(void* p);

}  // namespace hr::data::stb
