#include "http_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "tessera/error.h"

namespace tessera::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr uint32_t kHeaderLimit = 16 << 10;
// After an answer that leaves request bytes unread (a refusal), the rest is read and dropped for
// this long, so that a client still sending reads its answer instead of a reset connection.
constexpr double kLingerSeconds = 5;
constexpr int kIoThreads = 2;

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The target's path, %XX decoded (a malformed escape stays as it is), without the query.
std::string decoded_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string out;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '%' && i + 2 < target.size() && hex_digit(target[i + 1]) >= 0 && hex_digit(target[i + 2]) >= 0) {
      out += char(hex_digit(target[i + 1]) * 16 + hex_digit(target[i + 2]));
      i += 2;
    } else {
      out += target[i];
    }
  }
  return out;
}

std::string status_line(int status) {
  std::string reason = status == 499 ? "Client Closed Request"
                                     : std::string(http::obsolete_reason(http::int_to_status(unsigned(status))));
  if (reason.empty() || reason == "<unknown-status>") reason = "Unknown";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
}

std::string head_text(int status, const std::string& content_type, const HttpHeaders& headers) {
  std::string s = status_line(status);
  if (!content_type.empty()) s += "Content-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : headers) s += k + ": " + v + "\r\n";
  return s;
}

std::string response_text(const HttpResponse& r, bool close) {
  std::string s = head_text(r.status, r.content_type, r.headers);
  s += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (close) s += "Connection: close\r\n";
  s += "\r\n";
  s += r.body;
  return s;
}

// What is wrong with a request's framing headers, from its unparsed text (the parser names no value).
std::string framing_problem(std::string_view raw) {
  raw = raw.substr(0, raw.find("\r\n\r\n"));
  std::vector<std::string> lengths;
  bool transfer_encoding = false;
  for (size_t at = 0; at < raw.size();) {
    size_t end = raw.find("\r\n", at);
    if (end == std::string_view::npos) end = raw.size();
    const std::string_view line = raw.substr(at, end - at);
    at = end + 2;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (same_name(name, "Content-Length")) lengths.emplace_back(value.substr(0, 40));
    if (same_name(name, "Transfer-Encoding")) transfer_encoding = true;
  }
  if (lengths.size() > 1) return "more than one Content-Length header";
  if (!lengths.empty() && transfer_encoding) return "both Content-Length and Transfer-Encoding headers";
  if (!lengths.empty()) return "invalid Content-Length '" + lengths[0] + "'";
  return "Transfer-Encoding other than chunked";
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Handler work off the I/O threads: a fixed set of threads and a queue.
class WorkerPool {
 public:
  void start(size_t n) {
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return;
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Running tasks finish; queued ones are dropped.
  void stop() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
      dropped.swap(tasks_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  ~WorkerPool() { stop(); }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopped_ || !tasks_.empty(); });
        if (stopped_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

class Session;

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (same_name(k, name)) return v;
  }
  return "";
}

size_t HttpRequest::header_count(std::string_view name) const {
  return size_t(std::count_if(headers.begin(), headers.end(), [&](const auto& h) { return same_name(h.first, name); }));
}

class HttpTransport::Impl {
 public:
  Impl(TransportConfig c, HttpHandlers h) : config(std::move(c)), handlers(std::move(h)) {}

  void accept();
  void on_accept(tcp::socket socket);
  void stop_sessions();

  TransportConfig config;
  HttpHandlers handlers;
  std::atomic<bool> stopping{false};
  std::mutex mutex;  // guards what follows, up to ioc
  std::condition_variable cv;
  bool stop_requested = false;
  std::unordered_map<std::string, int64_t> per_client;
  std::unordered_set<Session*> sessions;
  // Destroyed before the above: pending handlers hold sessions, which unregister themselves.
  net::io_context ioc;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  WorkerPool pool;
};

namespace {

class Session : public std::enable_shared_from_this<Session>, public HttpConnection {
 public:
  Session(HttpTransport::Impl& t, tcp::socket socket, std::string address, bool counted)
      : t_(t), socket_(std::move(socket)), timer_(socket_.get_executor()), address_(std::move(address)),
        counted_(counted), fd_(socket_.native_handle()) {
    std::lock_guard lock(t_.mutex);
    t_.sessions.insert(this);
  }
  ~Session() override {
    std::lock_guard lock(t_.mutex);
    t_.sessions.erase(this);
    if (counted_ && --t_.per_client[address_] <= 0) t_.per_client.erase(address_);
  }

  void start() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }
  // A connection over its address's cap: refused at once.
  void refuse_at_once(HttpResponse r) {
    net::dispatch(socket_.get_executor(), [self = shared_from_this(), r = std::move(r)] { self->answer(r, false); });
  }
  // Any thread: ends the connection whatever is under way on it (its operations fail at once).
  void shut_down() { ::shutdown(fd_, SHUT_RDWR); }

  // HttpConnection, on the worker thread that holds the request.
  bool client_gone() override {
    if (write_failed_) return true;
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if ((p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
    if ((p.revents & POLLRDHUP) != 0 && !probed_) {
      // The client sent its FIN: gone, or only done sending (`nc -N`). Writing tells them apart:
      // a closed socket answers with a reset, seen at the next look. HTTP/1.0 has no interim
      // responses: a half-closed 1.0 client without a stream is taken as waiting.
      probed_ = true;
      if (streaming_) {
        write(": \n\n");  // an SSE comment, which clients skip
      } else if (request_.version >= 11) {
        write_all("HTTP/1.1 100 Continue\r\n\r\n");
      }
    }
    return write_failed_;
  }
  bool start_stream(int status, const std::string& content_type, const HttpHeaders& headers) override {
    streaming_ = true;
    chunked_ = request_.version >= 11;
    std::string s = head_text(status, content_type, headers);
    s += chunked_ ? "Transfer-Encoding: chunked\r\n\r\n" : "Connection: close\r\n\r\n";
    return write_all(s);
  }
  bool write(std::string_view data) override {
    if (data.empty()) return !write_failed_;
    if (!chunked_) return write_all(data);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string s = size;
    s.append(data);
    s += "\r\n";
    return write_all(s);
  }
  bool end_stream() override {
    stream_ended_ = write_all(chunked_ ? "0\r\n\r\n" : "");
    return stream_ended_;
  }

 private:
  HttpTransport::Impl& t_;
  tcp::socket socket_;
  net::steady_timer timer_;
  uint64_t deadline_id_ = 0;
  bool timed_out_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string address_;
  bool counted_;
  int fd_;
  HttpRequest request_;
  bool keep_alive_ = false;
  // Worker-side state of the request being handled.
  bool probed_ = false, streaming_ = false, chunked_ = false, stream_ended_ = false, write_failed_ = false;
  std::array<char, 16384> drain_{};
  uint64_t drained_ = 0;

  void arm_deadline(double s) {
    const uint64_t id = ++deadline_id_;
    timed_out_ = false;
    timer_.expires_after(seconds(s));
    timer_.async_wait([self = shared_from_this(), id](beast::error_code ec) {
      if (ec || id != self->deadline_id_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void disarm_deadline() {
    ++deadline_id_;
    timer_.cancel();
  }

  void read_request() {
    if (t_.stopping) return close();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(uint64_t(t_.config.max_body_bytes));
    request_ = HttpRequest{};
    arm_deadline(t_.config.request_deadline);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  HttpRequest head() const {
    const auto& m = parser_->get();
    HttpRequest r;
    r.method = std::string(m.method_string());
    r.path = decoded_path(std::string_view(m.target().data(), m.target().size()));
    r.version = m.version();
    for (const auto& f : m) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.has_body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
    return r;
  }

  // A read that failed: the answer, if the client is owed one, then the close.
  void read_failed(beast::error_code ec) {
    disarm_deadline();
    if (timed_out_) {
      if (!parser_->got_some()) return close();  // an idle connection: nothing to answer
      std::ostringstream limit;
      limit << t_.config.request_deadline;
      return refuse(408, "the request did not arrive within server.request_deadline (" + limit.str() + " s)");
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "the request body is larger than " + std::to_string(t_.config.max_body_bytes) +
                             " bytes (server.max_body_bytes)");
    }
    if (ec == http::error::header_limit) {
      return refuse(431, "the request's headers are larger than " + std::to_string(kHeaderLimit) + " bytes");
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      if (ec == http::error::bad_content_length || ec == http::error::bad_transfer_encoding) {
        // Framing two parties could read differently (RFC 9112 6.3: request smuggling through a
        // proxy): where this body ends is not known, so the connection closes after the answer.
        return refuse(400, framing_problem(std::string_view(static_cast<const char*>(buffer_.data().data()),
                                                            buffer_.size())));
      }
      return refuse(400, "the HTTP request could not be read: " + ec.message());
    }
    close();  // the client closed, or the connection failed
  }

  void on_header(beast::error_code ec) {
    if (ec == http::error::body_limit && !timed_out_) {
      // The declared length is over the limit: the headers are in, the answer is now (the route's
      // own refusal first, as for a request within the limit).
      request_ = head();
      if (auto r = t_.handlers.on_head(request_)) {
        disarm_deadline();
        return answer(*r, false);
      }
    }
    if (ec || timed_out_) return read_failed(ec);
    request_ = head();
    keep_alive_ = parser_->get().keep_alive();
    if (auto r = t_.handlers.on_head(request_)) {
      disarm_deadline();
      return answer(*r, keep_alive_ && !request_.has_body && !r->close);
    }
    if (!request_.has_body) return on_body({});
    auto read_body = [self = shared_from_this()] {
      http::async_read(self->socket_, self->buffer_, *self->parser_,
                       [self](beast::error_code ec, size_t) { self->on_body(ec); });
    };
    if (same_name(request_.header("Expect"), "100-continue")) {
      static const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(cont), [self = shared_from_this(), read_body](beast::error_code ec, size_t) {
        if (ec) return self->read_failed(ec);
        read_body();
      });
      return;
    }
    read_body();
  }

  void on_body(beast::error_code ec) {
    if (ec || timed_out_) return read_failed(ec);
    disarm_deadline();
    request_.body = parser_->release().body();
    t_.pool.post([self = shared_from_this()] { self->handle(); });
  }

  // On a worker thread; no I/O object of this session is in use meanwhile.
  void handle() {
    probed_ = streaming_ = chunked_ = stream_ended_ = write_failed_ = false;
    std::optional<HttpResponse> r;
    try {
      r = t_.handlers.handle(request_, *this);
    } catch (const std::exception& e) {
      r = t_.handlers.refuse(500, std::string("internal error: ") + e.what(), request_.path);
    }
    bool keep = keep_alive_;
    if (r) {
      keep = keep && !r->close;
      write_all(response_text(*r, !keep));
    } else {
      keep = keep && chunked_ && stream_ended_;
    }
    keep = keep && !write_failed_;
    net::post(socket_.get_executor(), [self = shared_from_this(), keep] { self->after_response(keep); });
  }

  void after_response(bool keep) {
    if (keep && !t_.stopping) return read_request();
    linger_close();
  }

  void answer(const HttpResponse& r, bool keep) {
    auto text = std::make_shared<std::string>(response_text(r, !keep));
    arm_deadline(t_.config.write_timeout);  // a client that does not read its answer is not kept
    net::async_write(socket_, net::buffer(*text), [self = shared_from_this(), text, keep](beast::error_code ec, size_t) {
      self->disarm_deadline();
      if (ec || self->timed_out_) return self->close();
      self->after_response(keep);
    });
  }

  void refuse(int status, const std::string& message) {
    answer(t_.handlers.refuse(status, message, request_.path), false);
  }

  // Done sending; what the client still sends is read and dropped (bounded), then the close.
  void linger_close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    drained_ = 0;
    arm_deadline(kLingerSeconds);
    drain();
  }
  void drain() {
    socket_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->timed_out_ || self->drained_ > 4 * uint64_t(self->t_.config.max_body_bytes)) return self->close();
      self->drain();
    });
  }
  void close() {
    disarm_deadline();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // Blocking write from a worker, bounded by the write timeout.
  bool write_all(std::string_view data) {
    if (write_failed_) return false;
    const auto deadline = std::chrono::steady_clock::now() + seconds(t_.config.write_timeout);
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        data.remove_prefix(size_t(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && left.count() > 0) {
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, int(left.count())) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0) continue;
      }
      write_failed_ = true;
      return false;
    }
    return true;
  }
};

}  // namespace

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open() || stopping) return;
    if (!ec) {
      on_accept(std::move(socket));
    } else if (ec != net::error::operation_aborted) {
      // Out of descriptors, most likely: try again shortly instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    accept();
  });
}

void HttpTransport::Impl::on_accept(tcp::socket socket) {
  beast::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return;  // already reset
  const std::string address = peer.address().to_string();
  bool over = false;
  {
    std::lock_guard lock(mutex);
    int64_t& n = per_client[address];
    over = n >= config.max_connections_per_client;
    if (!over) ++n;
    if (n == 0) per_client.erase(address);
  }
  auto session = std::make_shared<Session>(*this, std::move(socket), address, !over);
  if (over) {
    session->refuse_at_once(handlers.refuse(429, "too many connections from " + address + " (server.max_connections_per_client " +
                                                     std::to_string(config.max_connections_per_client) + ")", ""));
  } else {
    session->start();
  }
}

void HttpTransport::Impl::stop_sessions() {
  std::lock_guard lock(mutex);
  for (Session* s : sessions) s->shut_down();
}

HttpTransport::HttpTransport(TransportConfig config, HttpHandlers handlers)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(handlers))) {}

HttpTransport::~HttpTransport() { stop(); }

int HttpTransport::bind() {
  Impl& t = *impl_;
  const std::string where = t.config.port == 0 ? t.config.host + " on any port"
                                               : t.config.host + ":" + std::to_string(t.config.port);
  beast::error_code ec;
  tcp::resolver resolver(t.ioc);
  const auto endpoints = resolver.resolve(t.config.host, std::to_string(t.config.port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) throw Error("cannot bind to " + where + ": " + ec.message());
  const tcp::endpoint endpoint = *endpoints.begin();
  // SO_REUSEADDR, not SO_REUSEPORT: with the latter a second server binds the same port and the
  // kernel splits the connections between the two.
  t.acceptor.open(endpoint.protocol(), ec);
  if (!ec) t.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) t.acceptor.bind(endpoint, ec);
  if (!ec) t.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error("cannot bind to " + where + (t.config.port == 0 ? "" : " (in use, or not an address of this machine)"));
  }
  return t.acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  Impl& t = *impl_;
  {
    std::lock_guard lock(t.mutex);
    if (t.stop_requested) return;
  }
  t.pool.start(size_t(t.config.worker_threads));
  t.accept();
  std::vector<std::thread> io;
  for (int i = 0; i < kIoThreads; ++i) io.emplace_back([&t] { t.ioc.run(); });
  {
    std::unique_lock lock(t.mutex);
    t.cv.wait(lock, [&] { return t.stop_requested; });
  }
  t.stopping = true;
  net::post(t.acceptor.get_executor(), [&t] {
    beast::error_code ignored;
    t.acceptor.close(ignored);
  });
  t.stop_sessions();
  t.pool.stop();  // handlers writing to a shut-down connection fail at once
  t.stop_sessions();
  t.ioc.stop();
  for (auto& th : io) th.join();
}

void HttpTransport::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop_requested = true;
  }
  impl_->cv.notify_all();
}

}  // namespace tessera::serve
