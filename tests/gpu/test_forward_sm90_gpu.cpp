// GPU tests of the sm90 forward kernel (TMA + wgmma, warp-specialised): O and LSE against the float64 CPU
// oracle under the FlashAttention tolerance rule (2x the error of a plain bf16/fp16 computation), every output
// element written over a NaN poison, for odd lengths, s_q != s_k, varlen with empty sequences, GQA, causal,
// sliding windows, softcap, rows without visible keys, several tiles per CTA, every head-dim bucket of the
// build, key-block widths that are no power of 2, the wide-key d 128 kernel and the three-warpgroup d 64 kernel
// (192-row tiles). HSTU (jagged): rab with none / 1 / h heads, every HSTU mask (causal, window, contextual,
// targets with group sizes), many targets (hidden key blocks skipped), alpha and scaling_seqlen, zero-length and
// one-row sequences, several tiles per CTA, every bucket. d != d_v (softmax and HSTU). The workspace: a
// caller's (dirty, reused across calls), none when tiles are scheduled statically, too small. Packed GQA (the
// query heads of a kv head in one tile): groups of 2 to 16, short and forced-long query ranges, every mask,
// varlen. Split-KV (a tile's key blocks over several CTAs, then a combine): forced and default split counts,
// packed and not, every mask, splits without keys, varlen with empty sequences, a caller's dirty workspace; the
// default's no-split rule for tiles that fill 40% of the GPU. Causal/window tiles over several scheduler sections.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cuteattn/attention.h"
#include "gpu/case_lists.h"
#include "gpu/device_case.h"

namespace cuteattn::test {
namespace {

void check_forward(const CaseConfig& cfg) { check_forward_on_device(cfg, Backend::kSm90); }

class Sm90Forward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!is_hopper()) GTEST_SKIP() << "the sm90 kernels need a Hopper GPU";
  }
};

// Sets CUTEATTN_SM90_NUM_SPLITS (which forces the split-KV count; 1 = unsplit) for its lifetime; unset after.
class ForceNumSplits {
 public:
  explicit ForceNumSplits(int n) { setenv("CUTEATTN_SM90_NUM_SPLITS", std::to_string(n).c_str(), 1); }
  ~ForceNumSplits() { unsetenv("CUTEATTN_SM90_NUM_SPLITS"); }
  ForceNumSplits(const ForceNumSplits&) = delete;
  ForceNumSplits& operator=(const ForceNumSplits&) = delete;
};

TEST_F(Sm90Forward, OddLengths) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) check_forward(softmax_fixed(dt, 2, 3, 3, 128, s, s));
  }
  check_forward(softmax_fixed(DType::kBFloat16, 1, 1, 1, 128, 4224, 4224));
}

TEST_F(Sm90Forward, DifferentQueryAndKeyLengths) {
  check_forward(softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 113, 300));
  check_forward(softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 257, 97));
  check_forward(softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 1, 4224));
}

TEST_F(Sm90Forward, Causal) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t s : {1, 113, 1023}) {
      CaseConfig cfg = softmax_fixed(dt, 1, 2, 2, 128, s, s);
      cfg.causal = true;
      check_forward(cfg);
    }
  }
  CaseConfig big = softmax_fixed(DType::kBFloat16, 1, 1, 1, 128, 4224, 4224);
  big.causal = true;
  check_forward(big);
  // Bottom-right aligned: with s_q > s_k the first s_q - s_k rows see no key (O = 0, LSE = -inf).
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 300, 113);
  cfg.causal = true;
  check_forward(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 113, 700);
  cfg.causal = true;
  check_forward(cfg);
}

TEST_F(Sm90Forward, SlidingWindow) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 1023, 1023);
  cfg.window_left = 100;
  cfg.window_right = 37;
  check_forward(cfg);
  cfg.window_left = 300;
  cfg.window_right = -1;
  check_forward(cfg);
  cfg.window_left = -1;
  cfg.window_right = 5;
  check_forward(cfg);
  cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 500, 777);
  cfg.window_left = 0;  // each row sees its own key only
  cfg.window_right = 0;
  check_forward(cfg);
}

TEST_F(Sm90Forward, Softcap) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 2, 2, 128, 333, 333);
  cfg.softcap = 5.0f;
  check_forward(cfg);
  cfg.causal = true;
  cfg.softmax_scale = 0.3f;
  check_forward(cfg);
}

TEST_F(Sm90Forward, GroupedQueryAttention) {
  check_forward(softmax_fixed(DType::kBFloat16, 2, 8, 2, 128, 257, 257));
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 6, 1, 128, 300, 500);
  cfg.causal = true;
  check_forward(cfg);
}

TEST_F(Sm90Forward, VarlenWithEmptySequences) {
  for (bool causal : {false, true}) {
    CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 113, 1, 0, 300, 1023}, {}, 4, 2, 128);
    cfg.causal = causal;
    check_forward(cfg);
    cfg = softmax_varlen(DType::kFloat16, {5, 0, 200, 129, 64}, {300, 7, 0, 129, 1000}, 2, 2, 128);
    cfg.causal = causal;
    check_forward(cfg);
  }
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {100, 250, 0, 77}, {}, 2, 1, 128);
  cfg.window_left = 50;
  cfg.window_right = 10;
  cfg.softcap = 10.0f;
  check_forward(cfg);
}

// True when the auto backend picks the sm90 kernel for `cfg` (its bucket is in the build and supports it).
bool auto_picks_sm90(const CaseConfig& cfg) {
  Case probe = Case::make(cfg, 1);
  DeviceCase dc(probe, Backend::kSm90, DeviceCase::Pass::kForward);
  ForwardArgs args = dc.forward_args();
  Backend chosen = Backend::kAuto;
  args.problem.backend = Backend::kAuto;
  EXPECT_TRUE(resolve_backend(args, &chosen).ok());
  return chosen == Backend::kSm90;
}

// Every other bucket of the build (d below a bucket is served zero-padded by that bucket).
TEST_F(Sm90Forward, HeadDims) {
  for (int64_t d : {64, 96, 192, 256, 80, 136}) {
    for (bool causal : {false, true}) {
      CaseConfig cfg = softmax_fixed(d % 64 == 0 ? DType::kBFloat16 : DType::kFloat16, 2, 2, 1, d, 300, 300);
      cfg.causal = causal;
      if (!auto_picks_sm90(cfg)) {
        ADD_FAILURE() << "head dim " << d << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
        continue;
      }
      check_forward(cfg);
    }
  }
}

// The key-block widths that are no power of 2 (kBlockN 112 at d 192, 80 at d 256) and d 128 for comparison.
TEST_F(Sm90Forward, KeyBlockWidths) {
  for (int64_t d : {128, 192, 256}) {
    if (!auto_picks_sm90(softmax_fixed(DType::kBFloat16, 1, 1, 1, d, 64, 64))) {
      ADD_FAILURE() << "head dim " << d << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
      continue;
    }
    for (const CaseConfig& cfg : key_block_edge_cases(d)) check_forward(cfg);
  }
}

// Softmax d 64 over long rows (4096 keys or more, 1024 without a mask) runs 192-row tiles on three consumer
// warpgroups (Sm90Forward::long_rows): query lengths that are no multiple of 192 (one row, one short of a tile,
// one past it, two tiles and a row), causal with s_q < s_k and s_q > s_k (the first rows see no key), GQA,
// fp16, varlen with empty and one-row sequences, and more tiles than SMs (static and through the dynamic
// handoff), so the pingpong turn goes round the three warpgroups across tiles.
TEST_F(Sm90Forward, ThreeWarpGroupTiles) {
  if (!auto_picks_sm90(softmax_fixed(DType::kBFloat16, 1, 1, 1, 64, 64, 64))) {
    ADD_FAILURE() << "no sm90 d 64 kernel in this build (CUTEATTN_HDIMS); not tested";
    return;
  }
  ForceNumSplits unsplit(1);  // these few tiles over long key ranges would split by default
  for (int64_t s : {1, 191, 193, 385}) {
    for (bool causal : {false, true}) {
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 1, 64, s, 4224);
      cfg.causal = causal;
      check_forward(cfg);
    }
  }
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 1, 1, 64, 4417, 4224);
  cfg.causal = true;
  check_forward(cfg);
  cfg = softmax_fixed(DType::kFloat16, 2, 3, 3, 64, 577, 1100);
  check_forward(cfg);
  for (bool causal : {false, true}) {
    cfg = softmax_varlen(DType::kBFloat16, {0, 1, 191, 0, 193, 385, 1}, {4224, 7, 0, 1, 4100, 385, 1}, 4, 2, 64);
    cfg.causal = causal;
    check_forward(cfg);
  }
  cfg = softmax_fixed(DType::kBFloat16, 1, 70, 70, 64, 200, 1100);
  check_forward(cfg);
  std::vector<int32_t> lengths_q, lengths_k;
  for (int i = 0; i < 40; ++i) {
    lengths_q.push_back(i % 7 == 3 ? 0 : 193 + 37 * (i % 3));
    lengths_k.push_back(i == 5 ? 4224 : 100 + 61 * (i % 4));
  }
  cfg = softmax_varlen(DType::kFloat16, lengths_q, lengths_k, 2, 1, 64);
  cfg.causal = true;
  check_forward(cfg);
}

// A small case of the three-warpgroup kernel for compute-sanitizer (scripts/gpu-sanitize): varlen (dynamic
// handoff) over 1100 keys, two query tiles in one sequence, GQA.
TEST_F(Sm90Forward, ThreeWarpGroupTilesSanitize) {
  ForceNumSplits unsplit(1);
  check_forward(softmax_varlen(DType::kBFloat16, {200, 7}, {1100, 300}, 4, 2, 64));
}

// Causal and sliding-window tiles are handed out longest first in sections of a quarter of the SM count of
// (batch, head) pairs (the last one narrower), decoded with precomputed divisors; the softmax mask tests a span's
// start only under a left window. Enough pairs for several sections at d 64 and 128: causal with s_q = s_k, s_q
// < s_k and s_q > s_k (rows without keys), odd lengths, GQA, a window with a left bound (two-sided spans), softcap,
// and varlen with empty and one-row sequences (dynamic handoff).
TEST_F(Sm90Forward, CausalSections) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t heads = 2 * ((sms + 3) / 4) / 3 + 5;  // 3 batches: two full sections and a narrower one
  for (int64_t d : {64, 128}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 3, heads, heads, d, 385, 385);
    cfg.causal = true;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kFloat16, 3, heads, 1, d, 113, 1023);
    cfg.causal = true;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kBFloat16, 3, heads, heads, d, 300, 129);
    cfg.causal = true;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kBFloat16, 3, heads, heads, d, 257, 257);
    cfg.window_left = 100;
    cfg.window_right = 0;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kFloat16, 3, heads, heads, d, 129, 700);
    cfg.window_left = 37;
    cfg.window_right = 11;
    cfg.softcap = 9.0f;
    check_forward(cfg);
    cfg = softmax_varlen(DType::kBFloat16, {0, 1, 385, 129, 0, 1, 700}, {}, heads, heads, d);
    cfg.causal = true;
    check_forward(cfg);
  }
}

// A small case of the sections for compute-sanitizer: 36 pairs (two sections on an H100), causal, then a window
// with a left bound.
TEST_F(Sm90Forward, CausalSectionsSanitize) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 18, 6, 64, 129, 129);
  cfg.causal = true;
  check_forward(cfg);
  cfg.causal = false;
  cfg.window_left = 17;
  cfg.window_right = 5;
  check_forward(cfg);
}

// Softmax d 128 over 4096 keys or more runs the wide-key kernel (kBlockN 176, no TMA-store epilogue, one Q
// slot): key lengths that are no multiple of 176, causal with s_q < s_k, GQA, softcap in fp16, varlen whose
// longest key range picks it (with an empty sequence and a one-key one beside it).
TEST_F(Sm90Forward, WideKeyBlocks) {
  if (!auto_picks_sm90(softmax_fixed(DType::kBFloat16, 1, 1, 1, 128, 64, 64))) {
    ADD_FAILURE() << "no sm90 d 128 kernel in this build (CUTEATTN_HDIMS); not tested";
    return;
  }
  ForceNumSplits unsplit(1);  // these few tiles over long key ranges would split by default
  for (bool causal : {false, true}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 4, 2, 128, 300, 4100);
    cfg.causal = causal;
    check_forward(cfg);
  }
  CaseConfig cfg = softmax_fixed(DType::kFloat16, 1, 2, 2, 128, 131, 4500);
  cfg.softcap = 30.0f;
  check_forward(cfg);
  cfg = softmax_varlen(DType::kBFloat16, {0, 150, 1, 37}, {0, 4100, 1, 4097}, 2, 1, 128);
  cfg.causal = true;
  check_forward(cfg);
}

// More tiles than SMs (400: 200 heads x 2 query tiles, the second of one row), so each CTA runs several in turn:
// Q slots reused (one at d 256, two below) and the next tile loaded while the consumers finish the last one,
// statically (no mask) and through the dynamic handoff (causal, varlen).
TEST_F(Sm90Forward, SeveralTilesPerCta) {
  for (int64_t d : {64, 128, 256}) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 200, 200, d, 129, 129);
    cfg.causal = d != 64;
    if (!auto_picks_sm90(cfg)) {
      ADD_FAILURE() << "head dim " << d << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
      continue;
    }
    check_forward(cfg);
  }
  std::vector<int32_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(i % 7 == 3 ? 0 : 65 + 19 * (i % 5));
  check_forward(softmax_varlen(DType::kFloat16, lengths, {}, 8, 4, 256));
  // Query tiles without keys (sequences with none) before and between tiles with keys on one CTA (600 tiles,
  // claimed in sequence order): the producer's block and Q slot counts stay in step with the consumers' (one Q
  // slot at d 256, two at d 64).
  for (int64_t d : {64, 256}) {
    check_forward(softmax_varlen(DType::kBFloat16, {300, 200, 129, 400, 77}, {0, 150, 0, 260, 0}, 30, 30, d));
  }
}

// ---- Packed GQA (Sm90Forward::pack_gqa: the query heads of a kv head share a tile's rows) ----

// Sets CUTEATTN_SM90_PACK_GQA (which forces packing on or off) for its lifetime; unset after.
class ForcePackGqa {
 public:
  explicit ForcePackGqa(bool on) { setenv("CUTEATTN_SM90_PACK_GQA", on ? "1" : "0", 1); }
  ~ForcePackGqa() { unsetenv("CUTEATTN_SM90_PACK_GQA"); }
  ForcePackGqa(const ForcePackGqa&) = delete;
  ForcePackGqa& operator=(const ForcePackGqa&) = delete;
};

bool has_sm90_head_dim(int64_t d) {
  if (auto_picks_sm90(softmax_fixed(DType::kBFloat16, 1, 2, 1, d, 16, 64))) return true;
  ADD_FAILURE() << "head dim " << d << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
  return false;
}

// Groups of 2, 4, 8 and 16 (MQA) query heads against query lengths from 1 to 113 and key lengths 1, 129, 1023
// and 4224 (4224 with s_q <= 16 only, to keep the float64 oracle short), every pair; causal (s_q < s_k:
// bottom-right) every other case; both dtypes. s_q 113 is never packed here (packed tiles would compute as
// many rows as one 128-row tile per head), which pins the unpacked path beside the packed ones.
TEST_F(Sm90Forward, PackedGqaShapes) {
  const int64_t groups[][2] = {{4, 2}, {8, 2}, {16, 2}, {16, 1}};  // (h, h_k)
  const int64_t queries[] = {1, 3, 16, 37, 64, 113};
  const int64_t keys[] = {1, 129, 1023, 4224};
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    for (int gi = 0; gi < 4; ++gi) {
      for (int qi = 0; qi < 6; ++qi) {
        const int64_t sq = queries[qi];
        const int64_t sk = keys[(gi + qi) % (sq > 16 ? 3 : 4)];
        CaseConfig cfg = softmax_fixed((gi + qi) % 3 == 0 ? DType::kFloat16 : DType::kBFloat16, sq > 16 ? 1 : 2,
                                       groups[gi][0], groups[gi][1], d, sq, sk);
        cfg.causal = qi % 2 == 1;
        check_forward(cfg);
      }
    }
  }
}

// Masks on packed tiles: sliding windows (edges inside a key block), softcap, causal with s_q > s_k (the first
// rows see no key: O = 0, LSE = -inf), and the lengths on either side of the packing threshold over 300 keys
// (128-row unpacked tiles; g 8: 112 packed, 113 not; g 2: 64 and 65).
TEST_F(Sm90Forward, PackedGqaMasks) {
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 8, 2, d, 64, 1023);
    cfg.window_left = 100;
    cfg.window_right = 0;
    check_forward(cfg);
    cfg.window_left = 20;
    cfg.window_right = 5;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kFloat16, 1, 16, 1, d, 37, 777);
    cfg.softcap = 7.0f;
    cfg.causal = true;
    check_forward(cfg);
    cfg = softmax_fixed(DType::kBFloat16, 2, 8, 2, d, 64, 37);
    cfg.causal = true;
    check_forward(cfg);
    for (int64_t sq : {112, 113}) check_forward(softmax_fixed(DType::kBFloat16, 1, 8, 1, d, sq, 300));
    for (int64_t sq : {64, 65}) {
      cfg = softmax_fixed(DType::kFloat16, 1, 4, 2, d, sq, 300);
      cfg.causal = true;
      check_forward(cfg);
    }
  }
}

// Varlen with empty and one-row sequences (max_seqlen_q picks packing; tiles of the short sequences hold
// rows of no sequence past their end), causal, windowed; and more packed tiles than SMs (140 kv heads),
// statically and through the dynamic handoff.
TEST_F(Sm90Forward, PackedGqaVarlenAndManyTiles) {
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    for (bool causal : {false, true}) {
      CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 1, 37, 0, 64, 1}, {300, 4224, 129, 0, 1023, 1}, 8,
                                      2, d);
      cfg.causal = causal;
      check_forward(cfg);
    }
    CaseConfig cfg = softmax_varlen(DType::kFloat16, {16, 3, 0, 50}, {}, 16, 1, d);
    cfg.window_left = 7;
    cfg.window_right = 2;
    check_forward(cfg);
    for (bool causal : {false, true}) {
      cfg = softmax_fixed(DType::kBFloat16, 2, 140, 70, d, 37, 129);
      cfg.causal = causal;
      check_forward(cfg);
    }
  }
}

// Packing forced over long query ranges: packed tiles split a query row's heads between two tiles, several
// packed tiles per kv head, tiles whose rows see no key at all (causal s_q > s_k: the O = 0 / LSE = -inf
// tile), windows, varlen; and forced off at s_q = 16 (the unpacked path of a shape that packs by default).
TEST_F(Sm90Forward, PackedGqaForced) {
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    {
      ForcePackGqa on(true);
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 6, 2, d, 300, 700);
      cfg.causal = true;
      check_forward(cfg);
      cfg = softmax_fixed(DType::kFloat16, 1, 12, 3, d, 300, 37);
      cfg.causal = true;
      check_forward(cfg);
      cfg = softmax_fixed(DType::kBFloat16, 1, 16, 1, d, 200, 500);
      cfg.window_left = 64;
      cfg.window_right = 16;
      check_forward(cfg);
      cfg = softmax_varlen(DType::kBFloat16, {300, 0, 129, 1}, {500, 7, 129, 0}, 6, 2, d);
      cfg.causal = true;
      check_forward(cfg);
    }
    ForcePackGqa off(false);
    check_forward(softmax_fixed(DType::kBFloat16, 2, 8, 2, d, 16, 1023));
  }
}

// A small packed case for compute-sanitizer: varlen (dynamic handoff), causal, g 4, two packed tiles per kv
// head and a one-row sequence.
TEST_F(Sm90Forward, PackedGqaSanitize) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {40, 1}, {300, 129}, 8, 2, 128);
  cfg.causal = true;
  check_forward(cfg);
}

// ---- HSTU (jagged layout) ----

// Causal HSTU with alpha = 1/d, the benchmark's setting. GPU rab rows start on 16-byte boundaries (checked),
// so cases with rab have max_seqlen_k % 8 == 0.
CaseConfig hstu(DType dt, std::vector<int32_t> lengths, int64_t h, int64_t d) {
  return hstu_varlen(dt, std::move(lengths), h, d, /*causal=*/true, 1.0f / static_cast<float>(d));
}

TEST_F(Sm90Forward, HstuCausalAndRab) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t rab_heads : {0, 1, 3}) {
      CaseConfig cfg = hstu(dt, {113, 0, 200, 1, 64}, 3, 128);
      cfg.rab_heads = rab_heads;
      check_forward(cfg);
    }
  }
}

// alpha 1 puts scores far into both tails of SiLU; scaling_seqlen given explicitly.
TEST_F(Sm90Forward, HstuAlphaAndScaling) {
  for (float alpha : {1.0f, 0.1f}) {
    CaseConfig cfg = hstu(DType::kBFloat16, {1111, 0, 1, 2000}, 2, 128);
    cfg.alpha = alpha;
    cfg.rab_heads = 1;
    check_forward(cfg);
    cfg = hstu(DType::kFloat16, {1111, 0, 1, 2000}, 2, 128);
    cfg.alpha = alpha;
    cfg.scaling_seqlen = 300.0f;
    check_forward(cfg);
  }
}

TEST_F(Sm90Forward, HstuNoMaskAndWindow) {
  for (const CaseConfig& cfg : hstu_window_cases()) check_forward(cfg);
}

TEST_F(Sm90Forward, HstuContextsAndTargets) {
  for (const CaseConfig& cfg : hstu_context_target_cases()) check_forward(cfg);
}

// Fewer queries than keys: query row i sits at key position i + s_k - s_q (rab row too).
TEST_F(Sm90Forward, HstuQueriesShorterThanKeys) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {100, 57, 0, 1}, {200, 57, 30, 9}, 2, 2, 128);
  cfg.score = ScoreFunction::kHstuSilu;
  cfg.alpha = 1.0f / 128;
  for (bool causal : {false, true}) {
    cfg.causal = causal;
    cfg.rab_heads = causal ? 2 : 1;
    check_forward(cfg);
  }
}

TEST_F(Sm90Forward, HstuLong) {
  CaseConfig cfg = hstu(DType::kBFloat16, {4224, 1023}, 1, 128);
  cfg.rab_heads = 1;
  cfg.num_targets = {30, 10};
  cfg.target_group_size = 2;
  check_forward(cfg);
}

// More tiles than SMs (about 300): several tiles per CTA through the dynamic handoff. With rab one Q slot at
// d 128 (the next tile's Q waits for the last Q K^T of this one); without rab the rab ring's storage is a second
// slot (Traits::kSpareQuerySlot), used in turns, at d 64 and d 128.
TEST_F(Sm90Forward, HstuSeveralTilesPerCta) {
  std::vector<int32_t> lengths;
  for (int i = 0; i < 50; ++i) lengths.push_back(i % 9 == 4 ? 0 : 128 + 40 * (i % 3));
  CaseConfig cfg = hstu(DType::kBFloat16, lengths, 4, 128);
  cfg.rab_heads = 1;
  check_forward(cfg);
  for (int64_t d : {64, 128}) check_forward(hstu(DType::kBFloat16, lengths, 4, d));
}

// The one-Q-slot kernels (softmax d 256, HSTU) with more tiles than SMs, small enough for compute-sanitizer:
// the producer issues a tile's first K block, then waits for the Q slot the consumers free after their last
// Q K^T of the tile before, and only then loads Q (racecheck: the slot's reuse against the last reads); HSTU
// without rab with its second slot in the rab ring.
TEST_F(Sm90Forward, SeveralTilesPerCtaSanitize) {
  CaseConfig softmax = softmax_fixed(DType::kBFloat16, 1, 300, 300, 256, 40, 70);
  softmax.causal = true;
  if (auto_picks_sm90(softmax)) {
    check_forward(softmax);
  } else {
    ADD_FAILURE() << "head dim 256: no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
  }
  std::vector<int32_t> lengths;
  for (int i = 0; i < 70; ++i) lengths.push_back(i % 9 == 4 ? 0 : 16 + 8 * (i % 4));
  CaseConfig jagged = hstu(DType::kBFloat16, lengths, 4, 128);
  check_forward(jagged);  // two Q slots: the second in the unused rab ring
  jagged.rab_heads = 1;
  check_forward(jagged);
}

// Many targets: a query tile of target rows sees the history and its own groups only, so the kernel skips the
// key blocks of the targets before them (Mask::key_hole): the producer does not load them and the consumers
// walk the same shortened block sequence. Group sizes from one key to more than a block, with contexts, rab
// per head; a sequence made of targets only (the hole starts at key 0), one whose targets fit in one block.
TEST_F(Sm90Forward, HstuManyTargetsSkipHiddenBlocks) {
  for (int64_t group : {1, 11, 222}) {
    CaseConfig cfg = hstu(DType::kBFloat16, {1504, 0, 1388, 1431, 1100}, 2, 128);
    cfg.rab_heads = 2;
    cfg.num_contexts = {30, 0, 0, 100, 0};
    cfg.num_targets = {1024, 0, 1024, 1300, 1100};
    cfg.target_group_size = group;
    check_forward(cfg);
  }
  CaseConfig cfg = hstu(DType::kFloat16, {1496, 700, 1}, 3, 64);
  cfg.rab_heads = 1;
  cfg.num_contexts = {10, 0, 0};
  cfg.num_targets = {1024, 100, 1};
  cfg.target_group_size = 11;
  check_forward(cfg);
  cfg = hstu(DType::kBFloat16, {1500, 999}, 2, 256);
  cfg.num_targets = {1024, 998};
  cfg.target_group_size = 222;
  if (auto_picks_sm90(cfg)) {
    check_forward(cfg);
  } else {
    ADD_FAILURE() << "head dim 256: no sm90 HSTU kernel in this build (CUTEATTN_HDIMS); not tested";
  }
}

// Every other bucket, both dtypes (d below a bucket is served zero-padded by that bucket).
TEST_F(Sm90Forward, HstuHeadDims) {
  for (int64_t d : {64, 96, 192, 256, 80, 136}) {
    for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
      CaseConfig cfg = hstu(dt, {304, 0, 129, 1}, 2, d);
      cfg.rab_heads = 1;
      cfg.num_targets = {20, 0, 7, 0};
      cfg.target_group_size = 3;
      if (!auto_picks_sm90(cfg)) {
        ADD_FAILURE() << "head dim " << d << ": no sm90 HSTU kernel in this build (CUTEATTN_HDIMS); not tested";
        continue;
      }
      check_forward(cfg);
    }
  }
}

// Runs cfg's sm90 forward twice through one caller workspace filled with 0xff bytes (so the launch must zero
// the tile counter itself, and the second run sees what the first left) and checks both runs.
void check_forward_with_workspace(const CaseConfig& cfg) {
  SCOPED_TRACE(cfg.describe());
  Case c = Case::make(cfg, test_seed());
  Case ref = c.fp32_copy();
  ASSERT_TRUE(run_forward(ref, Backend::kCpuReference));
  Case plain = c.fresh_copy();
  plain_forward(plain);
  DeviceCase dc(c, Backend::kSm90, DeviceCase::Pass::kForward);
  ForwardArgs args = dc.forward_args();
  const size_t bytes = forward_workspace_bytes(args);
  ASSERT_GT(bytes, 0u) << "a dynamically scheduled sm90 forward needs a workspace";
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(workspace, 0xff, bytes), cudaSuccess);
  args.workspace = workspace;
  args.workspace_bytes = bytes;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    dc.poison_forward();
    const Status s = attention_forward(args);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dc.download_forward();
    EXPECT_TRUE(check_close("out", c.out, plain.out, ref.out, kForwardFactor));
    EXPECT_TRUE(check_close("lse", c.lse, plain.lse, ref.lse, kForwardFactor));
  }
  cudaFree(workspace);
}

TEST_F(Sm90Forward, CallerWorkspace) {
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 113, 1, 300, 1023}, {}, 2, 1, 128);
  cfg.causal = true;
  check_forward_with_workspace(cfg);
  cfg = softmax_fixed(DType::kBFloat16, 2, 3, 3, 128, 1023, 1023);
  cfg.window_left = 100;
  cfg.window_right = 0;
  check_forward_with_workspace(cfg);
}

// No mask and fixed lengths: tiles are scheduled statically and the call needs no workspace.
TEST_F(Sm90Forward, NoWorkspaceWithoutDynamicScheduling) {
  Case c = Case::make(softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 300, 300), 1);
  DeviceCase dc(c, Backend::kSm90, DeviceCase::Pass::kForward);
  EXPECT_EQ(forward_workspace_bytes(dc.forward_args()), 0u);
}

TEST_F(Sm90Forward, WorkspaceTooSmallIsRefused) {
  CaseConfig cfg = softmax_fixed(DType::kBFloat16, 1, 2, 2, 128, 300, 300);
  cfg.causal = true;
  Case c = Case::make(cfg, 1);
  DeviceCase dc(c, Backend::kSm90, DeviceCase::Pass::kForward);
  ForwardArgs args = dc.forward_args();
  const size_t bytes = forward_workspace_bytes(args);
  ASSERT_GT(bytes, 0u);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  args.workspace = workspace;
  args.workspace_bytes = bytes - 1;
  Status s = attention_forward(args);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_EQ(s.message.rfind("workspace:", 0), 0u) << s.message;
  // A null workspace with a size is refused by the checker.
  args.workspace = nullptr;
  args.workspace_bytes = bytes;
  s = check_forward(args);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_EQ(s.message.rfind("workspace:", 0), 0u) << s.message;
  cudaFree(workspace);
}

// ---- Split-KV (Sm90Forward::num_splits: a tile's key blocks over several CTAs, partials merged after) ----

// Query lengths 1 to 113 against key lengths 1 to 16500, every pair, with the split count forced to 2, 3, 7, 64
// or left to the default (which splits the long key ranges of these few tiles), packed GQA (g 4; s_q 113 is
// not packed) and MHA by turns, causal every third pair (bottom-right: s_q > s_k leaves rows without keys),
// both dtypes. Counts past the key blocks leave splits without keys (LSE -inf partials).
TEST_F(Sm90Forward, SplitKvShapes) {
  const int64_t queries[] = {1, 3, 16, 113};
  const int64_t keys[] = {1, 129, 1023, 4224, 16500};
  const int forced[] = {2, 3, 7, 64, 0};
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    int i = 0;
    for (int64_t sq : queries) {
      for (int64_t sk : keys) {
        if (sq == 113 && sk == 16500) continue;  // the float64 oracle's longest case, covered at s_q 16
        const bool gqa = i % 2 == 0;
        CaseConfig cfg = softmax_fixed(i % 3 == 1 ? DType::kFloat16 : DType::kBFloat16, sk > 4224 ? 1 : 2,
                                       gqa ? 8 : 2, 2, d, sq, sk);
        cfg.causal = i % 3 == 0;
        const int n = forced[(i + int(d / 64)) % 5];
        SCOPED_TRACE("splits " + (n == 0 ? std::string("default") : std::to_string(n)));
        if (n > 0) {
          ForceNumSplits splits(n);
          check_forward(cfg);
        } else {
          check_forward(cfg);
        }
        ++i;
      }
    }
  }
}

// Masks on split tiles: a sliding window whose key range misses most splits (and cuts the others' blocks),
// softcap, causal with s_q > s_k (rows without keys in every split), packed and not; varlen with one-row and
// empty query sequences and key-less sequences (dynamic handoff), forced 3 and 64.
TEST_F(Sm90Forward, SplitKvMasksAndVarlen) {
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    {
      ForceNumSplits splits(7);
      CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 8, 2, d, 16, 4224);
      cfg.window_left = 100;
      cfg.window_right = 0;
      check_forward(cfg);
      cfg = softmax_fixed(DType::kFloat16, 1, 4, 4, d, 3, 1023);
      cfg.window_left = 200;
      cfg.window_right = 30;
      check_forward(cfg);
      cfg = softmax_fixed(DType::kFloat16, 1, 16, 2, d, 5, 3000);
      cfg.softcap = 7.0f;
      cfg.causal = true;
      check_forward(cfg);
      cfg = softmax_fixed(DType::kBFloat16, 2, 4, 2, d, 300, 129);
      cfg.causal = true;
      check_forward(cfg);
    }
    for (int n : {3, 64}) {
      ForceNumSplits splits(n);
      for (bool causal : {false, true}) {
        CaseConfig cfg = softmax_varlen(DType::kBFloat16, {0, 1, 37, 0, 16, 1, 113},
                                        {300, 4224, 129, 0, 1023, 0, 2000}, 8, 2, d);
        cfg.causal = causal;
        check_forward(cfg);
        cfg = softmax_varlen(DType::kFloat16, {1, 3, 0, 1}, {1500, 0, 7, 2}, 4, 4, d);
        cfg.causal = causal;
        check_forward(cfg);
      }
    }
  }
}

// The default choice: decode over long keys splits (its workspace grows past the tile counter's), a grid the
// tiles fill does not, nor do tiles that fill 40% of it over short key ranges; an explicit 1 runs the unsplit
// kernel. Checked against the oracle either way.
TEST_F(Sm90Forward, SplitKvDefaultChoice) {
  for (int64_t d : {64, 128}) {
    if (!has_sm90_head_dim(d)) continue;
    auto bytes = [](const CaseConfig& cfg) {
      Case c = Case::make(cfg, 1);
      DeviceCase dc(c, Backend::kSm90, DeviceCase::Pass::kForward);
      return forward_workspace_bytes(dc.forward_args());
    };
    const CaseConfig decode = softmax_fixed(DType::kBFloat16, 1, 8, 2, d, 1, 16500);
    EXPECT_GT(bytes(decode), 256u) << "decode over 16500 keys on 2 tiles should split";
    check_forward(decode);
    const CaseConfig full = softmax_fixed(DType::kBFloat16, 1, 200, 200, d, 1, 1023);
    EXPECT_EQ(bytes(full), 0u) << "200 tiles fill the GPU: no split";
    // 64 packed tiles (b 8, h_k 8) fill 40-80% of an H100-sized GPU: their chunks keep 32 key blocks or more,
    // so 4096 keys (32 blocks of 128) stay unsplit.
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (sms * 8 > 64 * 10 && sms * 2 <= 64 * 5) {
      const CaseConfig busy = softmax_fixed(DType::kBFloat16, 8, 32, 8, d, 1, 4096);
      EXPECT_EQ(bytes(busy), 0u) << "64 busy tiles over 32 key blocks: no split";
      check_forward(busy);
    }
    ForceNumSplits unsplit(1);
    EXPECT_EQ(bytes(decode), 0u);
    check_forward(decode);
  }
}

// A split call through a caller's workspace filled with 0xff (partials and counter overwritten, never trusted),
// twice: fixed lengths (static schedule) and varlen (dynamic handoff).
TEST_F(Sm90Forward, SplitKvCallerWorkspace) {
  ForceNumSplits splits(5);
  check_forward_with_workspace(softmax_fixed(DType::kBFloat16, 2, 8, 2, 128, 3, 2000));
  CaseConfig cfg = softmax_varlen(DType::kFloat16, {1, 0, 20}, {1000, 5, 0}, 4, 2, 64);
  cfg.causal = true;
  if (has_sm90_head_dim(64)) check_forward_with_workspace(cfg);
}

// A small split case for compute-sanitizer: varlen (dynamic handoff), causal, packed g 4, a split without keys.
TEST_F(Sm90Forward, SplitKvSanitize) {
  ForceNumSplits splits(3);
  CaseConfig cfg = softmax_varlen(DType::kBFloat16, {2, 1}, {600, 129}, 8, 2, 128);
  cfg.causal = true;
  check_forward(cfg);
}

// d != d_v within the bucket of max(d, d_v) (the columns past d or d_v are zero-filled by TMA and never
// stored): 192/128 (DeepSeek's multi-head latent attention), 128/64, 64/128, 256/136 (O stored from registers,
// its columns tested against d_v); causal, varlen with an empty sequence, packed GQA (its own O stores),
// split-KV (its fp32 partials and combine), HSTU.
TEST_F(Sm90Forward, DifferentValueDims) {
  const int64_t dims[][2] = {{192, 128}, {128, 64}, {64, 128}, {256, 136}};
  for (auto [d, dv] : dims) {
    CaseConfig cfg = softmax_fixed(DType::kBFloat16, 2, 4, 2, d, 257, 300);
    cfg.head_dim_v = dv;
    cfg.causal = true;
    if (!auto_picks_sm90(cfg)) {
      ADD_FAILURE() << "d " << d << ", d_v " << dv << ": no sm90 kernel in this build (CUTEATTN_HDIMS); not tested";
      continue;
    }
    check_forward(cfg);
    CaseConfig var = softmax_varlen(DType::kFloat16, {0, 129, 77}, {}, 2, 2, d);
    var.head_dim_v = dv;
    check_forward(var);
  }
  CaseConfig packed = softmax_fixed(DType::kBFloat16, 2, 8, 1, 128, 5, 1500);
  packed.head_dim_v = 64;
  packed.causal = true;
  for (int splits : {1, 3}) {
    ForceNumSplits force(splits);
    check_forward(packed);
  }
  CaseConfig hstu_cfg = hstu(DType::kBFloat16, {120, 0, 37}, 2, 64);  // rab rows of 120: 16-byte strides
  hstu_cfg.head_dim_v = 128;
  hstu_cfg.rab_heads = 1;
  check_forward(hstu_cfg);
}

}  // namespace
}  // namespace cuteattn::test
