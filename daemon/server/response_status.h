// SetStatus: a Response's top-level status, as every RequestHandler file
// (request_handler*.cc) sets it. Private to daemon/server.
#pragma once

#include "kvtier/status.h"
#include "kvtier/v1/kvtier.pb.h"
#include "proto/wire.h"

namespace kvtier {

inline void SetStatus(v1::Response& response, const Status& s) { wire::ToProto(s, response.mutable_status()); }

}  // namespace kvtier
