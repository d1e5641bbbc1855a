# CUTEATTN_CPU_FLAGS: optimisation flags for the CPU backend. AVX2+FMA when the building machine has them
# (set CUTEATTN_CPU_NATIVE=OFF for a portable build).
option(CUTEATTN_CPU_NATIVE "Use AVX2/FMA in the CPU backend when the build machine supports them" ON)
set(CUTEATTN_CPU_FLAGS -O3)
if(CUTEATTN_CPU_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  include(CheckCXXSourceRuns)
  set(CMAKE_REQUIRED_FLAGS "-mavx2 -mfma")
  check_cxx_source_runs("int main() { return __builtin_cpu_supports(\"avx2\") && __builtin_cpu_supports(\"fma\") ? 0 : 1; }"
                        CUTEATTN_HOST_HAS_AVX2)
  unset(CMAKE_REQUIRED_FLAGS)
  if(CUTEATTN_HOST_HAS_AVX2)
    list(APPEND CUTEATTN_CPU_FLAGS -mavx2 -mfma)
  endif()
endif()
