// A request's connection, watched while a non-streaming answer is generated: a client that went
// away cancels its request (its KV blocks go back, its place in the batch goes to others), as a
// stream's failed write does. httplib 0.11 hands a handler no socket, so it is found among the
// process's descriptors by the connection's two ends.
#pragma once

#include <string>

namespace tessera::serve {

// Returned by connection_socket where the connection is gone already: a client that reset it
// (SO_LINGER 0, a killed process) leaves a socket with no peer, which no lookup by peer can find.
inline constexpr int kConnectionReset = -2;

// The socket with this local port and this peer (as httplib's Request gives them); kConnectionReset
// when there is none but a connected socket on that port has lost its peer; -1 when neither.
int connection_socket(int local_port, const std::string& remote_addr, int remote_port);

// Whether the peer has closed the connection, or it failed.
bool peer_closed(int fd);

}  // namespace tessera::serve
