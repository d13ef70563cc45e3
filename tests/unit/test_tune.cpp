// The tuner without a GPU: the space solver against brute force, pruning reasons, occupancy,
// the strategies replayed over recorded (synthetic) measurements, the results database, and a
// live tune on the CPU backend that is killed and resumed.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compile/variant.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/process.h"
#include "device/launch_limits.h"
#include "ops/op_spec.h"
#include "test_support.h"
#include "tune/library.h"
#include "tune/occupancy.h"
#include "tune/results_db.h"
#include "tune/strategy.h"
#include "tune/tuner.h"

namespace kforge {
namespace {

KernelFile kernel(const std::string& header_lines) {
  return KernelFile::parse(
      "/* kforge\n * op: rmsnorm\n * backend: cpu\n * dtypes: f16, bf16, f32\n" + header_lines +
          " */\nint body;\n",
      "synthetic.cpp");
}

Bindings context_for(const DeviceInfo& d, Sizes sizes = {{"M", 4096}, {"N", 4096}}) {
  Bindings b = d.limits();
  b["elem_bytes"] = 2;
  for (const auto& [k, v] : sizes)
    b[k] = v;
  return b;
}

double total_pruned(const SearchSpace& s) {
  double n = 0;
  for (const auto& [why, count] : s.pruned())
    n += count;
  return n;
}

TEST(SearchSpace, AgreesWithBruteForce) {
  const KernelFile f = kernel(
      " * param: A = 1 in {1, 2, 3, 4, 5, 6, 7}\n"
      " * param: B = 2 in {2, 4, 8, 16, 32}\n"
      " * param: C = 0 in {0, 1, 2}\n"
      " * derive: AB = A * B\n"
      " * require: AB % 4 == 0\n"
      " * require: C == 0 || B >= 8\n"
      " * require: AB + C <= N / 256\n");
  const Bindings ctx = context_for(test::hopper_device());
  const SearchSpace space = SearchSpace::solve({&f}, ctx, test::hopper_device());

  std::set<std::vector<long long>> expected;
  for (long long a : f.params[0].candidates) {
    for (long long b : f.params[1].candidates) {
      for (long long c : f.params[2].candidates) {
        Bindings all = ctx;
        all["A"] = a;
        all["B"] = b;
        all["C"] = c;
        all["AB"] = a * b;
        bool ok = true;
        for (const auto& r : f.requirements)
          ok = ok && r.expression.evaluate(all) != 0;
        if (ok) expected.insert({a, b, c});
      }
    }
  }
  std::set<std::vector<long long>> got;
  for (const PointId p : space.enumerate()) {
    const ParamValues v = space.values(p);
    got.insert({v.at("A"), v.at("B"), v.at("C")});
    EXPECT_EQ(v.at("AB"), v.at("A") * v.at("B"));
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(space.raw_size(), 7 * 5 * 3);
  EXPECT_EQ(total_pruned(space) + static_cast<double>(space.size()), space.raw_size());
}

TEST(SearchSpace, MillionCombinationsPrunedEarly) {
  // 10^6 raw combinations; the first requirement binds after two tunables and removes 90% of
  // the space at that depth.
  const KernelFile f = kernel(
      " * param: P1 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * param: P2 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * param: P3 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * param: P4 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * param: P5 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * param: P6 = 0 in {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}\n"
      " * require: P1 == P2\n"
      " * require: P3 + P4 + P5 + P6 <= 6\n");
  const SearchSpace space =
      SearchSpace::solve({&f}, context_for(test::hopper_device()), test::hopper_device());
  EXPECT_EQ(space.raw_size(), 1e6);
  // P1 == P2: 10 pairs; P3..P6 >= 0 summing to at most 6: C(6 + 4, 4) = 210 tuples.
  EXPECT_EQ(space.size(), 10u * 210u);
  EXPECT_EQ(space.pruned().at("require 'P1 == P2' (line 11)"), 90.0 * 10000);
  EXPECT_EQ(total_pruned(space) + static_cast<double>(space.size()), 1e6);
}

TEST(SearchSpace, LaunchLimitsBeforeCompiling) {
  const KernelFile f = kernel(
      " * param: THREADS = 256 in {128, 256, 1024, 2048}\n"
      " * param: TILE = 1 in {1, 64, 512}\n"
      " * param: CLUSTER = 1 in {1, 2, 16}\n"
      " * threads: THREADS\n"
      " * shared_bytes: TILE * 512\n"
      " * cluster: CLUSTER\n");
  const SearchSpace space =
      SearchSpace::solve({&f}, context_for(test::hopper_device()), test::hopper_device());
  // THREADS=2048 (9 combinations), TILE=512 (3 x 3 left of the other threads), CLUSTER=16.
  EXPECT_EQ(space.pruned().at("threads per block > the device's 1024"), 9);
  EXPECT_EQ(space.pruned().at("dynamic shared memory > the device's 232448 bytes per block"), 9);
  EXPECT_EQ(space.pruned().at("cluster size > 8 (the portable limit)"), 6);
  EXPECT_EQ(space.size(), 3u * 2u * 2u);
  const LaunchShape shape = space.launch_shape(space.nth(0));
  EXPECT_EQ(shape.threads, 128);
  EXPECT_EQ(shape.dynamic_shared_bytes, 512);
  EXPECT_EQ(shape.cluster_blocks, 1);

  DeviceInfo ampere = test::hopper_device();
  ampere.cc_major = 8;
  const SearchSpace old = SearchSpace::solve({&f}, context_for(ampere), ampere);
  // CLUSTER = 2 and 16, with each of the 6 (THREADS, TILE) pairs that fit.
  EXPECT_EQ(old.pruned().at("thread-block clusters need compute capability 9.0"), 12);
}

// `prune:` narrows the search like `require:`, but a variant asked for by name (the defaults
// at any size) is not refused for it; the library's reuse of a row at another size does check it.
TEST(SearchSpace, PruneNarrowsTheSearchButRefusesNoNamedVariant) {
  const KernelFile f = kernel(
      " * param: BLOCK = 64 in {64, 128, 256}\n"
      " * param: VEC = 2 in {2, 4, 8}\n"
      " * prune: BLOCK * VEC >= N\n");
  ASSERT_EQ(f.requirements.size(), 1u);
  EXPECT_TRUE(f.requirements[0].pruning_only);
  const Bindings at_1024 = context_for(test::hopper_device(), {{"M", 64}, {"N", 1024}});
  const SearchSpace space = SearchSpace::solve({&f}, at_1024, test::hopper_device());
  // BLOCK * VEC >= 1024: (128, 8), (256, 4), (256, 8).
  EXPECT_EQ(space.size(), 3u);
  EXPECT_EQ(space.pruned().begin()->first, "prune 'BLOCK * VEC >= N' (line 7)");
  EXPECT_FALSE(space.default_point(0).has_value());

  Bindings defaults = at_1024;
  defaults["BLOCK"] = 64;
  defaults["VEC"] = 2;
  EXPECT_EQ(first_violation(f, defaults, test::hopper_device()), "");
  EXPECT_EQ(first_violation(f, defaults, test::hopper_device(), true),
            "prune 'BLOCK * VEC >= N' (line 7) does not hold");
}

TEST(SearchSpace, UnknownNameIsAUsageError) {
  const KernelFile f = kernel(" * param: A = 1 in {1, 2}\n * require: A <= ROWS\n");
  EXPECT_THROW(SearchSpace::solve({&f}, context_for(test::hopper_device()), test::hopper_device()),
               UsageError);
}

TEST(SearchSpace, NeighborsChangeOneTunableOrTwoWhereAConstraintCouplesThem) {
  const KernelFile f = kernel(
      " * param: A = 1 in {1, 2, 3}\n * param: B = 1 in {1, 2, 3}\n * require: A + B != 4\n");
  const SearchSpace space =
      SearchSpace::solve({&f}, context_for(test::hopper_device()), test::hopper_device());
  const size_t origin = *space.default_point(0);  // A=1, B=1
  std::set<std::pair<long long, long long>> got;
  for (size_t n : space.neighbors(origin))
    got.insert({space.values(n).at("A"), space.values(n).at("B")});
  // (1,3) and (3,1) break the requirement alone; each is kept with the other tunable moved to
  // its nearest value that mends it: (2,3) and (3,2).
  EXPECT_EQ(got, (std::set<std::pair<long long, long long>>{{1, 2}, {2, 1}, {2, 3}, {3, 2}}));
}

// rmsnorm_rowblock.cu reads a row once (ROW_PACKS > 0) only with UNROLL 1 and L2_KEEP_ROW 0,
// and with a known N only at the one ROW_PACKS that fits the row. Its defaults read twice with
// UNROLL 4 and L2_KEEP_ROW 1, so no single change reaches a single-read variant: a tune at
// 4096x4096 on an H200 ran 85 variants (evolution) without one. They are one step away now.
TEST(SearchSpace, ALibraryFilesCoupledRegionIsOneStepFromItsDefaults) {
  const KernelFile f = KernelFile::load(test::kernels_dir() + "/rmsnorm/rmsnorm_rowblock.cu");
  const SearchSpace space =
      SearchSpace::solve({&f}, context_for(test::hopper_device()), test::hopper_device());
  const PointId origin = *space.default_point(0);
  ASSERT_EQ(space.values(origin).at("ROW_PACKS"), 0);
  ASSERT_EQ(space.values(origin).at("UNROLL"), 4);
  ASSERT_EQ(space.values(origin).at("L2_KEEP_ROW"), 1);
  const SpacePoint from = space.point(origin);
  std::set<long long> single_read;  // the ROW_PACKS values of the neighbours
  for (const PointId n : space.neighbors(origin)) {
    const SpacePoint to = space.point(n);
    size_t changed = 0;
    bool one_alone_breaks = false;  // a change that is no neighbour of its own
    for (size_t i = 0; i < to.choice.size(); ++i) {
      if (to.choice[i] == from.choice[i]) continue;
      ++changed;
      SpacePoint one = from;
      one.choice[i] = to.choice[i];
      one_alone_breaks |= !space.find(one).has_value();
    }
    EXPECT_TRUE(changed == 1 || one_alone_breaks) << fmt::format("{}", space.values(n));
    if (space.values(n).at("ROW_PACKS") > 0) single_read.insert(space.values(n).at("ROW_PACKS"));
  }
  EXPECT_EQ(single_read, (std::set<long long>{1, 2, 4, 8, 16}));
}

// The first rule of `f` that its bf16 parameters (the defaults with `overrides`) break on a
// Hopper GPU in `context`, or "".
std::string bf16_violation(const KernelFile& f, const Bindings& context,
                           const ParamValues& overrides) {
  Bindings all = context;
  for (const auto& [name, value] :
       f.with_derived(f.resolve_params(DType::bf16, overrides), context))
    all[name] = value;
  return first_violation(f, all, test::hopper_device());
}

// matmul_wgmma.cu as the library ships it, and a Hopper GPU's limits with the 4096^3 problem.
KernelFile matmul_wgmma() {
  return KernelFile::load(test::kernels_dir() + "/matmul/matmul_wgmma.cu");
}
Bindings hopper_at_4096_cubed() {
  return context_for(test::hopper_device(), {{"M", 4096}, {"N", 4096}, {"K", 4096}});
}

// matmul_wgmma.cu's SWAP_AB hands CUTLASS the transposed tile, so the cooperative schedule's
// 128-row pairs fall on C's columns (TILE_N) instead of its rows (TILE_M). The rules are read
// from the file's header, on the host.
TEST(SearchSpace, MatmulsSwappedTileTakesTheCooperativeRuleOnItsColumns) {
  const KernelFile f = matmul_wgmma();
  const Bindings context = hopper_at_4096_cubed();
  const auto violation = [&](const ParamValues& overrides) {
    return bf16_violation(f, context, overrides);
  };
  // Cooperative (SCHEDULE 0, the default) at C tiles of 64 x 256 and 256 x 64.
  EXPECT_NE(violation({{"TILE_M", 64}, {"TILE_N", 256}}), "");
  EXPECT_EQ(violation({{"TILE_M", 64}, {"TILE_N", 256}, {"SWAP_AB", 1}}), "");
  EXPECT_EQ(violation({{"TILE_M", 256}, {"TILE_N", 64}, {"TILE_K", 64}}), "");
  EXPECT_NE(violation({{"TILE_M", 256}, {"TILE_N", 64}, {"SWAP_AB", 1}}), "");
  // TILE_N 176 is no multiple of 128 or 64 once it is CUTLASS's M.
  EXPECT_NE(violation({{"TILE_N", 176}, {"SWAP_AB", 1}}), "");
  EXPECT_NE(violation({{"TILE_N", 176}, {"SWAP_AB", 1}, {"SCHEDULE", 1}, {"TILE_M", 64}}), "");
  EXPECT_EQ(f.with_derived(f.resolve_params(DType::bf16, {{"TILE_M", 64}, {"SWAP_AB", 1}}), context)
                .at("GEMM_TILE_M"),
            256);
}

// matmul_wgmma.cu's EPI_STAGES buffers of the TMA epilogue count against shared memory: at the
// 4096^3 row's tile (128 x 256, 4 stages of 64) four buffers of 128 x 32 still fit in Hopper's
// 227 KB, a fifth mainloop stage beside them does not, and the register-store epilogue, which
// has no buffers, takes only the dedupe value.
TEST(SearchSpace, MatmulsEpilogueBuffersCountAgainstSharedMemory) {
  const KernelFile f = matmul_wgmma();
  const Bindings context = hopper_at_4096_cubed();
  const auto violation = [&](const ParamValues& overrides) {
    return bf16_violation(f, context, overrides);
  };
  const ParamValues row = {{"TILE_M", 128}, {"TILE_N", 256}, {"TILE_K", 64}, {"EPI_N", 32}};
  const auto with = [&](ParamValues extra) {
    ParamValues v = row;
    for (const auto& [name, value] : extra)
      v[name] = value;
    return v;
  };
  EXPECT_EQ(violation(with({{"STAGES", 4}, {"EPI_STAGES", 4}})), "");
  EXPECT_NE(violation(with({{"STAGES", 5}, {"EPI_STAGES", 4}})), "");
  EXPECT_NE(violation(with({{"STAGES", 4}, {"EPI_STAGES", 4}, {"EPI_N", 64}})), "");
  EXPECT_EQ(violation(with({{"STAGES", 4}, {"EPI_STAGES", 2}, {"EPI_N", 64}})), "");
  EXPECT_NE(violation(with({{"STAGES", 4}, {"EPI_STAGES", 4}, {"EPILOGUE", 1}})), "");
  EXPECT_EQ(violation(with({{"STAGES", 4}, {"EPI_STAGES", 2}, {"EPILOGUE", 1}})), "");
  EXPECT_EQ(f.with_derived(f.resolve_params(DType::bf16, with({{"EPI_STAGES", 3}})), context)
                .at("EPI_BYTES"),
            (3 * 128 + 16) * 32 * 2);
  // kforge's own epilogue: two warp groups' EPI_STAGES buffers of 64 x EPI_N each (counted as
  // CUTLASS's are), in the cooperative, unswapped, data-parallel kernel alone.
  EXPECT_EQ(violation(with({{"STAGES", 4}, {"EPILOGUE", 2}, {"EPI_STAGES", 2}, {"EPI_N", 64}})),
            "");
  EXPECT_NE(violation(with({{"STAGES", 4}, {"EPILOGUE", 2}, {"EPI_STAGES", 3}, {"EPI_N", 64}}))
                .find("SMEM_BYTES"),
            std::string::npos);
  EXPECT_EQ(f.with_derived(
                 f.resolve_params(DType::bf16, with({{"EPILOGUE", 2}, {"EPI_STAGES", 4}})), context)
                .at("EPI_BYTES"),
            (4 * 128 + 16) * 32 * 2);
  // Each of these breaks the rule of kforge's epilogues (2, and 3, which stores 2's slices)
  // alone: with EPILOGUE 0 the same point is feasible.
  for (const ParamValues& kernel : std::vector<ParamValues>{
           {{"SCHEDULE", 1}, {"TILE_M", 64}}, {{"SPLIT", 1}}, {{"SWAP_AB", 1}}}) {
    for (const int epilogue : {2, 3}) {
      ParamValues point = kernel;
      point["STAGES"] = 4;
      point["EPILOGUE"] = 0;
      EXPECT_EQ(violation(with(point)), "");
      point["EPILOGUE"] = epilogue;
      EXPECT_NE(violation(with(point)).find("EPILOGUE < 2"), std::string::npos) << epilogue;
    }
  }
}

// EPILOGUE 3 keeps a 16-bit copy of a tile's accumulators in registers until the next tile's
// first K steps have stored it: half as many registers as the accumulators, so their 128 per
// thread (a 128 x 256 cooperative tile) at most, in kforge's own loop of one wgmma atom along N.
// The shared memory is EPILOGUE 2's.
TEST(SearchSpace, MatmulsDeferredStoreFitsItsRegisterCopy) {
  const KernelFile f = matmul_wgmma();
  const Bindings context = hopper_at_4096_cubed();
  const auto violation = [&](ParamValues point) {
    point["EPILOGUE"] = 3;
    return bf16_violation(f, context, point);
  };
  EXPECT_EQ(violation({{"TILE_M", 128}, {"TILE_N", 256}, {"STAGES", 4}, {"SWIZZLE", 8}}), "");
  EXPECT_EQ(violation({{"TILE_M", 128}, {"TILE_N", 128}, {"STAGES", 6}}), "");
  // 192 accumulators per thread (the LLM projections' 256-row tiles): no room for 96 more.
  for (const ParamValues& point :
       std::vector<ParamValues>{{{"TILE_M", 256}, {"TILE_N", 192}, {"TILE_K", 32}, {"STAGES", 6}},
                                {{"TILE_M", 256}, {"TILE_N", 176}, {"EPI_N", 16}, {"STAGES", 4}}}) {
    ParamValues feasible = point;
    feasible["EPILOGUE"] = 0;
    EXPECT_EQ(bf16_violation(f, context, feasible), "");
    EXPECT_NE(violation(point).find("EPILOGUE != 3"), std::string::npos);
  }
  EXPECT_NE(violation({{"TILE_M", 128}, {"TILE_N", 256}, {"STAGES", 4}, {"MMA_ORDER", 1}})
                .find("EPILOGUE != 3"),
            std::string::npos);
  EXPECT_EQ(violation({{"TILE_M", 128}, {"TILE_N", 256}, {"STAGES", 4}, {"EPI_STAGES", 4}}), "");
  EXPECT_NE(
      violation({{"TILE_M", 128}, {"TILE_N", 256}, {"STAGES", 4}, {"EPI_STAGES", 4}, {"EPI_N", 64}})
          .find("SMEM_BYTES"),
      std::string::npos);
}

// TAIL 1 splits the last, part-filled wave along K in EPILOGUE 3's loop; the busy: line then
// counts that wave's K steps shared over the SMs. At 4096x2304x4096 the 128 x 256 tiles (32 x 9,
// SWIZZLE 1) are 288 slots: 3 waves of 64 K steps whole (192), ceil(288 * 64 / 132) = 140
// shared. With one wave or less there is nothing to share: 1024x1024x4096 is 32 tiles.
TEST(SearchSpace, MatmulsTailSplitIsTheDeferredStoreLoopsAndCountsSharedSteps) {
  const KernelFile f = matmul_wgmma();
  const Bindings context = hopper_at_4096_cubed();
  ParamValues point = {{"TILE_M", 128}, {"TILE_N", 256}, {"STAGES", 4}, {"TAIL", 1}};
  EXPECT_NE(bf16_violation(f, context, point).find("TAIL == 0 || EPILOGUE == 3"),
            std::string::npos);
  point["EPILOGUE"] = 3;
  EXPECT_EQ(bf16_violation(f, context, point), "");

  const auto busy = [&](int tail, const Sizes& sizes) {
    ParamValues at = point;
    at["TAIL"] = tail;
    at["SWIZZLE"] = 1;
    return busy_at(f, at, sizes, DType::bf16, test::hopper_device()).value_or(-1);
  };
  const Sizes part_filled = {{"M", 4096}, {"N", 2304}, {"K", 4096}};
  const double step = 128.0 * 256 * 64;  // one K step of one tile
  EXPECT_EQ(busy(0, part_filled), 192 * step);
  EXPECT_EQ(busy(1, part_filled), 140 * step);
  const Sizes one_wave = {{"M", 1024}, {"N", 1024}, {"K", 4096}};
  EXPECT_EQ(busy(1, one_wave), busy(0, one_wave));
  EXPECT_EQ(busy(0, one_wave), 64 * step);
}

// MMA_ORDER 1 splits CUTLASS's tile into two wgmma atoms along its N, each of which must hold
// whole shared-memory atoms of B (64 elements wide): CUTLASS's TILE_N a multiple of 128. Tiles
// 160-224 wide (the LLM projections' rows) and 64 keep CUTLASS's order; swapped, CUTLASS's N is
// C's TILE_M.
TEST(SearchSpace, MatmulsSplitAccumulatorNeedsWholeAtomsPerHalf) {
  const KernelFile f = matmul_wgmma();
  const Bindings context = hopper_at_4096_cubed();
  const auto violation = [&](ParamValues point, int mma_order) {
    point["MMA_ORDER"] = mma_order;
    return bf16_violation(f, context, point);
  };
  for (const ParamValues& point :
       std::vector<ParamValues>{{{"TILE_M", 128}, {"TILE_N", 256}},
                                {{"TILE_M", 128}, {"TILE_N", 128}, {"STAGES", 6}},
                                {{"TILE_M", 256}, {"TILE_N", 128}, {"SWAP_AB", 1}}}) {
    EXPECT_EQ(violation(point, 1), "");
  }
  for (const ParamValues& point :
       std::vector<ParamValues>{{{"TILE_M", 256}, {"TILE_N", 192}, {"TILE_K", 32}, {"STAGES", 6}},
                                {{"TILE_M", 256}, {"TILE_N", 176}, {"EPI_N", 16}, {"STAGES", 4}},
                                {{"TILE_M", 256}, {"TILE_N", 160}, {"TILE_K", 32}, {"STAGES", 7}},
                                {{"TILE_M", 128}, {"TILE_N", 64}, {"STAGES", 6}},
                                {{"TILE_M", 64}, {"TILE_N", 128}, {"SWAP_AB", 1}, {"STAGES", 6}}}) {
    EXPECT_EQ(violation(point, 0), "");
    EXPECT_NE(violation(point, 1).find("MMA_ORDER == 0"), std::string::npos);
  }
}

// The same coupling under the guided strategies, in a tune like the one that missed it (both
// rmsnorm files at 4096x4096, single-read variants the fastest): every seed proposes one within
// 100 proposals. Before neighbours and mutations were repaired, local search did so with none
// of these 20 seeds (150 proposals each) and evolution with 7, when a random draw landed there.
TEST(SearchSpace, GuidedStrategiesCrossACoupledConstraint) {
  const KernelFile rowblock =
      KernelFile::load(test::kernels_dir() + "/rmsnorm/rmsnorm_rowblock.cu");
  const KernelFile bulk = KernelFile::load(test::kernels_dir() + "/rmsnorm/rmsnorm_bulk.cu");
  const SearchSpace space = SearchSpace::solve(
      {&rowblock, &bulk}, context_for(test::hopper_device()), test::hopper_device());
  const auto cost = [&](PointId p) {
    const ParamValues v = space.values(p);
    const double threads = std::abs(std::log2(static_cast<double>(v.at("BLOCK_THREADS")) / 256));
    if (space.point(p).file == 1) return 30.0 + threads;
    return (v.at("ROW_PACKS") > 0 ? 18.0 : 22.0) + threads - 0.5 * std::log2(v.at("UNROLL"));
  };
  for (const std::string strategy : {"local", "evolution"}) {
    int seeds_that_crossed = 0;
    std::string missed;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      auto s = make_strategy(strategy, space, seed);
      bool crossed = false;
      for (int n = 0; n < 100 && !crossed; ++n) {
        const auto p = s->propose();
        if (!p) break;
        crossed = space.point(*p).file == 0 && space.values(*p).at("ROW_PACKS") > 0;
        s->observe(*p, cost(*p));
      }
      seeds_that_crossed += crossed;
      if (!crossed) missed += fmt::format(" {}", seed);
    }
    EXPECT_EQ(seeds_that_crossed, 20) << strategy << " missed the region with seeds" << missed;
  }
}

ResourceReport resources(int registers, long long shared = 0, long long spill = 0) {
  ResourceReport r;
  r.functions.push_back({"kernel", registers, shared, spill, spill, 0});
  return r;
}

TEST(Occupancy, MatchesTheCudaCalculator) {
  // Values as the CUDA occupancy calculator gives them for compute capability 9.0.
  const DeviceInfo d = test::hopper_device();
  EXPECT_DOUBLE_EQ(theoretical_occupancy(d, 256, 32, 0).fraction, 1.0);
  EXPECT_DOUBLE_EQ(theoretical_occupancy(d, 256, 64, 0).fraction, 0.5);
  EXPECT_EQ(theoretical_occupancy(d, 256, 64, 0).limiter, "registers");
  // 40 registers round up to 1280 per warp: 65536 / (1280 * 8) = 6 blocks of 8 warps.
  EXPECT_EQ(theoretical_occupancy(d, 256, 40, 0).blocks_per_sm, 6);
  EXPECT_EQ(theoretical_occupancy(d, 64, 16, 0).blocks_per_sm, 32);
  EXPECT_EQ(theoretical_occupancy(d, 64, 16, 0).limiter, "blocks");
  // 100 KB of shared memory (+1 KB reserved) per block: two blocks per SM.
  EXPECT_EQ(theoretical_occupancy(d, 128, 32, 100 * 1024).blocks_per_sm, 2);
  EXPECT_EQ(theoretical_occupancy(d, 128, 32, 100 * 1024).limiter, "shared memory");
}

TEST(Occupancy, RejectionsAfterCompiling) {
  const DeviceInfo d = test::hopper_device();
  std::optional<Occupancy> occ;
  EXPECT_EQ(post_compile_rejection(resources(255), {1024, 0, 1}, d, 0, &occ),
            "registers x threads > the register file (65536 per block)");
  EXPECT_EQ(post_compile_rejection(resources(64, 0, 32), {256, 0, 1}, d, 0, &occ),
            "spills registers to local memory");
  EXPECT_EQ(post_compile_rejection(resources(32, 200000), {256, 40000, 1}, d, 0, &occ),
            "static + dynamic shared memory > the device's 232448 bytes per block");
  EXPECT_EQ(post_compile_rejection(resources(128), {256, 0, 1}, d, 50, &occ),
            "theoretical occupancy < 50%");
  ResourceReport serialized = resources(168);
  serialized.functions[0].serialized_wgmma = "a reason";
  EXPECT_EQ(post_compile_rejection(serialized, {384, 0, 1}, d, 0, &occ),
            "ptxas serializes its wgmma instructions (a reason)");
  EXPECT_EQ(post_compile_rejection(resources(64), {256, 0, 1}, d, 50, &occ), std::nullopt);
  ASSERT_TRUE(occ);
  EXPECT_DOUBLE_EQ(occ->fraction, 0.5);
  EXPECT_EQ(post_compile_rejection(ResourceReport{}, {256, 0, 1}, d, 90, &occ), std::nullopt)
      << "the CPU backend reports no resources and is never rejected for them";
}

// A template shaped like the memory-bound library kernels, and a measured-looking landscape
// over it: a best block size, wider vectors better, unrolling helps up to a point, extra
// rows per block pay off only for small blocks, spills at the corner, +-2% of "noise".
constexpr const char* kTemplate =
    " * param: BLOCK = 256 in {32, 64, 128, 256, 512, 1024}\n"
    " * param: VEC = 2 in {1, 2, 4, 8}\n"
    " * param: ROWS = 1 in {1, 2, 4, 8}\n"
    " * param: UNROLL = 1 in {1, 2, 4, 8}\n"
    " * param: HINT = 0 in {0, 1}\n"
    " * require: BLOCK / ROWS >= 32\n";

double landscape(const ParamValues& v) {
  const double block = std::log2(static_cast<double>(v.at("BLOCK")));
  const double unroll = std::log2(static_cast<double>(v.at("UNROLL")));
  double t = 100.0 * (1 + 0.15 * std::abs(block - 8.0)) * (1 + 0.4 / v.at("VEC")) *
             (1 + 0.06 * std::abs(unroll - 2.0));
  if (v.at("ROWS") > 1) t *= v.at("BLOCK") <= 128 ? 0.93 : 1.04;
  if (v.at("HINT")) t *= 0.985;
  const std::string key = fmt::format("{}", v);
  const double noise = static_cast<double>(std::hash<std::string>{}(key) % 1000) / 1000.0;
  return t * (0.98 + 0.04 * noise);
}

struct RecordedSpace {
  KernelFile file = kernel(kTemplate);
  const OpSpec* op = find_op("rmsnorm");
  TuneProblem problem{op, {{"M", 4096}, {"N", 4096}}, DType::bf16};
  DeviceInfo device = test::hopper_device();
  double optimum = INFINITY;
  size_t feasible = 0;

  // Records every feasible variant of the template in `db` as if timed on `device`.
  void record(ResultsDb& db) {
    db.put_device(device);
    const SearchSpace space = SearchSpace::solve({&file}, tune_context(device, problem), device);
    feasible = space.size();
    for (const PointId p : space.enumerate()) {
      const ParamValues v = space.values(p);
      const Variant variant = Variant::make(file, v, problem.dtype, device.default_arch());
      EvaluationRecord r;
      r.variant_key = variant.key();
      r.problem = problem.key();
      r.device = device_key(device);
      r.file = variant.file_name;
      r.variant = variant.describe();
      r.params = v;
      if (v.at("VEC") == 8 && v.at("UNROLL") == 8) {
        r.verdict = Verdict::rejected;
        r.stage = "resources";
        r.detail = "spills registers to local memory";
      } else {
        r.stage = "timed";
        r.stats.count = 50;
        r.stats.median = landscape(v) * 1e-3;  // ms
        r.stats.p10 = r.stats.median * 0.99;
        r.stats.p90 = r.stats.median * 1.01;
        optimum = std::min(optimum, r.stats.median);
      }
      db.put(r);
    }
  }
};

// One recorded database for the whole suite (writing it costs a commit per row).
class Replay : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    db_ = std::make_unique<ResultsDb>(test::temp_dir("replay") / "results.sqlite");
    recorded_.record(*db_);
  }
  static void TearDownTestSuite() { db_.reset(); }
  TuneReport replay(const std::string& strategy, uint64_t seed, size_t budget,
                    const std::vector<TuneStart>& starts = {}) {
    TuneOptions o;
    o.strategy = strategy;
    o.seed = seed;
    o.max_evaluations = budget;
    o.starts = starts;
    Tuner tuner(*db_, nullptr, nullptr);
    return tuner.replay({&recorded_.file}, recorded_.problem, device_key(recorded_.device), o);
  }
  static double best_ms(const TuneReport& r) {
    return r.best ? r.evaluations[*r.best].record.stats.median : INFINITY;
  }

  static inline RecordedSpace recorded_;
  static inline std::unique_ptr<ResultsDb> db_;
};

// Two kernel files of one op whose tunables differ: local search climbs in each (neighbours
// never leave a file), so with a quarter of the points it finds the optimum that lives in the
// second file, which a climb from the first file's defaults alone could never reach.
TEST(LocalSearch, ClimbsInEveryFile) {
  const KernelFile first = kernel(kTemplate);
  const KernelFile second = kernel(
      " * param: STAGES = 2 in {1, 2, 3, 4, 6, 8}\n"
      " * param: WARPS = 8 in {1, 2, 4, 8, 16}\n"
      " * param: CTAS = 1 in {1, 2, 3, 4}\n");
  const SearchSpace space = SearchSpace::solve(
      {&first, &second}, context_for(test::hopper_device()), test::hopper_device());
  const auto cost = [&](size_t p) {
    const ParamValues v = space.values(p);
    if (space.point(p).file == 0) return landscape(v);
    // Every variant of the second file beats the first file's best (~90), the best by far.
    return 80.0 + std::abs(v.at("STAGES") - 4.0) + std::abs(v.at("WARPS") - 2.0) +
           2.0 * std::abs(v.at("CTAS") - 3.0);
  };
  auto local = make_strategy("local", space, 3);
  std::set<int> files_proposed;
  double best = INFINITY;
  for (size_t n = 0; n < space.size() / 4; ++n) {
    const auto p = local->propose();
    ASSERT_TRUE(p.has_value());
    files_proposed.insert(space.point(*p).file);
    best = std::min(best, cost(*p));
    local->observe(*p, cost(*p));
  }
  EXPECT_EQ(files_proposed, (std::set<int>{0, 1}));
  EXPECT_EQ(best, 80.0) << "the second file's optimum (STAGES=4 WARPS=2 CTAS=3)";
}

TEST_F(Replay, ExhaustiveVisitsEveryVariantOnceAndFindsTheOptimum) {
  const TuneReport r = replay("exhaustive", 1, 0);
  EXPECT_EQ(r.evaluations.size(), recorded_.feasible);
  std::set<size_t> points;
  for (const auto& e : r.evaluations)
    points.insert(e.point);
  EXPECT_EQ(points.size(), recorded_.feasible);
  EXPECT_EQ(best_ms(r), recorded_.optimum);
  EXPECT_EQ(r.missing_in_replay, 0u);
  // VEC = 8 and UNROLL = 8 with each of the 18 (BLOCK, ROWS) pairs and 2 hints.
  EXPECT_EQ(r.rejected_after_compile.at("spills registers to local memory"), 18 * 2);
  EXPECT_TRUE(r.baseline.has_value());
}

TEST_F(Replay, EveryStrategyCoversTheSpaceWithoutRepeats) {
  for (const auto& s : strategies()) {
    if (s.name == "given") continue;  // proposes its start points only (below)
    const TuneReport r = replay(s.name, 7, 0);
    std::set<size_t> points;
    for (const auto& e : r.evaluations)
      points.insert(e.point);
    EXPECT_EQ(points.size(), r.evaluations.size()) << s.name << " proposed a point twice";
    EXPECT_EQ(points.size(), recorded_.feasible) << s.name;
    EXPECT_EQ(best_ms(r), recorded_.optimum) << s.name;
  }
}

// Start points (another device's table rows) come before anything a strategy proposes of its
// own; `given` evaluates them and the defaults only; starts that are not feasible here, or name
// a file that is not searched, are skipped and said.
TEST_F(Replay, StartPointsComeFirstAndGivenEvaluatesOnlyThem) {
  const std::string name = recorded_.file.path.filename().string();
  const ParamValues good = {{"BLOCK", 128}, {"VEC", 8}, {"ROWS", 2}, {"UNROLL", 4}, {"HINT", 1}};
  const std::vector<TuneStart> starts = {
      {name, good, "row A"},
      {name, {{"BLOCK", 32}, {"ROWS", 2}}, "row B"},  // BLOCK / ROWS < 32: infeasible
      {"other.cu", good, "row C"},
      {name, {{"VEC", 4}}, "row D"}};
  for (const auto& s : strategies()) {
    const TuneReport r = replay(s.name, 3, 6, starts);
    ASSERT_GE(r.evaluations.size(), 2u) << s.name;
    EXPECT_EQ(r.evaluations[0].record.params.at("BLOCK"), 128) << s.name;
    EXPECT_EQ(r.evaluations[0].record.params.at("HINT"), 1) << s.name;
    EXPECT_EQ(r.evaluations[1].record.params.at("VEC"), 4) << s.name;
    EXPECT_EQ(r.evaluations[1].record.params.at("BLOCK"), 256) << s.name;  // the default
    EXPECT_EQ(r.starts_used, (std::vector<std::string>{"row A", "row D"})) << s.name;
    ASSERT_EQ(r.starts_skipped.size(), 2u) << s.name;
    EXPECT_NE(r.starts_skipped[0].find("row B: not a feasible variant"), std::string::npos);
    EXPECT_NE(r.starts_skipped[1].find("row C: other.cu is not searched"), std::string::npos);
    if (s.name == "given") {
      // The two starts, then the defaults as the baseline.
      EXPECT_EQ(r.evaluations.size(), 3u);
      EXPECT_EQ(r.stop_reason, "strategy finished");
      ASSERT_TRUE(r.baseline.has_value());
      EXPECT_EQ(*r.baseline, 2u);
    }
  }
  // Without starts, `given` has nothing to propose: the defaults alone are timed.
  EXPECT_EQ(replay("given", 3, 0).evaluations.size(), 1u);
}

// With a quarter of the evaluations, the guided strategies must get within 1% of the optimum
// on every seed (the issue asks for 95%); random sampling, on the same budget, lands around
// 94-98% on this landscape, so the check tells search from luck.
TEST_F(Replay, GuidedStrategiesNearTheOptimumWithAQuarterOfTheEvaluations) {
  const size_t budget = recorded_.feasible / 4;
  const auto mean_fraction = [&](const std::string& name) {
    double sum = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      const TuneReport r = replay(name, seed, budget);
      EXPECT_LE(r.evaluations.size(), budget + 1);  // + the defaults, as the baseline
      const double fraction = recorded_.optimum / best_ms(r);
      if (name != "random") EXPECT_GE(fraction, 0.99) << name << " seed " << seed;
      sum += fraction;
    }
    return sum / 8;
  };
  const double random = mean_fraction("random");
  EXPECT_GT(mean_fraction("local"), random);
  EXPECT_GT(mean_fraction("evolution"), random);
}

TEST_F(Replay, IsReproducible) {
  for (const std::string name : {"random", "local", "evolution"}) {
    const TuneReport a = replay(name, 3, 40);
    const TuneReport b = replay(name, 3, 40);
    ASSERT_EQ(a.evaluations.size(), b.evaluations.size());
    for (size_t i = 0; i < a.evaluations.size(); ++i)
      EXPECT_EQ(a.evaluations[i].point, b.evaluations[i].point) << name;
    const TuneReport c = replay(name, 4, 40);
    bool same = a.evaluations.size() == c.evaluations.size();
    for (size_t i = 0; same && i < a.evaluations.size(); ++i)
      same = a.evaluations[i].point == c.evaluations[i].point;
    EXPECT_FALSE(same) << name << ": another seed took the same path";
  }
}

TEST_F(Replay, StopsAtTheTimeBudget) {
  TuneOptions o;
  o.strategy = "exhaustive";
  o.max_seconds = 1e-9;  // spent before the first proposal
  Tuner tuner(*db_, nullptr, nullptr);
  const TuneReport r =
      tuner.replay({&recorded_.file}, recorded_.problem, device_key(recorded_.device), o);
  EXPECT_EQ(r.stop_reason, "time budget (1e-09 s)");
  EXPECT_LE(r.evaluations.size(), 1u);  // at most the defaults, as the baseline
}

TEST_F(Replay, UnrecordedVariantsAreCountedNotInvented) {
  // A copy of the template with one more candidate: those variants were never measured.
  KernelFile wider = kernel(std::string(kTemplate) + " * param: EXTRA = 0 in {0, 1}\n");
  TuneOptions o;
  o.strategy = "exhaustive";
  Tuner tuner(*db_, nullptr, nullptr);
  const TuneReport r = tuner.replay({&wider}, recorded_.problem, device_key(recorded_.device), o);
  EXPECT_EQ(r.missing_in_replay, r.evaluations.size());
  EXPECT_FALSE(r.best.has_value());
}

// Replays over real measurements: every feasible variant of the rmsnorm template timed at
// 8192x8192 bf16 on an H200 (bench/results/2026-11-21-H200-tune), with the kernel file exactly
// as it was measured (a variant's key covers the file's content).
class RecordedH200 : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto dir = test::temp_dir("recorded");
    const auto data = std::filesystem::path(test::test_data_dir()) / "recorded";
    std::filesystem::copy_file(data / "rmsnorm-8192x8192-bf16-h200.sqlite", dir / "r.sqlite");
    db_ = std::make_unique<ResultsDb>(dir / "r.sqlite");
    file_.emplace(KernelFile::load(data / "rmsnorm_rowblock-h200.cu"));
    // Its rows were keyed by the file's text alone, before keys covered the headers a file
    // includes (kernel_text_hash); those headers have changed since, which is no matter to a
    // test of how strategies search.
    file_->text_hash = hash_hex(file_->source);
  }
  TuneReport replay(const std::string& strategy, double fraction) {
    TuneOptions o;
    o.strategy = strategy;
    o.max_fraction = fraction;
    Tuner tuner(*db_, nullptr, nullptr);
    return tuner.replay({&*file_}, problem_, "NVIDIA H200 (cc 9.0)", o);
  }
  static double best_ms(const TuneReport& r) {
    return r.best ? r.evaluations[*r.best].record.stats.median : INFINITY;
  }

  std::unique_ptr<ResultsDb> db_;
  std::optional<KernelFile> file_;
  TuneProblem problem_{find_op("rmsnorm"), {{"M", 8192}, {"N", 8192}}, DType::bf16};
};

TEST_F(RecordedH200, GuidedStrategiesReachNinetyFivePercentOfTheOptimumWithAQuarter) {
  const TuneReport all = replay("exhaustive", 0);
  ASSERT_EQ(all.missing_in_replay, 0u) << "the recorded kernel file no longer matches its rows";
  ASSERT_GT(all.feasible, 300u);
  const double optimum = best_ms(all);
  for (const std::string name : {"local", "evolution"}) {
    const TuneReport r = replay(name, 0.25);
    EXPECT_EQ(r.missing_in_replay, 0u);
    EXPECT_LE(static_cast<double>(r.evaluations.size()), 0.25 * static_cast<double>(all.feasible));
    EXPECT_GE(optimum / best_ms(r), 0.95) << name;
  }
}

// Variant k1 (f.cu, A = 1) of `problem` on device "dev", at `stage`.
EvaluationRecord evaluation_record(const std::string& problem, const std::string& stage) {
  EvaluationRecord r;
  r.variant_key = "k1";
  r.problem = problem;
  r.device = "dev";
  r.file = "f.cu";
  r.variant = "f.cu [A=1] bf16 sm_90a";
  r.params = {{"A", 1}};
  r.stage = stage;
  return r;
}

// A variant's final check stands for the other sizes of its op only: another op may run the same
// file against another reference (a KernelBench problem against its own Model), and an op whose
// name another's begins with is another op.
TEST(ResultsDb, ACheckStandsForItsOpAlone) {
  ResultsDb db(test::temp_dir("checked-at") / "r.sqlite");
  EvaluationRecord r = evaluation_record("rotary_embedding 1x4x64x64 f32", "checked");
  db.put(r);
  EXPECT_EQ(db.checked_at("k1", "rotary_embedding", "dev"), r.problem);
  EXPECT_FALSE(db.checked_at("k1", "rotary_embedding_half", "dev"));
  EXPECT_FALSE(db.checked_at("k1", "kb:rotary_embedding", "dev"));
  EXPECT_FALSE(db.checked_at("k1", "rotary", "dev"));
  EXPECT_FALSE(db.checked_at("k1", "rotary_embedding", "another device"));
  r.variant_key = "k2";
  r.stage = "timed";  // timed, never checked
  db.put(r);
  EXPECT_FALSE(db.checked_at("k2", "rotary_embedding", "dev"));
}

TEST(ResultsDb, RoundTripAndTunes) {
  const auto path = test::temp_dir("db") / "r.sqlite";
  EvaluationRecord r = evaluation_record("rmsnorm 8x8 bf16", "timed");
  r.registers = 40;
  r.occupancy = 0.75;
  r.stats.count = 20;
  r.stats.median = 0.0721;
  r.stats.p90 = 0.0730;
  r.seed = 42;
  {
    ResultsDb db(path);
    db.put(r);
    db.put_device(test::hopper_device());
    const auto id = db.begin_tune(r.problem, r.device, {{"strategy", "local"}});
    db.finish_tune(id, {{"best", "k1"}});
  }
  ResultsDb db(path);  // reopened: everything committed
  const auto got = db.find("k1", r.problem, r.device);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->params, r.params);
  EXPECT_EQ(got->registers, 40);
  EXPECT_DOUBLE_EQ(got->occupancy, 0.75);
  EXPECT_DOUBLE_EQ(got->stats.median, 0.0721);
  EXPECT_EQ(got->seed, 42u);
  EXPECT_TRUE(got->timed());
  EXPECT_FALSE(db.find("k1", r.problem, "another device"));
  EXPECT_EQ(db.find_device(device_key(test::hopper_device()))->max_threads_per_sm, 2048);
  ASSERT_EQ(db.tunes(r.problem).size(), 1u);
  EXPECT_EQ(db.tunes(r.problem)[0].summary.at("best"), "k1");
  EXPECT_FALSE(db.tunes(r.problem)[0].finished_at.empty());
  r.verdict = Verdict::wrong;
  r.stage = "final check";
  db.put(r);  // replaces
  EXPECT_EQ(db.evaluations(r.problem, r.device).size(), 1u);
  EXPECT_EQ(db.find("k1", r.problem, r.device)->cost(), INFINITY);
}

// Counts rows without holding the database open (the tune writes it meanwhile).
size_t recorded_rows(const std::filesystem::path& db) {
  return ResultsDb(db).evaluations("matmul 64x96x80 f32", device_key(cpu_device_info())).size();
}

// A live tune on the CPU backend is killed with SIGKILL once a few evaluations are committed;
// the same command then resumes: the recorded evaluations come from the database, the rest are
// measured, and a third run answers entirely from the database.
TEST(TuneCli, KilledTuneResumesFromTheDatabase) {
  const auto dir = test::temp_dir("resume");
  const auto db = dir / "results.sqlite";
  const std::vector<std::string> command = {
      test::kforge_binary(),
      "tune",
      (test::source_root() / "kernels/matmul/matmul_cpu.cpp").string(),
      "--shape",
      "64x96x80",
      "--dtype",
      "f32",
      "--strategy",
      "exhaustive",
      "--lookahead",
      "4",
      "--no-final-check",
      "--db",
      db.string(),
      "--json",
      (dir / "report.json").string()};
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : command)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    freopen("/dev/null", "w", stderr);
    freopen("/dev/null", "w", stdout);
    execv(args[0], args.data());
    _exit(127);
  }
  size_t before_kill = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (std::filesystem::exists(db) && (before_kill = recorded_rows(db)) >= 3) break;
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the tune finished before it could be killed";
  before_kill = recorded_rows(db);
  ASSERT_GE(before_kill, 3u);
  ASSERT_LT(before_kill, 25u);

  const CommandResult resumed = run_command(command, std::chrono::minutes(10));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto report = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  EXPECT_EQ(report.at("evaluated"), 25);  // K_BLOCK x N_BLOCK: 5 x 5
  EXPECT_EQ(report.at("from_database"), before_kill);
  EXPECT_EQ(recorded_rows(db), 25u);

  const CommandResult again = run_command(command, std::chrono::minutes(5));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto report2 = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  EXPECT_EQ(report2.at("from_database"), 25);
  EXPECT_EQ(report2.at("compile").at("compiled"), 0);
  EXPECT_EQ(report2.at("best").at("variant_key"), report.at("best").at("variant_key"));

  // Replayed without a worker, the same strategy makes the same choice.
  std::vector<std::string> replay = command;
  replay.push_back("--replay");
  const CommandResult replayed = run_command(replay, std::chrono::minutes(2));
  ASSERT_EQ(replayed.exit_code, 0) << replayed.output;
  const auto report3 = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  EXPECT_EQ(report3.at("best").at("variant_key"), report.at("best").at("variant_key"));
  EXPECT_TRUE(report3.at("replay").get<bool>());
}

// `--update-table` with `--shape` replaces or adds one size's row and keeps the others; a table
// for another dtype is refused rather than mixed.
TEST(TuneCli, FixHoldsATunableAtOneValue) {
  const auto dir = test::temp_dir("tune-fix");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const auto tune = [&](const std::string& fix) {
    return run_command({test::kforge_binary(), "tune",
                        (test::source_root() / "kernels/matmul/matmul_cpu.cpp").string(), "--shape",
                        "32x48x40", "--dtype", "f32", "--budget", "3", "--no-final-check", "--db",
                        (dir / "results.sqlite").string(), "--fix", fix, "--json", "-"},
                       std::chrono::minutes(5));
  };
  const CommandResult fixed = tune("K_BLOCK=32");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  const auto json_start = fixed.output.find("{\n");
  ASSERT_NE(json_start, std::string::npos) << fixed.output;
  const auto report = nlohmann::json::parse(fixed.output.substr(json_start));
  EXPECT_EQ(report.at("baseline").at("params").at("K_BLOCK"), 32);
  EXPECT_EQ(report.at("best").at("params").at("K_BLOCK"), 32);

  const CommandResult not_candidate = tune("K_BLOCK=48");
  EXPECT_EQ(not_candidate.exit_code, 2);
  EXPECT_NE(not_candidate.output.find("not a candidate"), std::string::npos)
      << not_candidate.output;
  const CommandResult unknown = tune("TILE=16");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("no tuned file declares it"), std::string::npos) << unknown.output;
}

// The final check runs the op's own sizes, so a winner that passed it at one size is not checked
// again at the next (a --sizes all sweep's winners repeat).
TEST(TuneCli, AWinnerCheckedAtOneSizeIsNotCheckedAgainAtAnother) {
  const auto dir = test::temp_dir("tune-checked-once");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const auto tune = [&](const std::string& shape) {  // the file's defaults alone
    const CommandResult r =
        run_command({test::kforge_binary(), "tune",
                     (test::source_root() / "kernels/softmax/softmax_cpu.cpp").string(), "--shape",
                     shape, "--dtype", "f32", "--strategy", "given", "--db",
                     (dir / "results.sqlite").string(), "--json", "-"},
                    std::chrono::minutes(5));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto json_start = r.output.find("{\n");
    EXPECT_NE(json_start, std::string::npos) << r.output;
    return nlohmann::json::parse(r.output.substr(json_start));
  };
  const auto first = tune("64x128");
  EXPECT_TRUE(first.at("final_check").get<std::string>().starts_with("PASS (seed"))
      << first.at("final_check");
  const auto second = tune("128x256");
  EXPECT_EQ(second.at("best").at("variant_key"), first.at("best").at("variant_key"));
  EXPECT_TRUE(second.at("final_check").get<std::string>().starts_with("PASS (recorded at softmax"))
      << second.at("final_check");
}

TEST(TuneCli, UpdateTableMergesOneSize) {
  const auto dir = test::temp_dir("update-table");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const auto table_path = dir / "table.json";
  const auto tune = [&](const std::string& shape, const std::string& dtype) {
    return run_command(
        {test::kforge_binary(), "tune",
         (test::source_root() / "kernels/matmul/matmul_cpu.cpp").string(), "--shape", shape,
         "--dtype", dtype, "--budget", "2", "--no-final-check", "--db",
         (dir / "results.sqlite").string(), "--update-table", "--table", table_path.string()},
        std::chrono::minutes(5));
  };
  const auto shapes = [&] {
    std::vector<std::string> out;
    const auto table = nlohmann::json::parse(std::ifstream(table_path));
    for (const auto& row : table.at("sizes"))
      out.push_back(row.at("shape").get<std::string>());
    return out;
  };
  ASSERT_EQ(tune("64x96x80", "f32").exit_code, 0);
  ASSERT_EQ(tune("32x48x40", "f32").exit_code, 0);
  EXPECT_EQ(shapes(), (std::vector<std::string>{"64x96x80", "32x48x40"}));
  ASSERT_EQ(tune("64x96x80", "f32").exit_code, 0);
  EXPECT_EQ(shapes(), (std::vector<std::string>{"64x96x80", "32x48x40"}));
  const auto table = nlohmann::json::parse(std::ifstream(table_path));
  EXPECT_EQ(table.at("op"), "matmul");
  EXPECT_EQ(table.at("dtype"), "f32");
  EXPECT_TRUE(table.at("sizes")[0].contains("git_sha"));

  const CommandResult other_dtype = tune("64x96x80", "f16");
  EXPECT_EQ(other_dtype.exit_code, 2);
  EXPECT_NE(other_dtype.output.find("is a table for matmul f32"), std::string::npos)
      << other_dtype.output;
  EXPECT_EQ(shapes().size(), 2u);
}

// A tune that writes one size's row checks the table in the dtypes that borrow it, as a tune
// of every size does: a new variant is checked; a variant with a check of its present code on
// another row has that check copied, not run again.
TEST(TuneCli, UpdateTableChecksTheDtypesThatBorrowIt) {
  const auto dir = test::temp_dir("update-table-check");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const auto table_path = dir / "table.json";
  const auto tune = [&](const std::string& shape) {
    return run_command({test::kforge_binary(), "tune",
                        (test::source_root() / "kernels/rmsnorm/rmsnorm_cpu.cpp").string(),
                        "--shape", shape, "--dtype", "f32", "--strategy", "given",
                        "--no-final-check", "--db", (dir / "results.sqlite").string(),
                        "--update-table", "--table", table_path.string(), "--check-dtypes", "bf16"},
                       std::chrono::minutes(5));
  };
  CommandResult r = tune("64x128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS  bf16 rmsnorm_cpu.cpp"), std::string::npos) << r.output;
  const auto bf16_check = [&](size_t row) {
    return nlohmann::json::parse(std::ifstream(table_path))
        .at("sizes")
        .at(row)
        .at("checks")
        .at("bf16");
  };
  const auto first = bf16_check(0);
  EXPECT_EQ(first.at("result"), "PASS (five stages)");

  r = tune("32x256");  // the same variant (the defaults) at another size
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("copied"), std::string::npos) << r.output;
  EXPECT_EQ(bf16_check(1).at("seed"), first.at("seed"));
}

}  // namespace
}  // namespace kforge
