# Checks the dependency direction of docs/ARCHITECTURE.md by scanning every
# #include of every source folder. Run as: cmake -DSOURCE_DIR=... -P this.
# A folder may include its own headers, std/system headers and the folders
# listed for it below; anything else of ours is a violation.
set(ours "kvtier/;common/;policy/;subscriber/;tiers/;gpu/;proto/;daemon/;client_lib/;support/;tools/;tests/;python/")
# folder -> allowed prefixes of our own headers ("kvtier/" = include/kvtier)
set(allowed_include_kvtier "kvtier/status.h;kvtier/result.h;kvtier/block_key.h;kvtier/client.h;kvtier/kvtier_c.h;kvtier/preload.h;kvtier/ready_estimate.h")
set(allowed_common "kvtier/;common/")
set(allowed_policy "kvtier/;common/;policy/")
# The KV events subscriber (kvtier events, the peer tier's directory): the public API and common.
set(allowed_subscriber "kvtier/;common/;subscriber/")
# The CUDA building blocks: public headers and their own, and the annotated
# Mutex (their locks are checked like every other).
set(allowed_gpu "kvtier/;gpu/;common/mutex.h")
# The tiers, one folder a target (tiers_x is tiers/x; tiers itself is only
# tier.h and forwarding_tier.h, the core every tier implements). A tier
# folder includes the core and its own headers, never another tier's, with
# one edge: nvme/'s staging pool carves its memory with host/'s
# ArenaAllocator. Each bans the libraries of the others.
set(tier_core "tiers/tier.h;tiers/forwarding_tier.h")
set(allowed_tiers "kvtier/;common/;policy/;${tier_core}")
set(allowed_tiers_host "kvtier/;common/;${tier_core};tiers/host/")
set(allowed_tiers_nvme "kvtier/;common/;policy/;${tier_core};tiers/nvme/;tiers/host/arena_allocator.h")
set(allowed_tiers_remote "kvtier/;common/;policy/option_defaults.h;${tier_core};tiers/remote/")
set(allowed_tiers_peer "kvtier/;common/;${tier_core};tiers/peer/")
set(allowed_tiers_hbm "kvtier/;common/;gpu/;${tier_core};tiers/hbm/")
set(allowed_proto "kvtier/status.h;kvtier/result.h;kvtier/block_key.h;kvtier/preload.h;kvtier/ready_estimate.h;kvtier/v1/;proto/")
# The daemon's parts, one way: config (over policy/'s registry) and engine are leaves, tenants over
# config, server over engine and tenants, setup over all, main.cc over setup.
set(allowed_daemon_config "kvtier/;common/;policy/;daemon/config/")  # policy/: its name registry
# The engine links the host tier and the core (the tiers below and above
# come to it as BlockTiers); tenants the core.
set(allowed_daemon_engine "kvtier/;common/;policy/;${tier_core};tiers/host/;daemon/engine/")
set(allowed_daemon_events "kvtier/;common/;${tier_core};daemon/engine/block_events.h;daemon/engine/lineage.h;daemon/events/")
set(allowed_daemon_tenants "kvtier/;common/;${tier_core};daemon/config/;daemon/tenants/")
set(allowed_daemon_server
    "kvtier/;common/;policy/;${tier_core};tiers/host/;proto/;daemon/engine/;daemon/tenants/;daemon/server/")
set(allowed_daemon_setup "kvtier/;common/;policy/;subscriber/;tiers/;gpu/;proto/;daemon/")
set(allowed_daemon "kvtier/;common/;daemon/")
set(allowed_client_lib "kvtier/;common/;gpu/;proto/;client_lib/")
# support/ (process, temp-dir, port and server helpers) is for tools/ and
# tests/ only: no product folder may include it.
set(allowed_support "kvtier/;common/;support/")
# The tools, one folder a product (tools_x is tools/x). The admin front end
# (cli) sees only the public API, common/ and the events subscriber, and
# none of RocksDB, liburing or Google Benchmark; the others include the
# libraries they run.
set(allowed_tools_cli "kvtier/;common/;subscriber/;tools/cli/")
set(allowed_tools_trace "kvtier/;common/;tools/trace/")
set(allowed_tools_replay "kvtier/;common/;policy/;${tier_core};tiers/nvme/;tiers/remote/;tools/replay/")
set(allowed_tools_stress "kvtier/;common/;support/;tools/stress/")
set(allowed_tools_supervise "kvtier/;common/;support/;tools/supervise/")
set(allowed_tools_bench "kvtier/;common/;policy/;${tier_core};tiers/nvme/;tiers/remote/;tiers/peer/;support/;tools/bench/")
set(allowed_python "kvtier/;python/")  # the binding sees only the public API
# Third-party headers forbidden per folder (Asio stays in daemon/client_lib;
# CUDA headers stay out of the public API, common/ and policy/).
set(banned_policy "asio;thread;mutex;sys/;unistd.h;liburing.h;rocksdb/;google/protobuf;cuda")
set(banned_tiers "asio;google/protobuf;rocksdb/;liburing.h;openssl/;cuda")
set(banned_tiers_host "asio;google/protobuf;rocksdb/;liburing.h;openssl/;cuda")
set(banned_tiers_nvme "asio;google/protobuf;openssl/;cuda")
set(banned_tiers_remote "asio;google/protobuf;rocksdb/;liburing.h;cuda")
set(banned_tiers_peer "asio;google/protobuf;rocksdb/;liburing.h;cuda")
set(banned_tiers_hbm "asio;google/protobuf;rocksdb/;liburing.h;openssl/")
set(banned_daemon_engine "asio;google/protobuf;proto/;toml;zmq")
set(banned_daemon_events "asio;google/protobuf;proto/;toml")
set(banned_daemon_config "asio;google/protobuf")
set(banned_common "asio;google/protobuf;cuda")
set(banned_subscriber "asio;google/protobuf;rocksdb/;liburing.h;cuda")
set(banned_gpu "asio;google/protobuf;spdlog;toml")
set(banned_include_kvtier "asio;google/protobuf;spdlog;toml;cuda")
set(banned_python "asio;google/protobuf;spdlog;toml;cuda")
set(banned_tools_cli "rocksdb/;liburing.h;benchmark/")

# ZeroMQ (zmq.hpp, zmq_addon.hpp, zmq.h): the KV events publisher
# (daemon/events/) and their subscriber (subscriber/) only.
set(zmq_folders "daemon_events;subscriber")
# UCX (ucp/, uct/, ucs/): the peer tier and its server (tiers/peer/) and the
# peer benchmark (tools/bench/) only.
set(ucx_folders "tiers_peer;tools_bench")

set(violations "")
# A folder written daemon_x is daemon/x (tools_x: tools/x, tiers_x:
# tiers/x); daemon and tiers themselves are only their own files (main.cc;
# tier.h, forwarding_tier.h), not their parts'.
foreach(folder include_kvtier common policy subscriber gpu tiers tiers_host tiers_nvme tiers_remote tiers_peer tiers_hbm proto daemon
        daemon_config daemon_engine daemon_events daemon_tenants daemon_server daemon_setup client_lib support tools_cli
        tools_bench tools_replay tools_stress tools_supervise tools_trace python)
  list(FIND zmq_folders "${folder}" zmq_allowed)
  if(zmq_allowed EQUAL -1)
    list(APPEND banned_${folder} "zmq")
  endif()
  list(FIND ucx_folders "${folder}" ucx_allowed)
  if(ucx_allowed EQUAL -1)
    list(APPEND banned_${folder} "ucp/" "uct/" "ucs/")
  endif()
  if(folder STREQUAL "include_kvtier")
    set(dir "${SOURCE_DIR}/include/kvtier")
  else()
    string(REPLACE "daemon_" "daemon/" subdir "${folder}")
    string(REPLACE "tools_" "tools/" subdir "${subdir}")
    string(REPLACE "tiers_" "tiers/" subdir "${subdir}")
    set(dir "${SOURCE_DIR}/${subdir}")
  endif()
  if(folder STREQUAL "daemon" OR folder STREQUAL "tiers")
    file(GLOB files "${dir}/*.h" "${dir}/*.cc")
  else()
    file(GLOB_RECURSE files "${dir}/*.h" "${dir}/*.cc" "${dir}/*.c" "${dir}/*.cu" "${dir}/*.cuh")
  endif()
  foreach(file ${files})
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*" "\\1" header "${line}")
      set(is_ours FALSE)
      foreach(prefix ${ours})
        string(FIND "${header}" "${prefix}" pos)
        if(pos EQUAL 0)
          set(is_ours TRUE)
        endif()
      endforeach()
      if(is_ours)
        set(ok FALSE)
        foreach(prefix ${allowed_${folder}})
          string(FIND "${header}" "${prefix}" pos)
          if(pos EQUAL 0)
            set(ok TRUE)
          endif()
        endforeach()
        if(NOT ok)
          list(APPEND violations "${file}: ${folder} must not include ${header}")
        endif()
      endif()
      foreach(ban ${banned_${folder}})
        string(FIND "${header}" "${ban}" pos)
        if(pos EQUAL 0)
          list(APPEND violations "${file}: ${folder} must not include ${header}")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()

if(violations)
  string(REPLACE ";" "\n" text "${violations}")
  message(FATAL_ERROR "include rules violated:\n${text}")
endif()
message(STATUS "include rules hold")
