// The peer protocol's messages (tiers/peer/peer_protocol.h): what each
// encodes decodes to the same, and what a reader or server must refuse.
#include "tiers/peer/peer_protocol.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x1234, 0x5678};

TEST(PeerProtocolTest, ATakenRoundTripsWithItsNamespaceAndKeys) {
  const PeerTaken taken{kNs, {{1, 2}, {3, 4}, {5, 6}}};
  const std::vector<std::byte> message = EncodePeer(7, taken);
  auto envelope = OpenPeer(message);
  ASSERT_TRUE(envelope.ok()) << envelope.status().ToString();
  EXPECT_EQ(envelope->type, PeerMessage::kTaken);
  EXPECT_EQ(envelope->request, 7u);
  auto decoded = DecodeTaken(envelope->body);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->ns, kNs);
  EXPECT_EQ(decoded->keys, taken.keys);
}

TEST(PeerProtocolTest, ATakenPastTheKeyBoundOrCutShortIsRefused) {
  PeerTaken many{kNs, std::vector<BlockKey>(kMaxPeerQueryKeys + 1, BlockKey{1, 1})};
  const std::vector<std::byte> long_message = EncodePeer(1, many);  // the envelope's body points into it
  auto too_many = OpenPeer(long_message);
  ASSERT_TRUE(too_many.ok());
  EXPECT_EQ(DecodeTaken(too_many->body).status().code(), StatusCode::kInvalidArgument);

  std::vector<std::byte> message = EncodePeer(1, PeerTaken{kNs, {{1, 2}}});
  message.pop_back();
  auto cut = OpenPeer(message);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(DecodeTaken(cut->body).status().code(), StatusCode::kInvalidArgument);
}

TEST(PeerProtocolTest, AWelcomeThatNamesARegionTwiceIsRefused) {
  PeerWelcome welcome;
  welcome.regions = {{3, 0x1000, 4096, "a"}, {4, 0x9000, 4096, "b"}};
  const std::vector<std::byte> first = EncodePeer(0, welcome);
  auto once = OpenPeer(first);
  ASSERT_TRUE(once.ok());
  auto decoded = DecodeWelcome(once->body);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->regions.size(), 2u);
  EXPECT_EQ(decoded->regions[1].rkey, "b");

  welcome.regions.push_back({3, 0x20000, 4096, "c"});
  const std::vector<std::byte> second = EncodePeer(0, welcome);
  auto twice = OpenPeer(second);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(DecodeWelcome(twice->body).status().code(), StatusCode::kInvalidArgument);
}

TEST(PeerProtocolTest, AWelcomeCarriesTheEventsEndpointsOnlyWhenTheServerHasThem) {
  PeerWelcome welcome;
  welcome.regions = {{0, 0x1000, 4096, "k"}};
  const std::vector<std::byte> without = EncodePeer(0, welcome);
  auto plain = DecodeWelcome(OpenPeer(without)->body);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->events_endpoint.empty());
  EXPECT_TRUE(plain->events_replay_endpoint.empty());

  welcome.events_endpoint = "tcp://10.0.0.5:5557";
  welcome.events_replay_endpoint = "tcp://10.0.0.5:5558";
  const std::vector<std::byte> with = EncodePeer(0, welcome);
  EXPECT_GT(with.size(), without.size());
  auto told = DecodeWelcome(OpenPeer(with)->body);
  ASSERT_TRUE(told.ok()) << told.status().ToString();
  EXPECT_EQ(told->events_endpoint, "tcp://10.0.0.5:5557");
  EXPECT_EQ(told->events_replay_endpoint, "tcp://10.0.0.5:5558");
  EXPECT_EQ(told->regions.size(), 1u);

  // One endpoint of the two, or one cut short, is malformed.
  std::vector<std::byte> cut = with;
  cut.resize(cut.size() - 3);
  EXPECT_EQ(DecodeWelcome(OpenPeer(cut)->body).status().code(), StatusCode::kInvalidArgument);
  welcome.events_replay_endpoint.clear();
  welcome.events_endpoint = "tcp://10.0.0.5:5557";
  std::vector<std::byte> half = EncodePeer(0, welcome);  // the encoder writes both: the second empty
  EXPECT_EQ(DecodeWelcome(OpenPeer(half)->body).status().code(), StatusCode::kInvalidArgument);
}

TEST(PeerProtocolTest, AnUnknownTypeOrVersionIsRefused) {
  std::vector<std::byte> message = EncodePeer(1, PeerTaken{kNs, {}});
  message[1] = std::byte{static_cast<uint8_t>(PeerMessage::kTaken) + 1};
  EXPECT_EQ(OpenPeer(message).status().code(), StatusCode::kInvalidArgument);
  message[1] = std::byte{0};
  EXPECT_EQ(OpenPeer(message).status().code(), StatusCode::kInvalidArgument);
  message = EncodePeer(1, PeerTaken{kNs, {}});
  message[0] = std::byte{kPeerProtocolVersion + 1};
  EXPECT_EQ(OpenPeer(message).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
