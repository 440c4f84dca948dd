// `chunkpipe logits MODEL --ids ...`: logits as JSON with the reference's keys
// (shared/reference/dsv3_ref.py logits), for parity checks. Optionally chunked through the cache.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/activation_dtype.h"
#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "cli/flag_limits.h"
#include "common/process_memory.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "model/deepseek_v3.h"
#include "model/sequence_runner.h"
#include "model/weight_census.h"

namespace cli {
namespace {

using nlohmann::json;

common::Result<std::vector<int32_t>> parse_ids(std::string text) {
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  for (char& ch : text) {
    if (ch == ',' || ch == '[' || ch == ']' || ch == '\n' || ch == '\t' || ch == '\r') ch = ' ';
  }
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) {
    int32_t v = 0;
    auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || ptr != tok.data() + tok.size()) {
      return common::invalid_argument("argument --ids: '" + tok + "' is not a token id");
    }
    ids.push_back(v);
  }
  if (ids.empty()) return common::invalid_argument("argument --ids: no token ids given");
  return ids;
}

json rows_json(const std::vector<float>& data, int64_t vocab) {
  json rows = json::array();
  for (size_t start = 0; start < data.size(); start += vocab) {
    rows.push_back(std::vector<float>(data.begin() + start, data.begin() + start + vocab));
  }
  return rows;
}

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

int run_logits_command(int argc, char** argv) {
  ArgParser p("chunkpipe logits",
              "Prints a DeepSeek-V3 checkpoint's logits for token ids as JSON.");
  p.add_positional("MODEL", "model directory (config.json + safetensors)");
  p.add_option("ids", "token ids: '1,2,3', '1 2 3', '[1,2,3]' or '-' for stdin");
  p.add_flag("all", "also write logits at every position (all_logits)");
  p.add_flag("mtp", "also run the MTP module (mtp.draft_logits_last, mtp.draft_logits with --all)");
  p.add_option("mtp-next", "token fed to MTP after the last id (default: argmax of last logits)");
  p.add_option("chunk", "feed the ids N at a time through the KV cache (0: all at once)", "0");
  p.add_option("block-size", "KV cache block size in tokens", "16");
  p.add_option("threads", "worker threads",
               std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  p.add_option("out", "write the JSON here instead of stdout");
  p.add_flag("fp8-dequantize",
             "widen FP8 linears to f32 at load, as chunkpipe did before it held them as FP8 "
             "(for comparison: the same logits, four times the weight memory)");
  add_dtype_option(p);
  add_kv_cache_dtype_option(p);
  if (auto st = p.parse(argc, argv, 2); !st.ok()) {
    std::fprintf(stderr, "%s\nchunkpipe logits: error: %s\n", p.usage().c_str(),
                 st.message().c_str());
    return 2;
  }
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  auto fail = [](const common::Status& st, int code) {
    std::fprintf(stderr, "chunkpipe logits: error: %s\n", st.message().c_str());
    return code;
  };
  if (!p.option("ids")) return fail(common::invalid_argument("argument --ids is required"), 2);
  auto ids = parse_ids(*p.option("ids"));
  if (!ids.ok()) return fail(ids.status(), 2);
  auto chunk = p.int_option("chunk", 0);
  auto threads = p.int_option("threads", 1, kMaxThreads);
  auto block_size = p.int_option("block-size", 1, kMaxBlockSize);
  if (!chunk.ok()) return fail(chunk.status(), 2);
  if (!threads.ok()) return fail(threads.status(), 2);
  if (!block_size.ok()) return fail(block_size.status(), 2);
  auto precision = parse_dtype_option(p, p.positional("MODEL"));
  if (!precision.ok()) return fail(precision.status(), 2);
  kernels::set_activation_precision(*precision);
  model::SequenceLogitsOptions opts;
  auto kv_dtype = parse_kv_cache_dtype_option(p);
  if (!kv_dtype.ok()) return fail(kv_dtype.status(), 2);
  opts.kv_cache_dtype = *kv_dtype;
  opts.chunk_size = *chunk;
  opts.all_logits = p.flag("all");
  opts.mtp = p.flag("mtp");
  opts.block_size = static_cast<int>(*block_size);
  if (auto next = p.option("mtp-next")) {
    auto v = p.int_option("mtp-next", 0);
    if (!v.ok()) return fail(v.status(), 2);
    opts.mtp_next_token = static_cast<int32_t>(*v);
  }

  model::LoadOptions load;
  load.load_mtp = opts.mtp;
  load.fp8_dequantize = p.flag("fp8-dequantize");
  const double t0 = common::now_seconds();
  auto loaded = model::DeepseekV3Model::load(p.positional("MODEL"), load);
  if (!loaded.ok()) return fail(loaded.status(), 1);
  const double t1 = common::now_seconds();
  common::ThreadPool pool(static_cast<int>(*threads));
  auto result = model::compute_sequence_logits(**loaded, *ids, opts, pool);
  if (!result.ok()) return fail(result.status(), 1);
  const double t2 = common::now_seconds();

  const model::SequenceLogits& r = *result;
  json out = json::object();
  out["model_dir"] = p.positional("MODEL");
  out["ids"] = *ids;
  out["n_tokens"] = ids->size();
  out["vocab_size"] = r.vocab_size;
  out["dtype"] = dtype_name(*precision);  // of the activations; the logits are f32
  out["kv_cache_dtype"] = model::kv_cache_dtype_name(opts.kv_cache_dtype);
  out["last_argmax"] = argmax(r.last_logits);
  std::vector<int> order(r.last_logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t top = std::min<size_t>(5, order.size());
  std::partial_sort(order.begin(), order.begin() + top, order.end(),
                    [&](int a, int b) { return r.last_logits[a] > r.last_logits[b]; });
  json top5 = json::array();
  for (size_t i = 0; i < top; ++i) top5.push_back({order[i], r.last_logits[order[i]]});
  out["last_top5"] = top5;
  out["last_logits"] = r.last_logits;
  if (opts.all_logits) out["all_logits"] = rows_json(r.all_logits, r.vocab_size);
  if (opts.mtp) {
    json m;
    const int64_t V = r.vocab_size;
    std::vector<float> last(r.mtp_draft_logits.end() - V, r.mtp_draft_logits.end());
    m["next_token"] = r.mtp_next_token;
    m["draft_argmax"] = argmax(last);
    m["draft_logits_last"] = last;
    if (opts.all_logits) m["draft_logits"] = rows_json(r.mtp_draft_logits, V);
    out["mtp"] = m;
  }
  out["timing"] = {{"load_s", t1 - t0}, {"forward_s", t2 - t1}};
  out["peak_rss_bytes"] = common::peak_resident_bytes();
  out["weight_bytes"] = model::weight_census((*loaded)->weights()).total();
  const std::string text = out.dump(-1, ' ', false, json::error_handler_t::replace);
  if (auto path = p.option("out")) {
    std::ofstream f(*path);
    if (!f) return fail(common::invalid_argument("cannot write --out file " + *path), 1);
    f << text << "\n";
    json summary = {{"written", *path}, {"last_argmax", out["last_argmax"]}, {"last_top5", top5}};
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return 0;
}

}  // namespace cli
