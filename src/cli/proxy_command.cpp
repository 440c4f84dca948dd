// `chunkpipe proxy`: the PD load-balancing proxy with the flags of vllm-ascend's
// load_balance_proxy_server_example.py (the singular --prefiller-host etc. work as unique
// prefixes, as with argparse). SIGTERM/SIGINT stop it.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "cli/arg_parser.h"
#include "cli/commands.h"
#include "common/logging.h"
#include "proxy/pd_proxy.h"
#include "server/http_server.h"

namespace cli {
namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

int g_proxy_signal_pipe[2] = {-1, -1};

extern "C" void on_proxy_signal(int sig) {  // async-signal-safe: one write
  const char byte = static_cast<char>(sig);
  if (write(g_proxy_signal_pipe[1], &byte, 1) < 0) _exit(1);
}

}  // namespace

int run_proxy_command(int argc, char** argv) {
  ArgParser p("chunkpipe proxy",
              "PD load-balancing proxy: each request is prefilled on a prefill instance, then "
              "decoded on a decode instance that pulls its KV cache.");
  p.add_option("host", "address to listen on", "localhost");
  p.add_option("port", "port to listen on", "8000");
  p.add_multi_option("prefiller-hosts", "prefill instance hosts (default localhost)");
  p.add_multi_option("prefiller-ports", "prefill instance ports (default 8001)");
  p.add_multi_option("decoder-hosts", "decode instance hosts (default localhost)");
  p.add_multi_option("decoder-ports", "decode instance ports (default 8002)");
  p.add_option("max-retries", "attempts per backend request", "3");
  p.add_option("retry-delay", "base of the exponential retry backoff, seconds", "0.001");
  p.add_option("max-waiting-retries", "probes of an added instance before it is dropped", "3");
  p.add_option("waiting-retry-interval", "seconds between probes of an added instance", "10");
  p.add_option("shutdown-drain-timeout",
               "seconds SIGTERM lets running requests finish before ending them", "3");
  p.add_option("workers", "accepted for compatibility (one process serves all)", "1");
  p.add_option("log-level", "accepted for compatibility", "INFO");
  if (auto st = p.parse(argc, argv, 2); !st.ok()) {
    std::fprintf(stderr, "%s\nchunkpipe proxy: error: %s\n", p.usage().c_str(),
                 st.message().c_str());
    return 2;
  }
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  proxy::ProxyOptions o;
  o.host = *p.option("host");
  auto number = [&](const char* name, double min) -> common::Result<double> {
    const std::string v = *p.option(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || x < min)
      return common::invalid_argument(std::string("--") + name + ": invalid value '" + v + "'");
    return x;
  };
  auto fail = [&](const common::Status& st) {
    std::fprintf(stderr, "chunkpipe proxy: error: %s\n", st.message().c_str());
    return 2;
  };
  auto port = p.int_option("port", 1);
  auto retries = p.int_option("max-retries", 0);
  auto waiting = p.int_option("max-waiting-retries", 0);
  auto delay = number("retry-delay", 0);
  auto interval = number("waiting-retry-interval", 0);
  auto drain = number("shutdown-drain-timeout", 0);
  for (const common::Status& st : {port.status(), retries.status(), waiting.status(),
                                   delay.status(), interval.status(), drain.status()})
    if (!st.ok()) return fail(st);
  o.shutdown_drain_timeout = *drain;
  o.port = static_cast<int>(*port);
  o.max_retries = static_cast<int>(*retries);
  o.max_waiting_retries = static_cast<int>(*waiting);
  o.retry_delay = *delay;
  o.waiting_retry_interval = *interval;
  auto with_default = [&](const char* name, const char* fallback) {
    if (!p.option(name)) return std::string(fallback);
    return *p.option(name);
  };
  auto lists = [&](const char* hosts, const char* ports, const char* host_default,
                   const char* port_default) -> common::Result<std::vector<proxy::InstanceInfo>> {
    const auto h = split_lines(with_default(hosts, host_default));
    const auto ps = split_lines(with_default(ports, port_default));
    std::vector<proxy::InstanceInfo> out;
    if (h.size() != ps.size())
      return common::invalid_argument(std::string("--") + hosts + " has " +
                                      std::to_string(h.size()) + " entries but --" + ports +
                                      " has " + std::to_string(ps.size()));
    for (size_t i = 0; i < h.size(); ++i) {
      char* end = nullptr;
      const long v = std::strtol(ps[i].c_str(), &end, 10);
      if (ps[i].empty() || *end != '\0' || v < 1 || v > 65535)
        return common::invalid_argument(std::string("--") + ports + ": invalid port '" + ps[i] +
                                        "'");
      out.push_back({h[i], static_cast<int>(v)});
    }
    return out;
  };
  auto prefillers = lists("prefiller-hosts", "prefiller-ports", "localhost", "8001");
  if (!prefillers.ok()) return fail(prefillers.status());
  auto decoders = lists("decoder-hosts", "decoder-ports", "localhost", "8002");
  if (!decoders.ok()) return fail(decoders.status());
  o.prefillers = std::move(prefillers).value();
  o.decoders = std::move(decoders).value();
  if (const char* key = std::getenv("OPENAI_API_KEY")) o.api_key = key;

  // A handler writes to a pipe that a watcher thread reads (sigwait would miss signals taken
  // by threads that libraries start before main).
  if (pipe(g_proxy_signal_pipe) != 0) return 1;
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, on_proxy_signal);
  signal(SIGTERM, on_proxy_signal);
  // Thousands of connections, each holding a descriptor.
  if (auto st = server::raise_open_file_limit(); !st.ok()) LOG(WARNING) << st.message();
  proxy::PdProxy server(o);
  if (auto st = server.bind(); !st.ok()) {
    LOG(ERROR) << st.message();
    return 1;
  }
  std::thread watcher([&] {
    char sig = 0;
    if (read(g_proxy_signal_pipe[0], &sig, 1) != 1 || sig == 0) return;  // 0: run() is over
    LOG(INFO) << "Proxy stopping (signal " << int(sig) << ")";
    server.stop();
  });
  LOG(INFO) << "PD proxy on " << o.host << ":" << o.port << " with " << o.prefillers.size()
            << " prefill and " << o.decoders.size() << " decode instance(s)";
  server.run();
  // The watcher may still be inside stop(): it must be done before the server is destroyed.
  const char done = 0;
  if (write(g_proxy_signal_pipe[1], &done, 1) != 1) LOG(WARNING) << "cannot wake the watcher";
  watcher.join();
  return 0;
}

}  // namespace cli
