#!/usr/bin/python3
"""PyTorch gloo peer for bench/comm_vs_peers: times torch.distributed.all_reduce (f32 sum, in place,
as torch always is) with the same batch/run method and table as `meshtrain bench comm`.

usage: /usr/bin/python3 bench/comm_gloo.py [--op allreduce] [--min 8] [--max 256M] [--nproc 2] [--bind]
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20
GIB = 1 << 30


def parse_size(text):
    """'8', '4K', '16M', '1G' -> bytes (K/M/G are powers of 2)."""
    shift = {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
    return int(text[:-1] if shift else text) << shift


def sizes(min_size, max_size):
    size = min_size
    while size <= max_size:
        yield size
        size *= 4


def fill_input(x, rank):
    """Rank r, element i: r + 1 + i % 17, small integers so the f32 sum is exact (as comm_mpi.c).
    Filled by strided slices so that 256 MiB needs no temporary of the same size."""
    for j in range(17):
        x[j::17] = rank + 1 + j


def check_result(y, nproc):
    """True on every rank if every element is the sum of fill_input over nproc ranks."""
    good = all(bool((y[j::17] == nproc * (nproc + 1) // 2 + nproc * j).all()) for j in range(17))
    ok = torch.tensor([int(good)], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def worker(rank, args, port):
    torch.set_num_threads(1)
    # Unpinned by default, as torchrun leaves it: gloo hands each operation between several
    # threads, and with all of a rank's threads on one core small all-reduces took 3x longer.
    if args.bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.nproc)
    nproc = args.nproc
    if rank == 0:
        print(f"# gloo allreduce: nproc {nproc}, f32 sum, in-place{', pinned' if args.bind else ''}")
        print(f"{'size':<12} {'count':>11} {'type':>4} {'redop':>5} {'time_us':>12} {'algbw':>9} "
              f"{'busbw':>9} {'check':>5}", flush=True)
    buffer = torch.empty(args.max // 4, dtype=torch.float32)
    for size in sizes(args.min, args.max):
        count = size // 4
        x = buffer[:count]
        # The shared method: a batch moves about 1 MiB (1 to 200 operations); 25 runs, fewer
        # (down to 5) once 25 runs would move more than 1 GiB.
        batch = max(1, min(200, MIB // size))
        runs = max(5, min(25, GIB // (size * batch)))
        fill_input(x, rank)
        times = []
        for run in range(runs + 2):  # the first 2 are uncounted warm-ups
            dist.barrier()
            start = time.perf_counter()
            for _ in range(batch):
                dist.all_reduce(x)
            if run >= 2:
                times.append((time.perf_counter() - start) / batch)
        # Every operation multiplied the buffer by nproc: refill and reduce once more to check.
        fill_input(x, rank)
        dist.all_reduce(x)
        ok = check_result(x, nproc)
        median = statistics.median(times)
        algbw = size / median / 1e9
        if rank == 0:
            print(f"{size:<12} {count:>11} {'f32':>4} {'sum':>5} {median * 1e6:>12.3f} {algbw:>9.3f} "
                  f"{algbw * 2 * (nproc - 1) / nproc:>9.3f} {'ok' if ok else 'FAIL':>5}", flush=True)
    dist.destroy_process_group()


def free_port():
    """A port free now on 127.0.0.1 (the kernel's pick); rank 0's store binds it right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="allreduce", choices=["allreduce"])
    parser.add_argument("--min", type=parse_size, default=8)
    parser.add_argument("--max", type=parse_size, default=256 * MIB)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--bind", action="store_true", help="pin rank r to core r (like mpirun --bind-to core)")
    args = parser.parse_args()
    if args.min < 4 or args.min % 4 or args.max < args.min or args.nproc < 1:
        parser.error("need 4 <= min <= max, min a multiple of 4, nproc >= 1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo's own sockets on loopback
    mp.spawn(worker, args=(args, free_port()), nprocs=args.nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
