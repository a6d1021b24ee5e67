#!/usr/bin/python3
# --offload_delay against an independent numpy reference of ZeRO-Offload's delayed parameter
# update: replays mt_delay_dump's gradients through float64 AdamW applied one step late.
"""usage: check_delay.py DUMP

DeepSpeed's delayed parameter update (DPU): after WARMUP normal steps, step t's gradient is
computed on the parameters without step t-1's update, and step t's update is applied after
step t+1's forward and backward. So the forward of step t sees the updates of steps 1..t-1
while t <= WARMUP + 1, and of steps 1..t-2 from there; update k always uses step k's gradient,
learning rate, clipping and bias-correction count k. The dump holds, per step, the parameters
meshtrain's forward saw and the gradient it computed (its correctness on those parameters is
tests/ref/check_gpt.py's); this rebuilds the parameter sequence from the definition above and
compares. Wrong variants of the rule (no delay, an update applied twice, the bias-correction
count or the learning rate a step off, the delay a step early) must fail the same bound, or the
check could not tell them apart.
"""
import struct
import sys

import numpy as np

CLIP_NORM_EPSILON = 1e-6  # torch.nn.utils.clip_grad_norm_
# fp32 meshtrain against float64: the worst parameter difference, as a share of the largest
# single update any element takes over the run (measured about 1e-5; a step-off rule moves
# parameters by a good part of an update)
TOLERANCE = 1e-3


def read_dump(path):
    with open(path, "rb") as f:
        data = f.read()
    records, pos = {}, 0
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        name = data[pos + 4:pos + 4 + length].decode()
        pos += 4 + length
        dtype, ndim = struct.unpack_from("<II", data, pos)
        pos += 8
        shape = struct.unpack_from(f"<{ndim}q", data, pos)
        pos += 8 * ndim
        count = int(np.prod(shape))
        kind = np.dtype("<f4") if dtype == 0 else np.dtype("<i4")
        records[name] = np.frombuffer(data, kind, count, pos).reshape(shape)
        pos += count * 4
    return records


def adamw(param, m, v, grad, lr, step, hyper, decay):
    """One torch.optim.AdamW step in float64 (the gradient already clipped)."""
    beta1, beta2, eps, weight_decay = hyper
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    param = param * (1 - lr * weight_decay * decay)
    denom = np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps
    return param - lr / (1 - beta1 ** step) * m / denom, m, v


def forward_params(initial, grads, lrs, hyper, clip, decay, seen, lr_at=None, count_at=None,
                   twice=()):
    """The parameters each step's forward sees when the forward of step t sees updates
    1..seen(t) (applied in order; `twice` lists updates applied two times)."""
    lr_at = lr_at or (lambda k: lrs[k - 1])
    count_at = count_at or (lambda k: k)
    param, m, v = initial.copy(), np.zeros_like(initial), np.zeros_like(initial)
    applied, out = 0, []

    def apply(k):
        nonlocal param, m, v
        g = grads[k - 1]
        scale = min(1.0, clip / (np.linalg.norm(g) + CLIP_NORM_EPSILON)) if clip > 0 else 1.0
        param, m, v = adamw(param, m, v, g * scale, lr_at(k), count_at(k), hyper, decay)

    for t in range(1, len(grads) + 2):  # the last: what a flush leaves after every step
        target = seen(t) if t <= len(grads) else len(grads)
        while applied < target:
            applied += 1
            for _ in range(2 if applied in twice else 1):
                apply(applied)
        out.append(param.copy())
    return out


def worst(got, want, update):
    return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want)) / update


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    r = read_dump(sys.argv[1])
    beta1, beta2, eps, weight_decay, clip, warmup = (float(x) for x in r["hyper"])
    warmup = int(warmup)
    steps = len(r["step_lr"])
    lrs = r["step_lr"].astype(np.float64)
    decay = r["decay"].astype(np.float64)
    hyper = (beta1, beta2, eps, weight_decay)
    got = [r[f"param/{t}"].astype(np.float64) for t in range(1, steps + 1)]
    got.append(r["final"].astype(np.float64))
    grads = [r[f"grad/{t}"].astype(np.float64) for t in range(1, steps + 1)]

    def run(seen, **wrong):
        return forward_params(got[0], grads, lrs, hyper, clip, decay, seen, **wrong)

    def dpu(t):
        return t - 1 if t <= warmup + 1 else t - 2

    want = run(dpu)
    update = max(float(np.max(np.abs(b - a))) for a, b in zip(want, want[1:]))
    error = worst(got, want, update)
    print(f"delayed update against the numpy DPU reference ({steps} steps, delay after "
          f"{warmup}): worst difference {error:.2e} of the largest update (bound {TOLERANCE:g})")
    failed = error > TOLERANCE
    for step, (g, w) in enumerate(zip(got, want), 1):
        e = float(np.max(np.abs(g - w))) / update
        if e > TOLERANCE:
            print(f"  the parameters {'after the flush' if step > steps else f'of step {step}'} "
                  f"differ by {e:.2e}")
    wrong = {
        "no delay": run(lambda t: t - 1),
        "the delay a step early": run(lambda t: t - 1 if t <= warmup else t - 2),
        "the first held update applied twice": run(dpu, twice=(warmup + 1,)),
        "bias correction counted a step late": run(dpu, count_at=lambda k: k + 1),
        "the held update with the next step's lr":
            run(dpu, lr_at=lambda k: lrs[min(k, steps - 1)] if k > warmup else lrs[k - 1]),
    }
    for name, params in wrong.items():
        e = worst(got, params, update)
        print(f"  wrong rule, {name}: {e:.2e}")
        if e <= TOLERANCE:
            print(f"  the check cannot tell the rule from '{name}'")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
