// UTF-8 checks and display shortening (common/utf8.h): a cut never splits
// a character, invalid bytes never pass, label values are escaped.
#include "common/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kvtier {
namespace {

TEST(Utf8Test, ValidatesWellFormedTextOnly) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xc3"));                                 // cut character
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                             // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));                         // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                     // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xff"));
}

TEST(Utf8Test, PrefixEndsOnACharacterBoundary) {
  const std::string euros = "\xe2\x82\xac\xe2\x82\xac";  // two 3-byte characters
  EXPECT_EQ(Utf8Prefix(euros, 6), euros);
  EXPECT_EQ(Utf8Prefix(euros, 5), "\xe2\x82\xac");
  EXPECT_EQ(Utf8Prefix(euros, 2), "");
  EXPECT_EQ(Utf8Prefix("abc", 2), "ab");
}

TEST(Utf8Test, LabelValueIsCutWholeEscapedAndValid) {
  std::string model;
  for (int i = 0; i < 43; ++i) model += "\xe2\x82\xac";  // 129 bytes of 3-byte characters
  ASSERT_EQ(model.size(), 129u);
  const std::string label = PrometheusLabelValue(model, 128);
  EXPECT_EQ(label.size(), 126u);  // 42 whole characters, not 128 bytes mid-character
  EXPECT_TRUE(IsValidUtf8(label));
  EXPECT_EQ(PrometheusLabelValue("a\"b\\c\nd\te", 128), "a\\\"b\\\\c\\nd_e");
  EXPECT_EQ(PrometheusLabelValue("ok\xff", 128), "ok\xef\xbf\xbd");  // replaced, not passed on
}

TEST(Utf8, CharBytesIsTheOneDecoderLogsAndLabelsUse) {
  EXPECT_EQ(Utf8CharBytes(""), 0u);
  EXPECT_EQ(Utf8CharBytes("a"), 1u);
  EXPECT_EQ(Utf8CharBytes("\xc3\xa9x"), 2u);
  EXPECT_EQ(Utf8CharBytes("\xe2\x82\xac"), 3u);
  EXPECT_EQ(Utf8CharBytes("\xf0\x9f\x98\x80"), 4u);
  EXPECT_EQ(Utf8CharBytes("\xed\xa0\x80"), 0u) << "a surrogate";
  EXPECT_EQ(Utf8CharBytes("\xc0\xaf"), 0u) << "overlong";
  EXPECT_EQ(Utf8CharBytes("\xe2\x82"), 0u) << "truncated";
  EXPECT_EQ(Utf8CharBytes("\x80"), 0u) << "a stray continuation byte";
}

}  // namespace
}  // namespace kvtier
