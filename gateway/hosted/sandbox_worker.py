"""The Python sandbox's worker process (standard library only; run as `python -I -S sandbox_worker.py`).

It confines itself before it reads any code: network and PID namespaces of its own (root: CLONE_NEWNET |
CLONE_NEWPID; other users: a user namespace too, where the kernel allows it), resource limits (address
space, CPU seconds, processes, file size, open files), then, when started as root, the sandbox's own
unprivileged uid. It stays outside the PID namespace as a supervisor: on SIGTERM it kills the namespace's
init, which takes every process of the sandbox with it, zombies included. Inside, the init reaps orphans
and the kernel process runs code cells like a Jupyter kernel: one global namespace kept across cells, the
value of a final expression shown, a traceback on error. Cells arrive and results leave on the socket whose
fd is the first argument (4-byte big-endian length + UTF-8 JSON); the cell's stdout and stderr, its child
processes' too, go to fds 1 and 2: a capture file the parent opened in append mode, emptied before each
cell and read by the parent after it.
"""

import ast
import contextlib
import ctypes
import json
import os
import resource
import signal
import struct
import sys
import time
import traceback

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: each a private tmpfs where it can be
PR_SET_PDEATHSIG = 1
SUPERVISOR_PROCESSES = 2  # the supervisor and the namespace's init, besides the kernel
STRAYS_GRACE_S = 2.0  # for the processes a cell left to be killed and reaped
CHANNEL = int(sys.argv[1]) if len(sys.argv) > 1 else 3


LIBC = ctypes.CDLL(None, use_errno=True)


def _unshare(flags):
    """The namespaces it got: all asked for, the network alone, or none."""
    base = 0 if os.getuid() == 0 else CLONE_NEWUSER
    for wanted in (flags, flags & ~CLONE_NEWNS, CLONE_NEWNET):
        if LIBC.unshare(base | wanted) == 0:
            return wanted
    return 0


def _mount(source, target, fstype, flags, data=None):
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if LIBC.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {target}: {os.strerror(error)}")


def _private_dirs(limits):
    """In its own mount namespace (root only): /tmp, /var/tmp and /dev/shm become tmpfs of its own, sized,
    gone with it; nothing another sandbox or the host left there is seen, nothing it leaves stays. Its
    working directory is made again inside the new /tmp."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates to the host
    for directory in SHARED_DIRS:
        if os.path.isdir(directory):
            _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits['tmp_bytes']},mode=1777")
    os.makedirs(limits["workdir"], mode=0o700, exist_ok=True)
    if limits.get("uid") is not None:
        os.chown(limits["workdir"], limits["uid"], limits["uid"])


def _die_with_parent():
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _confine(limits):
    """Namespaces, private directories and resource limits; returns the namespaces it got (CLONE_* bits).
    The uid is dropped later (`_drop`), once what needs root (mounting /proc in the PID namespace) is done."""
    namespaces = _unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS)
    if namespaces & CLONE_NEWNS:
        try:
            _private_dirs(limits)
        except OSError:
            namespaces &= ~CLONE_NEWNS
    memory = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails instead of killing
    os.chdir(limits["workdir"])
    return namespaces


def _own_proc():
    """As the PID namespace's init, in the sandbox's mount namespace: a /proc of its own processes only (the
    gateway's and other sandboxes' environment, files and limits out of sight)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _drop(limits):
    uid = limits.get("uid")
    if os.getuid() == 0 and uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from here on, the process limit counts this uid's processes alone
    processes = limits["processes"] + SUPERVISOR_PROCESSES
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _supervise(child):
    """Outside the PID namespace: SIGTERM kills its init (and so all of it); exit when it is gone."""

    def stop(signum, frame):
        os.kill(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    os.waitpid(child, 0)
    os._exit(0)


def _init(kernel):
    """PID 1 of the namespace: reap every orphan; end (and so end the namespace) when the kernel ends."""
    while True:
        pid, _ = os.wait()
        if pid == kernel:
            os._exit(0)


def _end_strays():
    """After a cell, in a PID namespace with its own /proc: every process the cell left running (a detached
    child, a re-forking daemon) is killed, so none outlives its cell or its limits; init and this kernel stay."""
    keep = {1, os.getpid()}
    deadline = time.monotonic() + STRAYS_GRACE_S
    while time.monotonic() < deadline:  # until init has reaped them all (a new one may fork meanwhile)
        strays = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in keep]
        if not strays:
            return
        for pid in strays:
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGKILL)
        _reap_own_children()  # the cell's direct children are this kernel's to reap, the rest init's
        time.sleep(0.005)


def _reap_own_children():
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _read_exact(count):
    data = b""
    while len(data) < count:
        chunk = os.read(CHANNEL, count - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _send(payload):
    data = json.dumps(payload).encode()
    os.write(CHANNEL, struct.pack(">I", len(data)) + data)


def _run_cell(code, namespace):
    """Execute the cell; a final expression's repr is printed, as a notebook shows it."""
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        return False
    except BaseException:  # the cell's own failure, SystemExit included: shown, and the kernel lives on
        kind, error, trace = sys.exc_info()
        traceback.print_exception(kind, error, trace.tb_next if trace is not None else None)  # from the cell down
        return True


def main():
    limits = json.loads(_read_exact(struct.unpack(">I", _read_exact(4))[0]))
    namespaces = _confine(limits)
    if namespaces & CLONE_NEWPID:
        child = os.fork()
        if child:
            _supervise(child)
        _die_with_parent()
        if namespaces & CLONE_NEWNS:
            try:
                _own_proc()
            except OSError:
                namespaces &= ~CLONE_NEWNS
        _drop(limits)
        kernel = os.fork()
        if kernel:
            _init(kernel)
        _die_with_parent()
    else:
        _drop(limits)
    isolated = bool(namespaces & CLONE_NEWNET)
    readable = os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK)
    _send(
        {
            "ready": True,
            "network_isolated": isolated,
            "pid_namespace": bool(namespaces & CLONE_NEWPID),
            "mount_namespace": bool(namespaces & CLONE_NEWNS),
            "stdlib_readable": readable,
        }
    )
    own_proc = bool(namespaces & CLONE_NEWPID and namespaces & CLONE_NEWNS)
    namespace = {"__name__": "__main__"}
    while True:
        try:
            code = _read_exact(struct.unpack(">I", _read_exact(4))[0]).decode()
        except EOFError:
            return
        os.ftruncate(1, 0)
        failed = _run_cell(code, namespace)
        sys.stdout.flush()
        sys.stderr.flush()
        if own_proc:
            _end_strays()
        _send({"error": failed})


if __name__ == "__main__":
    main()
