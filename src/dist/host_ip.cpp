// host_ip(): VLLM_HOST_IP, then the source address of the route toward a target (a UDP
// connect sends nothing), then loopback.
#include "dist/host_ip.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace dist {

std::string host_ip(const std::string& toward) {
  if (const char* env = std::getenv("VLLM_HOST_IP"); env != nullptr && *env != '\0') return env;
  std::string ip = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return ip;
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(80);
  if (inet_pton(AF_INET, toward.c_str(), &target.sin_addr) != 1) {
    close(fd);
    return ip;
  }
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  char text[INET_ADDRSTRLEN] = {};
  if (connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
      inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr)
    ip = text;
  close(fd);
  return ip;
}

}  // namespace dist
