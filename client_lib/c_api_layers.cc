// The C ABI's layer-wise saves and loads (kvtier_c.h): one layer at a time
// into reserved arena space, or out of the arena (or into GPU memory) as
// each layer is in place; and preload plans.
#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "client_lib/c_api_support.h"

using kvtier::c_abi::Guard;
using kvtier::c_abi::Missing;
using kvtier::c_abi::Report;

namespace kvtier::c_abi {
namespace {

// kvtier_begin_load and kvtier_begin_load_device once their options are built.
int BeginLoad(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, LoadOptions options,
              kvtier_layer_load** out, uint32_t* layers, size_t* layer_bytes, int* statuses) {
  auto begun = client->client->BeginLoad(ns, ToKeys(keys, n), std::move(options));
  if (!begun.ok()) return Report(begun.status());
  auto handle = std::make_unique<kvtier_layer_load>(kvtier_layer_load{std::move(*begun)});
  if (statuses != nullptr) {
    std::vector<kvtier::Status> outcomes;
    for (size_t i = 0; i < n; ++i) outcomes.push_back(handle->load.status(i));
    ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
  }
  if (layers != nullptr) *layers = handle->load.layer_count();
  if (layer_bytes != nullptr) *layer_bytes = handle->load.layer_bytes();
  *out = handle.release();
  return KVTIER_OK;
}

}  // namespace
}  // namespace kvtier::c_abi

extern "C" {

int kvtier_begin_save(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, const kvtier_key* parent,
                      kvtier_layer_save** out, size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (layer_bytes == nullptr) return Missing("layer_bytes");
    if (n > 0 && (keys == nullptr || statuses == nullptr)) return Missing("keys or statuses");
    kvtier::ChainLinks links;
    links.chain = true;
    if (parent != nullptr) links.parent = kvtier::c_abi::ToKey(*parent);
    auto begun = client->client->BeginSave(ns, kvtier::c_abi::ToKeys(keys, n), links);
    if (!begun.ok()) return Report(begun.status());
    auto handle = std::make_unique<kvtier_layer_save>(kvtier_layer_save{std::move(*begun)});
    std::vector<kvtier::Status> outcomes;
    for (size_t i = 0; i < n; ++i) outcomes.push_back(handle->save.status(i));
    kvtier::c_abi::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    *layer_bytes = handle->save.layer_bytes();
    *out = handle.release();
    return KVTIER_OK;
  });
}

int kvtier_save_layer(kvtier_layer_save* save, uint32_t layer, const void* const* src) {
  return Guard([&] {
    if (save == nullptr) return Missing("save");
    if (src == nullptr && save->save.size() > 0) return Missing("src");
    std::vector<std::span<const std::byte>> spans;
    for (size_t i = 0; i < save->save.size(); ++i) {
      const bool wanted = save->save.status(i).ok();
      if (wanted && src[i] == nullptr) return Missing("src entry of a block to save");
      spans.emplace_back(static_cast<const std::byte*>(src[i]), wanted ? save->save.layer_bytes() : 0);
    }
    return Report(save->save.SaveLayer(layer, spans));
  });
}

int kvtier_save_layer_span(kvtier_layer_save* save, size_t block, uint32_t layer, void** data) {
  return Guard([&] {
    if (data == nullptr) return Missing("data");
    *data = nullptr;
    if (save == nullptr) return Missing("save");
    std::span<std::byte> span = save->save.LayerSpan(block, layer);
    if (span.empty()) {
      return Report(kvtier::InvalidArgument("no writable layer " + std::to_string(layer) + " of block " +
                                            std::to_string(block) + " (out of range, not reserved, or finished)"));
    }
    *data = span.data();
    return KVTIER_OK;
  });
}

int kvtier_layer_written(kvtier_layer_save* save, uint32_t layer) {
  return Guard([&] { return save == nullptr ? Missing("save") : Report(save->save.LayerWritten(layer)); });
}

int kvtier_save_publish_to_peers(kvtier_layer_save* save, int free_when_taken) {
  return Guard(
      [&] { return save == nullptr ? Missing("save") : Report(save->save.PublishToPeers(free_when_taken != 0)); });
}

int kvtier_finish_save(kvtier_layer_save* save, int* statuses) {
  return Guard([&] {
    if (save == nullptr) return Missing("save");
    if (statuses == nullptr && save->save.size() > 0) return Missing("statuses");
    auto committed = save->save.FinishSave();
    if (!committed.ok()) return Report(committed.status());
    kvtier::c_abi::ReportEach(*committed, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    return KVTIER_OK;
  });
}

void kvtier_save_free(kvtier_layer_save* save) {
  Guard([&] {
    delete save;  // an unfinished save's reservation is aborted by its destructor
    return KVTIER_OK;
  });
}

int kvtier_begin_load(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, void* const* dst,
                      size_t dst_capacity, double compute_us_per_layer, int wait_for_depth, kvtier_layer_load** out,
                      uint32_t* layers, size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (n > 0 && keys == nullptr) return Missing("keys");
    kvtier::LoadOptions options;
    options.compute_us_per_layer = compute_us_per_layer;
    options.wait_for_depth = wait_for_depth != 0;
    if (dst != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        if (dst[i] == nullptr) return Missing("dst entry");
        options.dst.emplace_back(static_cast<std::byte*>(dst[i]), dst_capacity);
      }
    }
    return kvtier::c_abi::BeginLoad(client, ns, keys, n, std::move(options), out, layers, layer_bytes, statuses);
  });
}

int kvtier_begin_load_device(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                             void* const* device_dst, int device_ordinal, void* cuda_stream,
                             double compute_us_per_layer, int wait_for_depth, kvtier_layer_load** out, uint32_t* layers,
                             size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (n > 0 && (keys == nullptr || device_dst == nullptr)) return Missing("keys or device_dst");
    kvtier::LoadOptions options;
    options.compute_us_per_layer = compute_us_per_layer;
    options.wait_for_depth = wait_for_depth != 0;
    options.device_dst.assign(device_dst, device_dst + n);
    options.device_ordinal = device_ordinal;
    options.cuda_stream = cuda_stream;
    return kvtier::c_abi::BeginLoad(client, ns, keys, n, std::move(options), out, layers, layer_bytes, statuses);
  });
}

int kvtier_begin_load_with(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                           const kvtier_load_options* options, kvtier_layer_load** out, uint32_t* layers,
                           size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (options == nullptr) return Missing("options");
    if (n > 0 && keys == nullptr) return Missing("keys");
    // Every field up to deadline_us is in the first version.
    constexpr size_t kFirstVersion = offsetof(kvtier_load_options, deadline_us) + sizeof(uint64_t);
    if (options->size < kFirstVersion) {
      return Report(kvtier::InvalidArgument("kvtier_load_options.size is " + std::to_string(options->size) +
                                            ": initialise the options with kvtier_load_options_init"));
    }
    if (options->dst != nullptr && options->device_dst != nullptr) {
      return Report(kvtier::InvalidArgument("kvtier_load_options: dst or device_dst, not both"));
    }
    if (options->deadline_us > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Report(kvtier::InvalidArgument("kvtier_load_options.deadline_us is out of range"));
    }
    kvtier::LoadOptions load;
    load.compute_us_per_layer = options->compute_us_per_layer;
    load.wait_for_depth = options->wait_for_depth != 0;
    load.recompute_us_per_layer = options->recompute_us_per_layer;
    load.deadline = std::chrono::microseconds(static_cast<int64_t>(options->deadline_us));
    if (options->dst != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        if (options->dst[i] == nullptr) return Missing("dst entry");
        load.dst.emplace_back(static_cast<std::byte*>(options->dst[i]), options->dst_capacity);
      }
    }
    if (options->device_dst != nullptr) {
      load.device_dst.assign(options->device_dst, options->device_dst + n);
      load.device_ordinal = options->device_ordinal;
      load.cuda_stream = options->cuda_stream;
    }
    return kvtier::c_abi::BeginLoad(client, ns, keys, n, std::move(load), out, layers, layer_bytes, statuses);
  });
}

int kvtier_wait_layer(kvtier_layer_load* load, uint32_t layer) {
  return Guard([&] { return load == nullptr ? Missing("load") : Report(load->load.WaitLayer(layer)); });
}

uint32_t kvtier_layers_ready(const kvtier_layer_load* load) { return load == nullptr ? 0 : load->load.layers_ready(); }

int kvtier_load_block_status(const kvtier_layer_load* load, size_t block) {
  return Guard([&] { return load == nullptr ? Missing("load") : Report(load->load.status(block)); });
}

size_t kvtier_load_usable_prefix(const kvtier_layer_load* load) {
  return load == nullptr ? 0 : load->load.usable_prefix();
}

int kvtier_load_layer_span(const kvtier_layer_load* load, size_t block, uint32_t layer, const void** data) {
  return Guard([&] {
    if (data == nullptr) return Missing("data");
    *data = nullptr;
    if (load == nullptr) return Missing("load");
    // InvalidArgument, NotFound (failed, or not in place yet),
    // FailedPrecondition (in device memory), ProtocolError.
    auto span = load->load.TryLayerSpan(block, layer);
    if (!span.ok()) return Report(span.status());
    *data = span->data();
    return KVTIER_OK;
  });
}

int kvtier_load_plan(const kvtier_layer_load* load, kvtier_preload_plan* out) {
  return Guard([&] {
    if (load == nullptr) return Missing("load");
    if (out == nullptr) return Missing("out");
    if (!load->load.plan()) return Report(kvtier::NotFound("the load was begun without a compute time"));
    *out = kvtier::c_abi::ToC(*load->load.plan());
    return KVTIER_OK;
  });
}

int kvtier_end_load(kvtier_layer_load* load) {
  return Guard([&] {
    if (load == nullptr) return KVTIER_OK;
    const int code = Report(load->load.End());
    delete load;
    return code;
  });
}

int kvtier_plan_preload(kvtier_client* client, uint8_t source_tier, uint64_t bytes_per_layer,
                        double compute_us_per_layer, uint32_t layers, double recompute_us_per_layer,
                        kvtier_preload_plan* out) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (out == nullptr) return Missing("out");
    auto plan = client->client->PlanPreload(static_cast<kvtier::Tier>(source_tier), bytes_per_layer,
                                            compute_us_per_layer, layers, recompute_us_per_layer);
    if (!plan.ok()) return Report(plan.status());
    *out = kvtier::c_abi::ToC(*plan);
    return KVTIER_OK;
  });
}

}  // extern "C"
