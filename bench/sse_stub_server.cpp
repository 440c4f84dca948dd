// sse_stub_server: a trivial OpenAI-shaped streaming server for measuring the benchmark
// client itself. Every /v1/completions request gets `--chunks` one-token chunks `--gap-ms`
// apart, a usage chunk and [DONE]; nothing is computed. One thread per connection.
//   sse_stub_server PORT [--chunks 16] [--gap-ms 20] [--threads 1200]
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: sse_stub_server PORT [--chunks N] [--gap-ms N] [--threads N]\n");
    return 2;
  }
  const int port = std::stoi(argv[1]);
  int chunks = 16, gap_ms = 20, threads = 1200;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--chunks")
      chunks = std::stoi(argv[i + 1]);
    else if (a == "--gap-ms")
      gap_ms = std::stoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::stoi(argv[i + 1]);
  }
  httplib::Server server;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_tcp_nodelay(true);
  int listen_fd = -1;
  server.set_socket_options([&](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object":"list","data":[{"id":"stub","object":"model"}]})",
                    "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    auto sent = std::make_shared<int>(0);
    res.set_chunked_content_provider("text/event-stream", [&, sent](size_t,
                                                                    httplib::DataSink& sink) {
      if (*sent < chunks) {
        if (*sent > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        const std::string chunk =
            R"(data: {"id":"cmpl-stub","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}],"usage":null})"
            "\n\n";
        ++*sent;
        return sink.write(chunk.data(), chunk.size());
      }
      const std::string tail =
          "data: "
          "{\"id\":\"cmpl-stub\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_"
          "tokens\":16,\"completion_tokens\":" +
          std::to_string(chunks) + ",\"total_tokens\":" + std::to_string(16 + chunks) +
          "}}\n\ndata: [DONE]\n\n";
      sink.write(tail.data(), tail.size());
      sink.done();
      return true;
    });
  });
  if (!server.bind_to_port("127.0.0.1", port)) {
    std::fprintf(stderr, "cannot bind 127.0.0.1:%d\n", port);
    return 1;
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  std::printf("sse_stub_server on 127.0.0.1:%d (%d chunks, %d ms apart)\n", port, chunks, gap_ms);
  std::fflush(stdout);
  server.listen_after_bind();
  return 0;
}
