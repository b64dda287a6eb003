"""Alternated uploads of the same 1 GiB of random bytes to the CodaLab server: `curl -T` of its
tar.gz, our sender streaming that tar.gz (`worker/examples/put_blob.rs`: chunks on a channel to a
streamed body through the worker's own client, as the worker sends), and our sender archiving the directory itself (the
worker's archiver and gzip writer). Each to a new dataset bundle, deleted after; the disk synced
and 3 s of rest between uploads. One pair tells little: the server's own rate moves by a third
from one upload to the next (it unpacks on one core), so several rounds and their medians.

    eval "$(bash tests/peers/codalab-server.sh env)"
    cargo build --release --example put_blob -p codalab-worker
    ROUNDS=5 python3 bench/upload_pairs.py [PORT]

With PORT, the uploads go through the bench's recording proxy in front of 127.0.0.1:PORT, as
`bench.py`'s rows do. Standard library only (and `bench.py` beside it).
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUT = os.path.join(ROOT, "target", "release", "examples", "put_blob")
SIZE = 1 << 30


def main():
    rounds = int(os.environ.get("ROUNDS", "3"))
    tmp = tempfile.mkdtemp(prefix="clw-upload-pairs-", dir="/var/tmp")
    try:
        os.makedirs(os.path.join(tmp, "dir"))
        subprocess.run(["bash", "-c", f"head -c {SIZE} /dev/urandom > {tmp}/dir/out.bin"], check=True)
        tgz = os.path.join(tmp, "p.tgz")
        subprocess.run(["tar", "czf", tgz, "-C", f"{tmp}/dir", "."], check=True)
        os.sync()
        hdr = bench.curl_auth_header(tmp)
        base = bench.Proxy(int(sys.argv[1])).url if len(sys.argv) > 1 else bench.SERVER
        rates = {}
        for rnd in range(rounds):
            for who in ("curl", "ours-file", "ours-dir"):
                uuid = bench.create_dataset("upload-pairs")
                url = (f"{base}/rest/bundles/{uuid}/contents/blob/?"
                       "filename=bundle.tar.gz&finalize_on_success=0")
                t0 = time.time()
                if who == "curl":
                    with open(tgz, "rb") as f:
                        subprocess.run(["curl", "-sS", "--fail", "-H", f"@{hdr}", "-T", "-", url],
                                       stdin=f, check=True, stdout=subprocess.DEVNULL)
                else:
                    src = tgz if who == "ours-file" else os.path.join(tmp, "dir")
                    subprocess.run([PUT, base, uuid, src], env=bench.cred_env(), check=True,
                                   stdout=subprocess.DEVNULL)
                dt = time.time() - t0
                rates.setdefault(who, []).append(SIZE / 1e6 / dt)
                print(f"round {rnd}: {who:9s} {SIZE / 1e6 / dt:5.0f} MB/s", flush=True)
                bench.delete_bundles([uuid])
                os.sync()
                time.sleep(3)
        curl = statistics.median(rates["curl"])
        for who, v in rates.items():
            med = statistics.median(v)
            print(f"{who:9s} median {med:5.0f} MB/s ({med / curl:.2f} x curl's): "
                  + " ".join(f"{x:.0f}" for x in v))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
