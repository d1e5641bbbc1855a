// The shared mask policy (src/variants/mask.h) against the oracle's independent visibility rule: Mask::visible
// agrees everywhere, key_range / row_range contain every visible pair, key_hole holds no visible pair, and
// tile_fully_visible never answers true for a tile holding an invisible pair, fully_visible_blocks lists exactly
// the blocks tile_fully_visible accepts, fully_visible_query_blocks a subset of the query blocks it accepts
// (exactly those for windows); for window-only masks Window32 (key ranges and full blocks in 32 bits, bounds
// normalised against exact and larger limits) and WindowSpans agree with them; floor_div64 / ceil_div64 round
// correctly.
// Random small sequences, every mask kind, many tile shapes.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "cpu/cpu_backend.h"
#include "variants/mask.h"

namespace cuteattn::test {
namespace {

using detail::Mask;
using detail::Params;
using detail::Range;
using detail::SequenceInfo;

enum class Kind { kNone, kCausal, kWindow, kCausalWindow, kContext, kTarget, kContextTarget };

struct MaskCase {
  Params p;
  int32_t n_ctx = 0, n_tgt = 0;
  std::string name;
};

// A random sequence pair and mask of the given kind; contexts and targets come with causal (SEMANTICS.md).
MaskCase random_case(Kind kind, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  MaskCase c;
  Params& p = c.p;
  p.batch = 1;
  const bool hstu_like = kind == Kind::kContext || kind == Kind::kTarget || kind == Kind::kContextTarget;
  p.seqlen_q = pick(0, 40);
  p.seqlen_k = hstu_like && pick(0, 1) ? p.seqlen_q : pick(0, 40);
  const bool causal = kind != Kind::kNone && kind != Kind::kWindow;
  // The checker refuses contexts and targets together with a local window; the policy still handles them.
  p.window_left = kind == Kind::kWindow || kind == Kind::kCausalWindow || (hstu_like && pick(0, 3) == 0) ? pick(-1, 12) : -1;
  p.window_right = causal ? 0 : (kind == Kind::kWindow ? pick(-1, 12) : -1);
  p.causal = causal;
  const int64_t sk = p.seqlen_k;
  if (kind == Kind::kTarget || kind == Kind::kContextTarget) {
    c.n_tgt = static_cast<int32_t>(pick(0, sk));
    p.target_group_size = pick(0, 2) == 0 ? 1 : pick(1, 12);
  }
  if (kind == Kind::kContext || kind == Kind::kContextTarget) c.n_ctx = static_cast<int32_t>(pick(0, sk - c.n_tgt));
  c.name = "sq " + std::to_string(p.seqlen_q) + " sk " + std::to_string(sk) + " window (" +
           std::to_string(p.window_left) + ", " + std::to_string(p.window_right) + ") contexts " +
           std::to_string(c.n_ctx) + " targets " + std::to_string(c.n_tgt) + " group " +
           std::to_string(p.target_group_size);
  return c;
}

void check_policy(Kind kind, int trials) {
  std::mt19937_64 rng(test_seed());
  for (int t = 0; t < trials; ++t) {
    MaskCase c = random_case(kind, rng);
    Params& p = c.p;
    if (kind == Kind::kContext || kind == Kind::kContextTarget) p.num_contexts = &c.n_ctx;
    if (kind == Kind::kTarget || kind == Kind::kContextTarget) p.num_targets = &c.n_tgt;
    SCOPED_TRACE(c.name);
    const SequenceInfo s = SequenceInfo::of(p, 0);
    const Mask m = Mask::of(p, s, 0);
    const int64_t sq = s.sq, sk = s.sk;
    // Softmax masks (windows only) also against the 32-bit fast paths of the sm90 kernels (forward tile setup,
    // backward edge tiles).
    const bool window_only = kind == Kind::kNone || kind == Kind::kCausal || kind == Kind::kWindow ||
                             kind == Kind::kCausalWindow;
    // The sm90 forward normalises the bounds against the launch's row counts, which may exceed a sequence's.
    const int64_t slack = t % 3;
    const detail::Window32 w32{int(sq), int(sk), detail::Window32::bound(p.window_left, sk + slack),
                               detail::Window32::bound(p.window_right, sq + slack)};
    std::vector<char> vis(sq * sk);
    for (int64_t i = -2; i < sq + 2; ++i)
      for (int64_t j = -2; j < sk + 2; ++j) {
        const bool expected = detail::cpu::reference_visible(p, 0, sq, sk, i, j);
        ASSERT_EQ(m.visible(i, j), expected) << "visible(" << i << ", " << j << ")";
        if (i >= 0 && i < sq && j >= 0 && j < sk) vis[i * sk + j] = expected;
      }
    for (int64_t bm : {1, 3, 8, 16}) {
      for (int64_t start : {int64_t{0}, bm / 2}) {
        for (int64_t i0 = start; i0 < sq; i0 += bm) {
          const int64_t i1 = std::min(i0 + bm, sq);
          const Range keys = m.key_range(i0, i1);
          if (window_only) {
            const detail::WindowSpans spans = detail::WindowSpans::of(m, i0);
            const detail::WindowSpans spans32 = detail::WindowSpans::of(w32, int(i0));
            for (int64_t i = i0; i < i1; ++i) {
              const int r = int(i - i0);
              ASSERT_EQ(spans32.lo(r), spans.lo(r)) << "WindowSpans of Window32, row " << i;
              ASSERT_EQ(spans32.hi(r), spans.hi(r)) << "WindowSpans of Window32, row " << i;
              for (int64_t j = 0; j < sk; ++j) {
                const bool in_span = spans.lo(r) <= j && j < spans.hi(r);
                ASSERT_EQ(in_span, static_cast<bool>(vis[i * sk + j])) << "WindowSpans row " << i << " key " << j;
              }
            }
            // Exact: the keys some row of the tile sees (Mask::key_range may be wider where rows lie before
            // the keys, sq > sk).
            int64_t seen_lo = sk, seen_hi = 0;
            for (int64_t i = i0; i < i1; ++i)
              for (int64_t j = 0; j < sk; ++j)
                if (vis[i * sk + j]) {
                  seen_lo = std::min(seen_lo, j);
                  seen_hi = std::max(seen_hi, j + 1);
                }
            int begin, end;
            w32.key_range(int(i0), int(i1), &begin, &end);
            ASSERT_EQ(begin >= end, seen_lo >= seen_hi) << "Window32::key_range(" << i0 << ", " << i1 << ")";
            if (seen_lo < seen_hi) {
              ASSERT_EQ(begin, seen_lo) << "Window32::key_range(" << i0 << ", " << i1 << ")";
              ASSERT_EQ(end, seen_hi) << "Window32::key_range(" << i0 << ", " << i1 << ")";
            }
          }
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < sk; ++j)
              if (vis[i * sk + j]) {
                ASSERT_TRUE(keys.begin <= j && j < keys.end)
                    << "key_range(" << i0 << ", " << i1 << ") = [" << keys.begin << ", " << keys.end
                    << ") misses (" << i << ", " << j << ")";
              }
          const Range hole = m.key_hole(i0, i1);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = std::max<int64_t>(hole.begin, 0); j < std::min(hole.end, sk); ++j)
              ASSERT_FALSE(vis[i * sk + j]) << "key_hole(" << i0 << ", " << i1 << ") = [" << hole.begin << ", "
                                            << hole.end << ") holds visible (" << i << ", " << j << ")";
          for (int64_t bn : {1, 4, 8, 16}) {
            Range full_first, full_second;
            detail::fully_visible_blocks(m, i0, i1, bn, &full_first, &full_second);
            for (int64_t k = 0; k * bn < sk + 2 * bn; ++k) {
              const bool listed = (full_first.begin <= k && k < full_first.end) ||
                                  (full_second.begin <= k && k < full_second.end);
              ASSERT_EQ(listed, m.tile_fully_visible(i0, i1, k * bn, (k + 1) * bn))
                  << "fully_visible_blocks(" << i0 << ", " << i1 << ", " << bn << ") = [" << full_first.begin
                  << ", " << full_first.end << ") + [" << full_second.begin << ", " << full_second.end
                  << ") at block " << k;
              if (window_only) {
                int begin, end;
                w32.full_blocks(int(i0), int(i1), int(bn), &begin, &end);
                ASSERT_EQ(begin <= k && k < end, listed)
                    << "Window32::full_blocks(" << i0 << ", " << i1 << ", " << bn << ") = [" << begin << ", " << end
                    << ") at block " << k;
              }
            }
            const Range skipped = detail::blocks_inside(hole, bn);
            for (int64_t k = skipped.begin; k < skipped.end; ++k)
              ASSERT_TRUE(hole.begin <= k * bn && (k + 1) * bn <= hole.end) << "blocks_inside block " << k;
            for (int64_t j0 = 0; j0 < sk; j0 += bn) {
              const int64_t j1 = std::min(j0 + bn, sk);
              if (!m.tile_fully_visible(i0, i1, j0, j1)) continue;
              for (int64_t i = i0; i < i1; ++i)
                for (int64_t j = j0; j < j1; ++j)
                  ASSERT_TRUE(vis[i * sk + j]) << "tile_fully_visible([" << i0 << ", " << i1 << ") x [" << j0 << ", "
                                               << j1 << ")) but (" << i << ", " << j << ") is masked";
            }
          }
        }
        for (int64_t j0 = start; j0 < sk; j0 += bm) {
          const int64_t j1 = std::min(j0 + bm, sk);
          const Range rows = m.row_range(j0, j1);
          for (int64_t bq : {1, 3, 8, 16}) {
            const Range full = detail::fully_visible_query_blocks(m, j0, bq, bm);
            for (int64_t q = 0; q * bq < sq + 2 * bq; ++q) {
              const bool listed = full.begin <= q && q < full.end;
              const bool accepted = m.tile_fully_visible(q * bq, (q + 1) * bq, j0, j0 + bm);
              if (window_only) {
                ASSERT_EQ(listed, accepted) << "fully_visible_query_blocks(" << j0 << ", " << bq << ", " << bm
                                            << ") = [" << full.begin << ", " << full.end << ") at block " << q;
              } else if (listed) {
                ASSERT_TRUE(accepted) << "fully_visible_query_blocks(" << j0 << ", " << bq << ", " << bm << ") = ["
                                      << full.begin << ", " << full.end << ") lists block " << q;
              }
            }
          }
          for (int64_t i = 0; i < sq; ++i)
            for (int64_t j = j0; j < j1; ++j)
              if (vis[i * sk + j]) {
                ASSERT_TRUE(rows.begin <= i && i < rows.end)
                    << "row_range(" << j0 << ", " << j1 << ") = [" << rows.begin << ", " << rows.end
                    << ") misses (" << i << ", " << j << ")";
              }
        }
      }
    }
    // visible_spans: the same visibility as two intervals per row.
    for (int64_t i = 0; i < sq; ++i) {
      Range first, second;
      detail::visible_spans(m, i, &first, &second);
      for (int64_t j = 0; j < sk; ++j) {
        const bool in_spans = (first.begin <= j && j < first.end) || (second.begin <= j && j < second.end);
        ASSERT_EQ(in_spans, static_cast<bool>(vis[i * sk + j])) << "visible_spans row " << i << " key " << j;
      }
    }
    // Empty and out-of-range queries.
    EXPECT_TRUE(m.key_range(sq, sq + 4).empty());
    EXPECT_TRUE(m.row_range(sk, sk + 4).empty());
    EXPECT_FALSE(m.tile_fully_visible(0, sq + 1, 0, sk));
  }
}

// floor_div64 / ceil_div64 (the block bounds of fully_visible_blocks and fully_visible_query_blocks) round toward
// minus / plus infinity for either sign of x, also far from zero.
TEST(MaskPolicy, FloorAndCeilDivision) {
  for (int64_t d = 1; d <= 9; ++d) {
    for (int64_t base : {int64_t(0), int64_t(1) << 40, -(int64_t(1) << 40)}) {
      for (int64_t x = base - 60; x <= base + 60; ++x) {
        int64_t down = x / d, up = x / d;  // C++ division truncates toward zero
        if (down * d > x) --down;
        if (up * d < x) ++up;
        EXPECT_EQ(detail::floor_div64(x, d), down) << x << " / " << d;
        EXPECT_EQ(detail::ceil_div64(x, d), up) << x << " / " << d;
      }
    }
  }
}

TEST(MaskPolicy, NoMask) { check_policy(Kind::kNone, 1500); }
TEST(MaskPolicy, Causal) { check_policy(Kind::kCausal, 1500); }
TEST(MaskPolicy, Window) { check_policy(Kind::kWindow, 1500); }
TEST(MaskPolicy, CausalWindow) { check_policy(Kind::kCausalWindow, 1500); }
TEST(MaskPolicy, Contextual) { check_policy(Kind::kContext, 1500); }
TEST(MaskPolicy, Target) { check_policy(Kind::kTarget, 1500); }
TEST(MaskPolicy, ContextualAndTarget) { check_policy(Kind::kContextTarget, 1500); }

// A tight range is not required, but the causal and window ranges are exact: spot-check one.
TEST(MaskPolicy, CausalKeyRangeIsExact) {
  Params p;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = 100;
  p.window_right = 0;
  p.causal = true;
  const Mask m = Mask::of(p, SequenceInfo::of(p, 0), 0);
  const Range keys = m.key_range(32, 48);
  EXPECT_EQ(keys.begin, 0);
  EXPECT_EQ(keys.end, 48);
  const Range rows = m.row_range(32, 48);
  EXPECT_EQ(rows.begin, 32);
  EXPECT_EQ(rows.end, 100);
  EXPECT_TRUE(m.tile_fully_visible(48, 64, 0, 48));
  EXPECT_FALSE(m.tile_fully_visible(32, 48, 32, 48));
}

// Many targets in groups of 1: a tile of target rows sees the history and its own rows only, so the target
// keys before it form a hole, and a target key block is seen by the rows of that block only.
TEST(MaskPolicy, TargetTilesSkipOtherTargetKeys) {
  Params p;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = 3072;
  p.window_right = 0;
  p.causal = true;
  p.target_group_size = 1;
  const int32_t targets = 1024;
  p.num_targets = &targets;
  const Mask m = Mask::of(p, SequenceInfo::of(p, 0), 0);
  const Range hole = m.key_hole(2048 + 256, 2048 + 384);
  EXPECT_EQ(hole.begin, 2048);
  EXPECT_EQ(hole.end, 2048 + 256);
  const Range blocks = detail::blocks_inside(hole, 128);
  EXPECT_EQ(blocks.begin, 16);
  EXPECT_EQ(blocks.end, 18);
  EXPECT_TRUE(m.key_hole(1000, 1128).empty());  // history rows only
  const Range mixed = m.key_hole(2000, 2128);   // history rows up to 2047 see keys up to 2047
  EXPECT_EQ(mixed.begin, 2048);
  EXPECT_EQ(mixed.end, 2048);
  const Range rows = m.row_range(2048 + 128, 2048 + 256);
  EXPECT_EQ(rows.begin, 2048 + 128);
  EXPECT_EQ(rows.end, 2048 + 256);
}

}  // namespace
}  // namespace cuteattn::test
