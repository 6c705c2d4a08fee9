/*
 * The open-loop load generator of the serving benchmark, in C: sends requests at a
 * fixed rate whatever the answers do and measures each one's latency from the time it
 * was due (no coordinated omission), like bench/http-load.ts in open-loop mode, but
 * without a garbage collector and without polling: it sleeps on a timerfd armed for the
 * next send, so it takes a few percent of a core instead of one, and its own pauses
 * stay out of the server's tail. bench/http-load.ts writes the requests it sends
 * (bench/http.ts --generator c).
 *
 *   open-loop PAYLOADS HOST PORT ws|http RATE PER_FRAME CONNECTIONS WARMUP_MS DURATION_MS SERVER_PID PATCH
 *
 * PAYLOADS (little-endian): u32 count, then per payload: u32 length, u32 patches,
 * `patches` u32 offsets, `length` bytes. A payload is one HTTP request (head and body)
 * or one WebSocket message (sent as a binary frame). Each patch offset is where a
 * request's last block of 16 tokens starts; every request gets its own tokens there
 * (PATCH "json": 16 six-digit numbers, 7 bytes apart; "u32": 16 little-endian u32s),
 * so no two requests are the same.
 *
 * WebSocket answers come in order per connection, one message per frame sent; a
 * request counts as answered well when its answer carries `"status": 200` in
 * MessagePack. HTTP: one request in flight per connection, due requests wait for a
 * free connection in a FIFO (their wait counts); status 200 counts as well.
 *
 * stdout: one JSON line with the fields of bench/http-load.ts's LoadResult.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 16
#define MAX_CONNECTIONS 256
#define DRAIN_NS 3000000000LL

static void die(const char* what) {
  fprintf(stderr, "open-loop: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* ---- growable byte buffer ---- */
typedef struct {
  uint8_t* data;
  size_t length, capacity;
} Bytes;

static void bytes_reserve(Bytes* b, size_t extra) {
  if (b->length + extra <= b->capacity) return;
  size_t capacity = b->capacity ? b->capacity : 65536;
  while (capacity < b->length + extra) capacity *= 2;
  b->data = realloc(b->data, capacity);
  if (!b->data) die("realloc");
  b->capacity = capacity;
}

static void bytes_append(Bytes* b, const void* data, size_t n) {
  bytes_reserve(b, n);
  memcpy(b->data + b->length, data, n);
  b->length += n;
}

static void bytes_consume(Bytes* b, size_t n) {
  memmove(b->data, b->data + n, b->length - n);
  b->length -= n;
}

/* ---- payloads ---- */
typedef struct {
  uint8_t* bytes;
  uint32_t length, patches;
  uint32_t* offsets;
} Payload;

static Payload* payloads;
static uint32_t payload_count;
static int patch_u32; /* else JSON digits */

static void load_payloads(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) die(path);
  uint32_t count;
  if (fread(&count, 4, 1, f) != 1 || count == 0) die("payload count");
  payloads = calloc(count, sizeof *payloads);
  for (uint32_t i = 0; i < count; i++) {
    Payload* p = &payloads[i];
    if (fread(&p->length, 4, 1, f) != 1 || fread(&p->patches, 4, 1, f) != 1) die("payload header");
    p->offsets = malloc(4 * (p->patches ? p->patches : 1));
    p->bytes = malloc(p->length);
    if (fread(p->offsets, 4, p->patches, f) != p->patches || fread(p->bytes, 1, p->length, f) != p->length) die("payload body");
  }
  payload_count = count;
  fclose(f);
}

static uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

/* Writes request `counter`'s own last block at `at`. */
static void patch(uint8_t* at, uint64_t counter) {
  for (uint32_t i = 0; i < BLOCK; i++) {
    uint32_t token = 100000 + mix32((uint32_t)counter * 0x9e3779b1u ^ (uint32_t)(counter >> 32) ^ (i * 0x27d4eb2fu)) % 28000;
    if (patch_u32) {
      memcpy(at + 4 * i, &token, 4);
    } else {
      for (int d = 5; d >= 0; d--) {
        at[7 * i + d] = (uint8_t)('0' + token % 10);
        token /= 10;
      }
    }
  }
}

/* ---- measurement ---- */
typedef struct {
  double* values;
  size_t count, capacity;
} Samples;

static void add_sample(Samples* s, double value) {
  if (s->count == s->capacity) {
    s->capacity = s->capacity ? 2 * s->capacity : 1 << 16;
    s->values = realloc(s->values, s->capacity * sizeof(double));
    if (!s->values) die("realloc");
  }
  s->values[s->count++] = value;
}

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double percentile(Samples* s, double p) {
  if (s->count == 0) return -1;
  size_t at = (size_t)(p * (double)s->count);
  return s->values[at < s->count ? at : s->count - 1];
}

static Samples latencies, lags;
static int64_t window_start, window_end;
static uint64_t errors, completed_in_window;
static uint32_t per_frame;

/* A request (or frame of requests) scheduled at `due` was answered at `now`. */
static void record(int64_t due, int64_t now, uint32_t ok, uint32_t failed) {
  if (due < window_start || due >= window_end) return;
  errors += failed;
  for (uint32_t i = 0; i < ok; i++) add_sample(&latencies, (double)(now - due) / 1e6);
  if (now < window_end) completed_in_window += ok;
}

static double cpu_seconds_of(int pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char* p = strrchr(text, ')');
  if (!p) return 0;
  unsigned long utime = 0, stime = 0;
  /* fields after ")": state(3) ... utime(14) stime(15) */
  sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static double own_cpu_seconds(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

/* ---- connections ---- */
typedef struct {
  int fd;
  Bytes in, out;
  /* Due times of what is in flight, oldest first (a ring). */
  int64_t* due;
  uint32_t head, tail, ring;
  int want_write;
} Connection;

static Connection connections[MAX_CONNECTIONS];
static int connection_count, epoll_fd, is_ws;
static uint64_t inflight;

static void watch(Connection* c, int writable) {
  struct epoll_event e = {.events = EPOLLIN | (writable ? EPOLLOUT : 0), .data.ptr = c};
  if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->fd, &e) != 0) die("epoll_ctl");
  c->want_write = writable;
}

static void flush(Connection* c) {
  while (c->out.length > 0) {
    ssize_t n = write(c->fd, c->out.data, c->out.length);
    if (n < 0) {
      if (errno == EAGAIN) break;
      die("write");
    }
    bytes_consume(&c->out, (size_t)n);
  }
  if ((c->out.length > 0) != c->want_write) watch(c, c->out.length > 0);
}

static void push_due(Connection* c, int64_t due) {
  if (c->tail - c->head == c->ring) die("too many frames in flight on one connection");
  c->due[c->tail++ % c->ring] = due;
  inflight++;
}

static int connect_to(const char* host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("host (IPv4 literal expected)");
  if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* Blocking WebSocket handshake (before the socket goes non-blocking). */
static void ws_handshake(int fd, const char* host, int port) {
  char request[512];
  int n = snprintf(request, sizeof request,
                   "GET /v1/ws HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                   host, port);
  if (write(fd, request, (size_t)n) != n) die("handshake write");
  char response[2048];
  size_t got = 0;
  while (got < sizeof response - 1) {
    ssize_t r = read(fd, response + got, 1); /* byte by byte: nothing after the head is consumed */
    if (r <= 0) die("handshake read");
    got++;
    if (got >= 4 && memcmp(response + got - 4, "\r\n\r\n", 4) == 0) break;
  }
  response[got] = 0;
  if (strncmp(response, "HTTP/1.1 101", 12) != 0) {
    fprintf(stderr, "open-loop: WebSocket upgrade refused: %s\n", response);
    exit(1);
  }
}

static uint64_t counter;
static uint64_t next_payload;

/* Appends the next payload, with its requests' last blocks made unique, to c->out. */
static void append_payload(Connection* c) {
  Payload* p = &payloads[next_payload++ % payload_count];
  for (uint32_t i = 0; i < p->patches; i++) patch(p->bytes + p->offsets[i], counter++);
  if (is_ws) {
    uint8_t head[14];
    size_t h = 0;
    head[h++] = 0x82; /* FIN, binary */
    if (p->length < 126) {
      head[h++] = 0x80 | (uint8_t)p->length;
    } else if (p->length < 65536) {
      head[h++] = 0x80 | 126;
      head[h++] = (uint8_t)(p->length >> 8);
      head[h++] = (uint8_t)p->length;
    } else {
      head[h++] = 0x80 | 127;
      for (int s = 56; s >= 0; s -= 8) head[h++] = (uint8_t)((uint64_t)p->length >> s);
    }
    memset(head + h, 0, 4); /* mask key 0: the payload goes as is */
    h += 4;
    bytes_append(&c->out, head, h);
  }
  bytes_append(&c->out, p->bytes, p->length);
}

/* MessagePack `"status": 200`: fixstr "status", uint8 200. */
static const uint8_t STATUS_OK[] = {0xa6, 's', 't', 'a', 't', 'u', 's', 0xcc, 200};

static uint32_t count_ok(const uint8_t* data, size_t n) {
  uint32_t ok = 0;
  for (size_t i = 0; i + sizeof STATUS_OK <= n; i++) {
    if (data[i] == 0xa6 && memcmp(data + i, STATUS_OK, sizeof STATUS_OK) == 0) {
      ok++;
      i += sizeof STATUS_OK - 1;
    }
  }
  return ok;
}

/* HTTP: requests waiting for a free connection, and the free connections. */
static int64_t* queue;
static uint64_t queue_head, queue_tail, queue_ring;
static Connection* idle[MAX_CONNECTIONS];
static int idle_count;

static void pump(void) {
  while (queue_head < queue_tail && idle_count > 0) {
    Connection* c = idle[--idle_count];
    push_due(c, queue[queue_head++ % queue_ring]);
    append_payload(c);
    flush(c);
  }
}

static void on_readable(Connection* c) {
  for (;;) {
    bytes_reserve(&c->in, 65536);
    ssize_t n = read(c->fd, c->in.data + c->in.length, c->in.capacity - c->in.length);
    if (n < 0) {
      if (errno == EAGAIN) break;
      die("read");
    }
    if (n == 0) {
      if (c->tail != c->head) {
        fprintf(stderr, "open-loop: the server closed a connection with requests in flight\n");
        exit(1);
      }
      return;
    }
    c->in.length += (size_t)n;
  }
  int64_t now = now_ns();
  for (;;) {
    const uint8_t* d = c->in.data;
    size_t have = c->in.length;
    if (is_ws) {
      if (have < 2) return;
      uint64_t length = d[1] & 0x7f;
      size_t h = 2;
      if (length == 126) {
        if (have < 4) return;
        length = ((uint64_t)d[2] << 8) | d[3];
        h = 4;
      } else if (length == 127) {
        if (have < 10) return;
        length = 0;
        for (int i = 0; i < 8; i++) length = (length << 8) | d[2 + i];
        h = 10;
      }
      if (have < h + length) return;
      uint8_t opcode = d[0] & 0x0f;
      if (opcode == 0x2 || opcode == 0x1) {
        if (c->tail == c->head) die("an answer nothing was sent for");
        uint32_t ok = count_ok(d + h, (size_t)length);
        if (ok > per_frame) ok = per_frame;
        record(c->due[c->head++ % c->ring], now, ok, per_frame - ok);
        inflight--;
      }
      bytes_consume(&c->in, h + (size_t)length);
    } else {
      const uint8_t* end = memmem(d, have, "\r\n\r\n", 4);
      if (!end) return;
      size_t head_length = (size_t)(end - d);
      const char* cl = memmem(d, head_length, "ontent-Length:", 14);
      if (!cl) cl = memmem(d, head_length, "ontent-length:", 14);
      if (!cl) die("a response without Content-Length");
      size_t body = strtoul(cl + 14, NULL, 10);
      if (have < head_length + 4 + body) return;
      int status = atoi((const char*)d + 9);
      if (c->tail == c->head) die("a response nothing was sent for");
      record(c->due[c->head++ % c->ring], now, status == 200, status != 200);
      inflight--;
      bytes_consume(&c->in, head_length + 4 + body);
      idle[idle_count++] = c;
      pump();
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 12) {
    fprintf(stderr, "usage: open-loop PAYLOADS HOST PORT ws|http RATE PER_FRAME CONNECTIONS WARMUP_MS DURATION_MS SERVER_PID json|u32\n");
    return 2;
  }
  load_payloads(argv[1]);
  const char* host = argv[2];
  int port = atoi(argv[3]);
  is_ws = strcmp(argv[4], "ws") == 0;
  double rate = atof(argv[5]);
  per_frame = (uint32_t)atoi(argv[6]);
  connection_count = atoi(argv[7]);
  int64_t warmup = (int64_t)atoll(argv[8]) * 1000000LL;
  int64_t duration = (int64_t)atoll(argv[9]) * 1000000LL;
  int server_pid = atoi(argv[10]);
  patch_u32 = strcmp(argv[11], "u32") == 0;
  if (connection_count < 1 || connection_count > MAX_CONNECTIONS || rate <= 0 || per_frame < 1) {
    fprintf(stderr, "open-loop: bad arguments\n");
    return 2;
  }
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake on time, not up to 50 µs late */

  epoll_fd = epoll_create1(0);
  if (epoll_fd < 0) die("epoll_create1");
  uint64_t frames_total = (uint64_t)(rate * (double)(warmup + duration + 200000000LL) / 1e9 / per_frame) + 16;
  for (int i = 0; i < connection_count; i++) {
    Connection* c = &connections[i];
    c->fd = connect_to(host, port);
    if (is_ws) ws_handshake(c->fd, host, port);
    if (fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) != 0) die("fcntl");
    c->ring = (uint32_t)(is_ws ? frames_total / (uint64_t)connection_count + 16 : 2);
    c->due = malloc(sizeof(int64_t) * c->ring);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &e) != 0) die("epoll_ctl add");
    idle[idle_count++] = c;
  }
  if (!is_ws) {
    queue_ring = frames_total;
    queue = malloc(sizeof(int64_t) * queue_ring);
  }
  int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
  if (timer < 0) die("timerfd_create");
  struct epoll_event te = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, timer, &te) != 0) die("epoll_ctl timer");

  int64_t start = now_ns() + 200000000LL;
  window_start = start + warmup;
  window_end = window_start + duration;
  double interval = 1e9 * per_frame / rate;
  uint64_t scheduled = 0;
  double server_cpu0 = -1, server_cpu1 = -1, own_cpu0 = 0, own_cpu1 = 0;
  int64_t cpu_at0 = 0, cpu_at1 = 0;
  int64_t drain_until = 0;
  struct epoll_event events[64];
  for (;;) {
    int64_t now = now_ns();
    if (server_cpu0 < 0 && now >= window_start) {
      server_cpu0 = cpu_seconds_of(server_pid);
      own_cpu0 = own_cpu_seconds();
      cpu_at0 = now;
    }
    if (server_cpu1 < 0 && now >= window_end) {
      server_cpu1 = cpu_seconds_of(server_pid);
      own_cpu1 = own_cpu_seconds();
      cpu_at1 = now;
      drain_until = now + DRAIN_NS;
    }
    for (;;) {
      int64_t due = start + (int64_t)((double)scheduled * interval);
      if (due > now || due >= window_end) break;
      scheduled++;
      if (due >= window_start) add_sample(&lags, (double)(now - due) / 1e6);
      if (is_ws) {
        Connection* c = &connections[scheduled % (uint64_t)connection_count];
        push_due(c, due);
        append_payload(c);
        flush(c);
      } else {
        queue[queue_tail++ % queue_ring] = due;
        pump();
      }
    }
    if (server_cpu1 >= 0 && (inflight == 0 || now >= drain_until)) break;
    /* Sleep until the next send, the window's edges, or I/O. */
    int64_t wake = start + (int64_t)((double)scheduled * interval);
    if (wake >= window_end) wake = server_cpu1 < 0 ? window_end : drain_until;
    if (server_cpu0 < 0 && window_start < wake) wake = window_start;
    struct itimerspec at = {.it_value = {.tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL}};
    if (timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL) != 0) die("timerfd_settime");
    int n = epoll_wait(epoll_fd, events, 64, -1);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      Connection* c = events[i].data.ptr;
      if (c == NULL) {
        uint64_t expirations;
        if (read(timer, &expirations, sizeof expirations) < 0 && errno != EAGAIN) die("timerfd read");
        continue;
      }
      if (events[i].events & EPOLLOUT) flush(c);
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
    }
  }
  qsort(latencies.values, latencies.count, sizeof(double), compare_doubles);
  qsort(lags.values, lags.count, sizeof(double), compare_doubles);
  double seconds = (double)duration / 1e9;
  double span = (double)(cpu_at1 - cpu_at0) / 1e9;
  printf("{\"completed\":%llu,\"errors\":%llu,\"seconds\":%g,\"routesPerSecond\":%g,\"p50Ms\":%g,\"p99Ms\":%g,"
         "\"p999Ms\":%g,\"maxMs\":%g,\"serverCpu\":%g,\"generatorCpu\":%g,\"unanswered\":%llu,\"sendLagP99Ms\":%g}\n",
         (unsigned long long)completed_in_window, (unsigned long long)errors, seconds, (double)completed_in_window / seconds,
         percentile(&latencies, 0.5), percentile(&latencies, 0.99), percentile(&latencies, 0.999),
         latencies.count ? latencies.values[latencies.count - 1] : -1.0, (server_cpu1 - server_cpu0) / span,
         (own_cpu1 - own_cpu0) / span, (unsigned long long)(inflight * per_frame + (queue_tail - queue_head)), percentile(&lags, 0.99));
  return 0;
}
