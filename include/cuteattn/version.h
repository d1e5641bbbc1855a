// cuteattn version and build information.
#pragma once

namespace cuteattn {

const char* version();
// Comma-separated GPU architectures compiled into this build ("" when built without CUDA).
const char* compiled_archs();
bool cuda_available();  // built with CUDA and a device is present

}  // namespace cuteattn
