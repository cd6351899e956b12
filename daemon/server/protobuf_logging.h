// The protobuf library logs on its own: a peer's string field with invalid
// UTF-8 makes every parse write a 225-byte line to stderr, so one client
// could fill the disk (45 MB in half a second). RouteProtobufLogging sends
// those lines through spdlog instead, at most a few per ten seconds, each
// saying how many were held back.
#pragma once

namespace kvtier {

// Installs the handler for the whole process (protobuf's log handler is
// process-wide). Idempotent; call once at start.
void RouteProtobufLogging();

}  // namespace kvtier
