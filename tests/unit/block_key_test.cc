// Tests for block keys: the published vectors of docs/KEYS.md bit for bit,
// and the properties DESIGN.md section 2 requires of the chain.
//
// The expected hex below was produced independently of this code (Python
// building the bytes, the xxhsum CLI hashing them; see docs/KEYS.md). If a
// vector test fails, the key format changed: that is a protocol break.

#include "kvtier/block_key.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace kvtier {
namespace {

// tokens[i] = (i * 7919) mod 128256, the generated sequence of vector V7.
std::vector<uint32_t> Generated7919(size_t n) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 128256);
  return tokens;
}

struct Vector {
  std::string name;
  NamespaceDescriptor ns;
  std::vector<uint32_t> tokens;
  std::string fingerprint_hex;
  std::vector<std::string> key_hex;
};

// Exactly the vectors of docs/KEYS.md, section "Test vectors".
const std::vector<Vector>& Vectors() {
  static const std::vector<Vector> vectors = {
      {"V1",
       {"meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659", "", "",
        "bf16", 4, 32, "layer_major_kv", 4096, 0, 1},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256},
       "a6631af4665b535d1e157412cb6842c7",
       {"425d2c1689de019d3ca8a46b47923b27", "7f741d9983225f55ddb3ca2419ef1d3a",
        "9b3600df725da1107e799b9bf628bc88"}},
      {"V2",
       {"meta-llama/Llama-3.1-8B-Instruct", "5206a32e0bd3067aef1ce90f5528ade7d866253f", "", "",
        "bf16", 4, 32, "layer_major_kv", 4096, 0, 1},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256},
       "6d349afd8c28163efb585418c9ef053c",
       {"415bc7e6bccc5581f04bf41dc3a561db", "c4b7484ba88dcd72d7be699d4a6a8946",
        "f4b03ec74766fb6f5596af0f948ab082"}},
      {"V3",
       {"meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659",
        "acme/sql-lora", "v3", "bf16", 4, 32, "layer_major_kv", 4096, 0, 1},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256},
       "c4b5b95c5847fb704ed888de9617d135",
       {"db1c7a0082c8c013f673e9a4c2f1401b", "8c66d8ecbd727c8fe5081a4a2c972ebb",
        "7117721e4f7fc8168767c5ad0731a95b"}},
      {"V4",
       {"meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659", "", "",
        "bf16", 4, 32, "layer_major_kv", 2048, 0, 2},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256},
       "3ebf22121f72f0e276b15554aa4ed091",
       {"b4e1524334700991073c0a8df9848eb5", "b816029691205c91761d17a04ec2129c",
        "e1064d8eafb34dc8be8dc0d300a008a3"}},
      {"V5",
       {"meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659", "", "",
        "bf16", 4, 32, "layer_major_kv", 2048, 1, 2},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256},
       "21c736f6fa3bc61792d496c7c62290f7",
       {"35a5374c80c89cdcb26bfa953dbdc17a", "a1f6d6f9ad85e6d62478a7ec65995060",
        "5f1173f03967128be645ac9d15b2c925"}},
      {"V6",
       {"meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659", "", "",
        "bf16", 4, 32, "layer_major_kv", 4096, 0, 1},
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256, 42, 43, 44},
       "a6631af4665b535d1e157412cb6842c7",
       {"425d2c1689de019d3ca8a46b47923b27", "7f741d9983225f55ddb3ca2419ef1d3a",
        "9b3600df725da1107e799b9bf628bc88"}},
      {"V7",
       {"Qwen/Qwen2.5-7B-Instruct", "a09a35458c702b33eeacc393d103063234e8bc28", "", "", "fp8_e4m3",
        256, 28, "layer_major_kv", 1024, 0, 1},
       Generated7919(868),
       "51d2208a054a4ea906dfcaf9a425d58c",
       {"9d34fb21b0e793829692d531bf9f1a34", "1548a849fc4ebfc8c7b1fe2685427d14",
        "3e8190a64191828df7f2d7f45f9ced00"}},
  };
  return vectors;
}

// Canonical namespace bytes of V1, from docs/KEYS.md.
constexpr char kV1CanonicalHex[] =
    "6b76746965722d6e732d7631200000006d6574612d6c6c616d612f4c6c616d612d332e31"
    "2d38422d496e73747275637428000000306539653339663234396131363937363931386636"
    "35363462383833306263383934633839363539000400000062663136040000002000000"
    "00e0000006c617965725f6d616a6f725f6b7600100000000000000000000001000000";

// Canonical namespace bytes of V7, from docs/KEYS.md.
constexpr char kV7CanonicalHex[] =
    "6b76746965722d6e732d7631180000005177656e2f5177656e322e352d37422d496e7374"
    "727563742800000061303961333534353863373032623333656561636333393364313033"
    "30363332333465386263323800080000006670385f65346d33000100001c0000000e0000"
    "006c617965725f6d616a6f725f6b7600040000000000000000000001000000";

std::string ToHexString(const std::vector<uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

NamespaceDescriptor BaseNamespace() { return Vectors()[0].ns; }

ChainHasher MakeHasher(const NamespaceDescriptor& ns) {
  Result<ChainHasher> h = ChainHasher::Create(ns);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return std::move(h).value();
}

std::vector<std::string> Hexes(const std::vector<BlockKey>& keys) {
  std::vector<std::string> out;
  for (const BlockKey& k : keys) out.push_back(k.ToHex());
  return out;
}

// ---------------------------------------------------------------------------
// Published vectors

TEST(BlockKeyVectorsTest, CanonicalNamespaceBytesOfV1) {
  EXPECT_EQ(ToHexString(CanonicalNamespaceBytes(BaseNamespace())), kV1CanonicalHex);
}

TEST(BlockKeyVectorsTest, CanonicalNamespaceBytesOfV7) {
  EXPECT_EQ(ToHexString(CanonicalNamespaceBytes(Vectors()[6].ns)), kV7CanonicalHex);
}

TEST(BlockKeyVectorsTest, EveryVectorMatchesBitForBit) {
  for (const Vector& v : Vectors()) {
    SCOPED_TRACE(v.name);
    ASSERT_TRUE(v.ns.Validate().ok()) << v.ns.Validate().ToString();
    EXPECT_EQ(FingerprintNamespace(v.ns).ToHex(), v.fingerprint_hex);
    ChainHasher hasher = MakeHasher(v.ns);
    EXPECT_EQ(hasher.fingerprint().ToHex(), v.fingerprint_hex);
    EXPECT_EQ(hasher.block_tokens(), v.ns.block_tokens);
    EXPECT_EQ(Hexes(hasher.Keys(v.tokens)), v.key_hex);

    // The same keys link by link through the free function.
    BlockKey prev = FingerprintNamespace(v.ns);
    const size_t b = v.ns.block_tokens;
    for (size_t i = 0; i < v.key_hex.size(); ++i) {
      prev = ChainKey(prev, static_cast<uint32_t>(i),
                      std::span<const uint32_t>(v.tokens).subspan(i * b, b));
      EXPECT_EQ(prev.ToHex(), v.key_hex[i]) << "block " << i;
    }
  }
}

TEST(BlockKeyVectorsTest, VectorsShowTheDocumentedDifferences) {
  const auto& v = Vectors();
  auto shares_key = [](const Vector& a, const Vector& b) {
    for (const std::string& k : a.key_hex) {
      for (const std::string& l : b.key_hex) {
        if (k == l) return true;
      }
    }
    return false;
  };
  // V2 (other revision), V3 (adapter), V4/V5 (tp ranks) differ from block 0.
  EXPECT_FALSE(shares_key(v[0], v[1]));
  EXPECT_FALSE(shares_key(v[0], v[2]));
  EXPECT_FALSE(shares_key(v[3], v[4]));
  EXPECT_FALSE(shares_key(v[0], v[3]));
  // V6 is V1 plus 3 tokens: the partial block adds no key.
  EXPECT_EQ(v[5].tokens.size(), v[0].tokens.size() + 3);
  EXPECT_EQ(v[5].key_hex, v[0].key_hex);
  // V7 has 868 tokens with B = 256: 3 full blocks.
  EXPECT_EQ(v[6].tokens.size(), 868u);
  EXPECT_EQ(v[6].key_hex.size(), 3u);
}

// ---------------------------------------------------------------------------
// Chain properties

std::vector<uint32_t> PseudoRandomTokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> tokens(n);
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ seed;
  for (auto& t : tokens) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<uint32_t>(x % 128256);
  }
  return tokens;
}

TEST(ChainHasherTest, EachNamespaceFieldGivesADisjointChain) {
  constexpr size_t kBlocks = 64;
  const NamespaceDescriptor base = BaseNamespace();
  std::vector<std::pair<std::string, NamespaceDescriptor>> variants;
  auto add = [&](std::string name, auto mutate) {
    NamespaceDescriptor ns = base;
    mutate(ns);
    variants.emplace_back(std::move(name), ns);
  };
  add("base", [](NamespaceDescriptor&) {});
  add("model_id", [](NamespaceDescriptor& ns) { ns.model_id = "meta-llama/Llama-3.1-70B"; });
  add("model_revision", [](NamespaceDescriptor& ns) { ns.model_revision = "main"; });
  add("adapter", [](NamespaceDescriptor& ns) {
    ns.adapter_id = "acme/sql-lora";
    ns.adapter_revision = "v3";
  });
  add("adapter_revision", [](NamespaceDescriptor& ns) {
    ns.adapter_id = "acme/sql-lora";
    ns.adapter_revision = "v4";
  });
  add("kv_dtype", [](NamespaceDescriptor& ns) { ns.kv_dtype = "fp8_e4m3"; });
  add("kv_layout", [](NamespaceDescriptor& ns) { ns.kv_layout = "token_major_kv"; });
  add("layer_count", [](NamespaceDescriptor& ns) { ns.layer_count = 31; });
  add("bytes_per_token_per_layer",
      [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = 2048; });
  add("tp_rank", [](NamespaceDescriptor& ns) {
    ns.tp_size = 2;
    ns.tp_rank = 1;
  });
  add("tp_size", [](NamespaceDescriptor& ns) { ns.tp_size = 2; });
  // Swapping bytes between adjacent strings must not collide either.
  add("string_boundary", [](NamespaceDescriptor& ns) {
    ns.model_id += ns.model_revision.substr(0, 1);
    ns.model_revision = ns.model_revision.substr(1);
  });
  // block_tokens is covered below with the same total token count.

  const std::vector<uint32_t> tokens = PseudoRandomTokens(kBlocks * base.block_tokens, /*seed=*/1);
  std::set<std::string> fingerprints;
  std::unordered_set<BlockKey> all_keys;
  for (const auto& [name, ns] : variants) {
    SCOPED_TRACE(name);
    ChainHasher hasher = MakeHasher(ns);
    EXPECT_TRUE(fingerprints.insert(hasher.fingerprint().ToHex()).second);
    std::vector<BlockKey> keys = hasher.Keys(tokens);
    ASSERT_EQ(keys.size(), kBlocks);
    for (const BlockKey& k : keys) EXPECT_TRUE(all_keys.insert(k).second);
  }

  // block_tokens 4 vs 8 over the same tokens: no key in common.
  NamespaceDescriptor wide = base;
  wide.block_tokens = 8;
  std::vector<BlockKey> narrow_keys = MakeHasher(base).Keys(tokens);
  std::vector<BlockKey> wide_keys = MakeHasher(wide).Keys(tokens);
  ASSERT_EQ(wide_keys.size(), kBlocks / 2);
  for (const BlockKey& k : wide_keys) EXPECT_EQ(all_keys.count(k), 0u);
}

TEST(ChainHasherTest, SameInputsGiveSameKeys) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(256, /*seed=*/2);
  ChainHasher a = MakeHasher(BaseNamespace());
  ChainHasher b = MakeHasher(BaseNamespace());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_EQ(a.Keys(tokens), b.Keys(tokens));
  EXPECT_EQ(a.Keys(tokens), a.Keys(tokens));
}

TEST(ChainHasherTest, KeysOfAPrefixAreAPrefixOfTheKeys) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 40 + 3, /*seed=*/3);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const std::vector<BlockKey> all = hasher.Keys(tokens);
  ASSERT_EQ(all.size(), 40u);
  for (size_t n = 0; n <= tokens.size(); ++n) {
    std::vector<BlockKey> prefix = hasher.Keys(std::span<const uint32_t>(tokens).first(n));
    ASSERT_EQ(prefix.size(), n / 4) << n;
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), all.begin())) << n;
  }
}

TEST(ChainHasherTest, ADifferentTokenChangesThatBlockAndEveryLaterOne) {
  std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 16, /*seed=*/4);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const std::vector<BlockKey> before = hasher.Keys(tokens);
  tokens[4 * 5 + 2] ^= 1;  // inside block 5
  const std::vector<BlockKey> after = hasher.Keys(tokens);
  for (size_t i = 0; i < before.size(); ++i) {
    if (i < 5) {
      EXPECT_EQ(before[i], after[i]) << i;
    } else {
      EXPECT_NE(before[i], after[i]) << i;
    }
  }
}

TEST(ChainHasherTest, SameBlockAtAnotherPositionGetsAnotherKey) {
  // Four identical blocks: the position and the chain make every key unique.
  const std::vector<uint32_t> tokens(16, 7);
  std::vector<BlockKey> keys = MakeHasher(BaseNamespace()).Keys(tokens);
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(std::set<BlockKey>(keys.begin(), keys.end()).size(), 4u);
}

TEST(ChainHasherTest, PartialTrailingBlockIsNotKeyed) {
  NamespaceDescriptor ns = BaseNamespace();
  ns.block_tokens = 16;
  ChainHasher hasher = MakeHasher(ns);
  const uint32_t b = ns.block_tokens;
  const std::vector<uint32_t> tokens = PseudoRandomTokens(2 * b + 3, /*seed=*/5);
  std::span<const uint32_t> all(tokens);
  EXPECT_EQ(hasher.Keys(all).size(), 2u);
  EXPECT_EQ(hasher.Keys(all.first(2 * b)), hasher.Keys(all));
  EXPECT_EQ(hasher.Keys(all.first(2 * b - 1)).size(), 1u);
  EXPECT_TRUE(hasher.Keys(all.first(b - 1)).empty());
  EXPECT_TRUE(hasher.Keys(all.first(0)).empty());
  EXPECT_EQ(hasher.Keys(all.first(b)).size(), 1u);
}

TEST(ChainHasherTest, ExtendEqualsKeys) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 30 + 2, /*seed=*/6);
  std::span<const uint32_t> all(tokens);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const std::vector<BlockKey> expected = hasher.Keys(all);

  // Grow the token sequence a few tokens at a time, as a decode loop would.
  std::vector<BlockKey> chain;
  for (size_t n = 0; n <= tokens.size(); n += 3) {
    hasher.Extend(all.first(n), chain);
    EXPECT_EQ(chain, hasher.Keys(all.first(n))) << n;
  }
  hasher.Extend(all, chain);
  EXPECT_EQ(chain, expected);

  // Extending a complete chain is a no-op; from empty equals Keys.
  hasher.Extend(all, chain);
  EXPECT_EQ(chain, expected);
  std::vector<BlockKey> fresh;
  hasher.Extend(all, fresh);
  EXPECT_EQ(fresh, expected);
}

TEST(ChainHasherTest, ExtendTrustsTheExistingPrefix) {
  // Extend does not rehash the prefix: it chains from chain.back().
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 3, /*seed=*/7);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const BlockKey fake{1, 2};
  std::vector<BlockKey> chain = {fake};
  hasher.Extend(tokens, chain);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0], fake);
  EXPECT_EQ(chain[1], ChainKey(fake, 1, std::span<const uint32_t>(tokens).subspan(4, 4)));
}

TEST(ChainHasherDeathTest, ExtendAbortsOnAChainLongerThanTheTokens) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 2 + 1, /*seed=*/9);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  std::vector<BlockKey> chain(3);  // only 2 full blocks in `tokens`
  EXPECT_DEATH(hasher.Extend(tokens, chain), "chain is longer");
}

TEST(ChainHasherTest, CreateRejectsAnInvalidDescriptor) {
  NamespaceDescriptor ns = BaseNamespace();
  ns.kv_dtype.clear();
  Result<ChainHasher> h = ChainHasher::Create(ns);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("kv_dtype"), std::string::npos);
}

// ---------------------------------------------------------------------------
// BlockKey text form

TEST(BlockKeyTest, ToHexIsHiThenLoBigEndian) {
  const BlockKey k{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(k.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(BlockKey{}.ToHex(), std::string(32, '0'));
}

TEST(BlockKeyTest, HexRoundTrips) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 50, /*seed=*/8);
  std::vector<BlockKey> keys = MakeHasher(BaseNamespace()).Keys(tokens);
  keys.push_back(BlockKey{});
  keys.push_back(BlockKey{~0ULL, ~0ULL});
  keys.push_back(BlockKey{1, 0});
  for (const BlockKey& k : keys) {
    Result<BlockKey> parsed = BlockKey::FromHex(k.ToHex());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, k);
  }
}

TEST(BlockKeyTest, FromHexRejectsBadInput) {
  const std::string good = "425d2c1689de019d3ca8a46b47923b27";
  ASSERT_TRUE(BlockKey::FromHex(good).ok());
  const std::vector<std::string> bad = {
      "",
      good.substr(0, 31),                  // too short
      good + "0",                          // too long
      "0x" + good.substr(2),               // prefix
      "425D2C1689DE019D3CA8A46B47923B27",  // upper case is not canonical
      "425d2c1689de019d3ca8a46b47923b2g",  // not hex
      " 425d2c1689de019d3ca8a46b47923b2",  // whitespace
      "425d2c1689de019d-ca8a46b47923b27",  // separator
      std::string("425d2c1689de019d\0ca8a46b47923b27", 32),
  };
  for (const std::string& s : bad) {
    Result<BlockKey> r = BlockKey::FromHex(s);
    EXPECT_FALSE(r.ok()) << '"' << s << '"';
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(BlockKeyTest, OrderingAndHashAreUsable) {
  const BlockKey a{1, 2}, b{1, 3}, c{2, 0};
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_EQ(std::hash<BlockKey>{}(a), std::hash<BlockKey>{}(BlockKey{1, 2}));
}

// ---------------------------------------------------------------------------
// NamespaceDescriptor

TEST(NamespaceDescriptorTest, ValidateAcceptsTheVectors) {
  for (const Vector& v : Vectors()) EXPECT_TRUE(v.ns.Validate().ok()) << v.name;
}

TEST(NamespaceDescriptorTest, ValidateNamesEachBadField) {
  struct Case {
    std::string field;
    void (*mutate)(NamespaceDescriptor&);
  };
  const std::vector<Case> cases = {
      {"model_id", [](NamespaceDescriptor& ns) { ns.model_id.clear(); }},
      {"model_revision", [](NamespaceDescriptor& ns) { ns.model_revision.clear(); }},
      {"adapter_revision", [](NamespaceDescriptor& ns) { ns.adapter_revision = "v1"; }},
      {"adapter_revision", [](NamespaceDescriptor& ns) { ns.adapter_id = "acme/lora"; }},
      {"kv_dtype", [](NamespaceDescriptor& ns) { ns.kv_dtype.clear(); }},
      {"block_tokens", [](NamespaceDescriptor& ns) { ns.block_tokens = 0; }},
      {"layer_count", [](NamespaceDescriptor& ns) { ns.layer_count = 0; }},
      {"kv_layout", [](NamespaceDescriptor& ns) { ns.kv_layout.clear(); }},
      {"bytes_per_token_per_layer",
       [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = 0; }},
      {"bytes_per_token_per_layer",
       [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = ~0ULL / 64; }},
      {"tp_size", [](NamespaceDescriptor& ns) { ns.tp_size = 0; }},
      {"tp_rank", [](NamespaceDescriptor& ns) { ns.tp_rank = 1; }},
      {"tp_rank",
       [](NamespaceDescriptor& ns) {
         ns.tp_size = 4;
         ns.tp_rank = 7;
       }},
  };
  for (const Case& c : cases) {
    NamespaceDescriptor ns = BaseNamespace();
    c.mutate(ns);
    const Status s = ns.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    // The message starts with the name of the offending field.
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << c.field << ": " << s.message();
  }
}

TEST(NamespaceDescriptorTest, DefaultDescriptorIsInvalid) {
  EXPECT_FALSE(NamespaceDescriptor{}.Validate().ok());
}

TEST(NamespaceDescriptorTest, BlockAndLayerBytes) {
  NamespaceDescriptor ns = BaseNamespace();  // 4 tokens, 32 layers, 4096 B
  EXPECT_EQ(ns.LayerBytes(), 4u * 4096u);
  EXPECT_EQ(ns.BlockBytes(), 4u * 32u * 4096u);

  // Llama-3.1-8B bf16 at B = 256: 8 KV heads * 128 dims * 2 (K, V) * 2 bytes.
  ns.block_tokens = 256;
  ns.bytes_per_token_per_layer = 8 * 128 * 2 * 2;
  EXPECT_EQ(ns.LayerBytes(), 256u * 4096u);         // 1 MiB
  EXPECT_EQ(ns.BlockBytes(), 32ull * 1024 * 1024);  // 32 MiB
  EXPECT_EQ(ns.BlockBytes(), ns.LayerBytes() * ns.layer_count);

  // No 32-bit overflow in the products.
  ns.block_tokens = 1u << 20;
  ns.layer_count = 1u << 10;
  ns.bytes_per_token_per_layer = 1u << 20;
  EXPECT_TRUE(ns.Validate().ok());
  EXPECT_EQ(ns.LayerBytes(), 1ull << 40);
  EXPECT_EQ(ns.BlockBytes(), 1ull << 50);
}

TEST(NamespaceDescriptorTest, CanonicalBytesEncodeTheAdapterPresence) {
  NamespaceDescriptor ns = BaseNamespace();
  const std::vector<uint8_t> none = CanonicalNamespaceBytes(ns);
  ns.adapter_id = "a";
  ns.adapter_revision = "b";
  const std::vector<uint8_t> with = CanonicalNamespaceBytes(ns);
  // Presence byte 1, then two length-prefixed one-byte strings: 1 + 5 + 5.
  EXPECT_EQ(with.size(), none.size() + 10);
  const std::string magic = "kvtier-ns-v1";
  EXPECT_EQ(std::string(none.begin(), none.begin() + magic.size()), magic);
}

}  // namespace
}  // namespace kvtier
