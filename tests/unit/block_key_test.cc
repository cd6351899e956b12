// Tests for block keys: the published vectors of docs/KEYS.md bit for bit,
// and the properties docs/KEYS.md requires of the chain.
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

const std::vector<uint32_t> kT12 = {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256};

// The payloads of the extra keys of V13-V15.
const std::string kImageA = "image:sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const std::string kImageB = "image:sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";
const std::string kEmbeds = "embeds:xxh3:4a1c7e0f2b9d3856";

// The base descriptor of docs/KEYS.md (V1), with `mutate` applied.
template <typename Mutate>
NamespaceDescriptor BaseWith(Mutate mutate) {
  NamespaceDescriptor ns{.model_id = "meta-llama/Llama-3.1-8B-Instruct",
                         .model_revision = "0e9e39f249a16976918f6564b8830bc894c89659",
                         .kv_dtype = "bf16",
                         .block_tokens = 4,
                         .layer_count = 32,
                         .kv_layout = "layer_major_kv",
                         .bytes_per_token_per_layer = 4096};
  mutate(ns);
  return ns;
}
NamespaceDescriptor BaseNamespace() {
  return BaseWith([](NamespaceDescriptor&) {});
}

NamespaceDescriptor V7Namespace() {
  return {.model_id = "Qwen/Qwen2.5-7B-Instruct",
          .model_revision = "a09a35458c702b33eeacc393d103063234e8bc28",
          .kv_dtype = "fp8_e4m3",
          .block_tokens = 256,
          .layer_count = 28,
          .kv_layout = "layer_major_kv",
          .bytes_per_token_per_layer = 1024};
}

struct Vector {
  std::string name;
  NamespaceDescriptor ns;
  std::vector<uint32_t> tokens;
  ChainExtras extras;
  std::string fingerprint_hex;
  std::vector<std::string> key_hex;
};

const std::string kV1Fingerprint = "20af72c79a4ba5d08c2b9e52c0543beb";
const std::vector<std::string> kV1Keys = {"613a89fd907ba88074b75707c399af33", "2c98b337a1b2a0c21960c191e1bf13c9",
                                          "c3a132abd959537afd1f0fa8f1cc3d12"};

// Exactly the vectors of docs/KEYS.md, section "Test vectors" (and
// docs/key_vectors.json).
const std::vector<Vector>& Vectors() {
  using K = ExtraKeyKind;
  static const std::vector<Vector> vectors = {
      {"V1", BaseNamespace(), kT12, {}, kV1Fingerprint, kV1Keys},
      {"V2",
       BaseWith([](NamespaceDescriptor& ns) { ns.model_revision = "5206a32e0bd3067aef1ce90f5528ade7d866253f"; }),
       kT12,
       {},
       "ff122e7b5a4c38c699c7f03c951a0cb8",
       {"c2b6472ee46330e47c0c844b1565c300", "b29f9522f11c0e15cf0e785848b4073c", "01bbf7c950654de8eea97fa1c5d1db42"}},
      {"V3",
       BaseWith([](NamespaceDescriptor& ns) {
         ns.adapter_id = "acme/sql-lora";
         ns.adapter_revision = "v3";
       }),
       kT12,
       {},
       "09659bbe15126487c8be2499bc575566",
       {"8bb9c73e701edc49a1d480fc2c9a335b", "78defe8936b89fe6c985d6aa7bda8480", "abefb884ffd5249aed49578db1836c6d"}},
      {"V4",
       BaseWith([](NamespaceDescriptor& ns) {
         ns.bytes_per_token_per_layer = 2048;
         ns.tp_size = 2;
       }),
       kT12,
       {},
       "daa6081f86cce37b68a1d804b8c2eaa8",
       {"68eeb522ba5bebc67a0e3b877d39748d", "0d719a90e1ae3117b23c3aa9463de809", "cb237163186223afff4fab1b6f7e0369"}},
      {"V5",
       BaseWith([](NamespaceDescriptor& ns) {
         ns.bytes_per_token_per_layer = 2048;
         ns.tp_rank = 1;
         ns.tp_size = 2;
       }),
       kT12,
       {},
       "c8eea3ba939773f4bd1da893720ce3be",
       {"1d3569979e7bc97a270eb83f0d6b1f6a", "7911a30af31532a23285051f6d74cbba", "9f0559649c0923d1e0e2e987c3e7d604"}},
      {"V6",
       BaseNamespace(),
       {128000, 9906, 11, 1917, 0, 1, 2, 3, 4294967295u, 128255, 65536, 256, 42, 43, 44},
       {},
       kV1Fingerprint,
       kV1Keys},
      {"V7",
       V7Namespace(),
       Generated7919(868),
       {},
       "beb48394a5276a6d737ac7ef94679a6a",
       {"c04c799e047d844b8418b7cb907a70e0", "63f8424c157e11d0a3d8c9b1090a0b25", "983cddc8715f51b124ff94c9852031a3"}},
      {"V8",
       BaseWith([](NamespaceDescriptor& ns) {
         ns.layer_count = 16;
         ns.pp_rank = 1;
         ns.pp_size = 2;
       }),
       kT12,
       {},
       "41025defc5a30daec85457d130b1ae1a",
       {"79f366f29512fdf69191a3da6cd01cd9", "61596d4e574ebe3336d4a79a939f9b91", "adf63a15a0a9e3e472bd1fb29c83c4b8"}},
      {"V9",
       BaseWith([](NamespaceDescriptor& ns) { ns.kv_format_version = 2; }),
       kT12,
       {},
       "8f1b83210f201c1d91df93e241765d45",
       {"8358c3a10fb76ab69361d1efa1368a71", "022495c0605c4d788da93e98bc471a45", "47f7c23872a5d42f4bf1eacab6a4ddea"}},
      {"V10",
       BaseWith([](NamespaceDescriptor& ns) { ns.object_kind = "recurrent_state"; }),
       kT12,
       {},
       "2dc6be4b5ba84bf720924ae0b01b9548",
       {"d94241baab7131acec2ffbc092248342", "aa2c7840b24cc7c6c76ab2081e84e463", "aff939f0c644274f782a74bc2f1e7dfb"}},
      {"V11",
       BaseNamespace(),
       kT12,
       {.cache_salt = "tenant-a"},
       kV1Fingerprint,
       {"0d22f386e960c8c0281eab673d75dd59", "3c442cfab1b4fa7dc2fbe3a31cded4a1", "e65660b999559877829be757ad60d7ca"}},
      {"V12",
       BaseNamespace(),
       kT12,
       {.cache_salt = "tenant-b"},
       kV1Fingerprint,
       {"26c7c0d96548db699286a03c5e65ff6a", "beaacdd8b389e75a63dbebe8360b537d", "a79231ef86e6e3aca00dd2ebb8de83a6"}},
      {"V13",
       BaseNamespace(),
       kT12,
       {.blocks = {{}, {{K::kMultimodal, kImageA}}, {{K::kPromptEmbeds, kEmbeds}}}},
       kV1Fingerprint,
       {"613a89fd907ba88074b75707c399af33", "f8e6adc5d393fda4ca7c49e112a3be8b", "a53f837d2879ec9996f0f48f4a0757f5"}},
      {"V14",
       BaseNamespace(),
       kT12,
       {.cache_salt = "tenant-a", .blocks = {{{K::kMultimodal, kImageA}, {K::kMultimodal, kImageB}}}},
       kV1Fingerprint,
       {"ed8859e33fec11f6b0ba08662aa4b224", "8a00f9ca84155580da0e59839795dcb2", "3f9a7ca1e576620f0152bdde94573485"}},
      {"V15",
       BaseNamespace(),
       kT12,
       {.cache_salt = "tenant-a", .blocks = {{{K::kMultimodal, kImageB}, {K::kMultimodal, kImageA}}}},
       kV1Fingerprint,
       {"78a6083bcfc366a3dd92782ea9f6386c", "c86b970c9efe32980e60111b15038c3b", "033292b08e035528987cc3e29057773d"}},
  };
  return vectors;
}

const Vector& V(const std::string& name) {
  for (const Vector& v : Vectors()) {
    if (v.name == name) return v;
  }
  ADD_FAILURE() << "no vector " << name;
  return Vectors()[0];
}

// Canonical namespace bytes of V1, from docs/KEYS.md (161 bytes).
constexpr char kV1CanonicalHex[] =
    "6b76746965722d6e732d7632200000006d6574612d6c6c616d612f4c6c616d612d332e31"
    "2d38422d496e737472756374280000003065396533396632343961313639373639313866"
    "363536346238383330626338393463383936353900040000006266313604000000200000"
    "000e0000006c617965725f6d616a6f725f6b760010000000000000000000000100000000"
    "0000000100000001000000020000006b76";

// Canonical namespace bytes of V7, from docs/KEYS.md (157 bytes).
constexpr char kV7CanonicalHex[] =
    "6b76746965722d6e732d7632180000005177656e2f5177656e322e352d37422d496e7374"
    "727563742800000061303961333534353863373032623333656561636333393364313033"
    "30363332333465386263323800080000006670385f65346d33000100001c0000000e0000"
    "006c617965725f6d616a6f725f6b76000400000000000000000000010000000000000001"
    "00000001000000020000006b76";

std::string ToHexString(const std::vector<uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

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
  EXPECT_EQ(ToHexString(CanonicalNamespaceBytes(V("V7").ns)), kV7CanonicalHex);
}

// The extra keys ChainKey takes for block i: the salt entry first (block 0).
std::vector<ExtraKey> LinkExtras(const ChainExtras& extras, size_t i) {
  std::vector<ExtraKey> out;
  if (i == 0 && !extras.cache_salt.empty()) out.push_back({ExtraKeyKind::kCacheSalt, extras.cache_salt});
  if (i < extras.blocks.size()) out.insert(out.end(), extras.blocks[i].begin(), extras.blocks[i].end());
  return out;
}

bool HasExtras(const ChainExtras& e) { return !e.cache_salt.empty() || !e.blocks.empty(); }

TEST(BlockKeyVectorsTest, EveryVectorMatchesBitForBit) {
  ASSERT_EQ(Vectors().size(), 15u);
  for (const Vector& v : Vectors()) {
    SCOPED_TRACE(v.name);
    ASSERT_TRUE(v.ns.Validate().ok()) << v.ns.Validate().ToString();
    ASSERT_TRUE(v.extras.Validate().ok()) << v.extras.Validate().ToString();
    EXPECT_EQ(FingerprintNamespace(v.ns).ToHex(), v.fingerprint_hex);
    ChainHasher hasher = MakeHasher(v.ns);
    EXPECT_EQ(hasher.fingerprint().ToHex(), v.fingerprint_hex);
    EXPECT_EQ(hasher.block_tokens(), v.ns.block_tokens);
    Result<std::vector<BlockKey>> keys = hasher.Keys(v.tokens, v.extras);
    ASSERT_TRUE(keys.ok()) << keys.status().ToString();
    EXPECT_EQ(Hexes(*keys), v.key_hex);
    if (!HasExtras(v.extras)) EXPECT_EQ(Hexes(hasher.Keys(v.tokens)), v.key_hex);

    // The same keys link by link through the free function.
    BlockKey prev = FingerprintNamespace(v.ns);
    const size_t b = v.ns.block_tokens;
    for (size_t i = 0; i < v.key_hex.size(); ++i) {
      const std::vector<ExtraKey> extras = LinkExtras(v.extras, i);
      prev = ChainKey(prev, static_cast<uint32_t>(i), std::span<const uint32_t>(v.tokens).subspan(i * b, b), extras);
      EXPECT_EQ(prev.ToHex(), v.key_hex[i]) << "block " << i;
    }
  }
}

bool SharesKey(const Vector& a, const Vector& b) {
  for (const std::string& k : a.key_hex) {
    for (const std::string& l : b.key_hex) {
      if (k == l) return true;
    }
  }
  return false;
}

TEST(BlockKeyVectorsTest, VectorsShowTheDocumentedDifferences) {
  // V2 (other revision), V3 (adapter), V4/V5 (tp ranks), V8 (pp rank), V9
  // (format version), V10 (object kind) differ from block 0.
  for (const char* other : {"V2", "V3", "V4", "V8", "V9", "V10"}) {
    EXPECT_FALSE(SharesKey(V("V1"), V(other))) << other;
    EXPECT_NE(V("V1").fingerprint_hex, V(other).fingerprint_hex) << other;
  }
  EXPECT_FALSE(SharesKey(V("V4"), V("V5")));
  // V6 is V1 plus 3 tokens: the partial block adds no key.
  EXPECT_EQ(V("V6").tokens.size(), V("V1").tokens.size() + 3);
  EXPECT_EQ(V("V6").key_hex, V("V1").key_hex);
  // V7 has 868 tokens with B = 256: 3 full blocks.
  EXPECT_EQ(V("V7").tokens.size(), 868u);
  EXPECT_EQ(V("V7").key_hex.size(), 3u);
  // V11-V15 keep V1's namespace: salt and extras are not in the fingerprint.
  for (const char* name : {"V11", "V12", "V13", "V14", "V15"}) {
    EXPECT_EQ(V(name).fingerprint_hex, kV1Fingerprint) << name;
  }
  // A salt changes every key; two salts share none.
  EXPECT_FALSE(SharesKey(V("V1"), V("V11")));
  EXPECT_FALSE(SharesKey(V("V11"), V("V12")));
  // Extras on block 1 keep k[0] and change k[1] onward.
  EXPECT_EQ(V("V13").key_hex[0], kV1Keys[0]);
  EXPECT_NE(V("V13").key_hex[1], kV1Keys[1]);
  EXPECT_NE(V("V13").key_hex[2], kV1Keys[2]);
  // The order of a block's extra keys matters.
  EXPECT_FALSE(SharesKey(V("V14"), V("V15")));
  EXPECT_FALSE(SharesKey(V("V11"), V("V14")));
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
  add("bytes_per_token_per_layer", [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = 2048; });
  add("tp_rank", [](NamespaceDescriptor& ns) {
    ns.tp_size = 2;
    ns.tp_rank = 1;
  });
  add("tp_size", [](NamespaceDescriptor& ns) { ns.tp_size = 2; });
  add("pp_rank", [](NamespaceDescriptor& ns) {
    ns.pp_size = 2;
    ns.pp_rank = 1;
  });
  add("pp_size", [](NamespaceDescriptor& ns) { ns.pp_size = 2; });
  add("kv_format_version", [](NamespaceDescriptor& ns) { ns.kv_format_version = 2; });
  add("object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "recurrent_state"; });
  // A tp value must not read as the pp value next to it.
  add("tp_vs_pp", [](NamespaceDescriptor& ns) {
    ns.tp_size = 2;
    ns.pp_size = 2;
    ns.pp_rank = 1;
  });
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
  const std::string good = "613a89fd907ba88074b75707c399af33";
  ASSERT_TRUE(BlockKey::FromHex(good).ok());
  const std::vector<std::string> bad = {
      "",
      good.substr(0, 31),                  // too short
      good + "0",                          // too long
      "0x" + good.substr(2),               // prefix
      "613A89FD907BA88074B75707C399AF33",  // upper case is not canonical
      "613a89fd907ba88074b75707c399af3g",  // not hex
      " 613a89fd907ba88074b75707c399af3",  // whitespace
      "613a89fd907ba880-4b75707c399af33",  // separator
      std::string("613a89fd907ba880\0"
                  "4b75707c399af33",
                  32),
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
      {"bytes_per_token_per_layer", [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = 0; }},
      {"bytes_per_token_per_layer", [](NamespaceDescriptor& ns) { ns.bytes_per_token_per_layer = ~0ULL / 64; }},
      {"tp_size", [](NamespaceDescriptor& ns) { ns.tp_size = 0; }},
      {"tp_rank", [](NamespaceDescriptor& ns) { ns.tp_rank = 1; }},
      {"tp_rank",
       [](NamespaceDescriptor& ns) {
         ns.tp_size = 4;
         ns.tp_rank = 7;
       }},
      {"pp_size", [](NamespaceDescriptor& ns) { ns.pp_size = 0; }},
      {"pp_rank", [](NamespaceDescriptor& ns) { ns.pp_rank = 1; }},
      {"pp_rank",
       [](NamespaceDescriptor& ns) {
         ns.pp_size = 4;
         ns.pp_rank = 4;
       }},
      {"kv_format_version", [](NamespaceDescriptor& ns) { ns.kv_format_version = 0; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind.clear(); }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "KV"; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "recurrent-state"; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "kv "; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = std::string("k\0v", 3); }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "\xc3\xa9t\xc3\xa9"; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = std::string(65, 'a'); }},
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

TEST(NamespaceDescriptorTest, DefaultDescriptorIsInvalid) { EXPECT_FALSE(NamespaceDescriptor{}.Validate().ok()); }

TEST(NamespaceDescriptorTest, KeyV2FieldsHaveTheirDefaults) {
  const NamespaceDescriptor ns;
  EXPECT_EQ(ns.pp_rank, 0u);
  EXPECT_EQ(ns.pp_size, 1u);
  EXPECT_EQ(ns.kv_format_version, 1u);
  EXPECT_EQ(ns.object_kind, "kv");
}

TEST(NamespaceDescriptorTest, ValidateAcceptsObjectKindsAtTheLimits) {
  for (const std::string& kind : {std::string("kv"), std::string("recurrent_state"), std::string("a"),
                                  std::string("state_v2_0"), std::string(64, 'z')}) {
    NamespaceDescriptor ns = BaseNamespace();
    ns.object_kind = kind;
    EXPECT_TRUE(ns.Validate().ok()) << kind << ": " << ns.Validate().ToString();
  }
  NamespaceDescriptor ns = BaseNamespace();
  ns.pp_size = 8;
  ns.pp_rank = 7;
  ns.kv_format_version = ~0u;
  EXPECT_TRUE(ns.Validate().ok()) << ns.Validate().ToString();
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
  const std::string magic = "kvtier-ns-v2";
  EXPECT_EQ(std::string(none.begin(), none.begin() + magic.size()), magic);
}

TEST(NamespaceDescriptorTest, CanonicalBytesEndWithTheV2Fields) {
  NamespaceDescriptor ns = BaseNamespace();
  ns.pp_rank = 0x01020304;
  ns.pp_size = 0x05060708;
  ns.kv_format_version = 0x090a0b0c;
  ns.object_kind = "abc";
  const std::vector<uint8_t> bytes = CanonicalNamespaceBytes(ns);
  const std::vector<uint8_t> tail(bytes.end() - 19, bytes.end());
  const std::vector<uint8_t> want = {4, 3, 2, 1, 8, 7, 6, 5, 0xc, 0xb, 0xa, 9, 3, 0, 0, 0, 'a', 'b', 'c'};
  EXPECT_EQ(tail, want);
}

// ---------------------------------------------------------------------------
// ChainExtras

ExtraKey Image(std::string bytes) { return {ExtraKeyKind::kMultimodal, std::move(bytes)}; }
ExtraKey Embeds(std::string bytes) { return {ExtraKeyKind::kPromptEmbeds, std::move(bytes)}; }

TEST(ChainExtrasTest, ValidateAcceptsTheLimits) {
  ChainExtras e;
  EXPECT_TRUE(e.Validate().ok());
  e.cache_salt = std::string(kMaxExtraKeyBytes, 's');
  e.blocks = {{},
              std::vector<ExtraKey>(kMaxExtraKeysPerBlock, Image("x")),
              {Image(std::string(kMaxExtraKeyBytes, 'i')), Embeds("e")}};
  EXPECT_TRUE(e.Validate().ok()) << e.Validate().ToString();
  // Binary payloads and salts are fine: they are opaque bytes.
  e.cache_salt = std::string("\0\xff", 2);
  e.blocks = {{Image(std::string("\0", 1))}};
  EXPECT_TRUE(e.Validate().ok()) << e.Validate().ToString();
}

TEST(ChainExtrasTest, ValidateRefusesEachBadInput) {
  struct Case {
    std::string what;  // a part of the message
    ChainExtras extras;
  };
  const std::vector<Case> cases = {
      {"cache_salt", {.cache_salt = std::string(kMaxExtraKeyBytes + 1, 's')}},
      {"block 1", {.blocks = {{}, std::vector<ExtraKey>(kMaxExtraKeysPerBlock + 1, Image("x"))}}},
      {"kind 1", {.blocks = {{{ExtraKeyKind::kCacheSalt, "tenant-a"}}}}},
      {"kind 0", {.blocks = {{{static_cast<ExtraKeyKind>(0), "x"}}}}},
      {"kind 4", {.blocks = {{Image("ok"), {static_cast<ExtraKeyKind>(4), "x"}}}}},
      {"empty payload", {.blocks = {{}, {}, {Embeds("")}}}},
      {"payload is 4097", {.blocks = {{Image(std::string(kMaxExtraKeyBytes + 1, 'i'))}}}},
  };
  const std::vector<uint32_t> tokens(12, 5);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  for (const Case& c : cases) {
    const Status s = c.extras.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << c.what << ": " << s.message();
    // Keys and Extend refuse them too, leaving the chain as it was.
    EXPECT_EQ(hasher.Keys(tokens, c.extras).status().code(), StatusCode::kInvalidArgument);
    std::vector<BlockKey> chain = {BlockKey{1, 2}};
    EXPECT_EQ(hasher.Extend(tokens, c.extras, chain).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(chain, (std::vector<BlockKey>{BlockKey{1, 2}}));
  }
}

// Salt, images on blocks 0, 3 and 4, embeddings on block 4, none on the rest.
ChainExtras SomeExtras() {
  ChainExtras e;
  e.cache_salt = "tenant-x";
  e.blocks.resize(5);
  e.blocks[0] = {Image("img-0")};
  e.blocks[3] = {Image("img-3a"), Image("img-3b")};
  e.blocks[4] = {Embeds("emb-4"), Image("img-4")};
  return e;
}

TEST(ChainExtrasTest, EmptyExtrasGiveThePlainKeys) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 10 + 1, /*seed=*/10);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  Result<std::vector<BlockKey>> keys = hasher.Keys(tokens, ChainExtras{});
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, hasher.Keys(tokens));
  // Empty per-block lists are no extras either.
  keys = hasher.Keys(tokens, ChainExtras{.blocks = std::vector<std::vector<ExtraKey>>(10)});
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, hasher.Keys(tokens));
  // And ChainKey with no extras is the plain link.
  std::span<const uint32_t> first(tokens.data(), 4);
  EXPECT_EQ(ChainKey(hasher.fingerprint(), 0, first, {}), hasher.Keys(tokens)[0]);
}

TEST(ChainExtrasTest, ExtendWithExtrasEqualsKeys) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 12 + 3, /*seed=*/11);
  std::span<const uint32_t> all(tokens);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const ChainExtras extras = SomeExtras();
  Result<std::vector<BlockKey>> expected = hasher.Keys(all, extras);
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(expected->size(), 12u);

  // Grow the sequence a few tokens at a time; the extras are the whole
  // request's, as Keys takes them.
  std::vector<BlockKey> chain;
  for (size_t n = 0; n <= tokens.size(); n += 3) {
    ASSERT_TRUE(hasher.Extend(all.first(n), extras, chain).ok());
    Result<std::vector<BlockKey>> keys = hasher.Keys(all.first(n), extras);
    ASSERT_TRUE(keys.ok());
    EXPECT_EQ(chain, *keys) << n;
  }
  ASSERT_TRUE(hasher.Extend(all, extras, chain).ok());
  EXPECT_EQ(chain, *expected);
  // Continuing a chain of the first 5 blocks, in one go.
  std::vector<BlockKey> prefix(expected->begin(), expected->begin() + 5);
  ASSERT_TRUE(hasher.Extend(all, extras, prefix).ok());
  EXPECT_EQ(prefix, *expected);
}

TEST(ChainExtrasTest, SaltChangesEveryKeyFromBlockZero) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 8, /*seed=*/12);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const std::vector<BlockKey> plain = hasher.Keys(tokens);
  std::unordered_set<BlockKey> seen(plain.begin(), plain.end());
  for (const std::string& salt : {"a", "b", "tenant-a", "tenant-b"}) {
    Result<std::vector<BlockKey>> salted = hasher.Keys(tokens, ChainExtras{.cache_salt = salt});
    ASSERT_TRUE(salted.ok());
    ASSERT_EQ(salted->size(), plain.size());
    for (const BlockKey& k : *salted) EXPECT_TRUE(seen.insert(k).second) << salt;
  }
  // The salt is not a block-0 multimodal key of the same bytes.
  Result<std::vector<BlockKey>> salted = hasher.Keys(tokens, ChainExtras{.cache_salt = "x"});
  Result<std::vector<BlockKey>> image = hasher.Keys(tokens, ChainExtras{.blocks = {{Image("x")}}});
  EXPECT_NE((*salted)[0], (*image)[0]);
}

TEST(ChainExtrasTest, ExtrasOnABlockChangeThatBlockAndEveryLaterOne) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 8, /*seed=*/13);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const std::vector<BlockKey> plain = hasher.Keys(tokens);
  for (size_t block : {size_t{0}, size_t{1}, size_t{5}, size_t{7}}) {
    ChainExtras extras;
    extras.blocks.resize(block + 1);
    extras.blocks[block] = {Embeds("emb")};
    Result<std::vector<BlockKey>> keys = hasher.Keys(tokens, extras);
    ASSERT_TRUE(keys.ok());
    for (size_t i = 0; i < plain.size(); ++i) {
      if (i < block) {
        EXPECT_EQ((*keys)[i], plain[i]) << block << " " << i;
      } else {
        EXPECT_NE((*keys)[i], plain[i]) << block << " " << i;
      }
    }
  }
  // The kind is hashed: the same bytes as another kind give another key.
  Result<std::vector<BlockKey>> image = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {Image("p")}}});
  Result<std::vector<BlockKey>> embeds = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {Embeds("p")}}});
  EXPECT_EQ((*image)[0], (*embeds)[0]);
  EXPECT_NE((*image)[1], (*embeds)[1]);
}

TEST(ChainExtrasTest, OrderOfExtraKeysMatters) {
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 3, /*seed=*/14);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  Result<std::vector<BlockKey>> ab = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {Image("a"), Image("b")}}});
  Result<std::vector<BlockKey>> ba = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {Image("b"), Image("a")}}});
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ((*ab)[0], (*ba)[0]);
  EXPECT_NE((*ab)[1], (*ba)[1]);
  EXPECT_NE((*ab)[2], (*ba)[2]);
  // Length prefixes keep payload boundaries: {"ab"} vs {"a", "b"}.
  Result<std::vector<BlockKey>> joined = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {Image("ab")}}});
  EXPECT_NE((*joined)[1], (*ab)[1]);
}

TEST(ChainExtrasTest, ExtrasPastTheFullBlocksAreNotUsed) {
  // Extras for a partial trailing block do not matter until it is full.
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 2 + 3, /*seed=*/15);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  Result<std::vector<BlockKey>> keys = hasher.Keys(tokens, ChainExtras{.blocks = {{}, {}, {Image("x")}}});
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(*keys, hasher.Keys(tokens));
}

TEST(ChainExtrasTest, ExtendAfterBlockZeroDoesNotAddTheSaltAgain) {
  // Extend chains from chain.back(): the salt is already in it.
  const std::vector<uint32_t> tokens = PseudoRandomTokens(4 * 3, /*seed=*/16);
  ChainHasher hasher = MakeHasher(BaseNamespace());
  const BlockKey fake{1, 2};
  std::vector<BlockKey> chain = {fake};
  ASSERT_TRUE(hasher.Extend(tokens, ChainExtras{.cache_salt = "tenant-a"}, chain).ok());
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[1], ChainKey(fake, 1, std::span<const uint32_t>(tokens).subspan(4, 4)));
}

}  // namespace
}  // namespace kvtier
