// `mammoth launch`: start a mammoth command on several machines through Open MPI's mpirun,
// after checking every host, in the spirit of DeepSpeed's `deepspeed --hostfile`.
//
//   mammoth launch --hostfile FILE [--nproc-per-node N] [--include H1@H2 | --exclude H3]
//                  [--master-addr ADDR] [--ssh CMD] [--btl LIST] [--port-base P --port-range N]
//                  -- train --dp 4 ...
//
// Hostfile lines (comments from '#', blank lines ignored), DeepSpeed's and Open MPI's forms:
//   node1 slots=4            DeepSpeed (and Open MPI)
//   node2 slots=4 max_slots=8  Open MPI
//   node3                    Open MPI: one slot here (Open MPI would count cores; we do not guess)
// --nproc-per-node N starts N ranks on every selected host instead of its slots (never more
// than max_slots). --include/--exclude select whole hosts joined by '@' (DeepSpeed's syntax
// without its slot lists: "node1:0,1" is refused, since per-host device lists need a per-host
// CUDA_VISIBLE_DEVICES that one mpirun line cannot give).
//
// Before anything starts, for every host, through the same remote shell mpirun will use
// (--ssh, mpirun's plm_rsh_agent): it answers (`CMD HOST true` within --check-timeout seconds),
// it has this very binary at this path (sha256sum), and the TCP ports MPI's tcp transport
// will listen on (--port-base .. + --port-range) are free there (`mammoth launch --probe-ports`
// on the host). The first failure is reported by host name and nothing is started.
//
// --master-addr ADDR: this machine's address on the network the job should use; launch finds
// the local interface holding it and restricts Open MPI's out-of-band and tcp traffic to that
// subnet (oob_tcp_if_include / btl_tcp_if_include). The job forwards MAMMOTH_*, NCCL_* and
// CUDA_VISIBLE_DEVICES (mpirun -x), prints the mpirun line it runs, and exits with mpirun's
// status: the first failing rank's exit code.
//
// --np N instead of --hostfile: N ranks on this machine, no host checks (nothing is remote).
//
// --elastic [--max-restarts K] [--min-ranks M]: when the job fails, restart it from the latest
// checkpoint of the command's --save-dir with the ranks that are left, at most K times. The
// failed rank is the one mpirun names as the cause ("mpirun noticed that process rank R ...
// exited on signal", or "Process name: [[J,S],R] Exit code: C"): mpirun reports the first rank
// that died or exited non-zero and kills the others, so exactly one rank is taken as failed per
// attempt; a failure in which mpirun names no rank is not restarted. Its slot leaves the world
// (its host's slots shrink by one; ranks map to hosts in hostfile order, slots each, as
// mpirun's default by-slot mapping places them). The layout keeps --tp, --pp and --sp and
// shrinks dp to what the ranks left hold (idle ranks beyond dp * tp * pp * sp are dropped),
// refused by name below --min-ranks or below one model replica. The restart runs the same
// command with --dp rewritten (when given) and --resume added; checkpoints reshard on load.
// Micro-batch and accumulation stay, so the global batch shrinks with dp, as a hand resume at
// that size does. MAMMOTH_FAULT (test-only fault injection) is forwarded to the first attempt
// only: an injected fault models one failure, not a rank that fails on every start.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "engine/train/checkpoint.h"
#include "tools/command.h"
#include "tools/plan_flags.h"

ABSL_FLAG(std::string, hostfile, "", "launch: hosts, one per line (`host slots=N [max_slots=M]`)");
ABSL_FLAG(int, nproc_per_node, 0, "launch: ranks per host (0: each host's slots)");
ABSL_FLAG(std::string, include, "", "launch: only these hosts, joined by '@' (host1@host2)");
ABSL_FLAG(std::string, exclude, "", "launch: all hosts but these, joined by '@'");
ABSL_FLAG(std::string, master_addr, "",
          "launch: this machine's address on the job's network (restricts MPI to its subnet)");
ABSL_FLAG(std::string, ssh, "ssh -o BatchMode=yes -o ConnectTimeout=10",
          "launch: remote shell for the checks and mpirun's plm_rsh_agent");
ABSL_FLAG(std::string, btl, "tcp,vader,self", "launch: Open MPI byte transfer layers (--mca btl)");
ABSL_FLAG(int, port_base, 29500, "launch: first TCP port of MPI's tcp transport on every host");
ABSL_FLAG(int, port_range, 32, "launch: TCP ports from --port-base that MPI may listen on");
ABSL_FLAG(double, check_timeout, 15.0, "launch: seconds each host check may take");
// train's, for the defaults of a command that does not give them.
ABSL_DECLARE_FLAG(int64_t, micro_batch);
ABSL_DECLARE_FLAG(int64_t, grad_accum);
ABSL_FLAG(int, np, 0, "launch: ranks on this machine only, instead of --hostfile (no host checks)");
ABSL_FLAG(bool, elastic, false,
          "launch: on a failure, restart from the latest checkpoint with the ranks left");
ABSL_FLAG(int, max_restarts, 3, "launch --elastic: restarts at most");
ABSL_FLAG(int, min_ranks, 1, "launch --elastic: fewest ranks a restart may run with");
ABSL_FLAG(std::string, probe_ports, "",
          "launch (internal, run on each host by the checks): exit 1 unless ports P:N are free");

namespace mammoth::tools {
namespace {

struct Host {
  std::string name;
  int slots = 1;
  int max_slots = 0;  // 0: no limit given
  int line = 0;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

int parse_count(const std::string& value, const std::string& what) {
  size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  MAMMOTH_CHECK(used == value.size() && n >= 1)
      << "[launch] " << what << ": '" << value << "' is not a positive integer";
  return n;
}

std::vector<Host> parse_hostfile(const std::string& path) {
  std::ifstream in(path);
  MAMMOTH_CHECK(in.good()) << "[launch] cannot read --hostfile " << path;
  std::vector<Host> hosts;
  std::set<std::string> seen;
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    const std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    Host h;
    h.line = number;
    words >> h.name;
    const std::string where = path + ":" + std::to_string(number);
    std::string word;
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      MAMMOTH_CHECK(eq != std::string::npos && (key == "slots" || key == "max_slots"))
          << "[launch] " << where << ": '" << word
          << "' is not slots=N or max_slots=N (the hostfile forms of DeepSpeed and Open MPI)";
      (key == "slots" ? h.slots : h.max_slots) = parse_count(word.substr(eq + 1), where);
    }
    MAMMOTH_CHECK(h.max_slots == 0 || h.slots <= h.max_slots)
        << "[launch] " << where << ": slots=" << h.slots << " exceeds max_slots=" << h.max_slots;
    MAMMOTH_CHECK(seen.insert(h.name).second)
        << "[launch] " << where << ": host " << h.name << " is listed twice";
    hosts.push_back(h);
  }
  MAMMOTH_CHECK(!hosts.empty()) << "[launch] --hostfile " << path << " lists no host";
  return hosts;
}

// "host1@host2" -> its hosts; DeepSpeed's slot lists ("host1:0,1") are refused by name.
std::set<std::string> host_list(const std::string& spec, const char* flag,
                                const std::vector<Host>& hosts) {
  std::set<std::string> out;
  std::stringstream ss(spec);
  std::string name;
  while (std::getline(ss, name, '@')) {
    MAMMOTH_CHECK(name.find(':') == std::string::npos)
        << "[launch] --" << flag << " " << spec << ": slot lists ('" << name
        << "') are not supported, only whole hosts joined by '@'";
    bool known = false;
    for (const Host& h : hosts) known = known || h.name == name;
    MAMMOTH_CHECK(known) << "[launch] --" << flag << " names host '" << name
                         << "', which the hostfile does not list";
    out.insert(name);
  }
  return out;
}

// Single quotes for a POSIX shell.
std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-+=/.,:@%") == std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command line, returns (exit status, stdout and stderr together).
std::pair<int, std::string> run_shell(const std::string& command) {
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  MAMMOTH_CHECK(p != nullptr) << "[launch] cannot run " << command << ": " << std::strerror(errno);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), trim(out)};
}

// `SSH HOST command` under timeout(1), so a host that hangs is a failed check too.
std::pair<int, std::string> on_host(const Host& h, const std::string& command) {
  char limit[32];
  std::snprintf(limit, sizeof(limit), "%g", absl::GetFlag(FLAGS_check_timeout));
  return run_shell("timeout " + std::string(limit) + " " + absl::GetFlag(FLAGS_ssh) + " " +
                   quote(h.name) + " " + quote(command));
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  MAMMOTH_CHECK(n > 0) << "[launch] cannot read /proc/self/exe: " << std::strerror(errno);
  return std::string(buf, static_cast<size_t>(n));
}

std::string first_word(const std::string& s) { return s.substr(0, s.find_first_of(" \t\n")); }

std::string host_text(const Host& h) {
  return "host " + h.name + " (hostfile line " + std::to_string(h.line) + ")";
}

// Reachable, the same binary, free ports: the first failure throws, naming the host.
void check_host(const Host& h, const std::string& binary, const std::string& hash) {
  const auto [rc, out] = on_host(h, "true");
  MAMMOTH_CHECK(rc == 0) << "[launch] " << host_text(h) << " is unreachable through '"
                         << absl::GetFlag(FLAGS_ssh) << "' (exit " << rc
                         << (out.empty() ? "" : ": " + out) << "); nothing was started";
  const auto [hrc, hout] = on_host(h, "sha256sum " + quote(binary));
  MAMMOTH_CHECK(hrc == 0) << "[launch] " << host_text(h) << " has no " << binary << " (" << hout
                          << "); install the same build at the same path there";
  MAMMOTH_CHECK(first_word(hout) == hash)
      << "[launch] " << host_text(h) << " has a different " << binary << " (sha256 "
      << first_word(hout) << ", here " << hash << "); all hosts must run the same build";
  const std::string ports = std::to_string(absl::GetFlag(FLAGS_port_base)) + ":" +
                            std::to_string(absl::GetFlag(FLAGS_port_range)) + ":" +
                            std::to_string(h.slots);
  const auto [prc, pout] = on_host(h, quote(binary) + " launch --probe-ports " + ports);
  MAMMOTH_CHECK(prc == 0) << "[launch] " << host_text(h) << ": " << pout
                          << "; choose other ports with --port-base / --port-range";
}

// Exit 0 when at least K ports of "P:N:K" (N ports from P) can be bound here, as Open MPI's
// tcp transport binds them (one listener per rank, the first free port of the range; no
// SO_REUSEADDR, so a port a finished job left in TIME_WAIT counts as busy, as it is for MPI).
int probe_ports(const std::string& spec) {
  std::vector<int> v;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, ':');)
    v.push_back(parse_count(part, "--probe-ports"));
  MAMMOTH_CHECK(v.size() == 3) << "[launch] --probe-ports wants P:N:K, got " << spec;
  const int base = v[0], range = v[1], needed = v[2];
  int free = 0;
  std::string busy;
  for (int port = base; port < base + range; ++port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    MAMMOTH_CHECK(fd >= 0) << "[launch] socket: " << std::strerror(errno);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (ok) {
      ++free;
    } else if (busy.size() < 80) {
      busy += (busy.empty() ? "" : ", ") + std::to_string(port);
    }
  }
  if (free < needed) {
    std::printf("%d of TCP ports %d..%d are free, %d rank%s need%s one each (in use: %s)\n", free,
                base, base + range - 1, needed, needed == 1 ? "" : "s", needed == 1 ? "s" : "",
                busy.c_str());
    return 1;
  }
  std::printf("%d of TCP ports %d..%d are free\n", free, base, base + range - 1);
  return 0;
}

// The subnet ("10.0.0.0/24") of the local interface holding `addr`.
std::string local_subnet(const std::string& addr) {
  in_addr want{};
  MAMMOTH_CHECK(::inet_pton(AF_INET, addr.c_str(), &want) == 1)
      << "[launch] --master-addr " << addr << " is not an IPv4 address";
  ifaddrs* list = nullptr;
  MAMMOTH_CHECK(::getifaddrs(&list) == 0) << "[launch] getifaddrs: " << std::strerror(errno);
  std::string found, mine;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    const in_addr m = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &a, text, sizeof(text));
    mine += (mine.empty() ? "" : ", ") + std::string(text);
    if (a.s_addr != want.s_addr || !found.empty()) continue;
    const in_addr net{a.s_addr & m.s_addr};
    ::inet_ntop(AF_INET, &net, text, sizeof(text));
    found = std::string(text) + "/" + std::to_string(__builtin_popcount(m.s_addr));
  }
  ::freeifaddrs(list);
  MAMMOTH_CHECK(!found.empty()) << "[launch] --master-addr " << addr
                                << " is not an address of this machine (it has " << mine << ")";
  return found;
}

// The command's flags that an elastic restart reads or rewrites (after `--`).
struct CommandLayout {
  int dp = 0;  // 0: not given (train derives it from the world)
  int tp = 1, pp = 1, sp = 1;
  int64_t micro_batch = 0, grad_accum = 0;
  std::string save_dir;
};

// The value of --NAME in `args` ("--name V", "--name=V", hyphens or underscores), or nullopt.
std::optional<std::string> command_flag(const std::vector<std::string>& args,
                                        const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string a = normalize_flag(args[i]);
    if (a == "--" + name && i + 1 < args.size()) return args[i + 1];
    if (a.rfind("--" + name + "=", 0) == 0) return a.substr(name.size() + 3);
  }
  return std::nullopt;
}

CommandLayout command_layout(const std::vector<std::string>& args) {
  for (const char* name : {"plan", "config"}) {
    MAMMOTH_CHECK(!command_flag(args, name))
        << "[launch] --elastic resizes the layout given by the command's --dp/--tp/--pp/--sp; "
           "it cannot rewrite a --"
        << name << " file: give the layout and --save-dir as flags";
  }
  CommandLayout l;
  auto count = [&args](const char* name, int fallback) {
    const std::optional<std::string> v = command_flag(args, name);
    return v ? parse_count(*v, std::string("the command's --") + name) : fallback;
  };
  l.dp = count("dp", 0);
  l.tp = count("tp", 1);
  l.pp = count("pp", 1);
  l.sp = count("sp", 1);
  l.micro_batch = count("micro_batch", static_cast<int>(absl::GetFlag(FLAGS_micro_batch)));
  l.grad_accum = count("grad_accum", static_cast<int>(absl::GetFlag(FLAGS_grad_accum)));
  l.save_dir = command_flag(args, "save_dir").value_or("");
  MAMMOTH_CHECK(!l.save_dir.empty())
      << "[launch] --elastic restarts from the command's checkpoints: give it --save-dir DIR "
         "(and --save-every N, or nothing survives a failure)";
  return l;
}

// `args` with --NAME set to `value` (replaced where given, else appended).
std::vector<std::string> with_flag(const std::vector<std::string>& args, const std::string& name,
                                   const std::string& value) {
  std::vector<std::string> out;
  bool set = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string a = normalize_flag(args[i]);
    if (a == "--" + name && i + 1 < args.size()) {
      out.insert(out.end(), {args[i], value});
      ++i;
      set = true;
    } else if (a.rfind("--" + name + "=", 0) == 0) {
      out.push_back(args[i].substr(0, args[i].find('=') + 1) + value);
      set = true;
    } else {
      out.push_back(args[i]);
    }
  }
  if (!set) {
    std::string flag = name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    out.insert(out.end(), {"--" + flag, value});
  }
  return out;
}

// The restart's command: the layout's --dp (when the command gave one) and --grad-accum,
// and --resume.
std::vector<std::string> restart_args(const std::vector<std::string>& args, const CommandLayout& l,
                                      int dp, int64_t grad_accum) {
  std::vector<std::string> out = with_flag(args, "grad_accum", std::to_string(grad_accum));
  if (l.dp > 0) out = with_flag(out, "dp", std::to_string(dp));
  bool resume = false;
  for (const std::string& arg : out) {
    const std::string a = normalize_flag(arg);
    resume = resume || a == "--resume" || a == "--resume=true";
    MAMMOTH_CHECK(a != "--resume=false" && a != "--noresume")
        << "[launch] --elastic restarts with --resume; the command says " << arg;
  }
  if (!resume) out.push_back("--resume");
  return out;
}

struct Attempt {
  int code = 0;
  int failed_rank = -1;  // the rank mpirun named as the cause, -1: none named
  std::string why;       // mpirun's words for it
};

// mpirun's report of the rank that ended the job, from one line of its stderr.
void scan_mpirun_line(const std::string& line, Attempt& a, bool& want_exit_code) {
  if (a.failed_rank >= 0 && !want_exit_code) return;
  int rank = -1;
  const size_t noticed = line.find("noticed that process rank ");
  if (noticed != std::string::npos &&
      std::sscanf(line.c_str() + noticed, "noticed that process rank %d", &rank) == 1) {
    a.failed_rank = rank;
    const size_t on = line.find(" exited on ");
    a.why = on == std::string::npos ? "died" : trim(line.substr(on + 1));
    while (!a.why.empty() && a.why.back() == '.') a.why.pop_back();
    return;
  }
  int job = 0, step = 0;
  const size_t name = line.find("Process name: [[");
  if (a.failed_rank < 0 && name != std::string::npos &&
      std::sscanf(line.c_str() + name, "Process name: [[%d,%d],%d]", &job, &step, &rank) == 3) {
    a.failed_rank = rank;
    a.why = "exited non-zero";
    want_exit_code = true;
    return;
  }
  const size_t code = line.find("Exit code:");
  if (want_exit_code && code != std::string::npos) {
    a.why = "exited with status " + trim(line.substr(code + 10));
    want_exit_code = false;
  }
}

// Runs the mpirun line; its stderr (the ranks' too) passes through and is scanned for the rank
// mpirun names as the cause of a failure.
Attempt run_mpirun(std::vector<std::string> cmd) {
  int fds[2];
  MAMMOTH_CHECK(::pipe(fds) == 0) << "[launch] pipe: " << std::strerror(errno);
  const pid_t pid = ::fork();
  MAMMOTH_CHECK(pid >= 0) << "[launch] fork: " << std::strerror(errno);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    for (std::string& a : cmd) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "[launch] cannot run mpirun: %s\n", std::strerror(errno));
    std::_Exit(127);
  }
  ::close(fds[1]);
  Attempt a;
  bool want_exit_code = false;
  std::FILE* in = ::fdopen(fds[0], "r");
  MAMMOTH_CHECK(in != nullptr) << "[launch] fdopen: " << std::strerror(errno);
  char* buf = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = ::getline(&buf, &cap, in)) > 0) {
    std::fwrite(buf, 1, static_cast<size_t>(n), stderr);
    std::fflush(stderr);
    scan_mpirun_line(std::string(buf, static_cast<size_t>(n)), a, want_exit_code);
  }
  std::free(buf);
  std::fclose(in);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  a.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return a;
}

// The host (index into `hosts`) of `rank` under mpirun's by-slot mapping.
size_t host_of_rank(const std::vector<Host>& hosts, int rank) {
  int first = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (rank < first + hosts[i].slots) return i;
    first += hosts[i].slots;
  }
  MAMMOTH_THROW() << "[launch] mpirun named rank " << rank << ", beyond the " << first
                  << " ranks started";
}

int world_of(const std::vector<Host>& hosts) {
  int world = 0;
  for (const Host& h : hosts) world += h.slots;
  return world;
}

struct Resized {
  int dp = 0;
  int64_t grad_accum = 0;
};

// Drops `rank`'s slot and picks the largest dp the ranks left hold (tp * pp * sp ranks per
// model replica) that keeps the global batch with the same micro-batch (train refuses to
// resume a checkpoint under another global batch); the slots beyond it leave too, the last
// hosts' first.
Resized shrink_world(std::vector<Host>& hosts, int rank, int world, const CommandLayout& l) {
  Host& failed = hosts[host_of_rank(hosts, rank)];
  --failed.slots;
  const int replica = l.tp * l.pp * l.sp;
  const int left = world_of(hosts);
  const int64_t global = (l.dp > 0 ? l.dp : world / replica) * l.micro_batch * l.grad_accum;
  Resized r;
  for (int dp = left / replica; dp >= 1 && r.dp == 0; --dp) {
    if (global % (dp * l.micro_batch) == 0) r = {dp, global / (dp * l.micro_batch)};
  }
  MAMMOTH_CHECK(r.dp >= 1) << "[launch] --elastic: " << left << " rank" << (left == 1 ? "" : "s")
                           << " left, fewer than one model replica (tp " << l.tp << " x pp " << l.pp
                           << " x sp " << l.sp << " = " << replica << "); not restarting";
  MAMMOTH_CHECK(r.dp * replica >= absl::GetFlag(FLAGS_min_ranks))
      << "[launch] --elastic: " << left << " ranks left; the largest layout that keeps the "
      << "global batch " << global << " at micro-batch " << l.micro_batch << " is dp " << r.dp
      << " x " << replica << " = " << r.dp * replica << " ranks, fewer than --min-ranks "
      << absl::GetFlag(FLAGS_min_ranks) << "; not restarting";
  for (int extra = left - r.dp * replica; extra > 0; --extra) {
    auto h = std::find_if(hosts.rbegin(), hosts.rend(), [](const Host& x) { return x.slots > 0; });
    --h->slots;
  }
  hosts.erase(
      std::remove_if(hosts.begin(), hosts.end(), [](const Host& h) { return h.slots == 0; }),
      hosts.end());
  return r;
}

// The mpirun line for `hosts` running `args`.
std::vector<std::string> mpirun_line(const std::vector<Host>& hosts, const std::string& subnet,
                                     const std::string& binary,
                                     const std::vector<std::string>& args) {
  std::string host_arg;
  for (const Host& h : hosts)
    host_arg += (host_arg.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  std::vector<std::string> cmd = {"mpirun"};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  auto mca = [&cmd](const std::string& key, const std::string& value) {
    cmd.insert(cmd.end(), {"--mca", key, value});
  };
  if (absl::GetFlag(FLAGS_np) == 0) mca("plm_rsh_agent", absl::GetFlag(FLAGS_ssh));
  mca("btl", absl::GetFlag(FLAGS_btl));
  mca("btl_tcp_port_min_v4", std::to_string(absl::GetFlag(FLAGS_port_base)));
  mca("btl_tcp_port_range_v4", std::to_string(absl::GetFlag(FLAGS_port_range)));
  if (!subnet.empty()) {
    mca("oob_tcp_if_include", subnet);
    mca("btl_tcp_if_include", subnet);
  }
  // mammoth sizes its own thread pool; Open MPI's default core binding would squeeze it.
  cmd.insert(cmd.end(),
             {"--bind-to", "none", "-H", host_arg, "-np", std::to_string(world_of(hosts))});
  std::vector<std::string> forwarded;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var(*e);
    const std::string name = var.substr(0, var.find('='));
    if (name.rfind("MAMMOTH_", 0) == 0 || name.rfind("NCCL_", 0) == 0 ||
        name == "CUDA_VISIBLE_DEVICES")
      forwarded.push_back(name);
  }
  std::sort(forwarded.begin(), forwarded.end());
  for (const std::string& name : forwarded) cmd.insert(cmd.end(), {"-x", name});
  cmd.push_back(binary);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

int run_launch(const std::vector<std::string>& args) {
  if (!absl::GetFlag(FLAGS_probe_ports).empty())
    return probe_ports(absl::GetFlag(FLAGS_probe_ports));
  MAMMOTH_CHECK(!args.empty())
      << "[launch] usage: mammoth launch (--hostfile FILE [--nproc-per-node N] "
         "[--include H1@H2 | --exclude H] [--master-addr ADDR] | --np N) "
         "[--elastic [--max-restarts K] [--min-ranks M]] -- COMMAND [ARGS...]";
  const std::string hostfile = absl::GetFlag(FLAGS_hostfile);
  const int np = absl::GetFlag(FLAGS_np);
  MAMMOTH_CHECK(hostfile.empty() != (np == 0))
      << "[launch] needs --hostfile FILE or --np N (ranks on this machine), one of them";
  MAMMOTH_CHECK(np >= 0) << "[launch] --np " << np << " is negative";
  const bool elastic = absl::GetFlag(FLAGS_elastic);
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_max_restarts) >= 0 && absl::GetFlag(FLAGS_min_ranks) >= 1)
      << "[launch] --max-restarts " << absl::GetFlag(FLAGS_max_restarts) << " --min-ranks "
      << absl::GetFlag(FLAGS_min_ranks) << ": want a count >= 0 and one >= 1";
  const CommandLayout layout = elastic ? command_layout(args) : CommandLayout{};
  std::vector<Host> hosts;
  std::string subnet;
  const std::string binary = self_path();
  if (np > 0) {
    for (const char* flag : {"nproc_per_node", "include", "exclude", "master_addr"}) {
      MAMMOTH_CHECK(!flag_changed(flag))
          << "[launch] --" << flag << " selects hosts of a --hostfile; --np runs on this machine";
    }
    hosts.push_back({.name = "localhost", .slots = np});
  } else {
    hosts = parse_hostfile(hostfile);
    const std::string include = absl::GetFlag(FLAGS_include);
    const std::string exclude = absl::GetFlag(FLAGS_exclude);
    MAMMOTH_CHECK(include.empty() || exclude.empty())
        << "[launch] give --include or --exclude, not both";
    if (!include.empty() || !exclude.empty()) {
      const std::set<std::string> named = host_list(include.empty() ? exclude : include,
                                                    include.empty() ? "exclude" : "include", hosts);
      std::vector<Host> kept;
      for (const Host& h : hosts) {
        if (named.count(h.name) == (include.empty() ? 0u : 1u)) kept.push_back(h);
      }
      hosts = kept;
      MAMMOTH_CHECK(!hosts.empty()) << "[launch] --exclude " << exclude << " leaves no host";
    }
    const int per_node = absl::GetFlag(FLAGS_nproc_per_node);
    MAMMOTH_CHECK(per_node >= 0) << "[launch] --nproc-per-node " << per_node << " is negative";
    for (Host& h : hosts) {
      if (per_node > 0) {
        MAMMOTH_CHECK(h.max_slots == 0 || per_node <= h.max_slots)
            << "[launch] --nproc-per-node " << per_node << " exceeds " << host_text(h)
            << "'s max_slots=" << h.max_slots;
        h.slots = per_node;
      }
    }
    MAMMOTH_CHECK(absl::GetFlag(FLAGS_port_base) > 0 && absl::GetFlag(FLAGS_port_range) > 0 &&
                  absl::GetFlag(FLAGS_port_base) + absl::GetFlag(FLAGS_port_range) <= 65536)
        << "[launch] --port-base " << absl::GetFlag(FLAGS_port_base) << " --port-range "
        << absl::GetFlag(FLAGS_port_range) << " is not a range of TCP ports";
    if (!absl::GetFlag(FLAGS_master_addr).empty())
      subnet = local_subnet(absl::GetFlag(FLAGS_master_addr));
    const auto [rc, out] = run_shell("sha256sum " + quote(binary));
    MAMMOTH_CHECK(rc == 0) << "[launch] sha256sum " << binary << " failed: " << out;
    const std::string hash = first_word(out);
    for (const Host& h : hosts) {
      check_host(h, binary, hash);
      std::fprintf(stderr, "[launch] %s: reachable, same binary, ports free; %d rank%s\n",
                   h.name.c_str(), h.slots, h.slots == 1 ? "" : "s");
    }
  }
  if (elastic && layout.dp > 0) {
    MAMMOTH_CHECK(layout.dp * layout.tp * layout.pp * layout.sp == world_of(hosts))
        << "[launch] --elastic: the command's dp " << layout.dp << " x tp " << layout.tp << " x pp "
        << layout.pp << " x sp " << layout.sp << " is not the " << world_of(hosts)
        << " ranks launched";
  }

  std::vector<std::string> command = args;
  for (int restart = 0;; ++restart) {
    const std::vector<std::string> cmd = mpirun_line(hosts, subnet, binary, command);
    std::string line;
    for (const std::string& a : cmd) line += (line.empty() ? "" : " ") + quote(a);
    const int world = world_of(hosts);
    std::fprintf(stderr, "[launch] %d rank%s on %zu host%s: %s\n", world, world == 1 ? "" : "s",
                 hosts.size(), hosts.size() == 1 ? "" : "s", line.c_str());
    std::fflush(stderr);
    const Attempt a = run_mpirun(cmd);
    if (a.code == 0) return 0;
    std::fprintf(stderr, "[launch] mpirun exited with %d\n", a.code);
    if (!elastic) return a.code;
    if (restart == absl::GetFlag(FLAGS_max_restarts)) {
      std::fprintf(stderr, "[launch] --elastic: %d restart%s (--max-restarts) used; giving up\n",
                   restart, restart == 1 ? "" : "s");
      return a.code;
    }
    if (a.failed_rank < 0) {
      std::fprintf(stderr,
                   "[launch] --elastic: mpirun named no failed rank (the launch itself failed?); "
                   "not restarting\n");
      return a.code;
    }
    const std::string host = hosts[host_of_rank(hosts, a.failed_rank)].name;
    Resized r;
    try {
      r = shrink_world(hosts, a.failed_rank, world, layout);
    } catch (const Error& e) {
      // Too few ranks left is the end of the job, with the status of its failure.
      std::fprintf(stderr, "[launch] rank %d on %s %s\n%s\n", a.failed_rank, host.c_str(),
                   a.why.c_str(), e.what());
      return a.code;
    }
    const std::optional<std::string> ckpt = engine::train::latest_checkpoint(layout.save_dir);
    command = restart_args(args, layout, r.dp, r.grad_accum);
    // mpirun hands its own environment to local ranks, so -x alone would not keep it out.
    const bool fault = std::getenv("MAMMOTH_FAULT") != nullptr;
    ::unsetenv("MAMMOTH_FAULT");
    std::fprintf(stderr,
                 "[launch] --elastic restart %d of %d: rank %d on %s %s; %d ranks left: dp %d x "
                 "tp %d x pp %d x sp %d, grad-accum %lld (the global batch kept), %s%s\n",
                 restart + 1, absl::GetFlag(FLAGS_max_restarts), a.failed_rank, host.c_str(),
                 a.why.c_str(), world_of(hosts), r.dp, layout.tp, layout.pp, layout.sp,
                 static_cast<long long>(r.grad_accum),
                 ckpt ? ("resuming from " + *ckpt).c_str() : "no checkpoint yet: from the start",
                 fault ? " (MAMMOTH_FAULT not passed on)" : "");
  }
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(
    launch,
    "start a command on the hosts of a hostfile through mpirun, after checking each "
    "(`launch --hostfile FILE -- train ...`), or on this machine (`--np N`); `--elastic` "
    "restarts from the last checkpoint with the ranks left",
    mammoth::tools::run_launch);
