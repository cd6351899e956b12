// Protocol round trips: frame headers, and every public type through its
// protobuf form and back, plus a whole Request through serialization.
#include <gtest/gtest.h>

#include "common/framing.h"
#include "kvtier/v1/kvtier.pb.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

TEST(Framing, HeaderIsLittleEndianU32) {
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(0x01020304u, header);
  EXPECT_EQ(header[0], 0x04);
  EXPECT_EQ(header[3], 0x01);
  for (uint32_t v : {0u, 1u, 255u, 256u, kDefaultMaxFrameBytes, 0xFFFFFFFFu}) {
    EncodeFrameHeader(v, header);
    EXPECT_EQ(DecodeFrameHeader(header), v);
  }
}

TEST(Wire, StatusRoundTripKeepsCodeAndMessage) {
  for (int code = 0; code <= static_cast<int>(StatusCode::kTimedOut); ++code) {
    Status s = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), "m" + std::to_string(code));
    v1::Status p;
    wire::ToProto(s, &p);
    EXPECT_EQ(wire::FromProto(p), s);
  }
}

TEST(Wire, KeysAndDescriptorsRoundTrip) {
  std::vector<BlockKey> keys = {{1, 2}, {~0ull, 0}, {0x0123456789abcdefull, 0xfedcba9876543210ull}};
  google::protobuf::RepeatedPtrField<v1::Key> p;
  wire::AddKeys(keys, &p);
  EXPECT_EQ(wire::FromProto(p), keys);

  NamespaceDescriptor d{.model_id = "m",
                        .model_revision = "r",
                        .adapter_id = "a",
                        .adapter_revision = "ar",
                        .kv_dtype = "fp8_e4m3",
                        .block_tokens = 512,
                        .layer_count = 80,
                        .kv_layout = "x",
                        .bytes_per_token_per_layer = 2048,
                        .tp_rank = 3,
                        .tp_size = 8,
                        .pp_rank = 1,
                        .pp_size = 4,
                        .kv_format_version = 7,
                        .object_kind = "recurrent_state"};
  ASSERT_TRUE(d.Validate().ok());
  v1::NamespaceDescriptor pd;
  wire::ToProto(d, &pd);
  NamespaceDescriptor back = wire::FromProto(pd);
  EXPECT_EQ(FingerprintNamespace(back), FingerprintNamespace(d)) << "every field survives";
  EXPECT_EQ(back.pp_rank, 1u);
  EXPECT_EQ(back.pp_size, 4u);
  EXPECT_EQ(back.kv_format_version, 7u);
  EXPECT_EQ(back.object_kind, "recurrent_state");
}

TEST(Wire, DescriptorWithoutTheV2FieldsDoesNotValidate) {
  // A descriptor built by a v1 peer: the key-v2 fields are absent (0 / "")
  // and are not read as defaults.
  NamespaceDescriptor d{.model_id = "m",
                        .model_revision = "r",
                        .kv_dtype = "bf16",
                        .block_tokens = 16,
                        .layer_count = 2,
                        .kv_layout = "x",
                        .bytes_per_token_per_layer = 64};
  v1::NamespaceDescriptor pd;
  wire::ToProto(d, &pd);
  pd.clear_pp_rank();
  pd.clear_pp_size();
  pd.clear_kv_format_version();
  pd.clear_object_kind();
  const Status s = wire::FromProto(pd).Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("pp_size", 0), 0u) << s.message();
}

TEST(Wire, RequestSurvivesSerialization) {
  v1::Request request;
  request.set_id(42);
  auto* reserve = request.mutable_reserve();
  reserve->set_ns(1);
  wire::AddKeys(std::vector<BlockKey>{{7, 8}, {9, 10}}, reserve->mutable_keys());
  reserve->add_sizes(256 << 10);
  reserve->add_sizes(32 << 20);
  std::string bytes = request.SerializeAsString();
  v1::Request parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.id(), 42u);
  ASSERT_EQ(parsed.body_case(), v1::Request::kReserve);
  EXPECT_EQ(*wire::KeysFromProto(parsed.reserve().keys()), (std::vector<BlockKey>{{7, 8}, {9, 10}}));
  google::protobuf::RepeatedField<uint64_t> odd;
  odd.Add(1);
  EXPECT_EQ(wire::KeysFromProto(odd).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.reserve().sizes(1), 32u << 20);
  // 64 keys of a Lookup fit comfortably in the default frame cap.
  v1::Request lookup;
  std::vector<BlockKey> many(64, BlockKey{~0ull, ~0ull});
  wire::AddKeys(many, lookup.mutable_lookup()->mutable_keys());
  EXPECT_LE(lookup.ByteSizeLong(), 64u * 16u + 8u) << "packed: 16 bytes a key plus the field header";
}

}  // namespace
}  // namespace kvtier
