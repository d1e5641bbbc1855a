# Resolves CUTEATTN_CUDA (ON/OFF/AUTO) into CUTEATTN_WITH_CUDA, finds the CUTLASS headers, and defines the
# nvcc flags for kernel translation units.
include(CheckLanguage)

set(CUTEATTN_WITH_CUDA OFF)
if(CUTEATTN_CUDA STREQUAL "AUTO")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CUTEATTN_WITH_CUDA ON)
  endif()
elseif(CUTEATTN_CUDA)
  set(CUTEATTN_WITH_CUDA ON)
endif()

if(CUTEATTN_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES OFF)  # each kernel source carries its own -gencode flags
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)

  if(NOT CUTEATTN_CUTLASS_INCLUDE)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "CUTLASS headers not found: run `pip install --no-deps nvidia-cutlass==4.2.0.0` "
                          "or pass -DCUTEATTN_CUTLASS_INCLUDE=<dir>")
    endif()
    set(CUTEATTN_CUTLASS_INCLUDE ${_cutlass_inc} CACHE PATH "" FORCE)
  endif()
  if(NOT EXISTS ${CUTEATTN_CUTLASS_INCLUDE}/cute/tensor.hpp)
    message(FATAL_ERROR "CUTEATTN_CUTLASS_INCLUDE=${CUTEATTN_CUTLASS_INCLUDE} has no cute/tensor.hpp")
  endif()
  message(STATUS "cuteattn: CUTLASS headers at ${CUTEATTN_CUTLASS_INCLUDE}")

  # CuTe needs relaxed constexpr; NDEBUG always (CuTe asserts are costly); lineinfo for profilers.
  set(CUTEATTN_CUDA_FLAGS --expt-relaxed-constexpr --expt-extended-lambda -DNDEBUG -lineinfo
                          -O3 --use_fast_math -Xptxas=-warn-spills -Xcudafe=--diag_suppress=177)
  string(REPLACE ";" "," CUTEATTN_ARCHS_STRING "${CUTEATTN_ARCHS}")
endif()

# flags(<out> <archs>): -gencode flags for one kernel source; "90a" gets the arch-specific target.
function(cuteattn_gencode_flags out archs)
  set(f "")
  foreach(a IN LISTS archs)
    list(APPEND f "-gencode=arch=compute_${a},code=sm_${a}")
  endforeach()
  set(${out} "${f}" PARENT_SCOPE)
endfunction()
