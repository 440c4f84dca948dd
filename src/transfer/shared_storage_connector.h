// SharedStorageConnector, after vLLM's example connector of that name: a prompt's KV, in whole
// blocks up to (not including) its last token, is saved under
//   shared_storage_path/<xxh3-128 of those token ids>/layer_<L>.kv
// (one file per decoder layer: a header, then [tokens, row_dim] f32 latent rows), and a later
// request whose prompt starts with the same blocks loads it instead of computing it, on this
// engine or another started on the same directory. Loads are synchronous (before the forward);
// each layer's file is written right after the layer runs (save_kv_layer), through a temporary
// name and a rename, so a reader never sees half a file. Both sides are single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/kv_connector.h"
#include "worker/kv_connector.h"

namespace transfer {

struct SharedStorageOptions {
  std::string path = "/tmp";  // kv_connector_extra_config.shared_storage_path
  int block_size = 16;
  int num_layers = 0;   // decoder layers of the model
  int64_t row_dim = 0;  // latent row width (kv_lora_rank + qk_rope_head_dim)
};

// One load or save the worker side performs in a step (the connector's metadata).
struct StorageTransfer {
  std::string req_id;
  std::string key;  // the directory name under path
  int64_t num_tokens = 0;
  std::vector<int32_t> block_ids;  // covering num_tokens
  bool save = false;               // false: load
};

std::vector<uint8_t> encode_transfers(const std::vector<StorageTransfer>& transfers);
common::Result<std::vector<StorageTransfer>> decode_transfers(const std::vector<uint8_t>& bytes);

class SharedStorageScheduler : public sched::KvConnectorScheduler {
 public:
  explicit SharedStorageScheduler(SharedStorageOptions options) : o_(std::move(options)) {}

  std::optional<sched::MatchedTokens> get_num_new_matched_tokens(
      const sched::Request& request, int64_t num_computed_tokens) override;
  void update_state_after_alloc(const sched::Request& request,
                                const std::vector<kv::BlockId>& block_ids,
                                int64_t num_external_tokens) override;
  std::vector<uint8_t> build_connector_meta(const sched::SchedulerOutput& output,
                                            const kv::KvCacheManager& kv) override;
  sched::FinishedHandoff request_finished(const sched::Request& request,
                                          const std::vector<kv::BlockId>& block_ids) override;

 private:
  struct Tracked {
    std::string key;
    int64_t num_tokens = 0;  // whole blocks before the prompt's last token
    bool load = false;       // loading now (set after allocation)
    bool stored = false;     // on disk, or being saved by this request
  };
  Tracked& track(const sched::Request& request);
  bool on_disk(const Tracked& t) const;

  SharedStorageOptions o_;
  std::unordered_map<std::string, Tracked> requests_;
};

class SharedStorageWorker : public worker::KvConnectorWorker {
 public:
  explicit SharedStorageWorker(SharedStorageOptions options) : o_(std::move(options)) {}

  void register_kv_cache(model::LatentKvCache* cache, int layer_begin, int layer_end) override;
  common::Status start_load_kv(const std::vector<uint8_t>& metadata) override;
  void wait_for_layer_load(int /*layer*/) override {}
  common::Status save_kv_layer(int layer) override;
  common::Status wait_for_save() override { return {}; }
  worker::FinishedTransfers get_finished(const std::vector<std::string>&) override { return {}; }

 private:
  SharedStorageOptions o_;
  model::LatentKvCache* cache_ = nullptr;
  int layer_begin_ = 0, layer_end_ = 0;
  std::vector<StorageTransfer> saves_;  // this step's
};

// The file of `layer` under `key`.
std::string layer_file(const std::string& path, const std::string& key, int layer);

}  // namespace transfer
