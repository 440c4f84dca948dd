// The decoder worker's load thread: metadata, block reads, DONE.
#include "transfer/pull_receiver.h"

#include <algorithm>

#include "common/logging.h"
#include "common/timer.h"
#include "dist/request_channel.h"
#include "transfer/ucx_transport.h"

namespace transfer {

PullReceiver::PullReceiver(PullReceiverOptions options, model::LatentKvCache* cache,
                           int layer_begin, int layer_end)
    : options_(options), cache_(cache), layer_begin_(layer_begin), layer_end_(layer_end) {
  side_ = std::make_unique<dist::RequestClient>();
  thread_ = std::thread([this] { loop(); });
}

PullReceiver::~PullReceiver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PullReceiver::enqueue(std::vector<RecvTask> tasks) {
  if (tasks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (RecvTask& t : tasks) queue_.push_back(std::move(t));
  }
  cv_.notify_one();
}

void PullReceiver::take_finished(sched::KvTransferReport* report) {
  std::lock_guard<std::mutex> lock(mu_);
  auto move_all = [](auto& from, auto& to) {
    to.insert(to.end(), from.begin(), from.end());
    from.clear();
  };
  move_all(done_.finished_recving, report->finished_recving);
  move_all(done_.failed_recving, report->failed_recving);
  done_.stats.pulls_in_flight = static_cast<int64_t>(queue_.size()) + busy_;
  report->stats += done_.stats;
  done_.stats = {};
}

void PullReceiver::loop() {
  while (true) {
    RecvTask task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
    }
    const double t0 = common::now_seconds();
    int64_t bytes = 0;
    common::Status st = load(task, &bytes);
    const double seconds = common::now_seconds() - t0;
    // DONE to every stage, whatever happened: P holds the blocks until it hears from us.
    const PullParams& p = task.remote;
    for (int stage = 0; stage < p.remote_pp_size; ++stage) {
      const int port = worker_port(p.remote_port, stage, 0, p.remote_tp_size);
      auto acked = send_done(*side_, p.remote_host, port, p.remote_request_id);
      if (!acked.ok()) {
        LOG(WARNING) << "KV transfer of request " << task.req_id << ": DONE to " << p.remote_host
                     << ":" << port << " failed: " << acked.status().message();
      } else if (!*acked && st.ok()) {
        st = common::data_loss(p.remote_host + ":" + std::to_string(port) +
                               " had freed the blocks before DONE (its lease expired or the "
                               "request was released)");
      }
    }
    if (!st.ok()) {
      LOG(WARNING) << "KV transfer of request " << task.req_id << " (remote request "
                   << p.remote_request_id << ") from " << p.remote_host << ":" << p.remote_port
                   << " failed: " << st.message();
    }
    std::lock_guard<std::mutex> lock(mu_);
    --busy_;
    if (st.ok()) {
      done_.finished_recving.push_back(task.req_id);
      done_.stats.bytes_pulled += bytes;
      done_.stats.blocks_pulled +=
          bytes / std::max<int64_t>(1, cache_->block_size() * cache_->row_bytes());
      done_.stats.read_seconds += seconds;
    } else {
      done_.failed_recving.emplace_back(task.req_id, st.message());
      ++done_.stats.pulls_failed;
    }
  }
}

common::Result<const AgentMetadata*> PullReceiver::metadata(const std::string& host, int port) {
  const auto key = std::make_pair(host, port);
  auto it = peers_.find(key);
  if (it != peers_.end()) return &it->second;
  CP_ASSIGN_OR_RETURN(Bytes reply, side_->call(host, port, encode_get_meta()));
  CP_ASSIGN_OR_RETURN(AgentMetadata meta, decode_metadata(reply));
  return &peers_.emplace(key, std::move(meta)).first->second;
}

common::Status PullReceiver::load(const RecvTask& task, int64_t* bytes) {
  if (!ucx_) {
    CP_ASSIGN_OR_RETURN(ucx_, UcxTransport::create());
  }
  const PullParams& p = task.remote;
  const int bs = cache_->block_size();
  const int64_t dim = cache_->row_dim();
  const int64_t block_bytes = int64_t(bs) * cache_->row_bytes();
  for (int32_t b : task.local_block_ids) {
    if (b < 0 || b >= cache_->num_blocks())
      return common::data_loss("local block " + std::to_string(b) + " is out of range");
  }
  int covered_begin = layer_end_, covered_end = layer_begin_;  // hull of the stages' layers
  int64_t covered = 0;
  for (int stage = 0; stage < p.remote_pp_size; ++stage) {
    const int port = worker_port(p.remote_port, stage, 0, p.remote_tp_size);
    const std::string peer = p.remote_host + ":" + std::to_string(port);
    auto fail = [&](const std::string& why) {
      peers_.erase({p.remote_host, port});  // a restarted P publishes new memory
      return common::data_loss(peer + ": " + why);
    };
    auto got = metadata(p.remote_host, port);
    if (!got.ok()) return fail(got.status().message());
    const AgentMetadata& m = **got;
    if (m.engine_id != p.remote_engine_id)
      return fail("engine_id is '" + m.engine_id + "', the request names '" + p.remote_engine_id +
                  "'");
    if (m.block_size != bs || m.row_dim != dim || m.value_bytes != cache_->value_bytes())
      return fail("KV blocks of " + std::to_string(m.block_size) + " tokens x " +
                  std::to_string(m.row_dim) + " values of " + std::to_string(m.value_bytes) +
                  " bytes do not match this decoder's " + std::to_string(bs) + " x " +
                  std::to_string(dim) + " of " + std::to_string(cache_->value_bytes()) +
                  " (both ends need the same --kv-cache-dtype)");
    for (int32_t b : task.remote_block_ids) {
      if (b < 0 || b >= m.num_blocks)
        return fail("remote block " + std::to_string(b) + " is out of range");
    }
    const int from = std::max(layer_begin_, m.layer_begin);
    const int to = std::min(layer_end_, m.layer_end);
    if (from >= to) continue;
    covered += to - from;
    covered_begin = std::min(covered_begin, from);
    covered_end = std::max(covered_end, to);
    std::vector<UcxRead> reads;
    const size_t n = task.remote_block_ids.size();
    for (int l = from; l < to; ++l) {
      // Runs of blocks consecutive on both sides, in the same direction, are one region on
      // each side (a descending run, as a pool that frees tails first hands out, too): one read.
      const auto& rem = task.remote_block_ids;
      const auto& loc = task.local_block_ids;
      for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        const int32_t step = j < n ? rem[j] - rem[i] : 1;
        if (step == 1 || step == -1) {
          while (j < n && rem[j] == rem[j - 1] + step && loc[j] == loc[j - 1] + step) ++j;
        }
        const size_t first = step == -1 ? j - 1 : i;  // the run's lowest block, on both sides
        UcxRead r;
        r.local = cache_->layer_bytes(l) + int64_t(loc[first]) * block_bytes;
        r.remote_addr =
            m.layer_base[size_t(l - m.layer_begin)] + uint64_t(rem[first]) * uint64_t(block_bytes);
        r.length = (j - i) * size_t(block_bytes);
        r.region = l - m.layer_begin;
        reads.push_back(r);
        *bytes += static_cast<int64_t>(r.length);
        i = j;
      }
    }
    auto ep = ucx_->connect(m.ucx_address, m.rkeys);
    if (!ep.ok()) return fail(ep.status().message());
    if (auto st = ucx_->read(*ep, reads, options_.transfer_timeout_ms); !st.ok())
      return fail(st.message());
  }
  if (covered != layer_end_ - layer_begin_) {
    // The usual cause: MTP layers follow the main stack, and only a prefiller that runs the same
    // --speculative-config computes their KV.
    const bool tail_missing = covered == covered_end - covered_begin &&
                              covered_begin == layer_begin_ && covered_end < layer_end_;
    return common::data_loss(
        "the prefill stages at " + p.remote_host + ":" + std::to_string(p.remote_port) +
        " serve layers [" + std::to_string(covered_begin) + ", " + std::to_string(covered_end) +
        ") of this worker's [" + std::to_string(layer_begin_) + ", " + std::to_string(layer_end_) +
        ")" +
        (tail_missing ? " (a decoder with MTP speculative decoding needs a prefiller started "
                        "with the same --speculative-config)"
                      : ""));
  }
  return {};
}

}  // namespace transfer
