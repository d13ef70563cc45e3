// The injection library's record store writes raw files that kforge reads back, whatever texts a
// program puts in its NVTX ranges or CUPTI puts in its errors.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "profile/cupti_import.h"
#include "profile/inject/activity_store.h"

namespace kforge {
namespace {

using nlohmann::json;

TEST(ActivityStoreTest, RawFilesParseWhateverTheTexts) {
  inject::ActivityStore store;
  EXPECT_FALSE(store.has_new_rows());
  store.add_error("quote \" backslash \\ newline \n tab \t bell \x07 end");
  store.add_error("valid UTF-8: \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  store.add_error("not UTF-8: \xff\xfe \xc3 \xe2\x82");
  store.add_device({0, "NVIDIA \"H100\"", 9, 0, 132});
  store.add_device({0, "the same device again", 9, 0, 132});
  store.add_dropped(3);
  EXPECT_TRUE(store.has_new_rows());

  const json raw = json::parse(store.to_json(1234, "signal 15"));
  EXPECT_FALSE(store.has_new_rows());
  EXPECT_EQ(raw["format"], "kforge-cupti-raw");
  EXPECT_EQ(raw["pid"], 1234);
  EXPECT_EQ(raw["written_at"], "signal 15");
  EXPECT_EQ(raw["dropped_records"], 3);
  ASSERT_EQ(raw["errors"].size(), 3u);
  EXPECT_EQ(raw["errors"][0], "quote \" backslash \\ newline \n tab \t bell \x07 end");
  EXPECT_EQ(raw["errors"][1], "valid UTF-8: \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(raw["errors"][2], "not UTF-8: ?? ? ??");
  EXPECT_TRUE(raw["kernels"].empty());
  EXPECT_TRUE(raw["api_calls"].empty());

  const Profile p = assemble_profile({raw}, {});
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.devices[0].name, "NVIDIA \"H100\"");
  EXPECT_EQ(p.devices[0].compute_major, 9);
  EXPECT_EQ(p.devices[0].sm_count, 132);
  EXPECT_EQ(p.dropped_records, 3);
  EXPECT_EQ(p.metadata["cupti"]["processes"][0]["written_at"], "signal 15");
}

TEST(ActivityStoreTest, CountsEveryApiCallAndKeepsOnlyLaunchingOnes) {
  // Three runtime calls as CUPTI lays them out in a buffer; none launched GPU work.
  std::vector<CUpti_ActivityAPI> calls(3);
  const uint32_t cbids[] = {211, 3, 211};  // two launches, one cudaGetDevice
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i] = {};
    calls[i].kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    calls[i].cbid = cbids[i];
    calls[i].correlationId = static_cast<uint32_t>(10 + i);
    calls[i].start = 100 * i;
    calls[i].end = 100 * i + 50;
  }
  inject::ActivityStore store;
  store.add_buffer(reinterpret_cast<const uint8_t*>(calls.data()),
                   calls.size() * sizeof(CUpti_ActivityAPI));
  const json raw = json::parse(store.to_json(1, "exit", [](bool runtime, uint32_t cbid) {
    return std::string(runtime ? "runtime " : "driver ") + std::to_string(cbid);
  }));
  EXPECT_TRUE(raw["errors"].empty()) << raw["errors"];
  EXPECT_TRUE(raw["api_calls"].empty());  // no kernel or transfer carries their ids
  ASSERT_EQ(raw["api_counts"].size(), 2u);
  EXPECT_EQ(raw["api_counts"][0]["cbid"], 211);
  EXPECT_EQ(raw["api_counts"][0]["calls"], 2);
  EXPECT_EQ(raw["api_counts"][0]["name"], "runtime 211");
  EXPECT_EQ(raw["api_counts"][1]["calls"], 1);
  const Profile p = assemble_profile({raw}, {});
  EXPECT_EQ(p.metadata["cupti"]["api_calls_recorded"], 3);
}

}  // namespace
}  // namespace kforge
