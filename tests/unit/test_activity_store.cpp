// The injection library's record store writes raw files that kforge reads back, whatever texts a
// program puts in its NVTX ranges or CUPTI puts in its errors.
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

}  // namespace
}  // namespace kforge
