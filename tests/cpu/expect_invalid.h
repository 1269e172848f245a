// expect_invalid: the check of the host-side tests that a call fails with a named argument error.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tessera/error.h"

namespace tessera_cpu_test {

/// Runs f() and expects a tessera::Error of code kInvalidArgument whose message contains `needle`.
template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), tessera::StatusCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace tessera_cpu_test
