// TESSERA_API marks the declarations libtessera exports. The library is compiled with hidden
// visibility by default, so everything else (tessera::detail, tessera::jit, the kernels' host
// stubs) stays private to it and cannot clash with another library loaded into the process.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TESSERA_API __attribute__((visibility("default")))
#else
#define TESSERA_API
#endif
