"""CodaLab's own `cl` CLI, run from a process that has already imported it.

Importing the CLI costs about three CPU seconds (SQLAlchemy, the bundle model), more than most
commands themselves; the tests run `cl` hundreds of times. So `serve` imports `codalab.bin.cl`
once and, for each request on a Unix socket, forks: the child runs the unchanged `cl` entry
point with the request's arguments, environment and working directory, its stdout and stderr in
files, and answers with its exit code and both outputs. The parent only accepts and forks (one
thread, so forking is safe). `client` is what a test runs instead of `cl`: it forwards its
argv, environment and working directory, prints what came back, and exits with the same code.

    python3 cl-fork.py serve SOCKET        (the CodaLab peer venv's Python; codalab-server.sh)
    python3 cl-fork.py client SOCKET ARGS  (any Python 3; imports nothing heavy)
Standard library only.
"""

import json
import os
import socket
import struct
import sys
import tempfile


def send_msg(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">Q", len(data)) + data)


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def recv_msg(sock):
    (n,) = struct.unpack(">Q", recv_exact(sock, 8))
    return json.loads(recv_exact(sock, n))


def run_cli(req):
    """In the forked child: `cl ARGS` as the request says; returns (code, stdout, stderr)."""
    from codalab.bin.cl import main  # already imported by the parent

    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.argv = ["cl"] + req["args"]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # what the real `cl` would print before dying
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    out.seek(0)
    err.seek(0)
    return code, out.read(), err.read()


def serve(path):
    import codalab.bin.cl  # noqa: F401  (the import every child then shares)
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)
    os.rename(path + ".tmp", path)
    srv.listen(64)
    print(f"cl-fork: serving on {path}", flush=True)
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            try:
                req = recv_msg(conn)
                code, out, err = run_cli(req)
                send_msg(conn, {
                    "code": code,
                    "stdout": out.decode("latin-1"),
                    "stderr": err.decode("latin-1"),
                })
            finally:
                os._exit(0)
        conn.close()


def client(path, args):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    send_msg(sock, {"args": args, "env": dict(os.environ), "cwd": os.getcwd()})
    resp = recv_msg(sock)
    sys.stdout.buffer.write(resp["stdout"].encode("latin-1"))
    sys.stderr.buffer.write(resp["stderr"].encode("latin-1"))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(resp["code"])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("serve", "client"):
        sys.exit(__doc__)
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3:])
