// The HTTP/1.1 layer under `tessera serve`, on Boost.Beast and Boost.Asio: a few I/O threads read
// every connection asynchronously (a slow or stalled client costs no thread), and a pool of worker
// threads runs the handlers that wait on the engine. Per connection:
//  - each request (headers and body) must arrive within request_deadline of the wait for it starting,
//    however slowly its bytes trickle: past it the client gets 408 and the connection is closed;
//  - a declared Content-Length over max_body_bytes gets 413 as soon as the headers are in;
//  - requests are read one after another, so pipelined ones are answered in order, and a client that
//    half-closes after its request (shutdown(SHUT_WR), `nc -N`) still gets its answer;
//  - at most max_connections_per_client connections per client address (the rest get 429).
// stop() closes every connection at once, whatever its client is doing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::serve {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string path;  // percent-decoded, without the query
  unsigned version = 11;  // 10 or 11
  HttpHeaders headers;
  std::string body;
  bool has_body = false;  // a Content-Length over 0, or chunked (known before the body is read)

  // The first value of a header (case-insensitive name), or "".
  std::string header(std::string_view name) const;
  size_t header_count(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  HttpHeaders headers;
  std::string body;
  bool close = false;  // close the connection after it
};

// The client's connection, for a handler on a worker thread: a stream's writes go straight out.
class HttpConnection {
 public:
  virtual ~HttpConnection() = default;
  // Whether the client went away (closed, reset). A half-closed one is not gone: where the protocol
  // allows, it is probed once (an interim 100 Continue, or an SSE comment in a stream), and only a
  // client whose connection then resets counts as gone.
  virtual bool client_gone() = 0;
  // A streamed answer: the head now (chunked on HTTP/1.1), then its pieces; false once the client
  // cannot be written to (gone, or not reading for the write timeout).
  virtual bool start_stream(int status, const std::string& content_type, const HttpHeaders& headers) = 0;
  virtual bool write(std::string_view data) = 0;
  virtual bool end_stream() = 0;
};

struct HttpHandlers {
  // Once the headers are in: an answer now (the body, if any, is not read), or nullopt to read the
  // body and call `handle`. Runs on an I/O thread: it must not block.
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> on_head;
  // With the body, on a worker thread: the answer, or nullopt when it streamed one through the connection.
  std::function<std::optional<HttpResponse>(const HttpRequest& request, HttpConnection& connection)> handle;
  // The transport's own refusals (400 unreadable, 408, 413, 429 too many connections, 431), for the
  // route `path` ("" when the request line was not read).
  std::function<HttpResponse(int status, const std::string& message, const std::string& path)> refuse;
};

struct TransportConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  double request_deadline = 30;  // seconds for one request's headers and body
  int64_t max_connections_per_client = 256;
  int64_t worker_threads = 264;
  int64_t max_body_bytes = 1 << 20;
  double write_timeout = 10;  // seconds a write may wait on a client that does not read
};

class HttpTransport {
 public:
  HttpTransport(TransportConfig config, HttpHandlers handlers);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds host:port (port 0 picks a free one) and returns the port; throws Error when it cannot.
  int bind();
  // Serves until stop(); returns at once when stop() came first.
  void run();
  // From any thread: closes the listener and every connection; run() then returns.
  void stop();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve
