// The operator's commands of `kvtier` against a running kvtierd:
//   kvtier stats [--json]                     every counter, a table or one JSON object
//   kvtier ls [--json]                        namespaces: model, revision, adapter, blocks and bytes per tier
//   kvtier ls --blocks [--json]               every block every tier holds: tier, namespace, key
//                                             (block_listing.h; paged, so not one atomic snapshot)
//   kvtier drop --ns FP... | --model ID [--revision REV]
//                                             remove namespaces from every tier (the NVMe index too)
//   kvtier pin --ns FP (--key HEX... | --tokens FILE) --ttl 90s|10m|2h|1d
//                                             hold blocks of a namespace in the host tier until unpinned or the TTL
//                                             passes
//   kvtier unpin --ns FP (--key HEX... | --tokens FILE)
//                                             end those holds
//   kvtier config get [KEY]                   the running configuration, or one option's value
//   kvtier health [--json]                    healthy or not, and why
// Exit codes, the same for each (scripts rely on them): 0 done (healthy);
// 1 the daemon refused or failed the request, or reports itself unhealthy,
// or a drop matched nothing, or a pin or unpin left a key not held
// (pending ones are waited for about a second); 2 bad usage (unknown option, a bad
// fingerprint, an unknown KEY); 3 the daemon cannot be reached. Errors go
// to stderr as one line "kvtier <command>: <why>"; results to stdout.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kvtier::tools {

struct AdminOptions {
  std::string socket_path;
  bool json = false;
  bool blocks = false;                   // ls --blocks
  std::vector<std::string> namespaces;   // drop --ns
  std::string model_id, model_revision;  // drop --model / --revision
  std::string key;                       // config get KEY
  std::string ns;                        // pin / unpin --ns
  std::vector<std::string> block_keys;   // pin / unpin --key
  std::string tokens_file;               // pin / unpin --tokens
  std::string ttl;                       // pin --ttl
};

// Adds stats, ls, drop, pin, unpin, config get and health to `app`, all filling
// `options`; returns the subcommands so main can tell which was parsed.
struct AdminCommands {
  CLI::App* stats = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* drop = nullptr;
  CLI::App* pin = nullptr;
  CLI::App* unpin = nullptr;
  CLI::App* config_get = nullptr;
  CLI::App* health = nullptr;
};
AdminCommands AddAdminCommands(CLI::App& app, AdminOptions& options);

// Runs the parsed one; returns the exit code.
int RunStats(const AdminOptions& options);
int RunLs(const AdminOptions& options);
int RunDrop(const AdminOptions& options);
int RunPin(const AdminOptions& options);
int RunUnpin(const AdminOptions& options);
int RunConfigGet(const AdminOptions& options);
int RunHealth(const AdminOptions& options);

}  // namespace kvtier::tools
