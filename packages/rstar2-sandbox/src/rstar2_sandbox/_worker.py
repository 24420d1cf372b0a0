"""The worker: one selector loop that runs many confined calls through its zygote.

Contract. Started as `python -I -m rstar2_sandbox._worker` with a clean environment; frames
(4-byte length, JSON) arrive on stdin and leave on stdout: first the worker answers `ready` with
its confinements, then it takes `run`, `cancel` and `close_session` and answers each run with
`done`. At start it enters its namespaces (`_confine.enter_worker_namespaces`) and forks the
zygote (`_zygote`), pid 1 of the new pid namespace, which pre-imports the maths stack and forks
the calls. The worker never forks a call itself and the zygote never sees request data: for each
call the worker puts the code and stdin in memfds, makes the output and result pipes, and passes
the descriptors to the zygote; the zygote answers with a pidfd and later with the exit status.
The clock starts when the zygote forks the call (the time it reports in `started`): what a
call waits for the zygote, which forks one call at a time and falls behind on a loaded host, is
queue time (`queue_s`), never charged to the call's timeout. The limit is the program's own time
(`_limit`: CPU time, or wall time less waits for a CPU); a call the host starves until
`wall_ceiling_factor` times its limit is a `sandbox_error`. The worker reads stdout and stderr up
to the cap, kills through the call's pidfd, renices calls by the CPU they have used, and treats
every byte from a call as hostile: the result report is size-capped and validated
(`_outcome.parse_report`), session frames too, and a failure while handling one call answers that
call with a sandbox-side `error` instead of ending the worker. Sessions are calls that live
across cells, one cell at a time (each under the same limit), stopped (SIGSTOP) between cells,
with a cumulative CPU budget (RLIMIT_CPU); closing one never waits for it.

Not covered: admission and queueing, and cgroups (the parent's `LocalSandbox` does both).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import math
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from rstar2_sandbox import _child, _confine, _limit, _pidfd, _profile, _zygote
from rstar2_sandbox._outcome import REPORT_CAP, Outcome, classify, parse_report
from rstar2_sandbox._pidfd import has_exited, outer_pid, renice, signal_pidfd, usage

_CHUNK = 1 << 16
_UID_SLOTS = 1000


@dataclass
class _Call:
    id: int
    started: float  # handed to the zygote; then its fork (`_forked`), or a cell's start
    deadline: float  # the next look at its limit (`_limit.look`); math.inf until it is forked
    cap: int
    cpu_limit_s: float | None  # RLIMIT_CPU: a backstop, a second past the worker's own limit
    slot: int
    timeout_s: float = 0.0
    base: _pidfd.Usage | None = None  # a session's account when the cell started
    kill_message: str = ""
    fds: dict[int, str] = field(default_factory=dict)  # readable fd -> stdout | stderr | result
    data: dict[str, bytearray] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    pidfd: int = -1
    pid: int = 0  # as the worker sees it (for /proc and renice), once it is needed
    killed: str = ""
    nice: int = 0  # the worker's renice so far (`_limit.step_down`)
    demoted: bool = False  # at the last step: no more demotion checks
    next_check: float = 0.0
    queue_s: float = 0.0
    session: _Session | None = None
    stamps: list[_profile.Stamp] | None = None  # SandboxConfig.profile (bench only)


@dataclass
class _Session:
    name: str
    tag: int
    slot: int
    to_child: int
    from_child: int
    last_used: float
    pidfd: int = -1
    stopped: bool = False
    buffer: bytearray = field(default_factory=bytearray)
    outgoing: bytearray = field(default_factory=bytearray)
    call: _Call | None = None
    waiting: list[dict[str, Any]] = field(default_factory=list)


class Worker:
    """The selector loop of one worker."""

    def __init__(self, config: dict[str, Any], zygote: socket.socket) -> None:
        self.config = config
        self.zygote = zygote
        self.selector = selectors.DefaultSelector()
        self.tags = itertools.count(1)
        self.calls: dict[int, _Call] = {}  # by tag
        self.sessions: dict[str, _Session] = {}
        self.session_tags: dict[int, _Session] = {}
        self.free_slots = collections.deque(range(_UID_SLOTS))  # FIFO: a uid is reused late
        self.inbox = bytearray()
        self.running = True
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)  # what calls start with (the zygote's)

    # --- plumbing -------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        _child.write_all(1, struct.pack("!I", len(data)) + data)

    def _memfd(self, name: str, text: str) -> int:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        _child.write_all(fd, text.encode("utf-8", "surrogatepass"))
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def _fork(self, tag: int, kind: str, slot: int, cpu_s: float | None, memory: int, fds) -> None:
        try:
            _zygote.send_fork(self.zygote, tag, kind, slot, cpu_s, memory, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _answer(self, call_id: int, status: str, message: str, started: float, **extra) -> None:
        self.send(
            {
                "op": "done",  # output, traceback, repr, CPU and queue time: the pool's defaults
                "id": call_id,
                "status": status,
                "exit_code": -1,
                "wall_s": time.monotonic() - started,
                "message": message,
            }
            | extra
        )

    # --- one-shot calls ---------------------------------------------------------------------
    def _slot(self) -> int:
        """A free uid slot; OSError (this call's sandbox_error) when every one is taken."""
        if not self.free_slots:
            raise OSError(f"all {_UID_SLOTS} call slots of this worker are taken")
        return self.free_slots.popleft()

    def start_call(self, msg: dict[str, Any]) -> None:
        slot = self._slot()
        tag = next(self.tags)
        started = time.monotonic()
        call = _Call(
            id=msg["id"],
            started=started,
            deadline=math.inf,  # the clock starts at the fork (`_forked`)
            cap=msg["max_output"],
            cpu_limit_s=float(int(msg["timeout_s"] + 0.999) + 1),
            slot=slot,
            timeout_s=msg["timeout_s"],
            queue_s=started - msg["received"],
            next_check=math.inf,
        )
        (out_r, out_w), (err_r, err_w), (res_r, res_w) = os.pipe(), os.pipe(), os.pipe()
        source = msg["code"]
        if msg.get("files") or msg.get("fetch"):  # the envelope `_child._unpack` reads
            envelope = {"code": source, "files": msg.get("files", {}), "fetch": msg["fetch"]}
            source = "\0" + json.dumps(envelope)
        stdin, code = self._memfd("stdin", msg["stdin"]), self._memfd("code", source)
        for fd, name in ((out_r, "stdout"), (err_r, "stderr"), (res_r, "result")):
            os.set_blocking(fd, False)
            call.fds[fd] = name
            call.data[name], call.sizes[name] = bytearray(), 0
            self.selector.register(fd, selectors.EVENT_READ, ("pipe", call, name))
        self.calls[tag] = call
        if self.config.get("profile"):
            call.stamps = _profile.begin(msg["received"])
        self._fork(
            tag, "once", slot, call.cpu_limit_s, msg["memory_bytes"],
            [stdin, out_w, err_w, res_w, code],
        )  # fmt: skip
        _profile.mark(call.stamps, "worker_handed")

    def _read_pipe(self, call: _Call, fd: int, name: str) -> None:
        """Read what is there, keeping at most the cap; closes the descriptor at EOF."""
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.selector.unregister(fd)
                os.close(fd)
                del call.fds[fd]
                return
            call.sizes[name] += len(chunk)
            cap = call.cap + 1 if name != "result" else REPORT_CAP + 1
            room = cap - len(call.data[name])
            if room > 0:
                call.data[name] += chunk[:room]

    def finish_call(
        self, tag: int, status: int, cpu_s: float, zygote_stamps: list[Any] | None = None
    ) -> None:
        call = self.calls.pop(tag)
        _profile.mark(call.stamps, "worker_exit_heard")
        wall = time.monotonic() - call.started
        for fd, name in list(call.fds.items()):
            with contextlib.suppress(OSError):
                self._read_pipe(call, fd, name)
            if fd in call.fds:  # a leftover holder of the pipe; stop here
                self.selector.unregister(fd)
                os.close(fd)
        if call.pidfd >= 0:
            os.close(call.pidfd)
        self.free_slots.append(call.slot)
        report, problem = parse_report(bytes(call.data["result"]))
        outcome = Outcome(
            report=report,
            wait_status=status,
            killed=call.killed,
            kill_message=call.kill_message,
            cap=call.cap,
            stdout=bytes(call.data["stdout"]),
            stderr=bytes(call.data["stderr"]),
            stdout_size=call.sizes["stdout"],
            stderr_size=call.sizes["stderr"],
            cpu_s=cpu_s,
            cpu_limit_s=call.cpu_limit_s,
            report_problem=problem,
        )
        extra = {"op": "done", "id": call.id, "wall_s": wall, "queue_s": call.queue_s}
        child = report.pop("profile", None) if report is not None else None
        if call.stamps is not None:
            _profile.mark(call.stamps, "worker_answered")
            extra["profile"] = _profile.answer(call.stamps, zygote_stamps, child, cpu_s)
        self.send(classify(outcome) | extra | {"cpu_s": cpu_s})

    def _fail_call(self, tag: int, why: str) -> None:
        """Answer a call that the sandbox could not handle, and forget it."""
        call = self.calls.pop(tag, None)
        if call is None:
            return
        signal_pidfd(call.pidfd, signal.SIGKILL)
        for fd in list(call.fds):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        if call.pidfd >= 0:
            os.close(call.pidfd)
        self.free_slots.append(call.slot)
        self._answer(call.id, "sandbox_error", f"sandbox: {why}", call.started)

    def kill(self, call: _Call, reason: str, message: str = "") -> None:
        if not call.killed:
            call.killed, call.kill_message = reason, message
        if call.pid > 0:  # a dying process needs the CPU to tear itself down (a call may have
            renice(call.pid, 0)  # reniced itself; lowering its nice back needs root)
        signal_pidfd(call.pidfd, signal.SIGKILL)

    # --- the zygote's messages -----------------------------------------------------------------
    def _forked(self, call: _Call, forked_s: float) -> None:
        """Start the call's clock at its fork; its wait for the zygote becomes queue time."""
        forked = max(call.started, forked_s)
        call.queue_s += forked - call.started
        call.started, call.deadline = forked, forked + call.timeout_s
        if call.session is None:
            call.next_check = forked + self.config["demote_after_s"]

    def _from_zygote(self) -> None:
        received = _zygote.receive(self.zygote)
        if received is None:
            raise RuntimeError("the zygote exited")
        message, fds = received
        tag = message.get("tag")
        if message["op"] == "started":
            pidfd = fds[0]
            if tag in self.calls:
                call = self.calls[tag]
                call.pidfd = pidfd  # its pid in our namespace is looked up if it runs long
                self._forked(call, message["forked_s"])
                if call.killed:
                    signal_pidfd(pidfd, signal.SIGKILL)
            elif tag in self.session_tags:
                session = self.session_tags[tag]
                session.pidfd = pidfd
                if session.call is not None:  # the first cell waited for the fork too
                    self._forked(session.call, message["forked_s"])
            else:  # closed or cancelled before it started
                signal_pidfd(pidfd, signal.SIGKILL)
                os.close(pidfd)
        elif message["op"] == "exited":
            if tag in self.calls:
                self.finish_call(tag, message["status"], message["cpu_s"], message.get("profile"))
            elif tag in self.session_tags:
                self._session_exited(self.session_tags[tag], message)
        elif message["op"] == "failed":
            if tag in self.calls:
                self._fail_call(tag, f"could not start the call: {message['error']}")
            elif tag in self.session_tags:
                self.close_session(self.session_tags[tag], "could not be started", "sandbox_error")

    # --- sessions -------------------------------------------------------------------------
    def _open_session(self, name: str, memory: int) -> _Session:
        slot = self._slot()
        (in_r, in_w), (out_r, out_w) = os.pipe(), os.pipe()
        os.set_blocking(in_w, False)
        os.set_blocking(out_r, False)
        session = _Session(name, next(self.tags), slot, in_w, out_r, time.monotonic())
        self.selector.register(out_r, selectors.EVENT_READ, ("session", session))
        self.sessions[name] = session
        self.session_tags[session.tag] = session
        self._fork(
            session.tag, "session", slot, self.config["session_cpu_s"], memory, [in_r, out_w]
        )
        self.send({"op": "session_opened", "session": name})
        return session

    def session_call(self, msg: dict[str, Any]) -> None:
        session = self.sessions.get(msg["session"]) or self._open_session(
            msg["session"], msg["memory_bytes"]
        )
        if session.call is not None:
            session.waiting.append(msg)
            return
        frame = {"code": msg["code"], "stdin": msg["stdin"], "max_output": msg["max_output"]}
        data = json.dumps(frame).encode()
        pid = outer_pid(session.pidfd) if session.pidfd >= 0 else 0
        base = usage(pid) if pid > 0 else None  # a later cell's limit counts from here
        started = time.monotonic()
        session.call = _Call(
            id=msg["id"],
            started=started,
            deadline=started + msg["timeout_s"] if session.pidfd >= 0 else math.inf,
            cap=msg["max_output"],
            cpu_limit_s=None,
            slot=session.slot,
            timeout_s=msg["timeout_s"],
            queue_s=started - msg["received"],
            session=session,
            base=base,
        )
        if session.stopped:
            signal_pidfd(session.pidfd, signal.SIGCONT)
            session.stopped = False
        session.outgoing += struct.pack("!I", len(data)) + data
        self._flush_session(session)

    def _flush_session(self, session: _Session) -> None:
        """Write what the session can take now; the rest when its pipe is writable."""
        try:
            while session.outgoing:
                written = os.write(session.to_child, session.outgoing[:_CHUNK])
                del session.outgoing[:written]
        except BlockingIOError:
            pass
        except OSError:  # it died: its exit reports it
            session.outgoing.clear()
        key = self.selector.get_map().get(session.to_child)
        if session.outgoing and key is None:
            self.selector.register(session.to_child, selectors.EVENT_WRITE, ("feed", session))
        elif not session.outgoing and key is not None:
            self.selector.unregister(session.to_child)

    def _session_output(self, session: _Session) -> None:
        limit = 6 * (2 * (session.call.cap if session.call else 0) + (1 << 17)) + 4096
        while True:
            try:
                chunk = os.read(session.from_child, _CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                self.selector.unregister(session.from_child)
                return
            session.buffer += chunk
            if len(session.buffer) > limit + 4:
                break
        while len(session.buffer) >= 4:
            (size,) = struct.unpack("!I", session.buffer[:4])
            if size > limit or session.call is None:
                self.close_session(session, "sent a malformed report", "sandbox_error")
                return
            if len(session.buffer) < 4 + size:
                return
            report, problem = parse_report(bytes(session.buffer[4 : 4 + size]), session=True)
            if report is None:
                self.close_session(session, f"sent a refused report ({problem})", "sandbox_error")
                return
            del session.buffer[: 4 + size]
            call, session.call = session.call, None
            session.last_used = time.monotonic()
            self.send(
                classify(Outcome.from_session(report, call.cap))
                | {
                    "op": "done",
                    "id": call.id,
                    "wall_s": session.last_used - call.started,
                    "queue_s": call.queue_s,
                    "cpu_s": 0.0,
                }
            )
            if session.waiting:
                self.session_call(session.waiting.pop(0))
            else:  # frozen between cells: a thread it left running burns nothing
                signal_pidfd(session.pidfd, signal.SIGSTOP)
                session.stopped = True

    def _session_exited(self, session: _Session, message: dict[str, Any]) -> None:
        status, cpu = message["status"], message["cpu_s"]
        budget = self.config["session_cpu_s"]
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        # SIGXCPU comes from the kernel at the soft limit; SIGKILL at the hard one.
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu >= 0.9 * budget):
            self.close_session(session, f"used up its CPU budget of {budget:g} s", "timeout")
        else:
            self.close_session(session, "crashed", "error")

    def close_session(self, session: _Session, why: str, status: str = "error") -> None:
        """Kill and forget a session now; the zygote reaps it (nothing here waits)."""
        if self.sessions.get(session.name) is not session:
            return
        signal_pidfd(session.pidfd, signal.SIGKILL)
        for fd in (session.from_child, session.to_child):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
            os.close(fd)
        if session.pidfd >= 0:
            os.close(session.pidfd)
        self.free_slots.append(session.slot)
        del self.sessions[session.name]
        del self.session_tags[session.tag]
        self.send({"op": "session_closed", "session": session.name})  # before the answers
        message = f"session {session.name.rsplit(chr(0), 1)[-1]!r} {why}; it was reset and its state is gone"
        stuck = [(session.call.id, session.call.started)] if session.call else []
        for call_id, started in stuck + [(m["id"], time.monotonic()) for m in session.waiting]:
            self._answer(call_id, status, message, started, exit_code=-9)

    # --- the loop ---------------------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> None:
        msg["received"] = time.monotonic()  # the same clock as perf_counter on Linux
        if msg["op"] == "run":
            try:
                (self.session_call if msg.get("session") else self.start_call)(msg)
            except OSError as exc:  # out of descriptors or memory: this call fails, not the worker
                self._answer(msg["id"], "sandbox_error", f"sandbox: {exc}", msg["received"])
        elif msg["op"] == "cancel":
            for call in self.calls.values():
                if call.id == msg["id"]:
                    self.kill(call, "cancelled")
            for session in list(self.sessions.values()):
                if session.call is not None and session.call.id == msg["id"]:
                    self.close_session(session, "was cancelled")
        elif msg["op"] == "close_session" and msg["session"] in self.sessions:
            self.close_session(self.sessions[msg["session"]], "was closed")

    def _read_inbox(self) -> None:
        chunk = os.read(0, _CHUNK)
        if not chunk:
            self.running = False
            return
        self.inbox += chunk
        while len(self.inbox) >= 4:
            (size,) = struct.unpack("!I", self.inbox[:4])
            if len(self.inbox) < 4 + size:
                return
            message = json.loads(self.inbox[4 : 4 + size])
            del self.inbox[: 4 + size]
            self.handle(message)

    def _tick(self) -> float:
        """Enforce limits, demote long runners, expire idle sessions; the next wake-up."""
        now = time.monotonic()
        wake = now + 1.0
        factor = self.config["wall_ceiling_factor"]
        demote = self.config["demote_after_s"], self.config["demote_again_after_s"]
        for call in list(self.calls.values()):
            if call.killed:
                continue
            wall = now - call.started
            # A call that already exited and waits to be reaped is not a timeout: the worker
            # was late (busy or descheduled), not the call.
            if now >= call.deadline and has_exited(call.pidfd):
                call.deadline = now + _limit.CHECK_AT_LEAST  # its exit is on the way
            elif now >= call.deadline:
                call.pid = call.pid or outer_pid(call.pidfd)
                nice = max(call.nice, self.nice)
                verdict = _limit.look(call.pid, call.timeout_s, wall, None, factor, nice)
                call.deadline = now + verdict.recheck_s
                if verdict.kind:
                    self.kill(call, verdict.kind, verdict.message)
            elif not call.demoted and call.pidfd >= 0 and now >= call.next_check:
                call.pid = call.pid or outer_pid(call.pidfd)
                call.nice, recheck = _limit.step_down(call.pid, call.nice, wall, *demote)
                call.demoted, call.next_check = not recheck, now + recheck
            if not call.killed:
                wake = min(wake, call.deadline, call.next_check if not call.demoted else wake)
        for session in list(self.sessions.values()):
            cell = session.call
            if cell is not None:
                if now >= cell.deadline:
                    pid, wall = outer_pid(session.pidfd), now - cell.started
                    verdict = _limit.look(pid, cell.timeout_s, wall, cell.base, factor, self.nice)
                    cell.deadline = now + verdict.recheck_s
                    if verdict.kind == "timeout":
                        self.close_session(session, f"timed out ({verdict.message})", "timeout")
                    elif verdict.kind:
                        self.close_session(session, "was starved of CPU", "sandbox_error")
                if session.call is cell:
                    wake = min(wake, cell.deadline)
            elif now - session.last_used > self.config["session_idle_s"]:
                self.close_session(session, "expired after being idle")
        return max(0.0, wake - time.monotonic())

    def _dispatch(self, kind: str, data: tuple[Any, ...], fd: int) -> None:
        if kind == "inbox":
            self._read_inbox()
        elif kind == "zygote":
            self._from_zygote()
        elif kind == "pipe":
            self._read_pipe(data[1], fd, data[2])
        elif kind == "session" and data[1].name in self.sessions:
            self._session_output(data[1])
        elif kind == "feed" and data[1].name in self.sessions:
            self._flush_session(data[1])

    def _fail(self, data: tuple[Any, ...], exc: BaseException) -> None:
        """A failure while handling one call or session: that one answers, the worker goes on."""
        why = f"internal error: {exc!r}"
        print(f"sandbox worker: {why}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if data[0] == "pipe":
            for tag, call in list(self.calls.items()):
                if call is data[1]:
                    self._fail_call(tag, why)
        elif data[0] in ("session", "feed") and data[1].name in self.sessions:
            self.close_session(data[1], f"hit a sandbox {why}", "sandbox_error")
        else:
            raise exc

    def serve(self) -> None:
        self.selector.register(0, selectors.EVENT_READ, ("inbox",))
        self.selector.register(self.zygote, selectors.EVENT_READ, ("zygote",))
        while self.running:
            for key, _ in self.selector.select(self._tick()):
                if self.selector.get_map().get(key.fd) is not key:
                    # Stale: an earlier event of this batch closed the descriptor (a call's
                    # exit reads and closes its pipes), and its number may already belong to
                    # another call's pipe; reading it would fail or take that call's output.
                    continue
                try:
                    self._dispatch(key.data[0], key.data, key.fd)
                except Exception as exc:
                    self._fail(key.data, exc)
        for call in list(self.calls.values()):
            self.kill(call, "shutdown")
        for session in list(self.sessions.values()):
            self.close_session(session, "was closed by shutdown")
        deadline = time.monotonic() + 5
        while self.calls and time.monotonic() < deadline:  # answer the killed calls
            if self.selector.select(0.1):
                received = _zygote.receive(self.zygote)
                if received is None:
                    break
                message, fds = received
                for fd in fds:
                    os.close(fd)
                if message["op"] == "exited" and message["tag"] in self.calls:
                    self.finish_call(message["tag"], message["status"], message["cpu_s"])


def main() -> None:
    """Entry point: read the config frame, enter the namespaces, start the zygote, serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    frame = _child.read_frame(0)
    if frame is None:
        return
    setup = json.loads(frame)
    config, index = setup["config"], setup["index"]
    conf = _confine.Confinements()
    _confine.enter_worker_namespaces(conf)
    _confine._LIBC.prctl(_confine._PR_SET_DUMPABLE, 0, 0, 0, 0)  # after writing our uid map
    ours, pid = _zygote.start(config, index, conf)
    received = _zygote.receive(ours)
    if received is None:
        sys.exit(1)
    ready = received[0]
    worker = Worker(config, ours)
    worker.send(ready | {"pid": os.getpid(), "zygote": pid})
    try:
        worker.serve()
    finally:
        ours.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    sys.exit(0)


if __name__ == "__main__":
    main()
