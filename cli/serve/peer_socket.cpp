#include "peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace tessera::serve {

namespace {

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// As httplib writes an address: getnameinfo's numeric host.
std::string host_of(const sockaddr_storage& a, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

}  // namespace

int connection_socket(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &self_len) != 0 || port_of(self) != local_port) {
      continue;  // not a socket of this port
    }
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      // The listener has no peer either; an accepted socket without one was reset by its client.
      const int error = errno;
      int listening = 0;
      socklen_t len = sizeof listening;
      const bool listener = getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
      if (error == ENOTCONN && !listener) found = kConnectionReset;
      continue;
    }
    if (port_of(peer) == remote_port && host_of(peer, peer_len) == remote_addr) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace tessera::serve
