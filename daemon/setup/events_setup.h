// The KV-events endpoint of each engine kvtierd serves (daemon/events/),
// from the [events] options.
//
// Endpoints: events.endpoint and events.replay_endpoint, or, left empty,
// ipc:// sockets beside server.socket_path (kvtierd-events.sock and
// kvtierd-events-replay.sock). With [[tenant]] tables each tenant has its
// own pair, the name carrying "-<tenant>" before ".sock", and only ipc://
// endpoints are accepted: a socket file is made mode 0600 and handed to the
// tenant's first uid and first gid (when it lists them), so a subscriber
// sees only its tenant's namespaces (the operator, as root or the
// daemon's uid, reads them all).
//
// A derived endpoint that cannot be bound (the directory is missing, the
// path too long) leaves that engine without events and logs one warning;
// one the operator named is a start-up error.
#pragma once

#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "daemon/events/event_journal.h"
#include "daemon/events/event_publisher.h"
#include "kvtier/result.h"

namespace kvtier {

struct EventEndpoints {
  std::string events, replay;
  bool derived = false;  // not named in the configuration
};
// `tenant`: empty without tenants. InvalidArgument for a tcp:// endpoint with tenants.
Result<EventEndpoints> EventEndpointsFor(const DaemonConfig& config, const std::string& tenant);

// The journal an engine of this configuration reports into (null when events are off).
std::unique_ptr<EventJournal> MakeEventJournal(const DaemonConfig& config);

// Starts `engine`'s publisher over `journal` (both borrowed; they outlive
// it). Null (and one warning) when a derived endpoint cannot be bound.
Result<std::unique_ptr<EventPublisher>> StartEvents(const DaemonConfig& config, const TenantConfig* tenant,
                                                    EventJournal& journal, Engine& engine);

}  // namespace kvtier
