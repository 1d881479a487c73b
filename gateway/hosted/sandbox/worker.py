"""The Python sandbox's worker process (standard library only; run as `python -I -S worker.py FD`).

It confines itself before it reads any code, as bubblewrap or nsjail would confine it:

1. New namespaces: mount, PID, network, IPC and UTS (root), inside a user namespace of its own (other users,
   where the kernel allows it; the gateway's uid is mapped to uid 1000 there and nothing else is).
2. A private root: a tmpfs holding read-only binds of `/usr`, the library directories, the interpreter's
   prefixes and a few files of `/etc`; a `/dev` of null, zero, full, random and urandom; sized tmpfs for `/tmp`,
   `/var/tmp` and `/dev/shm`; then `pivot_root` into it and the old root detached. Nothing else of the host
   (its files, other sandboxes' files, the gateway's) exists there, and nothing written outlives the sandbox.
3. Resource limits: address space, CPU seconds, file size, open files, no core dumps.
4. Outside the new PID namespace, a supervisor: on SIGTERM it kills the namespace's init, which ends every
   process of the sandbox. Inside, the init (which built the root above, with a /proc of the namespace's own
   processes) drops what makes it mighty (root: the sandbox's own uid; a user namespace: every capability),
   sets no_new_privs, installs the gateway's seccomp filter and forks the kernel, then reaps orphans.
5. The kernel runs code cells like a Jupyter kernel: one global namespace kept across cells, the value of a
   final expression shown, a traceback on error. After each cell every other process the cell left running
   is killed, so none outlives its cell or its limits.

Cells arrive and results leave on the socket whose fd is the first argument (4-byte big-endian length + UTF-8
JSON). The cell's stdout and stderr, its child processes' too, go to fds 1 and 2: a capture file the parent
opened in append mode, emptied before each cell and read by the parent after it. The first message it sends
says which of the steps above it got, so the gateway can refuse a weaker sandbox than the operator allowed.
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

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = {"mount": CLONE_NEWNS, "pid": CLONE_NEWPID, "network": CLONE_NEWNET, "ipc": CLONE_NEWIPC}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 0x400, 0x800, 0x1000, 0x4000, 0x40000, 0x200000
KEPT_MOUNT_FLAGS = {  # a read-only remount must keep these as the source has them (a user namespace locks them)
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522
INSIDE_ID = 1000  # the sandbox's uid and gid inside its own user namespace
BUILD_DIR = "/tmp"  # where the new root is put together: a tmpfs mounted there (in this mount namespace only)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "localtime", "mime.types")
DEVICES = ("null", "zero", "full", "random", "urandom")
PRIVATE_WORKDIR = "/tmp/work"
SUPERVISOR_PROCESSES = 2  # the supervisor and the namespace's init, besides the kernel
STRAYS_GRACE_S = 2.0  # for the processes a cell left to be killed and reaped
CHANNEL = int(sys.argv[1]) if len(sys.argv) > 1 else 3

LIBC = ctypes.CDLL(None, use_errno=True)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _unshare():
    """The namespaces it got (CLONE_* bits): all asked for, the network alone, or none."""
    wanted = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    user = 0 if os.getuid() == 0 else CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    for flags in (user | wanted, user | CLONE_NEWNET):
        if LIBC.unshare(flags) == 0:
            if flags & CLONE_NEWUSER:
                _map_ids(uid, gid)
            return flags
    return 0


def _map_ids(uid, gid):
    """In its new user namespace: the gateway's ids become INSIDE_ID; no other id exists there."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{INSIDE_ID} {uid} 1"), ("gid_map", f"{INSIDE_ID} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)


def _mount(source, target, fstype, flags, data=None):
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _check(LIBC.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _bind(source, target, read_only=True, devices=False):
    """`source` seen at `target`: read-only, no setuid, no devices unless asked (the flags the source locks kept)."""
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (MS_RDONLY if read_only else 0) | (0 if devices else MS_NODEV)
    kept = os.statvfs(target).f_flag
    for statvfs_flag, mount_flag in KEPT_MOUNT_FLAGS.items():
        if kept & statvfs_flag:
            flags |= mount_flag
    _mount(None, target, None, flags)


def _tmpfs(target, size, mode):
    os.makedirs(target, mode=0o755, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode:o}")


def _interpreter_dirs():
    """The interpreter's own directories outside the system ones (a virtual environment, a pyenv build)."""
    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    places.add(os.path.dirname(os.path.abspath(sys.executable)))  # as cells name it (a venv's bin: a link)
    places.add(os.path.dirname(os.path.realpath(sys.executable)))
    system = tuple(os.path.realpath(path) + "/" for path in SYSTEM_DIRS if os.path.isdir(path))
    chosen = []
    for place in sorted(path for path in places if path):
        if not (place + "/").startswith(system) and not any((place + "/").startswith(kept + "/") for kept in chosen):
            chosen.append(place)
    return chosen


def _private_root(tmp_bytes, with_proc):
    """Build the sandbox's whole filesystem on a tmpfs and pivot into it (see the module's docstring); with a
    /proc of the PID namespace's own processes when this is its init. Returns whether it got that /proc."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates to the host
    # held open before the tmpfs at BUILD_DIR can shadow one of them (an interpreter installed under /tmp),
    # and bound from their descriptors after the sandbox's own /tmp is mounted, which would hide them too
    interpreter = {directory: os.open(directory, os.O_PATH | os.O_DIRECTORY) for directory in _interpreter_dirs()}
    root = BUILD_DIR  # a mount point of its own, as pivot_root wants
    _tmpfs(root, 1 << 20, 0o755)
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            os.symlink(os.readlink(directory), root + directory)
        elif os.path.isdir(directory):
            _bind(directory, root + directory)
    os.mkdir(root + "/etc", 0o755)
    for name in ETC_FILES:
        path = "/etc/" + name
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isfile(path):
            _bind(path, root + path)
    _tmpfs(root + "/dev", 1 << 16, 0o755)
    for name in DEVICES:
        _bind("/dev/" + name, root + "/dev/" + name, read_only=False, devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, root + "/dev/" + name)
    os.symlink("/proc/self/fd/2", root + "/dev/stderr")
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        _tmpfs(root + directory, tmp_bytes, 0o1777)
    for directory, descriptor in interpreter.items():
        _bind(f"/proc/self/fd/{descriptor}", root + directory)
        os.close(descriptor)
    os.mkdir(root + "/proc", 0o555)
    own_proc = False
    if with_proc:  # before the pivot: the kernel lets a user namespace mount proc only while one is visible
        with contextlib.suppress(OSError):  # a container's masked /proc may forbid it: then there is none
            _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            own_proc = True
    os.chdir(root)
    _check(LIBC.syscall(PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(LIBC.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    return own_proc


def _limit(limits):
    memory = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails instead of killing


def _drop(limits):
    """Give up every privilege for good: root takes the sandbox's uid; in a user namespace, every capability
    goes (the uid there is not 0, so no exec brings one back). Then no_new_privs and the process limit."""
    uid = limits.get("uid")
    if os.getuid() == 0 and uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from here on, the process limit counts this uid's processes alone
    elif os.getuid() != 0:
        header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
        _check(LIBC.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    processes = limits["processes"] + SUPERVISOR_PROCESSES
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _seccomp(program):
    """Install the gateway's filter (a sock_filter array); it holds for this process and all it forks."""
    code = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(code))
    _check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _die_with_parent():
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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
    """After a cell, in its PID namespace: every process the cell left running (a detached child, a re-forking
    daemon) is killed, so none outlives its cell or its limits; init and this kernel stay. kill(-1) reaches
    every process of the namespace but init and the caller, and fails once none is left (zombies reaped)."""
    deadline = time.monotonic() + STRAYS_GRACE_S
    while time.monotonic() < deadline:  # until init has reaped them all (a new one may fork meanwhile)
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
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


def _confine(limits, got):
    """Every step of the module's docstring up to the kernel; `got` says which held. Returns in the kernel."""
    namespaces = _unshare()
    got["user_namespace"] = bool(namespaces & CLONE_NEWUSER)
    got.update({name: bool(namespaces & flag) for name, flag in NAMESPACES.items()})
    if namespaces & CLONE_NEWPID:
        child = os.fork()
        if child:
            _supervise(child)
        _die_with_parent()  # from here on, PID 1 of the new namespace
    workdir = limits["workdir"]
    if namespaces & CLONE_NEWNS:
        got["own_proc"] = _private_root(limits["tmp_bytes"], with_proc=bool(namespaces & CLONE_NEWPID))
        workdir = PRIVATE_WORKDIR
        os.mkdir(workdir, 0o700)
        if os.getuid() == 0 and limits.get("uid") is not None:
            os.chown(workdir, limits["uid"], limits["uid"])
    got["private_root"] = bool(namespaces & CLONE_NEWNS)
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    _limit(limits)
    os.chdir(workdir)
    _drop(limits)
    got["no_new_privs"] = True
    if limits.get("seccomp"):
        _seccomp(bytes.fromhex(limits["seccomp"]))
        got["seccomp"] = True
    if namespaces & CLONE_NEWPID:
        kernel = os.fork()
        if kernel:
            _init(kernel)
        _die_with_parent()


def main():
    limits = json.loads(_read_exact(struct.unpack(">I", _read_exact(4))[0]))
    got = {"own_proc": False, "seccomp": False, "no_new_privs": False}
    try:
        _confine(limits, got)
    except OSError as error:  # the operator hears why; no code runs
        _send({"ready": False, "failed": str(error)})
        return
    _send({"ready": True, **got})
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
        if got["pid"]:
            _end_strays()
        _send({"error": failed})


if __name__ == "__main__":
    main()
