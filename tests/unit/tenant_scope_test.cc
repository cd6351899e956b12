// Tests of TenantScope (daemon/tenants/tenant_scope.h): namespace tags, the keyed
// key permutation and its inverse, and the tenant key file LoadTenantKey
// creates and reads back.
#include "daemon/tenants/tenant_scope.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>

namespace kvtier {
namespace {

const std::string kSecret(kTenantKeyBytes, 'k');

TEST(TenantScopeTest, ScopeNamespacePutsTheTagInTheTopBits) {
  const TenantScope a(kSecret, "team-a");
  const TenantScope b(kSecret, "team-b");
  EXPECT_EQ(a.tag(), TenantScope::TagOf("team-a"));
  EXPECT_NE(a.tag(), b.tag());
  EXPECT_EQ(TenantScope::TagOf("team-a"), TenantScope::TagOf("team-a"));

  const NamespaceFingerprint fp{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  const NamespaceFingerprint scoped = a.ScopeNamespace(fp);
  EXPECT_EQ(static_cast<uint32_t>(scoped.hi >> 32), a.tag());
  EXPECT_EQ(scoped.hi & 0xffffffffULL, fp.hi & 0xffffffffULL);
  EXPECT_EQ(scoped.lo, fp.lo);
  EXPECT_NE(a.ScopeNamespace(fp), b.ScopeNamespace(fp));  // same model, two namespaces
  EXPECT_EQ(a.ScopeNamespace(scoped), scoped);            // idempotent

  EXPECT_TRUE(a.Owns(scoped));
  EXPECT_FALSE(b.Owns(scoped));
  EXPECT_TRUE(b.Owns(b.ScopeNamespace(fp)));
  EXPECT_FALSE(a.Owns(b.ScopeNamespace(fp)));
  // The tag does not depend on the secret: the namespace is the tenant's
  // whatever key the daemon holds.
  const TenantScope a_other_secret(std::string(kTenantKeyBytes, 'z'), "team-a");
  EXPECT_EQ(a_other_secret.tag(), a.tag());
  EXPECT_TRUE(a_other_secret.Owns(scoped));
}

TEST(TenantScopeTest, UnscopeInvertsScope) {
  const TenantScope scope(kSecret, "team-a");
  std::mt19937_64 rng(12345);
  SCOPED_TRACE("seed 12345");
  std::set<BlockKey> scoped_keys;
  for (int i = 0; i < 2000; ++i) {
    const BlockKey key{rng(), rng()};
    const BlockKey scoped = scope.Scope(key);
    EXPECT_NE(scoped, key);
    EXPECT_EQ(scope.Unscope(scoped), key) << key.ToHex();
    scoped_keys.insert(scoped);
  }
  EXPECT_EQ(scoped_keys.size(), 2000u);  // a permutation: no two keys collide
  for (const BlockKey key : {BlockKey{0, 0}, BlockKey{~0ULL, ~0ULL}, BlockKey{1, 0}, BlockKey{0, 1}}) {
    EXPECT_EQ(scope.Unscope(scope.Scope(key)), key) << key.ToHex();
  }
}

TEST(TenantScopeTest, ScopeIsDeterministicAndKeyedByNameAndSecret) {
  const BlockKey key{0x1111222233334444ULL, 0x5555666677778888ULL};
  const TenantScope a(kSecret, "team-a");
  const TenantScope a_again(kSecret, "team-a");
  const TenantScope b(kSecret, "team-b");
  const TenantScope a_other_secret(std::string(kTenantKeyBytes, 'z'), "team-a");

  EXPECT_EQ(a.Scope(key), a_again.Scope(key));
  EXPECT_NE(a.Scope(key), b.Scope(key));
  EXPECT_NE(a.Scope(key), a_other_secret.Scope(key));
  EXPECT_NE(b.Scope(key), a_other_secret.Scope(key));
  // One half changing changes both halves of the scoped key.
  const BlockKey next{key.hi, key.lo + 1};
  EXPECT_NE(a.Scope(key).hi, a.Scope(next).hi);
  EXPECT_NE(a.Scope(key).lo, a.Scope(next).lo);
  // Another tenant's inverse does not give the key back.
  EXPECT_NE(b.Unscope(a.Scope(key)), key);
}

class TenantKeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/kvtier-tenant-key-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    path_ = dir_ + "/tenant-key";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::unlink((path_ + ".tmp").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string FileBytes() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string dir_, path_;
};

TEST_F(TenantKeyFileTest, CreatesAPrivateKeyAndReadsItBack) {
  auto created = LoadTenantKey(path_);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->size(), kTenantKeyBytes);
  EXPECT_NE(*created, std::string(kTenantKeyBytes, '\0'));

  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kTenantKeyBytes));
  EXPECT_EQ(FileBytes(), *created);
  EXPECT_NE(::access((path_ + ".tmp").c_str(), F_OK), 0);  // renamed, not left behind

  auto again = LoadTenantKey(path_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *created);
  // The same key scopes the same way after a restart.
  const BlockKey key{7, 9};
  EXPECT_EQ(TenantScope(*again, "a").Scope(key), TenantScope(*created, "a").Scope(key));
}

TEST_F(TenantKeyFileTest, ShortFileIsInvalidArgument) {
  {
    std::ofstream out(path_, std::ios::binary);
    out << std::string(kTenantKeyBytes - 1, 'x');
  }
  ::chmod(path_.c_str(), 0600);  // a key's own mode: what is wrong here is only its length
  auto key = LoadTenantKey(path_);
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(key.status().message().find(path_), std::string::npos) << key.status().message();
  EXPECT_EQ(FileBytes(), std::string(kTenantKeyBytes - 1, 'x'));  // left as it was

  { std::ofstream out(path_, std::ios::binary | std::ios::trunc); }
  EXPECT_EQ(LoadTenantKey(path_).status().code(), StatusCode::kInvalidArgument);  // empty file
}

TEST_F(TenantKeyFileTest, ReadsAnExistingKey) {
  std::string bytes(kTenantKeyBytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  {
    std::ofstream out(path_, std::ios::binary);
    out << bytes;
  }
  ::chmod(path_.c_str(), 0600);
  auto key = LoadTenantKey(path_);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(*key, bytes);
}

TEST_F(TenantKeyFileTest, UnwritableDirectoryIsIoError) {
  auto key = LoadTenantKey(dir_ + "/no-such-dir/tenant-key");
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), StatusCode::kIoError);
}

TEST(TenantKeyTest, EmptyPathGivesAFreshRandomKeyEachTime) {
  auto first = LoadTenantKey("");
  auto second = LoadTenantKey("");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(first->size(), kTenantKeyBytes);
  EXPECT_EQ(second->size(), kTenantKeyBytes);
  EXPECT_NE(*first, *second);
}

}  // namespace
}  // namespace kvtier
