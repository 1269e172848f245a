// Tessera version. One place for the number: CMake reads it from here.
#pragma once

#include "tessera/export.h"

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0

namespace tessera {
/// "MAJOR.MINOR.PATCH" of the library actually linked (may differ from the header's macros).
TESSERA_API const char* version_string();
}  // namespace tessera
