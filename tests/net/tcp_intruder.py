# The intruder of tcp_intruder_netns.sh: a process without the job's secret that attacks every
# listener it is told about, and sweeps the nodes' ephemeral ports while the job trains.
# Usage: tcp_intruder.py TARGETS_FILE REPORT_FILE STOP_FILE HOST...
# TARGETS_FILE gains "host port" lines (listeners found by the test); each is attacked once with
# a bare connect-and-close (a scan), a bare hello frame claiming rank 1 with the world's id, a
# handshake-form hello with a made-up MAC, garbage, and a silent connection held until the run ends (6 s at most). REPORT_FILE
# gets "<kind> <host>:<port> <local port> <challenged|not challenged>" per connection.
import os
import random
import select
import socket
import struct
import sys
import threading
import time

targets_file, report_file, stop_file, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
WORLD_ID = 0x776F726C64
MAGIC = 0x4D54434D
HELLO, CHALLENGE = 4, 5
lock = threading.Lock()


def frame(kind, root_or_tag, sender, payload, comm_id, count):
    # magic, kind, op, dtype, redop, root/tag, sender, payload bytes, comm id, seq, count
    return struct.pack("<IHHHHiiIQQQ", MAGIC, kind, 0, 0, 0, root_or_tag, sender, payload,
                       comm_id, 0, count)


def report(kind, host, port, sock, challenged):
    with lock, open(report_file, "a") as f:
        state = "challenged" if challenged else "not challenged"
        f.write(f"{kind} {host}:{port} {sock.getsockname()[1]} {state}\n")


def challenged(sock, wait=1.0):
    """Whether the listener sends its challenge (a handshake frame) within `wait` seconds."""
    ready, _, _ = select.select([sock], [], [], wait)
    if not ready:
        return False
    try:
        data = sock.recv(80)
    except OSError:
        return False
    return len(data) >= 8 and struct.unpack_from("<IH", data) == (MAGIC, CHALLENGE)


def dial(host, port):
    s = socket.create_connection((host, port), timeout=2)
    s.setblocking(True)
    return s


def attack(host, port):
    try:
        scan = dial(host, port)
        report("scan", host, port, scan, False)
        scan.close()
        bare = dial(host, port)
        bare.sendall(frame(HELLO, 0, 1, 0, WORLD_ID, 0))
        report("forged-bare", host, port, bare, challenged(bare))
        new = dial(host, port)
        got = challenged(new)
        new.sendall(frame(HELLO, 1, 1, 64, WORLD_ID, 0) + os.urandom(64))
        report("forged", host, port, new, got)
        junk = dial(host, port)
        got = challenged(junk)
        junk.sendall(bytes(random.getrandbits(8) for _ in range(300)))
        report("garbage", host, port, junk, got)
        silent = dial(host, port)
        report("silent", host, port, silent, challenged(silent))
        for _ in range(60):  # until the run ends, 6 s at most: past any mesh build here
            if os.path.exists(stop_file):
                break
            time.sleep(0.1)
        for s in (bare, new, junk, silent):
            s.close()
    except OSError as e:  # the listener closed meanwhile: the mesh was complete
        with lock, open(report_file, "a") as f:
            f.write(f"gone {host}:{port} {e}\n")


def sweep(host):
    """A port scan of the ephemeral range: connect, close, in batches."""
    for start in range(32768, 61000, 512):
        socks = []
        for port in range(start, min(start + 512, 61000)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((host, port))
            socks.append(s)
        time.sleep(0.05)
        for s in socks:
            s.close()


def sweeping():
    while not os.path.exists(stop_file):
        for h in hosts:
            sweep(h)
        time.sleep(0.5)


seen = set()
threads = [threading.Thread(target=sweeping, daemon=True)]
threads[0].start()
while not os.path.exists(stop_file):
    try:
        with open(targets_file) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        lines = []
    for line in lines:
        if line.strip() and line not in seen:
            seen.add(line)
            host, port = line.split()
            t = threading.Thread(target=attack, args=(host, int(port)), daemon=True)
            t.start()
            threads.append(t)
    time.sleep(0.02)
for t in threads:
    t.join()
