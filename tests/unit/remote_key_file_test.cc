// The remote tier's cluster secret file (daemon/setup/remote_key_file.h):
// created 0600 with 32 random bytes when missing, read back unchanged, and
// refused with an error naming the file when others may read it, its size
// is wrong or it is a link.
#include "daemon/setup/remote_key_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

class RemoteKeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(RemoteKeyFileTest, AMissingFileIsCreated0600With32BytesAndReadBack) {
  const std::string path = dir_ + "/remote.key";
  auto created = LoadRemoteKey(path);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->size(), 32u);
  EXPECT_NE(*created, std::string(32, '\0'));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  auto again = LoadRemoteKey(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *created) << "the same secret on every start";
  auto other = LoadRemoteKey(dir_ + "/other.key");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *created) << "each new key is random";
}

TEST_F(RemoteKeyFileTest, AFileOthersMayReadIsRefused) {
  const std::string path = dir_ + "/remote.key";
  ASSERT_TRUE(LoadRemoteKey(path).ok());
  for (mode_t mode : {0640, 0604, 0660, 0620}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto loaded = LoadRemoteKey(path);
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument) << std::oct << mode;
    EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status().message();
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(LoadRemoteKey(path).ok()) << "read-only for its owner is fine";
}

TEST_F(RemoteKeyFileTest, AFileOfTheWrongSizeIsRefused) {
  for (size_t size : {size_t{0}, size_t{31}, size_t{33}, size_t{64}}) {
    const std::string path = dir_ + "/k" + std::to_string(size);
    std::ofstream(path, std::ios::binary) << std::string(size, 'k');
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    auto loaded = LoadRemoteKey(path);
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument) << size;
    EXPECT_NE(loaded.status().message().find("bytes"), std::string::npos) << loaded.status().message();
  }
}

TEST_F(RemoteKeyFileTest, ALinkIsNeitherFollowedNorCreatedThrough) {
  const std::string target = dir_ + "/target.key";
  ASSERT_TRUE(LoadRemoteKey(target).ok());
  const std::string link = dir_ + "/link.key";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_EQ(LoadRemoteKey(link).status().code(), StatusCode::kInvalidArgument);
  // A dangling link: not followed to create a file where it points.
  const std::string dangling = dir_ + "/dangling.key";
  ASSERT_EQ(::symlink((dir_ + "/elsewhere").c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(LoadRemoteKey(dangling).ok());
  EXPECT_NE(::access((dir_ + "/elsewhere").c_str(), F_OK), 0) << "a file was created through the link";
}

TEST_F(RemoteKeyFileTest, AnUncreatableFileIsAnIoErrorNamingIt) {
  auto loaded = LoadRemoteKey(dir_ + "/no/such/dir/remote.key");
  EXPECT_EQ(loaded.status().code(), StatusCode::kIoError);
  EXPECT_NE(loaded.status().message().find("no/such/dir"), std::string::npos) << loaded.status().message();
}

}  // namespace
}  // namespace kvtier
