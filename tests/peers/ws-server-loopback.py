#!/usr/bin/env python3
"""Run CodaLab's own `cl-ws-server` code, but listening on loopback only.

CodaLab 1.7.5's `codalab.bin.ws_server.async_main` hard-codes
`websockets.serve(ws_handler, "0.0.0.0", port)`. This launcher (run with the
peer venv's Python by tests/peers/codalab-server.sh) replaces `websockets.serve`
with a wrapper that forces the host to $CLW_WS_HOST (default 127.0.0.1) and then
calls the unmodified `codalab.bin.ws_server.main()`, so all routing and
behaviour (including upstream bugs) are the real server's.

Usage: python ws-server-loopback.py --port 2901
"""
import os
import sys

import websockets

from codalab.bin import ws_server

HOST = os.environ.get('CLW_WS_HOST', '127.0.0.1')
_real_serve = websockets.serve


def _loopback_serve(handler, host=None, port=None, *args, **kwargs):
    """Same as websockets.serve, but ignores the requested host."""
    return _real_serve(handler, HOST, port, *args, **kwargs)


# ws_server looks `websockets.serve` up at call time through the module object.
ws_server.websockets.serve = _loopback_serve

if __name__ == '__main__':
    sys.argv[0] = 'cl-ws-server'
    print(f'cl-ws-server (loopback launcher) binding {HOST}', file=sys.stderr, flush=True)
    ws_server.main()
