/*
 * slotbroker-job-launcher: the native job launcher of the execserver (Linux).
 *
 * The execserver starts this program with stdio ["pipe", "ignore", "inherit", "ipc"] and
 * JSON serialization; it speaks the same protocol as the Node launcher script
 * (src/execserver/runner/launcher-script.ts), over Node's IPC channel, and "input" and
 * "stdout":"spill" besides (the script is never asked them):
 *
 *   in:  {"t":"spawn","id":ID,"file":F,"args":[...],"cwd":D,"env":{K:V,...},"stdin":B,"stdout":B}
 *   out: {"t":"fd","id":ID,"n":N,"pid":P}  twice (stdin n=0, stdout 1), each with the
 *        execserver's end of the job's socketpair attached as a handle; with "stdin":false
 *        the job reads /dev/null and only n=1 is sent; with "stdout":false stdout is read
 *        here (below) and n=1 is not sent; when no handle is sent at all:
 *        {"t":"started","id":ID,"pid":P}; each with "watched":true when the job's process
 *        group is registered with the reaper already (below)
 *   stdout read here ("stdout":false): its first OUT_LIMIT bytes are kept and all counted,
 *        sent as "out" (hex; absent: none) and "outn" (the count) where "err" goes
 *   "input":HEX in a spawn: the job's whole stdin, written here (as the job reads it) and
 *        then closed; no stdin handle is sent (a job reaped before it read it all loses
 *        the rest; one that stops reading is not an error)
 *   "stdout":"spill": read here as with false while it fits OUT_LIMIT bytes; once more came,
 *        out: {"t":"spill","id":ID,"out":HEX} with the execserver's end of stdout attached
 *        as a handle (HEX: the OUT_LIMIT + 1 bytes read so far; the rest stays unread in
 *        the pipe), before the job's exit (or its "stderr") message; that one then
 *        carries no "out"
 *   reaper: with SLOTBROKER_REAPER_FD=N in its environment, fd N is the write end of the
 *        execserver's reaper (src/execserver/runner/group-watchdog.ts): right after a job is
 *        spawned, before anyone hears of it, the launcher writes "+PGID" there, so no moment
 *        passes in which the execserver and the launcher could die together and leave the
 *        job unregistered (and the execserver writes no line of its own); "watched" is left
 *        out when that write could not be done at once (the execserver writes it then)
 *   stderr stays here: its last non-empty line is kept as the execserver's LastLineTracker
 *        keeps it (at most LINE_LIMIT bytes, the first ones of a longer line) and sent as
 *        "err", the line's raw bytes in hex (absent: none)
 *   with "dir":true the launcher makes cwd (mkdir, mode 0700) before the job; a failed
 *        mkdir is answered {"t":"failed",...,"dir":true}, a failed spawn removes the
 *        directory again
 *   out: {"t":"exit","id":ID,"code":C|null,"signal":"SIGKILL"|null,"err":HEX,"rmn":N}
 *        once the job is reaped and its pipes read here to their end; when another process
 *        still holds one open at the reap: {...,"open":true} at once ("err", "out": what
 *        came so far), then {"t":"stderr","id":ID,"err":HEX} (and "out") when they close,
 *        unless {"t":"drop","id":ID} came in first (the execserver gave up on the job's
 *        pipes: they are closed here)
 *   "rm":[paths],"rmn":N in a spawn (done after it) or alone as {"t":"rm","rm":[...],"rmn":N}:
 *        finished jobs' directories, removed with rmdir (one already gone counts as
 *        removed) by a thread, batch after batch; once one is done, exits carry "rmn",
 *        the last batch done by then; {"t":"rm","rmn":N,"left":[paths]} answers a batch
 *        that left some (the execserver removes them), and every batch sent alone
 *   out: {"t":"failed","id":ID,"code":"ENOENT","message":"spawn F ENOENT"}  when it cannot start
 *
 * Why native: Node's spawn() forks, and fork copies the forking process's page tables
 * (about 1 ms of CPU for a 50 MB node). posix_spawn here uses clone(CLONE_VM|CLONE_VFORK):
 * no copy, and exec errors (ENOENT, EACCES) come back as its return value.
 *
 * Node's IPC wire format (lib/internal/child_process.js, JSON mode): one JSON text per line.
 * A handle travels as {"cmd":"NODE_HANDLE","type":"net.Socket","msg":MESSAGE} written by one
 * sendmsg() that carries the fd as SCM_RIGHTS; the receiver answers {"cmd":"NODE_HANDLE_ACK"}
 * (or NODE_HANDLE_NACK when the fd did not arrive: the sender sends it again, at most three
 * more times). A sender has at most one handle in flight: every message after it, with or
 * without a handle, waits for the ack, so messages keep their order.
 *
 * Orphan rule: when stdin (a pipe only the execserver holds) or the channel reads EOF, the
 * execserver is gone: every job not yet reaped is SIGKILLed by process group and the
 * launcher exits. Malformed input never crashes it: lines are bounded, invalid messages
 * are ignored, or answered "failed" when they carry an id.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <paths.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAUNCHER_NAME "slotbroker-job-launcher"
/* Said by --check: an execserver uses only a binary that speaks its protocol ("stdin", "dir",
 * stderr read here, "rm", "+PGID" to the reaper, "stdout":false and "spill", "input"). */
#define PROTOCOL "protocol 5"
/* A request longer than this is answered E2BIG (exec itself refuses a few MB of args+env). */
#define MAX_LINE (8u << 20)
/* Nesting depth of JSON values skipped in a request (a spawn request nests two levels). */
#define MAX_DEPTH 64
/* Node sends a handle again after a NACK at most this many times. */
#define MAX_RETRANSMISSIONS 3
/* The longest id echoed back (a JSON number token; the execserver counts from 1). */
#define MAX_ID 32
/* A job's stderr line is kept to this many bytes (stderr-line.ts's STDERR_LINE_LIMIT). */
#define LINE_LIMIT 1000
/* The first bytes of stdout kept when it is read here (stdout-buffer.ts's STDOUT_BUFFER_LIMIT). */
#define OUT_LIMIT 4000

static int channel = -1;
/* The write end of the execserver's reaper; -1: none, or it is gone. */
static int reaper = -1;

/* ------------------------------------------------------------------ jobs ---------------- */

/* A started job until it is reaped and its pipes read here closed. Few at a time (one per
 * slot): a linear table suffices. The stderr line: two buffers, the line being read
 * (line[cur]) and the last non-empty one, swapped rather than copied. */
struct job {
  pid_t pid;
  bool reaped;
  int err_fd; /* -1 once stderr is closed here */
  int out_fd; /* stdout when read here ("stdout":false); -1 otherwise or once closed or passed */
  bool spill; /* "stdout":"spill": stdout goes to the execserver once it outgrows OUT_LIMIT */
  int in_fd;  /* stdin while "input" is written here; -1 otherwise or once done */
  char *in;   /* "input", malloc'd; in_off of in_len written */
  size_t in_len, in_off;
  char id[MAX_ID];
  int cur;
  size_t len[2];
  char line[2][LINE_LIMIT];
  size_t out_len;          /* bytes of out kept */
  unsigned long long out_total; /* bytes of stdout read */
  char out[OUT_LIMIT + 1];
};
static struct job *jobs;
static size_t njobs, jobs_cap;

static bool add_job(pid_t pid, const char *id, int err_fd, int out_fd, bool spill) {
  if (njobs == jobs_cap) {
    size_t cap = jobs_cap ? jobs_cap * 2 : 16;
    struct job *grown = realloc(jobs, cap * sizeof *jobs);
    if (!grown) {
      /* Without a table entry the job could never be reported or killed: kill it now. */
      kill(-pid, SIGKILL);
      return false;
    }
    jobs = grown;
    jobs_cap = cap;
  }
  struct job *j = &jobs[njobs++];
  j->pid = pid;
  j->reaped = false;
  j->err_fd = err_fd;
  j->out_fd = out_fd;
  j->spill = spill;
  j->in_fd = -1;
  j->in = NULL;
  j->in_len = j->in_off = 0;
  snprintf(j->id, MAX_ID, "%s", id);
  j->cur = 0;
  j->len[0] = j->len[1] = 0;
  j->out_len = 0;
  j->out_total = 0;
  return true;
}

static bool pipes_open(const struct job *j) { return j->err_fd >= 0 || j->out_fd >= 0; }

static void input_done(struct job *j) {
  if (j->in_fd >= 0) close(j->in_fd);
  j->in_fd = -1;
  free(j->in);
  j->in = NULL;
}

/* Writes what the job's stdin takes of "input" (non-blocking); closes it when all is
 * written or the job stopped reading (EPIPE and the like: its business). */
static void write_input(struct job *j) {
  while (j->in_fd >= 0 && j->in_off < j->in_len) {
    ssize_t n = write(j->in_fd, j->in + j->in_off, j->in_len - j->in_off);
    if (n > 0) {
      j->in_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    break;
  }
  input_done(j);
}

static void remove_job(size_t i) {
  input_done(&jobs[i]);
  if (jobs[i].err_fd >= 0) close(jobs[i].err_fd);
  if (jobs[i].out_fd >= 0) close(jobs[i].out_fd);
  if (i != njobs - 1) memcpy(&jobs[i], &jobs[njobs - 1], sizeof *jobs);
  njobs--;
}

/* The execserver is gone: nobody could read the jobs' output or reap them. */
static void orphaned(void) __attribute__((noreturn));
static void orphaned(void) {
  for (size_t i = 0; i < njobs; i++)
    if (!jobs[i].reaped) kill(-jobs[i].pid, SIGKILL);
  _exit(0);
}

/* ------------------------------------------------------------------ stderr -------------- */

static bool blank(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c != ' ' && (c < '\t' || c > '\r')) return false;
  }
  return true;
}

/* Feeds stderr bytes to the job's line tracker. */
static void track(struct job *j, const char *p, size_t n) {
  size_t start = 0;
  for (;;) {
    const char *nl = memchr(p + start, '\n', n - start);
    size_t end = nl ? (size_t)(nl - p) : n;
    size_t *len = &j->len[j->cur];
    if (*len < LINE_LIMIT && end > start) {
      size_t take = end - start < LINE_LIMIT - *len ? end - start : LINE_LIMIT - *len;
      memcpy(j->line[j->cur] + *len, p + start, take);
      *len += take;
    }
    if (!nl) return;
    if (!blank(j->line[j->cur], *len)) j->cur ^= 1;
    j->len[j->cur] = 0;
    start = end + 1;
  }
}

/* Feeds stdout bytes to the job's prefix: the first OUT_LIMIT kept, all counted. */
static void keep_out(struct job *j, const char *p, size_t n) {
  size_t take = n < OUT_LIMIT - j->out_len ? n : OUT_LIMIT - j->out_len;
  memcpy(j->out + j->out_len, p, take);
  j->out_len += take;
  j->out_total += n;
}

/* Reads what one of the job's pipes has (non-blocking); at its end the fd is closed. */
static void read_pipe(struct job *j, int *fd, void (*eat)(struct job *, const char *, size_t)) {
  static char chunk[65536];
  while (*fd >= 0) {
    ssize_t n = read(*fd, chunk, sizeof chunk);
    if (n > 0) {
      eat(j, chunk, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(*fd); /* EOF, or an error: its end either way */
    *fd = -1;
  }
}

static void spill_out(struct job *j);

/* Reads a spilling job's stdout straight into out, never past OUT_LIMIT + 1 bytes: at that
 * many the pipe goes to the execserver with them, the rest unread. */
static void read_spill(struct job *j) {
  while (j->out_fd >= 0) {
    ssize_t n = read(j->out_fd, j->out + j->out_len, OUT_LIMIT + 1 - j->out_len);
    if (n > 0) {
      j->out_len += (size_t)n;
      j->out_total += (unsigned long long)n;
      if (j->out_len > OUT_LIMIT) spill_out(j);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(j->out_fd);
    j->out_fd = -1;
  }
}

static void read_pipes(struct job *j) {
  read_pipe(j, &j->err_fd, track);
  if (j->spill) read_spill(j);
  else read_pipe(j, &j->out_fd, keep_out);
}

/* ------------------------------------------------------------------ output -------------- */

/* A growable byte buffer for building JSON lines. Allocation failure ends the process. */
struct buf {
  char *p;
  size_t len, cap;
};

static void buf_need(struct buf *b, size_t more) {
  if (b->len + more <= b->cap) return;
  size_t cap = b->cap ? b->cap : 128;
  while (cap < b->len + more) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) orphaned(); /* out of memory: the execserver sees the launcher die */
  b->p = p;
  b->cap = cap;
}

static void buf_add(struct buf *b, const char *s, size_t n) {
  buf_need(b, n);
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* s as a JSON string: quotes, backslashes and control bytes escaped, other bytes as-is. */
static void buf_json(struct buf *b, const char *s) {
  buf_add(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      buf_add(b, e, 2);
    } else if (c < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", c);
      buf_add(b, e, 6);
    } else {
      buf_add(b, (const char *)&c, 1);
    }
  }
  buf_add(b, "\"", 1);
}

/* A line waiting to be written, with the fd it carries (-1: none). */
struct out {
  struct out *next;
  int fd;
  int retransmissions;
  size_t len;
  char line[];
};
static struct out *out_head, *out_tail;
/* out_head was written with its fd and waits for NODE_HANDLE_ACK. */
static bool awaiting_ack;

/* Writes a whole line; the fd (if any) rides on the first byte. A dead channel is EOF. */
static void write_line(const char *p, size_t len, int fd) {
  bool fd_sent = fd < 0;
  while (len > 0) {
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    union {
      struct cmsghdr align;
      char space[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (!fd_sent) {
      memset(&control, 0, sizeof control);
      msg.msg_control = control.space;
      msg.msg_controllen = sizeof control.space;
      struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    ssize_t n = sendmsg(channel, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd w = {.fd = channel, .events = POLLOUT};
        poll(&w, 1, -1);
        continue;
      }
      orphaned();
    }
    fd_sent = true;
    p += n;
    len -= (size_t)n;
  }
}

/* Writes queued lines until one carrying an fd is in flight (it then waits for its ack). */
static void flush_out(void) {
  while (out_head && !awaiting_ack) {
    struct out *o = out_head;
    write_line(o->line, o->len, o->fd);
    if (o->fd >= 0) {
      awaiting_ack = true;
      return;
    }
    out_head = o->next;
    if (!out_head) out_tail = NULL;
    free(o);
  }
}

/* Queues the line in b (newline appended here), with fd passed along if >= 0. */
static void send_line(struct buf *b, int fd) {
  buf_add(b, "\n", 1);
  struct out *o = malloc(sizeof *o + b->len);
  if (!o) orphaned();
  o->next = NULL;
  o->fd = fd;
  o->retransmissions = 0;
  o->len = b->len;
  memcpy(o->line, b->p, b->len);
  if (out_tail) out_tail->next = o;
  else out_head = o;
  out_tail = o;
  b->len = 0;
  flush_out();
}

/* The receiver answered the handle in flight: ack drops it, nack sends it again. */
static void handle_answered(bool ack) {
  if (!awaiting_ack) return;
  struct out *o = out_head;
  awaiting_ack = false;
  if (ack || ++o->retransmissions > MAX_RETRANSMISSIONS) {
    close(o->fd); /* the receiver holds its own copy now (or never will) */
    out_head = o->next;
    if (!out_head) out_tail = NULL;
    free(o);
  }
  flush_out();
}

static struct buf msg;

/* ,"err":"HEX" with the job's stderr line as LastLineTracker picks it (none: nothing). */
static void buf_err(struct buf *b, const struct job *j) {
  int which = blank(j->line[j->cur], j->len[j->cur]) ? j->cur ^ 1 : j->cur;
  size_t n = j->len[which];
  if (n == 0) return;
  static const char digits[] = "0123456789abcdef";
  buf_str(b, ",\"err\":\"");
  buf_need(b, 2 * n);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)j->line[which][i];
    b->p[b->len++] = digits[c >> 4];
    b->p[b->len++] = digits[c & 15];
  }
  buf_str(b, "\"");
}

static void buf_hex(struct buf *b, const char *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  buf_need(b, 2 * n);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    b->p[b->len++] = digits[c >> 4];
    b->p[b->len++] = digits[c & 15];
  }
}

/* ,"out":"HEX","outn":N with what stdout read here had: its first bytes and how many in all. */
static void buf_out(struct buf *b, const struct job *j) {
  if (j->out_total == 0) return;
  buf_str(b, ",\"out\":\"");
  buf_hex(b, j->out, j->out_len);
  char total[48];
  snprintf(total, sizeof total, "\",\"outn\":%llu", j->out_total);
  buf_str(b, total);
}

/* Passes a spilling job's stdout to the execserver with the bytes read of it so far; from
 * here on stdout is the execserver's alone (no "out" in the job's later messages). */
static void spill_out(struct job *j) {
  buf_str(&msg, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Socket\",\"msg\":{\"t\":\"spill\",\"id\":");
  buf_str(&msg, j->id);
  buf_str(&msg, ",\"out\":\"");
  buf_hex(&msg, j->out, j->out_len);
  buf_str(&msg, "\"}}");
  int fd = j->out_fd;
  j->out_fd = -1;
  j->out_len = 0;
  j->out_total = 0;
  send_line(&msg, fd);
}

/* The number of the last batch of removals done ("": none yet). */
static char rm_done[MAX_ID];

/* Node's error code names for the errors a spawn can meet. */
static const char *errno_name(int e) {
  switch (e) {
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case ELOOP: return "ELOOP";
    case ENAMETOOLONG: return "ENAMETOOLONG";
    case ENOEXEC: return "ENOEXEC";
    case E2BIG: return "E2BIG";
    case ETXTBSY: return "ETXTBSY";
    case ENOMEM: return "ENOMEM";
    case EAGAIN: return "EAGAIN";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case EIO: return "EIO";
    case EEXIST: return "EEXIST";
    case ENOSPC: return "ENOSPC";
    case EROFS: return "EROFS";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case ELIBBAD: return "ELIBBAD";
    default: return "UNKNOWN";
  }
}

/* {"t":"failed",...} with Node's message for a failed spawn ("spawn FILE CODE") or why;
 * dir: it was making the job's directory that failed. */
static void send_failed(const char *id, const char *code, const char *file, const char *why, bool dir) {
  buf_str(&msg, "{\"t\":\"failed\",\"id\":");
  buf_str(&msg, id);
  buf_str(&msg, ",\"code\":");
  buf_json(&msg, code);
  buf_str(&msg, ",\"message\":");
  if (why) {
    buf_json(&msg, why);
  } else {
    struct buf text = {0};
    buf_str(&text, "spawn ");
    buf_str(&text, file);
    buf_str(&text, " ");
    buf_str(&text, code);
    buf_add(&text, "", 1);
    buf_json(&msg, text.p);
    free(text.p);
  }
  buf_str(&msg, dir ? ",\"dir\":true}" : "}");
  send_line(&msg, -1);
}

/* ------------------------------------------------------------------ JSON reader --------- */

/*
 * Reads just what a request needs. Strings are decoded in place (an escape never decodes
 * longer than it is written) and NUL-terminated where their closing quote was, so the
 * request's strings point into the line buffer without copies.
 */
struct reader {
  char *p, *end;
};

static void skip_ws(struct reader *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static bool take(struct reader *r, char c) {
  skip_ws(r);
  if (r->p < r->end && *r->p == c) {
    r->p++;
    return true;
  }
  return false;
}

static int hex4(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}

static char *put_utf8(char *w, uint32_t cp) {
  if (cp < 0x80) {
    *w++ = (char)cp;
  } else if (cp < 0x800) {
    *w++ = (char)(0xC0 | (cp >> 6));
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *w++ = (char)(0xE0 | (cp >> 12));
    *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *w++ = (char)(0xF0 | (cp >> 18));
    *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
    *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  }
  return w;
}

/*
 * A JSON string at r, decoded in place into *out. *has_nul is set when it contains U+0000
 * (no C string can carry it; exec could not either). Lone surrogates become U+FFFD, as
 * Node's own UTF-8 conversion of a spawn argument makes them.
 */
static bool read_string(struct reader *r, char **out, bool *has_nul) {
  if (!take(r, '"')) return false;
  char *w = r->p;
  *out = w;
  while (r->p < r->end) {
    unsigned char c = (unsigned char)*r->p;
    if (c == '"') {
      *w = '\0';
      r->p++;
      return true;
    }
    if (c < 0x20) return false;
    if (c != '\\') {
      *w++ = *r->p++;
      continue;
    }
    if (r->end - r->p < 2) return false;
    char e = r->p[1];
    r->p += 2;
    switch (e) {
      case '"': *w++ = '"'; break;
      case '\\': *w++ = '\\'; break;
      case '/': *w++ = '/'; break;
      case 'b': *w++ = '\b'; break;
      case 'f': *w++ = '\f'; break;
      case 'n': *w++ = '\n'; break;
      case 'r': *w++ = '\r'; break;
      case 't': *w++ = '\t'; break;
      case 'u': {
        if (r->end - r->p < 4) return false;
        int u = hex4(r->p);
        if (u < 0) return false;
        r->p += 4;
        uint32_t cp = (uint32_t)u;
        if (cp >= 0xD800 && cp <= 0xDBFF && r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u') {
          int lo = hex4(r->p + 2);
          if (lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            r->p += 6;
          }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        if (cp == 0) *has_nul = true;
        w = put_utf8(w, cp);
        break;
      }
      default: return false;
    }
  }
  return false;
}

/* A JSON number token at r (validated, not converted): [start, r->p). */
static bool read_number(struct reader *r, char **start) {
  skip_ws(r);
  char *p = r->p;
  *start = p;
  if (p < r->end && *p == '-') p++;
  if (p >= r->end || *p < '0' || *p > '9') return false;
  if (*p == '0') p++;
  else while (p < r->end && *p >= '0' && *p <= '9') p++;
  if (p < r->end && *p == '.') {
    p++;
    if (p >= r->end || *p < '0' || *p > '9') return false;
    while (p < r->end && *p >= '0' && *p <= '9') p++;
  }
  if (p < r->end && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < r->end && (*p == '+' || *p == '-')) p++;
    if (p >= r->end || *p < '0' || *p > '9') return false;
    while (p < r->end && *p >= '0' && *p <= '9') p++;
  }
  r->p = p;
  return true;
}

static bool skip_value(struct reader *r, int depth) {
  if (depth > MAX_DEPTH) return false;
  skip_ws(r);
  if (r->p >= r->end) return false;
  char c = *r->p;
  if (c == '"') {
    char *s;
    bool nul = false;
    return read_string(r, &s, &nul);
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    r->p++;
    if (take(r, close)) return true;
    do {
      if (c == '{') {
        char *key;
        bool nul = false;
        if (!read_string(r, &key, &nul) || !take(r, ':')) return false;
      }
      if (!skip_value(r, depth + 1)) return false;
    } while (take(r, ','));
    return take(r, close);
  }
  static const char *const words[] = {"true", "false", "null"};
  for (size_t i = 0; i < 3; i++) {
    size_t n = strlen(words[i]);
    if ((size_t)(r->end - r->p) >= n && memcmp(r->p, words[i], n) == 0) {
      r->p += n;
      return true;
    }
  }
  char *num;
  return read_number(r, &num);
}

/* A growable array of string pointers (into the line), NULL-terminated when used. */
struct strv {
  char **v;
  size_t n, cap;
};

static bool strv_push(struct strv *s, char *p) {
  if (s->n + 1 >= s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    char **v = realloc(s->v, cap * sizeof *v);
    if (!v) return false;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = p;
  s->v[s->n] = NULL;
  return true;
}

/* The fields of one incoming message. */
struct request {
  char *t, *cmd, *file, *cwd;
  char id[MAX_ID];
  struct strv args; /* args.v[0] is reserved for argv[0] (the file) */
  struct strv env;  /* key, value, key, value, ... */
  bool no_stdin;    /* "stdin":false: the job reads /dev/null, no stdin handle is sent */
  bool no_stdout;   /* "stdout":false or "spill": stdout is read here, no stdout handle is sent */
  bool spill;       /* "stdout":"spill": ... until it outgrows OUT_LIMIT (see spill_out) */
  char *input;      /* "input": the job's stdin, decoded in place (NULL: none) */
  size_t input_len;
  bool make_dir;    /* "dir":true: make cwd before the job */
  struct strv rm;   /* "rm": directories to remove (one holding U+0000 is left out) */
  char rmn[MAX_ID]; /* "rmn": the number of that batch ("": none) */
  const char *invalid; /* the first field found invalid, for the "failed" answer */
};

/* A string field: *field points at it, or stays NULL (and the field is invalid) otherwise. */
static bool read_string_field(struct reader *r, char **field, const char *name, struct request *req) {
  bool nul = false;
  *field = NULL;
  skip_ws(r);
  if (r->p >= r->end || *r->p != '"') {
    if (!req->invalid) req->invalid = name;
    return skip_value(r, 1);
  }
  if (!read_string(r, field, &nul)) return false;
  if (nul && !req->invalid) req->invalid = name;
  return true;
}

/* "args": an array of strings, after the slot reserved for argv[0]. */
static bool read_args(struct reader *r, struct request *req) {
  req->args.n = 0;
  if (!strv_push(&req->args, NULL)) return false;
  skip_ws(r);
  if (r->p >= r->end || *r->p != '[') {
    if (!req->invalid) req->invalid = "args";
    return skip_value(r, 1);
  }
  r->p++;
  if (take(r, ']')) return true;
  do {
    char *s;
    if (!read_string_field(r, &s, "args", req)) return false;
    if (s && !strv_push(&req->args, s)) return false;
  } while (take(r, ','));
  return take(r, ']');
}

/* "env": an object of strings, kept as key, value, key, value, ... */
static bool read_env(struct reader *r, struct request *req) {
  req->env.n = 0;
  skip_ws(r);
  if (r->p >= r->end || *r->p != '{') {
    if (!req->invalid) req->invalid = "env";
    return skip_value(r, 1);
  }
  r->p++;
  if (take(r, '}')) return true;
  do {
    char *k, *v;
    bool nul = false;
    if (!read_string(r, &k, &nul) || !take(r, ':')) return false;
    if ((nul || !*k || strchr(k, '=')) && !req->invalid) req->invalid = "env";
    if (!read_string_field(r, &v, "env", req)) return false;
    if (v && (!strv_push(&req->env, k) || !strv_push(&req->env, v))) return false;
  } while (take(r, ','));
  return take(r, '}');
}

/* "rm": an array of paths; anything else in it is skipped. */
static bool read_rm(struct reader *r, struct request *req) {
  req->rm.n = 0;
  skip_ws(r);
  if (r->p >= r->end || *r->p != '[') return skip_value(r, 1);
  r->p++;
  if (take(r, ']')) return true;
  do {
    skip_ws(r);
    if (r->p < r->end && *r->p == '"') {
      char *s;
      bool nul = false;
      if (!read_string(r, &s, &nul)) return false;
      if (!nul && *s && !strv_push(&req->rm, s)) return false;
    } else if (!skip_value(r, 2)) {
      return false;
    }
  } while (take(r, ','));
  return take(r, ']');
}

/* A number token (an id) into out (MAX_ID bytes), else "" and the value skipped. */
static bool read_id(struct reader *r, char *out) {
  char *start;
  skip_ws(r);
  out[0] = '\0';
  if (r->p < r->end && (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) {
    bool ok = read_number(r, &start);
    size_t n = (size_t)(r->p - start);
    if (ok && n < MAX_ID) {
      memcpy(out, start, n);
      out[n] = '\0';
    }
    return ok;
  }
  return skip_value(r, 1);
}

/* "input": hex, decoded in place; anything else makes the request invalid. */
static bool read_input(struct reader *r, struct request *req) {
  char *hex;
  if (!read_string_field(r, &hex, "input", req)) return false;
  if (!hex) return true;
  size_t n = strlen(hex);
  bool ok = n % 2 == 0;
  for (size_t i = 0; ok && i < n; i += 2) {
    char pair[5] = {'0', '0', hex[i], hex[i + 1], 0};
    int v = hex4(pair);
    if (v < 0) ok = false;
    else hex[i / 2] = (char)v;
  }
  if (!ok) {
    if (!req->invalid) req->invalid = "input";
    return true;
  }
  req->input = hex;
  req->input_len = n / 2;
  return true;
}

/*
 * Parses a line (one JSON object) into req, reading the fields a message of the protocol
 * has and skipping any other. False when the line is not a well-formed JSON object.
 */
static bool parse_request(char *line, size_t len, struct request *req) {
  struct reader r = {line, line + len};
  if (!take(&r, '{')) return false;
  if (!take(&r, '}')) {
    do {
      char *key;
      bool nul = false;
      if (!read_string(&r, &key, &nul) || !take(&r, ':')) return false;
      bool ok;
      if (!strcmp(key, "t")) ok = read_string_field(&r, &req->t, "t", req);
      else if (!strcmp(key, "cmd")) ok = read_string_field(&r, &req->cmd, "cmd", req);
      else if (!strcmp(key, "file")) ok = read_string_field(&r, &req->file, "file", req);
      else if (!strcmp(key, "cwd")) ok = read_string_field(&r, &req->cwd, "cwd", req);
      else if (!strcmp(key, "args")) ok = read_args(&r, req);
      else if (!strcmp(key, "env")) ok = read_env(&r, req);
      else if (!strcmp(key, "stdin")) {
        skip_ws(&r);
        req->no_stdin = (size_t)(r.end - r.p) >= 5 && memcmp(r.p, "false", 5) == 0;
        ok = skip_value(&r, 1);
      } else if (!strcmp(key, "stdout")) {
        skip_ws(&r);
        req->spill = (size_t)(r.end - r.p) >= 7 && memcmp(r.p, "\"spill\"", 7) == 0;
        req->no_stdout = req->spill || ((size_t)(r.end - r.p) >= 5 && memcmp(r.p, "false", 5) == 0);
        ok = skip_value(&r, 1);
      } else if (!strcmp(key, "dir")) {
        skip_ws(&r);
        req->make_dir = (size_t)(r.end - r.p) >= 4 && memcmp(r.p, "true", 4) == 0;
        ok = skip_value(&r, 1);
      }
      else if (!strcmp(key, "id")) ok = read_id(&r, req->id);
      else if (!strcmp(key, "rmn")) ok = read_id(&r, req->rmn);
      else if (!strcmp(key, "rm")) ok = read_rm(&r, req);
      else if (!strcmp(key, "input")) ok = read_input(&r, req);
      else ok = skip_value(&r, 1);
      if (!ok) return false;
    } while (take(&r, ','));
    if (!take(&r, '}')) return false;
  }
  skip_ws(&r);
  return r.p == r.end;
}

/* ------------------------------------------------------------------ spawning ------------ */

static posix_spawnattr_t spawn_attr;

/*
 * posix_spawn with Node's (libuv's) lookup: a file with a slash as is, else each entry of
 * the job's own PATH in turn (ENOENT/ENOTDIR: try the next; EACCES: remember, try the
 * next; anything else: stop). Entries are tried after the job's chdir, so relative ones
 * are relative to its cwd, as in libuv. Absolute candidates that do not exist are skipped
 * without a spawn.
 */
static int spawn_path(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions, char **argv, char **envp) {
  if (strchr(file, '/')) return posix_spawn(pid, file, actions, &spawn_attr, argv, envp);
  const char *path = NULL;
  for (char **e = envp; *e; e++)
    if (!strncmp(*e, "PATH=", 5)) path = *e + 5;
  if (!path) path = _PATH_DEFPATH;
  bool eacces = false;
  char candidate[PATH_MAX];
  for (const char *p = path;; p++) {
    const char *colon = strchrnul(p, ':');
    size_t dirlen = (size_t)(colon - p);
    int n = dirlen ? snprintf(candidate, sizeof candidate, "%.*s/%s", (int)dirlen, p, file) : snprintf(candidate, sizeof candidate, "%s", file);
    if (n > 0 && (size_t)n < sizeof candidate && !(candidate[0] == '/' && access(candidate, F_OK) != 0 && (errno == ENOENT || errno == ENOTDIR))) {
      int err = posix_spawn(pid, candidate, actions, &spawn_attr, argv, envp);
      if (err == 0) return 0;
      if (err == EACCES) eacces = true;
      else if (err != ENOENT && err != ENOTDIR) return err;
    }
    if (!*colon) break;
    p = colon;
  }
  return eacces ? EACCES : ENOENT;
}

/*
 * Registers the job's process group with the reaper ("+PGID"); false when that could not be
 * done at once: no reaper, it is gone, or it is behind (the fd is non-blocking, and a line
 * this short is written whole or not at all: pipe or socket, nothing of it interleaves with
 * the execserver's lines).
 */
static bool tell_reaper(pid_t pid) {
  if (reaper < 0) return false;
  char line[32];
  int n = snprintf(line, sizeof line, "+%d\n", (int)pid);
  ssize_t w;
  while ((w = write(reaper, line, (size_t)n)) < 0 && errno == EINTR) {
  }
  if (w == n) return true;
  if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
    close(reaper); /* replaced by the execserver: it tells the new one itself */
    reaper = -1;
  }
  return false;
}

static void set_nonblock(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* Starts the job of a valid request and reports its handles (one or two), or why it failed. */
static void spawn_job(struct request *req) {
  /* "K=V" strings for the job's environment, in one block. */
  size_t size = 0;
  for (size_t i = 0; i < req->env.n; i += 2) size += strlen(req->env.v[i]) + strlen(req->env.v[i + 1]) + 2;
  char *block = malloc(size + 1);
  char **envp = calloc(req->env.n / 2 + 1, sizeof *envp);
  if (!block || !envp) {
    free(block);
    free(envp);
    send_failed(req->id, "ENOMEM", req->file, NULL, false);
    return;
  }
  char *w = block;
  for (size_t i = 0; i < req->env.n; i += 2) {
    envp[i / 2] = w;
    w += sprintf(w, "%s=%s", req->env.v[i], req->env.v[i + 1]) + 1;
  }
  req->args.v[0] = req->file;
  if (req->make_dir && mkdir(req->cwd, 0700) != 0) {
    int e = errno;
    free(block);
    free(envp);
    struct buf why = {0};
    buf_str(&why, "cannot create the working directory ");
    buf_str(&why, req->cwd);
    buf_str(&why, ": ");
    buf_str(&why, strerror(e));
    buf_add(&why, "", 1);
    send_failed(req->id, errno_name(e), req->file, why.p, true);
    free(why.p);
    return;
  }

  /* Socketpairs, as libuv makes a child's "pipe" stdio: [0] the execserver's end, [1] the job's.
   * Without stdin the job's fd 0 is /dev/null (Node's "ignore"): one socketpair and one
   * passed handle (a message and its ack) fewer per job. */
  int first = req->no_stdin ? 1 : 0;
  int pairs[3][2];
  int made = first, err = 0;
  for (; made < 3; made++)
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pairs[made]) != 0) {
      err = errno;
      break;
    }
  pid_t pid = 0;
  if (!err) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (first) posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    for (int n = first; n < 3; n++) posix_spawn_file_actions_adddup2(&actions, pairs[n][1], n);
    posix_spawn_file_actions_addchdir_np(&actions, req->cwd);
    err = spawn_path(&pid, req->file, &actions, req->args.v, envp);
    posix_spawn_file_actions_destroy(&actions);
  }
  free(block);
  free(envp);
  for (int n = first; n < made; n++) {
    close(pairs[n][1]);
    if (err) close(pairs[n][0]);
  }
  if (err) {
    if (req->make_dir) rmdir(req->cwd);
    send_failed(req->id, errno_name(err), req->file, NULL, false);
    return;
  }
  bool watched = tell_reaper(pid);
  /* stderr is read here: the job's line goes with its exit; so is stdout with "stdout":false. */
  int last = req->no_stdout ? 0 : 1; /* the last handle passed */
  char *input = NULL;
  if (req->input && !req->no_stdin) {
    input = malloc(req->input_len ? req->input_len : 1);
    if (!input) kill(-pid, SIGKILL); /* reaped and reported as killed, like any job */
    else memcpy(input, req->input, req->input_len);
  }
  set_nonblock(pairs[2][0]);
  if (last == 0) set_nonblock(pairs[1][0]);
  bool added = add_job(pid, req->id, pairs[2][0], last == 0 ? pairs[1][0] : -1, req->spill);
  if (!added) {
    close(pairs[2][0]);
    if (last == 0) close(pairs[1][0]);
  }
  if (req->input && !req->no_stdin) {
    /* The job's stdin is written here: no handle for it. */
    if (added && input) {
      struct job *j = &jobs[njobs - 1];
      j->in_fd = pairs[0][0];
      j->in = input;
      j->in_len = req->input_len;
      set_nonblock(j->in_fd);
      write_input(j);
    } else {
      close(pairs[0][0]);
      free(input);
    }
    first = 1;
  }
  char tail[64];
  for (int n = first; n <= last; n++) {
    set_nonblock(pairs[n][0]);
    buf_str(&msg, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Socket\",\"msg\":{\"t\":\"fd\",\"id\":");
    buf_str(&msg, req->id);
    snprintf(tail, sizeof tail, ",\"n\":%d,\"pid\":%d%s}}", n, (int)pid, watched ? ",\"watched\":true" : "");
    buf_str(&msg, tail);
    send_line(&msg, pairs[n][0]);
  }
  if (first > last) {
    buf_str(&msg, "{\"t\":\"started\",\"id\":");
    buf_str(&msg, req->id);
    snprintf(tail, sizeof tail, ",\"pid\":%d%s}", (int)pid, watched ? ",\"watched\":true" : "");
    buf_str(&msg, tail);
    send_line(&msg, -1);
  }
}

/*
 * Removing job directories. rmdir(2) can block for a long time (half a millisecond on a
 * filesystem mounted with discard), so a thread of its own does it, batch after batch in
 * order, while the main loop goes on starting and reaping jobs; the main loop reports a
 * batch once it is done (rm_done, and the paths left).
 */
struct rm_batch {
  struct rm_batch *next;
  char rmn[MAX_ID];
  bool answer; /* report it even when nothing was left */
  size_t n;
  char **paths;
  bool *left;
};
static pthread_mutex_t rm_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rm_wake = PTHREAD_COND_INITIALIZER;
static struct rm_batch *rm_todo, *rm_todo_tail, *rm_finished, *rm_finished_tail;
/* Counts finished batches for the main loop's poll; -1: no thread, removals inline. */
static int rm_event = -1;

static void rm_batch_do(struct rm_batch *b) {
  for (size_t i = 0; i < b->n; i++) b->left[i] = rmdir(b->paths[i]) != 0 && errno != ENOENT;
}

static void append(struct rm_batch **head, struct rm_batch **tail, struct rm_batch *b) {
  b->next = NULL;
  if (*tail) (*tail)->next = b;
  else *head = b;
  *tail = b;
}

static void *remover(void *unused) {
  (void)unused;
  for (;;) {
    pthread_mutex_lock(&rm_lock);
    while (!rm_todo) pthread_cond_wait(&rm_wake, &rm_lock);
    struct rm_batch *b = rm_todo;
    rm_todo = b->next;
    if (!rm_todo) rm_todo_tail = NULL;
    pthread_mutex_unlock(&rm_lock);
    rm_batch_do(b);
    pthread_mutex_lock(&rm_lock);
    append(&rm_finished, &rm_finished_tail, b);
    pthread_mutex_unlock(&rm_lock);
    uint64_t one = 1;
    while (write(rm_event, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
  return NULL;
}

/* Reports a finished batch: its number is done; those left go back. */
static void rm_batch_report(struct rm_batch *b) {
  snprintf(rm_done, MAX_ID, "%s", b->rmn);
  bool any = false;
  for (size_t i = 0; i < b->n; i++) any = any || b->left[i];
  if (any || b->answer) {
    buf_str(&msg, "{\"t\":\"rm\",\"rmn\":");
    buf_str(&msg, rm_done);
    buf_str(&msg, ",\"left\":[");
    bool first = true;
    for (size_t i = 0; i < b->n; i++) {
      if (!b->left[i]) continue;
      if (!first) buf_str(&msg, ",");
      first = false;
      buf_json(&msg, b->paths[i]);
    }
    buf_str(&msg, "]}");
    send_line(&msg, -1);
  }
  free(b);
}

/* The main loop's part: reports every batch the thread finished. */
static void rm_collect(void) {
  uint64_t count;
  while (read(rm_event, &count, sizeof count) < 0 && errno == EINTR) {
  }
  pthread_mutex_lock(&rm_lock);
  struct rm_batch *b = rm_finished;
  rm_finished = rm_finished_tail = NULL;
  pthread_mutex_unlock(&rm_lock);
  while (b) {
    struct rm_batch *next = b->next;
    rm_batch_report(b);
    b = next;
  }
}

/* Hands a batch of job directories to the thread (copied: the request's strings live in
 * the line buffer); reports those left (always, when `answer`) once it is done. */
static void remove_dirs(struct request *req, bool answer) {
  if (!req->rmn[0]) return; /* not numbered: nothing could confirm it */
  size_t n = req->rm.n, text = 0;
  for (size_t i = 0; i < n; i++) text += strlen(req->rm.v[i]) + 1;
  struct rm_batch *b = malloc(sizeof *b + n * (sizeof(char *) + sizeof(bool)) + text);
  if (!b) orphaned();
  b->paths = (char **)(b + 1);
  b->left = (bool *)(b->paths + n);
  char *w = (char *)(b->left + n);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(req->rm.v[i]) + 1;
    memcpy(w, req->rm.v[i], len);
    b->paths[i] = w;
    w += len;
  }
  b->n = n;
  b->answer = answer;
  snprintf(b->rmn, MAX_ID, "%s", req->rmn);
  if (rm_event < 0) {
    rm_batch_do(b);
    rm_batch_report(b);
    return;
  }
  pthread_mutex_lock(&rm_lock);
  append(&rm_todo, &rm_todo_tail, b);
  pthread_cond_signal(&rm_wake);
  pthread_mutex_unlock(&rm_lock);
}

/* Starts the removal thread; without one (it cannot start), removals are done inline. */
static void start_remover(void) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return;
  rm_event = fd;
  pthread_attr_t attr;
  pthread_t thread;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&thread, &attr, remover, NULL) != 0) {
    close(fd);
    rm_event = -1;
  }
  pthread_attr_destroy(&attr);
}

/* Acts on one complete line from the channel. */
static void handle_line(char *line, size_t len) {
  struct request req = {0};
  if (!parse_request(line, len, &req)) {
    free(req.args.v);
    free(req.env.v);
    free(req.rm.v);
    return; /* not a JSON object: nothing to answer to */
  }
  if (req.cmd && !strcmp(req.cmd, "NODE_HANDLE_ACK")) handle_answered(true);
  else if (req.cmd && !strcmp(req.cmd, "NODE_HANDLE_NACK")) handle_answered(false);
  else if (req.t && !strcmp(req.t, "spawn") && req.id[0]) {
    if (!req.invalid && (!req.file || !*req.file)) req.invalid = "file";
    if (!req.invalid && !req.cwd) req.invalid = "cwd";
    if (!req.invalid && req.args.n == 0 && !strv_push(&req.args, NULL)) req.invalid = "args"; /* argv[0] only */
    if (req.invalid) {
      char why[96];
      snprintf(why, sizeof why, "invalid spawn request: bad or missing field \"%s\"", req.invalid);
      send_failed(req.id, "EINVAL", "", why, false);
    } else {
      spawn_job(&req);
    }
    remove_dirs(&req, false); /* after the job started: removals never delay it */
  } else if (req.t && !strcmp(req.t, "rm")) {
    remove_dirs(&req, true);
  } else if (req.t && !strcmp(req.t, "drop") && req.id[0]) {
    for (size_t i = 0; i < njobs; i++)
      if (jobs[i].reaped && !strcmp(jobs[i].id, req.id)) {
        remove_job(i);
        break;
      }
  }
  free(req.args.v);
  free(req.env.v);
  free(req.rm.v);
}

/* ------------------------------------------------------------------ reaping ------------- */

/* Node's names of the signals a process can die of (os.constants.signals on Linux). */
static const char *signal_name(int sig, char *other, size_t size) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
#ifdef SIGSTKFLT
    case SIGSTKFLT: return "SIGSTKFLT";
#endif
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGWINCH: return "SIGWINCH";
    case SIGIO: return "SIGIO";
#ifdef SIGPWR
    case SIGPWR: return "SIGPWR";
#endif
    case SIGSYS: return "SIGSYS";
    default:
      /* A real-time signal: Node has no name for it; the number still tells what happened. */
      snprintf(other, size, "SIG%d", sig);
      return other;
  }
}

/* Reports the job reaped (with its stderr line and stdout read here, or "open" while either
 * is held open elsewhere), or their end after such an exit; forgets a job that is done. */
static void report(size_t i, int status) {
  struct job *j = &jobs[i];
  if (!j->reaped) {
    j->reaped = true;
    input_done(j); /* nobody of the job's is left to read it */
    read_pipes(j);
    buf_str(&msg, "{\"t\":\"exit\",\"id\":");
    buf_str(&msg, j->id);
    char tail[64], other[16];
    if (WIFSIGNALED(status)) snprintf(tail, sizeof tail, ",\"code\":null,\"signal\":\"%s\"", signal_name(WTERMSIG(status), other, sizeof other));
    else snprintf(tail, sizeof tail, ",\"code\":%d,\"signal\":null", WEXITSTATUS(status));
    buf_str(&msg, tail);
    buf_err(&msg, j);
    buf_out(&msg, j);
    if (pipes_open(j)) buf_str(&msg, ",\"open\":true");
    if (rm_done[0]) {
      buf_str(&msg, ",\"rmn\":");
      buf_str(&msg, rm_done);
    }
    buf_str(&msg, "}");
    send_line(&msg, -1);
    if (!pipes_open(j)) remove_job(i);
  } else if (!pipes_open(j)) {
    buf_str(&msg, "{\"t\":\"stderr\",\"id\":");
    buf_str(&msg, j->id);
    buf_err(&msg, j);
    buf_out(&msg, j);
    buf_str(&msg, "}");
    send_line(&msg, -1);
    remove_job(i);
  }
}

/* Reaps every exited job and reports it. */
static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (size_t i = 0; i < njobs; i++)
      if (!jobs[i].reaped && jobs[i].pid == pid) {
        report(i, status);
        break;
      }
  }
}

/* ------------------------------------------------------------------ main loop ----------- */

/* Reads what the channel has; handles each complete line. */
static char *in;
static size_t in_len, in_cap;
/* Inside a line longer than MAX_LINE: drop bytes up to its end. */
static bool skipping;

/* The id of a line too long to parse, if its first bytes name one ({"t":"spawn","id":N,...}). */
static void answer_too_long(const char *line, size_t len) {
  const char *p = memmem(line, len < 256 ? len : 256, "\"id\":", 5);
  if (!p) return;
  p += 5;
  size_t n = 0;
  while (n < MAX_ID - 1 && p + n < line + len && p[n] >= '0' && p[n] <= '9') n++;
  if (n == 0 || n == MAX_ID - 1) return;
  char id[MAX_ID];
  memcpy(id, p, n);
  id[n] = '\0';
  char why[96];
  snprintf(why, sizeof why, "the spawn request is longer than %u bytes", MAX_LINE);
  send_failed(id, "E2BIG", "", why, false);
}

static void read_channel(void) {
  if (in_cap - in_len < 65536) {
    size_t cap = in_cap ? in_cap * 2 : 131072;
    char *grown = realloc(in, cap);
    if (!grown) orphaned();
    in = grown;
    in_cap = cap;
  }
  ssize_t n = read(channel, in + in_len, in_cap - in_len);
  if (n == 0) orphaned();
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return;
    orphaned();
  }
  size_t scanned = in_len;
  in_len += (size_t)n;
  size_t start = 0;
  for (char *nl; (nl = memchr(in + scanned, '\n', in_len - scanned)); scanned = (size_t)(nl - in) + 1) {
    size_t end = (size_t)(nl - in);
    /* One read can bring the end of a line whose start was short enough to keep. */
    if (skipping) skipping = false;
    else if (end - start > MAX_LINE) answer_too_long(in + start, end - start);
    else handle_line(in + start, end - start);
    start = end + 1;
  }
  memmove(in, in + start, in_len - start);
  in_len -= start;
  if (in_len > MAX_LINE) {
    if (!skipping) answer_too_long(in, in_len);
    skipping = true;
    in_len = 0;
  }
  /* A buffer grown for one long line shrinks back once it is handled. */
  if (in_len == 0 && in_cap > 1u << 20) {
    free(in);
    in = NULL;
    in_cap = 0;
  }
}

int main(int argc, char **argv) {
  /* The execserver asks once whether this binary runs here at all (one built for another
   * machine may not); only then does it start jobs through it. */
  if (argc == 2 && !strcmp(argv[1], "--check")) {
    puts(LAUNCHER_NAME " ok " PROTOCOL);
    return 0;
  }
  prctl(PR_SET_NAME, LAUNCHER_NAME, 0, 0, 0); /* ps shows "slotbroker-job-" (15 chars) */
  const char *fd_text = getenv("NODE_CHANNEL_FD");
  char *end = NULL;
  long fd = fd_text ? strtol(fd_text, &end, 10) : -1;
  if (!fd_text || *end || fd < 3 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0) {
    fprintf(stderr, "%s: no IPC channel (NODE_CHANNEL_FD); it is started by the execserver\n", LAUNCHER_NAME);
    return 2;
  }
  channel = (int)fd;
  const char *reaper_text = getenv("SLOTBROKER_REAPER_FD");
  if (reaper_text) {
    long r = strtol(reaper_text, &end, 10);
    if (!*end && r >= 3 && r <= INT_MAX && r != fd && fcntl((int)r, F_GETFD) >= 0) reaper = (int)r;
    if (reaper >= 0) set_nonblock(reaper); /* a reaper that is behind never holds up a job */
  }
  if (getenv("NODE_CHANNEL_SERIALIZATION_MODE") && strcmp(getenv("NODE_CHANNEL_SERIALIZATION_MODE"), "json") != 0) {
    fprintf(stderr, "%s: the IPC channel must use JSON serialization\n", LAUNCHER_NAME);
    return 2;
  }
  /* Nothing of the launcher's own leaks into a job: the channel, stdin and any descriptor
   * inherited from further up (not marked close-on-exec there) close at exec. */
  fcntl(0, F_SETFD, FD_CLOEXEC);
  if (close_range(3, ~0u, CLOSE_RANGE_CLOEXEC) != 0)
    for (int f = 3; f < 1024; f++) fcntl(f, F_SETFD, FD_CLOEXEC); /* kernels before 5.11 */

  /* A hang-up or Ctrl-C of the execserver's group must not kill the launcher before its
   * jobs: it sees the execserver go (stdin EOF) and kills them. Writes to a dead channel
   * fail with EPIPE instead of a signal. */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd < 0) {
    perror(LAUNCHER_NAME ": signalfd");
    return 2;
  }

  /* Every job: a session and process group of its own (Node's detached: true), no blocked
   * signals and every signal at its default, as libuv starts a child. */
  posix_spawnattr_init(&spawn_attr);
  posix_spawnattr_setflags(&spawn_attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&spawn_attr, &none);
  posix_spawnattr_setsigdefault(&spawn_attr, &all);
  /* After SIGCHLD was blocked: the thread inherits the mask, so signalfd sees every one. */
  start_remover();

  struct pollfd *fds = NULL;
  size_t fds_cap = 0;
  for (;;) {
    /* stdin, the channel, SIGCHLD, finished removals, then each job's pipes still open here. */
    if (fds_cap < 4 + 3 * njobs) {
      fds_cap = 4 + 3 * jobs_cap;
      fds = realloc(fds, fds_cap * sizeof *fds);
      if (!fds) orphaned();
    }
    fds[0] = (struct pollfd){.fd = 0, .events = POLLIN};
    fds[1] = (struct pollfd){.fd = channel, .events = POLLIN};
    fds[2] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    fds[3] = (struct pollfd){.fd = rm_event, .events = POLLIN}; /* -1: ignored by poll */
    nfds_t nfds = 4;
    for (size_t i = 0; i < njobs; i++) {
      if (jobs[i].err_fd >= 0) fds[nfds++] = (struct pollfd){.fd = jobs[i].err_fd, .events = POLLIN};
      if (jobs[i].out_fd >= 0) fds[nfds++] = (struct pollfd){.fd = jobs[i].out_fd, .events = POLLIN};
      if (jobs[i].in_fd >= 0) fds[nfds++] = (struct pollfd){.fd = jobs[i].in_fd, .events = POLLOUT};
    }
    if (poll(fds, nfds, -1) < 0) {
      if (errno == EINTR) continue;
      orphaned();
    }
    for (nfds_t k = 4; k < nfds; k++) {
      if (!fds[k].revents) continue;
      for (size_t i = 0; i < njobs; i++)
        if (jobs[i].in_fd == fds[k].fd) {
          write_input(&jobs[i]);
          break;
        } else if (jobs[i].err_fd == fds[k].fd || jobs[i].out_fd == fds[k].fd) {
          read_pipes(&jobs[i]);
          if (jobs[i].reaped && !pipes_open(&jobs[i])) report(i, 0);
          break;
        }
    }
    if (fds[2].revents) {
      struct signalfd_siginfo info;
      while (read(sigfd, &info, sizeof info) == sizeof info) {
      }
      reap();
    }
    if (fds[3].revents) rm_collect();
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) read_channel();
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char scratch[4096];
      ssize_t n = read(0, scratch, sizeof scratch);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) orphaned();
    }
  }
}
