#include "src/env.h"

#include <cstdlib>

#include "src/check.h"

namespace tessera {
namespace detail {

std::string env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return *choices.begin();
  const std::string value = text;
  std::string expected;
  for (const char* c : choices) {
    if (value == c) return value;
    expected += (expected.empty() ? "" : " or ") + std::string(c);
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument) << name << " = " << value << ", expected " << expected;
}

}  // namespace detail
}  // namespace tessera
