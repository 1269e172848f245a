// Environment switches of the tuning aids (TESSERA_PLAN_ORDER, TESSERA_PREFILL_WGMMA, ...): one
// reader, so every switch rejects a bad value the same way. Host code only.
#pragma once

#include <initializer_list>
#include <string>

namespace tessera {
namespace detail {

/// The value of environment variable `name`: one of `choices`, or the first choice (the default)
/// when it is unset or empty. Any other value throws kInvalidArgument naming the variable, its
/// value and the choices. Callers read it once per process (a function-local static).
std::string env_choice(const char* name, std::initializer_list<const char*> choices);

}  // namespace detail
}  // namespace tessera
