// Umbrella header for Tessera's C++ API (DLPack interop lives in tessera/dlpack.h).
#pragma once

#include "tessera/attention.h"
#include "tessera/device.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/formats.h"
#include "tessera/merge.h"
#include "tessera/mla.h"
#include "tessera/page.h"
#include "tessera/rope.h"
#include "tessera/stream.h"
#include "tessera/tensor.h"
#include "tessera/validate.h"
#include "tessera/version.h"
