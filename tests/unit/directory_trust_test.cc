// What kvtierd trusts on disk (issue: a tenant that prepared the socket's
// or the state's directory swapped in its own listener, and symlinks
// planted there made kvtierd write over other files): directories others
// may write are refused, and the files kvtierd creates are never reached
// through a planted symlink.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/config/config.h"
#include "daemon/setup/directory_trust.h"
#include "daemon/tenants/tenant_scope.h"
#include "tiers/nvme/device_file.h"

namespace kvtier {
namespace {

class DirectoryTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kvtier-trust-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Sub(const std::string& name, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    EXPECT_EQ(::mkdir(path.c_str(), 0700), 0);
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  std::string dir_;
};

TEST_F(DirectoryTrustTest, ADirectoryOnlyItsOwnerWritesIsTrusted) {
  EXPECT_TRUE(CheckTrustedDirectory(Sub("private", 0700), "test", ::geteuid()).ok());
  EXPECT_TRUE(CheckTrustedDirectory(Sub("readable", 0755), "test", ::geteuid()).ok());
  // A directory still to be created is judged by where it will be made.
  EXPECT_TRUE(CheckTrustedDirectory(dir_ + "/private/not/yet", "test", ::geteuid()).ok());
}

TEST_F(DirectoryTrustTest, GroupOrWorldWritableDirectoriesAreRefusedWithTheReason) {
  Status group = CheckTrustedDirectory(Sub("group", 0770), "the socket's directory", ::geteuid());
  EXPECT_EQ(group.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(group.message().find("its group"), std::string::npos) << group.message();
  EXPECT_NE(group.message().find("server.trust_shared_directories"), std::string::npos) << group.message();

  Status world = CheckTrustedDirectory(Sub("world", 0777), "test", ::geteuid());
  EXPECT_EQ(world.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(world.message().find("anyone"), std::string::npos) << world.message();
  // Sticky (as /tmp): others cannot replace kvtierd's files, but can take
  // their names first.
  EXPECT_EQ(CheckTrustedDirectory(Sub("sticky", 01777), "test", ::geteuid()).code(), StatusCode::kPermissionDenied);
  // Missing, inside a directory anyone may write: refused too.
  EXPECT_EQ(CheckTrustedDirectory(dir_ + "/world/run/kvtier", "test", ::geteuid()).code(),
            StatusCode::kPermissionDenied);
}

TEST_F(DirectoryTrustTest, ADirectoryOfAnotherUserIsRefused) {
  const std::string other = Sub("other", 0755);
  // As this process's uid plus one (not root: root's is always trusted).
  const uid_t self = ::geteuid() + 1;
  Status s = CheckTrustedDirectory(other, "test", self);
  if (::geteuid() == 0) {
    EXPECT_TRUE(s.ok()) << "root's directories are trusted";
    ASSERT_EQ(::chown(other.c_str(), 65534, static_cast<gid_t>(-1)), 0);
    s = CheckTrustedDirectory(other, "test", 0);
  }
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("belongs to uid"), std::string::npos) << s.message();
}

TEST_F(DirectoryTrustTest, TheConfigurationsDirectoriesAreCheckedUnlessTheOperatorOptsIn) {
  DaemonConfig config;
  config.socket_path = Sub("run", 0750) + "/kvtierd.sock";
  config.nvme_path = Sub("state", 0777) + "/nvme.data";
  Status s = CheckStateDirectories(config, ::geteuid());
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("nvme.path"), std::string::npos) << s.message();
  config.trust_shared_directories = true;
  EXPECT_TRUE(CheckStateDirectories(config, ::geteuid()).ok());
  config.trust_shared_directories = false;
  ASSERT_EQ(::chmod((dir_ + "/state").c_str(), 0755), 0);
  EXPECT_TRUE(CheckStateDirectories(config, ::geteuid()).ok());
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(DirectoryTrustTest, ATenantKeyIsNeverWrittenOrReadThroughASymlink) {
  // A dangling symlink planted where the key goes: refused, and its target
  // is never created.
  const std::string victim = dir_ + "/victim";
  const std::string planted = dir_ + "/planted.tenant-key";
  ASSERT_EQ(::symlink(victim.c_str(), planted.c_str()), 0);
  auto through = LoadTenantKey(planted);
  EXPECT_EQ(through.status().code(), StatusCode::kInvalidArgument) << through.status().ToString();
  EXPECT_NE(through.status().message().find("symbolic link"), std::string::npos) << through.status().message();
  EXPECT_FALSE(std::filesystem::exists(victim));

  // A missing key is created as a regular file of mode 0600, no temporary
  // file left beside it, and read back the same.
  const std::string key_path = dir_ + "/nvme.tenant-key";
  auto key = LoadTenantKey(key_path);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  struct stat st {};
  ASSERT_EQ(::lstat(key_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    entries += e.path().string().find(".tmp") == std::string::npos ? 0 : 1;
  EXPECT_EQ(entries, 0u) << "a temporary key file was left behind";
  auto again = LoadTenantKey(key_path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *key);

  // The key itself a symlink to a good key, or readable by others: refused.
  const std::string linked = dir_ + "/linked.tenant-key";
  ASSERT_EQ(::symlink(key_path.c_str(), linked.c_str()), 0);
  EXPECT_EQ(LoadTenantKey(linked).status().code(), StatusCode::kInvalidArgument);
  ASSERT_EQ(::chmod(key_path.c_str(), 0644), 0);
  EXPECT_EQ(LoadTenantKey(key_path).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DirectoryTrustTest, TheNvmeFileIsNeverASymlinkToARegularFile) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious";
  const std::string path = dir_ + "/nvme.data";
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  BlockDeviceOptions options;
  options.path = path;
  options.capacity_bytes = 1 << 20;
  options.direct_io = false;
  auto file = DeviceFile::Open(options);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("symlink"), std::string::npos) << file.status().message();
  EXPECT_EQ(Contents(victim), "precious");
}

}  // namespace
}  // namespace kvtier
