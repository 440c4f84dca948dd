// The ZeroMQ context and the small wrappers every socket of dist/ uses.
#include "dist/zmq_util.h"

#include <zmq.h>

namespace dist::zmq_util {

void* context() {
  static void* ctx = zmq_ctx_new();
  return ctx;
}

std::string error() {
  return zmq_strerror(zmq_errno());
}

void set_int(void* socket, int option, int value) {
  zmq_setsockopt(socket, option, &value, sizeof(value));
}

bool recv_frame(void* socket, std::vector<uint8_t>* out, bool* more, int flags) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, socket, flags) < 0) {
    zmq_msg_close(&msg);
    return false;
  }
  const auto* p = static_cast<const uint8_t*>(zmq_msg_data(&msg));
  out->assign(p, p + zmq_msg_size(&msg));
  *more = zmq_msg_more(&msg) != 0;
  zmq_msg_close(&msg);
  return true;
}

}  // namespace dist::zmq_util
