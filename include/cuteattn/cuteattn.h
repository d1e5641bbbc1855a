// cuteattn: fused attention kernels (FlashAttention-2/3 class and HSTU) with a CPU backend.
#pragma once

#include "cuteattn/attention.h"
#include "cuteattn/types.h"
#include "cuteattn/version.h"
