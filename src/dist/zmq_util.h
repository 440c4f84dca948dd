// ZeroMQ helpers shared by this module's sockets (request_channel, message_socket): the
// process-wide context, error text, options and one-frame receive. Private to dist/.
// Thread-safety: the context is thread-safe; a socket belongs to one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dist::zmq_util {

void* context();  // process-wide, never destroyed (every socket lingers 0)
std::string error();
void set_int(void* socket, int option, int value);
// One frame into *out (with whether more frames follow). False when nothing was received.
bool recv_frame(void* socket, std::vector<uint8_t>* out, bool* more, int flags);

}  // namespace dist::zmq_util
