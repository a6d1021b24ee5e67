#!/usr/bin/python3
# PyTorch DistributedDataParallel (gloo, CPU) peer of meshtrain's data parallelism, on bench/gpt_torch.py's GPT.
# bench/ddp_vs_peers runs it at 1 and 2 ranks with a fixed per-rank batch to compare weak scaling.
"""Time data-parallel GPT training steps in PyTorch and print `step_seconds <median>`.

Spawns --nproc ranks (torch.multiprocessing, gloo over 127.0.0.1), each training the
GPT of bench/gpt_torch.py on its own random byte tokens, --batch sequences per rank
(weak scaling: the global batch is nproc * batch). AdamW with decay on 2-D tensors
only, gradient clipping 1.0, as gpt_torch.py. With --nproc 1 the model trains in this
process without DDP or a process group (the single-rank baseline, no communication).

Rank 0 times each step (zero_grad, forward, backward with DDP's bucketed all-reduces,
clipping, AdamW) with a wall clock and no barrier, skips the first --untimed steps and
prints to stdout:
  step_seconds <median of the timed steps>
  comm_wait_share <x>    (only with nproc > 1 and --probe-steps > 0)
comm_wait_share estimates the share of a step spent waiting for gradients to be reduced:
(median synced forward+backward - median no_sync() forward+backward) / median step, the
no_sync() ones timed in --probe-steps extra untimed steps after the timed ones; clamped
at 0. Progress goes to stderr.
"""
import argparse
import os
import socket
import statistics
import sys
import time

sys.dont_write_bytecode = True  # importing gpt_torch must not leave bench/__pycache__ behind
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from gpt_torch import GPT, make_adamw, random_batches  # noqa: E402

CLIP = 1.0
WEIGHT_DECAY = 0.1


def log(text):
    print(text, file=sys.stderr, flush=True)


def forward_backward(model, optimizer, tokens, targets):
    optimizer.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    return loss


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    distributed = args.nproc > 1
    if distributed:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=args.nproc)

    torch.manual_seed(args.seed)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    model = GPT(args.vocab, args.context, args.layers, args.heads, args.width)
    optimizer = make_adamw(model, args.lr, weight_decay=WEIGHT_DECAY)
    if distributed:
        model = DDP(model, bucket_cap_mb=args.bucket_mb)
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        log(f"# torch {torch.__version__}, {'gloo DDP' if distributed else 'no DDP'}, nproc {args.nproc}, "
            f"threads {torch.get_num_threads()} per rank, parameters {parameters}, per-rank batch {args.batch}, "
            f"bucket {args.bucket_mb} MiB")

    generator = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own data
    total = args.untimed + args.steps
    batches = random_batches(total + args.probe_steps, args.batch, args.context, args.vocab, generator)

    step_seconds, synced_fb_seconds = [], []
    for step in range(total):
        tokens, targets = next(batches)
        start = time.perf_counter()
        loss = forward_backward(model, optimizer, tokens, targets)
        backward_done = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        elapsed = time.perf_counter() - start
        timed = step >= args.untimed
        if timed:
            step_seconds.append(elapsed)
            synced_fb_seconds.append(backward_done - start)
        if rank == 0:
            log(f"step {step + 1} loss {loss.item():.4f} time {elapsed:.3f}s{'' if timed else ' (untimed)'}")

    # Forward+backward without the all-reduces, for the comm_wait_share estimate. The ranks
    # do not synchronise here, but all of them keep computing, so the cores stay as busy.
    unsynced_fb_seconds = []
    if distributed and args.probe_steps > 0:
        for _ in range(args.probe_steps):
            tokens, targets = next(batches)
            start = time.perf_counter()
            with model.no_sync():
                forward_backward(model, optimizer, tokens, targets)
            unsynced_fb_seconds.append(time.perf_counter() - start)
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()  # no rank leaves (and tears gloo down) while another still runs

    if rank == 0:
        median_step = statistics.median(step_seconds)
        print(f"step_seconds {median_step:.6f}")
        if unsynced_fb_seconds:
            wait = statistics.median(synced_fb_seconds) - statistics.median(unsynced_fb_seconds)
            print(f"comm_wait_share {max(0.0, wait) / median_step:.4f}")
        sys.stdout.flush()
    if distributed:
        dist.destroy_process_group()


def free_port():
    """A port free now on 127.0.0.1 (the kernel's pick); rank 0's store binds it right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="ranks to spawn (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=256, help="context = sequence length trained on")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step (weak scaling)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--untimed", type=int, default=2, help="steps before the timed ones")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP bucket_cap_mb (default 4)")
    parser.add_argument("--probe-steps", type=int, default=3,
                        help="extra no_sync() forward+backward passes for comm_wait_share (0: skip it)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    positive = ("nproc", "threads", "vocab", "context", "layers", "heads", "width", "batch", "steps")
    bad = [name for name in positive if getattr(args, name) < 1]
    if bad:
        parser.error("need positive values for " + ", ".join("--" + name for name in bad))
    if args.untimed < 0 or args.probe_steps < 0:
        parser.error("need --untimed >= 0 and --probe-steps >= 0")
    if not args.bucket_mb > 0:
        parser.error("need --bucket-mb > 0")
    if args.width % args.heads != 0:
        parser.error(f"--width {args.width} must be divisible by --heads {args.heads}")
    if args.vocab < 2:
        parser.error("need --vocab >= 2")
    if args.nproc > 1 and not dist.is_gloo_available():
        parser.error("this torch build has no gloo backend")
    return args


def main():
    args = parse_args()
    if args.nproc == 1:
        worker(0, args, None)
        return 0
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo's own sockets on loopback
    mp.spawn(worker, args=(args, free_port()), nprocs=args.nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
