// CUTEATTN_HD marks functions shared by host code (CPU backends, checks) and device kernels.
#pragma once

#if defined(__CUDACC__)
#define CUTEATTN_HD __host__ __device__ __forceinline__
#else
#define CUTEATTN_HD inline
#endif
