#!/usr/bin/python3
# PyTorch float64 parity check of meshtrain's GPT: forward, backward and 3 AdamW steps.
# Reads the dump written by build/tests/mt_ref_dump and recomputes everything in torch.
"""Check a meshtrain reference dump against a float64 PyTorch GPT.

usage:
    check_gpt.py DUMP              check a dump written by build/tests/mt_ref_dump
    check_gpt.py --self-test       write a dump from torch float32 and check it

Dump format (little-endian), a sequence of records:
    u32 name_len, name bytes, u32 dtype (0 = float32, 1 = int32),
    u32 ndim, ndim x i64 shape, prod(shape) elements of dtype.
"""
import argparse
import math
import os
import struct
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

DTYPE_CODES = {0: np.dtype("<f4"), 1: np.dtype("<i4")}
CODE_OF_DTYPE = {np.dtype("float32"): 0, np.dtype("int32"): 1}

LAYERNORM_EPS = 1e-5
NUM_STEPS = 3

TOL_LOSS = 1e-5
TOL_LOGITS = 1e-5
TOL_GRAD = 1e-4
TOL_KEY_BIAS_GRAD_ABS = 1e-6
TOL_STEP_LOSS = 1e-5
TOL_STEP_GRAD_NORM = 1e-5
TOL_FINAL = 1e-5


# ----------------------------------------------------------------------------
# Dump file: reading and writing


class DumpError(Exception):
    pass


def read_dump(path):
    """Return the records of a dump as an ordered dict name -> numpy array."""
    with open(path, "rb") as f:
        data = f.read()
    records = {}
    pos = 0

    def take(count):
        nonlocal pos
        if pos + count > len(data):
            raise DumpError(f"{path}: truncated at byte {pos} (need {count} more)")
        chunk = data[pos:pos + count]
        pos += count
        return chunk

    while pos < len(data):
        (name_len,) = struct.unpack("<I", take(4))
        name = take(name_len).decode("utf-8")
        dtype_code, ndim = struct.unpack("<II", take(8))
        if dtype_code not in DTYPE_CODES:
            raise DumpError(f"record {name!r}: unknown dtype code {dtype_code}")
        shape = struct.unpack(f"<{ndim}q", take(8 * ndim))
        if any(dim < 0 for dim in shape):
            raise DumpError(f"record {name!r}: negative shape {shape}")
        dtype = DTYPE_CODES[dtype_code]
        count = math.prod(shape)
        values = np.frombuffer(take(count * dtype.itemsize), dtype=dtype)
        if name in records:
            raise DumpError(f"record {name!r} appears twice")
        records[name] = values.reshape(shape)
    return records


def write_record(f, name, array):
    array = np.ascontiguousarray(array)
    code = CODE_OF_DTYPE[array.dtype]
    encoded_name = name.encode("utf-8")
    f.write(struct.pack("<I", len(encoded_name)))
    f.write(encoded_name)
    f.write(struct.pack("<II", code, array.ndim))
    f.write(struct.pack(f"<{array.ndim}q", *array.shape))
    f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())


def write_dump(path, records):
    with open(path, "wb") as f:
        for name, array in records.items():
            write_record(f, name, array)


# ----------------------------------------------------------------------------
# Model description


@dataclass
class Config:
    vocab: int
    context: int
    layers: int
    heads: int
    width: int


@dataclass
class Hyper:
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip: float


def parameter_shapes(cfg):
    """Global parameter names and shapes, in meshtrain's order."""
    C = cfg.width
    shapes = [("wte.weight", (cfg.vocab, C)), ("wpe.weight", (cfg.context, C))]
    for i in range(cfg.layers):
        p = f"h.{i}."
        shapes += [
            (p + "ln1.weight", (C,)), (p + "ln1.bias", (C,)),
            (p + "attn.qkv.weight", (3 * C, C)), (p + "attn.qkv.bias", (3 * C,)),
            (p + "attn.proj.weight", (C, C)), (p + "attn.proj.bias", (C,)),
            (p + "ln2.weight", (C,)), (p + "ln2.bias", (C,)),
            (p + "mlp.fc.weight", (4 * C, C)), (p + "mlp.fc.bias", (4 * C,)),
            (p + "mlp.proj.weight", (C, 4 * C)), (p + "mlp.proj.bias", (C,)),
        ]
    shapes += [("lnf.weight", (C,)), ("lnf.bias", (C,))]
    return shapes


def is_qkv_bias(name):
    return name.endswith(".attn.qkv.bias")


# ----------------------------------------------------------------------------
# The GPT in torch, as a function of a name -> tensor dict


def causal_self_attention(x, params, prefix, heads):
    B, T, C = x.shape
    head_size = C // heads
    qkv = F.linear(x, params[prefix + "qkv.weight"], params[prefix + "qkv.bias"])
    q, k, v = qkv.split(C, dim=-1)

    def by_head(t):
        return t.view(B, T, heads, head_size).transpose(1, 2)

    q, k, v = by_head(q), by_head(k), by_head(v)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_size)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    y = y.transpose(1, 2).reshape(B, T, C)
    return F.linear(y, params[prefix + "proj.weight"], params[prefix + "proj.bias"])


def mlp(x, params, prefix):
    hidden = F.linear(x, params[prefix + "fc.weight"], params[prefix + "fc.bias"])
    hidden = F.gelu(hidden, approximate="tanh")
    return F.linear(hidden, params[prefix + "proj.weight"], params[prefix + "proj.bias"])


def layer_norm(x, params, prefix):
    return F.layer_norm(x, (x.shape[-1],), params[prefix + "weight"],
                        params[prefix + "bias"], eps=LAYERNORM_EPS)


def gpt_forward(params, cfg, tokens, targets):
    """Return (logits [B, T, V], mean cross-entropy loss)."""
    T = tokens.shape[1]
    x = params["wte.weight"][tokens] + params["wpe.weight"][:T]
    for i in range(cfg.layers):
        p = f"h.{i}."
        x = x + causal_self_attention(layer_norm(x, params, p + "ln1."), params, p + "attn.", cfg.heads)
        x = x + mlp(layer_norm(x, params, p + "ln2."), params, p + "mlp.")
    x = layer_norm(x, params, "lnf.")
    logits = x @ params["wte.weight"].T
    loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))
    return logits, loss


def make_adamw(params, hyper):
    """torch AdamW (single-tensor path); weight decay only on 2-D tensors."""
    decayed = [t for t in params.values() if t.dim() == 2]
    undecayed = [t for t in params.values() if t.dim() != 2]
    groups = [{"params": decayed, "weight_decay": hyper.weight_decay},
              {"params": undecayed, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.0, betas=(hyper.beta1, hyper.beta2),
                             eps=hyper.eps, foreach=False)


def reference_run(cfg, hyper, initial_params, tokens, targets, step_lrs, dtype):
    """Run the dump's protocol in torch and return the computed records.

    Step 1's forward/backward is the single pass behind "logits", "loss" and
    "grad/*" (grads zeroed first, taken before clipping)."""
    params = {name: torch.tensor(value, dtype=dtype, requires_grad=True)
              for name, value in initial_params.items()}
    tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    targets = torch.from_numpy(np.asarray(targets, dtype=np.int64))
    optimizer = make_adamw(params, hyper)
    out = {}
    step_losses, step_norms = [], []
    for step, lr in enumerate(step_lrs):
        optimizer.zero_grad(set_to_none=False)
        logits, loss = gpt_forward(params, cfg, tokens, targets)
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.detach().reshape(1).clone()
            for name, tensor in params.items():
                out["grad/" + name] = tensor.grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hyper.clip)
        for group in optimizer.param_groups:
            group["lr"] = float(lr)
        optimizer.step()
        step_losses.append(loss.item())
        step_norms.append(norm.item())
    out["step_loss"] = torch.tensor(step_losses, dtype=torch.float64)
    out["step_grad_norm"] = torch.tensor(step_norms, dtype=torch.float64)
    for name, tensor in params.items():
        out["final/" + name] = tensor.detach().clone()
    return {name: t.numpy() for name, t in out.items()}


# ----------------------------------------------------------------------------
# Comparisons


@dataclass
class Check:
    category: str
    name: str
    error: float
    tolerance: float
    kind: str  # "rel" (|a-b|/|b| by norm) or "abs" (max |a-b|)

    @property
    def passed(self):
        return bool(self.error <= self.tolerance)  # NaN fails

    @property
    def ratio(self):
        return self.error / self.tolerance


def relative_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    want_norm = np.linalg.norm(want)
    diff_norm = np.linalg.norm(got - want)
    if want_norm == 0.0:
        return diff_norm  # nothing to scale by: fall back to the absolute norm
    return diff_norm / want_norm


def max_abs_error(got, want):
    diff = np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(diff))) if diff.size else 0.0


def qkv_slices(width):
    return {"q": slice(0, width), "k": slice(width, 2 * width), "v": slice(2 * width, 3 * width)}


def compare_tensor(category, name, got, want, tolerance, width,
                   key_bias_category=None, key_bias_tolerance=None):
    """Per-tensor relative check; a qkv bias is split so its key slice gets an absolute bound."""
    if not is_qkv_bias(name):
        return [Check(category, name, relative_error(got, want), tolerance, "rel")]
    checks = []
    for part, cut in qkv_slices(width).items():
        label = f"{name}[{part}]"
        if part == "k":
            checks.append(Check(key_bias_category, label, max_abs_error(got[cut], want[cut]),
                                key_bias_tolerance, "abs"))
        else:
            checks.append(Check(category, label, relative_error(got[cut], want[cut]), tolerance, "rel"))
    return checks


def check_dump_against(records, ref, cfg, step_lrs):
    checks = [
        Check("loss", "loss", relative_error(records["loss"], ref["loss"]), TOL_LOSS, "rel"),
        Check("logits", "logits", relative_error(records["logits"], ref["logits"]), TOL_LOGITS, "rel"),
    ]
    names = [name for name, _ in parameter_shapes(cfg)]
    for name in names:
        key = "grad/" + name
        checks += compare_tensor("grad", key, records[key], ref[key], TOL_GRAD, cfg.width,
                                 "grad_key_bias", TOL_KEY_BIAS_GRAD_ABS)
    for step in range(len(step_lrs)):
        checks.append(Check("step_loss", f"step_loss[{step + 1}]",
                            relative_error(records["step_loss"][step], ref["step_loss"][step]),
                            TOL_STEP_LOSS, "rel"))
        checks.append(Check("step_grad_norm", f"step_grad_norm[{step + 1}]",
                            relative_error(records["step_grad_norm"][step], ref["step_grad_norm"][step]),
                            TOL_STEP_GRAD_NORM, "rel"))
    # The key part of the qkv bias has an exactly zero gradient (softmax is
    # invariant to adding the same value to every score of a row), so fp32
    # leaves only round-off noise there. Adam normalises that noise to updates
    # of up to lr per step, so the key bias can drift by at most sum(lr) <=
    # 3 * max(lr) from the reference; a relative bound would be meaningless.
    key_bias_final_bound = NUM_STEPS * float(np.max(step_lrs))
    for name in names:
        key = "final/" + name
        checks += compare_tensor("final", key, records[key], ref[key], TOL_FINAL, cfg.width,
                                 "final_key_bias", key_bias_final_bound)
    return checks


# ----------------------------------------------------------------------------
# Loading and validating a dump


def expected_record_shapes(cfg, batch, seq):
    shapes = {"config": (5,), "hyper": (6,), "tokens": (batch, seq), "targets": (batch, seq),
              "logits": (batch, seq, cfg.vocab), "loss": (1,),
              "step_lr": (NUM_STEPS,), "step_loss": (NUM_STEPS,), "step_grad_norm": (NUM_STEPS,)}
    for name, shape in parameter_shapes(cfg):
        for kind in ("param/", "grad/", "final/"):
            shapes[kind + name] = shape
    return shapes


def validate_records(records):
    """Raise DumpError unless every expected record is there with its shape and dtype."""
    for required in ("config", "hyper", "tokens"):
        if required not in records:
            raise DumpError(f"missing record {required!r}")
    cfg = config_from_records(records)
    if cfg.width % cfg.heads != 0:
        raise DumpError(f"width {cfg.width} not divisible by heads {cfg.heads}")
    batch, seq = records["tokens"].shape
    if seq > cfg.context:
        raise DumpError(f"sequence length {seq} exceeds context {cfg.context}")
    integer_records = {"config", "tokens", "targets"}
    for name, shape in expected_record_shapes(cfg, batch, seq).items():
        if name not in records:
            raise DumpError(f"missing record {name!r}")
        if tuple(records[name].shape) != tuple(shape):
            raise DumpError(f"record {name!r} has shape {records[name].shape}, expected {shape}")
        want_dtype = np.int32 if name in integer_records else np.float32
        if records[name].dtype != want_dtype:
            raise DumpError(f"record {name!r} has dtype {records[name].dtype}, expected {np.dtype(want_dtype)}")
    for token_record in ("tokens", "targets"):
        values = records[token_record]
        if values.min() < 0 or values.max() >= cfg.vocab:
            raise DumpError(f"record {token_record!r} has ids outside [0, {cfg.vocab})")
    unknown = sorted(set(records) - set(expected_record_shapes(cfg, batch, seq)))
    if unknown:
        print(f"note: ignoring unexpected records: {', '.join(unknown)}")
    return cfg


def config_from_records(records):
    vocab, context, layers, heads, width = (int(v) for v in records["config"])
    return Config(vocab, context, layers, heads, width)


def hyper_from_records(records):
    beta1, beta2, eps, weight_decay, clip, _unused = (float(v) for v in records["hyper"])
    return Hyper(beta1, beta2, eps, weight_decay, clip)


def initial_params_from_records(records, cfg):
    return {name: records["param/" + name] for name, _ in parameter_shapes(cfg)}


def run_checks(records):
    """Validate a dump, recompute it in float64 torch, and return the list of Checks."""
    cfg = validate_records(records)
    hyper = hyper_from_records(records)
    step_lrs = records["step_lr"].astype(np.float64)
    ref = reference_run(cfg, hyper, initial_params_from_records(records, cfg),
                        records["tokens"], records["targets"], step_lrs, torch.float64)
    return check_dump_against(records, ref, cfg, step_lrs)


# ----------------------------------------------------------------------------
# Reporting


def print_checks(checks):
    for check in checks:
        verdict = "PASS" if check.passed else "FAIL"
        print(f"{verdict} {check.category:15s} {check.name:36s} {check.kind} err {check.error:.3e}"
              f"  (tol {check.tolerance:.1e})")


def print_worst_per_category(checks):
    print("worst per category (error / tolerance):")
    categories = list(dict.fromkeys(check.category for check in checks))
    for category in categories:
        in_category = [c for c in checks if c.category == category]
        worst = max(in_category, key=lambda c: c.ratio if c.passed else math.inf)
        print(f"  {category:15s} {worst.ratio:8.3f}  {worst.kind} err {worst.error:.3e}"
              f"  tol {worst.tolerance:.1e}  ({worst.name})")


def print_summary(checks):
    print_checks(checks)
    print_worst_per_category(checks)
    failures = [c for c in checks if not c.passed]
    print(f"{len(checks) - len(failures)}/{len(checks)} checks passed")
    return not failures


def check_dump_file(path):
    """Check one dump file; print the report; return True when all checks pass."""
    try:
        records = read_dump(path)
        config = config_from_records(records) if "config" in records else None
        if config is not None and "tokens" in records:
            batch, seq = records["tokens"].shape
            print(f"dump {path}: vocab {config.vocab} context {config.context} layers {config.layers}"
                  f" heads {config.heads} width {config.width} batch {batch} seq {seq}")
        checks = run_checks(records)
    except (DumpError, KeyError, ValueError) as error:
        print(f"FAIL dump {path}: {error}")
        return False
    return print_summary(checks)


# ----------------------------------------------------------------------------
# Self-test: a dump made by torch in float32 stands in for meshtrain


SELF_TEST_CONFIG = Config(vocab=67, context=16, layers=2, heads=2, width=32)
SELF_TEST_BATCH, SELF_TEST_SEQ = 3, 12  # seq < context: only part of wpe is used
SELF_TEST_HYPER = Hyper(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0)
SELF_TEST_LRS = np.array([1e-3, 6e-4, 3e-4], dtype=np.float32)


def random_params(cfg, rng):
    """GPT-2-like init, but with non-trivial biases and LayerNorm gains so they get exercised."""
    params = {}
    for name, shape in parameter_shapes(cfg):
        if ".ln" in name or name.startswith("lnf."):
            base = 1.0 if name.endswith(".weight") else 0.0
            values = base + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            values = 0.02 * rng.standard_normal(shape)
        else:
            values = 0.02 * rng.standard_normal(shape)
        params[name] = values.astype(np.float32)
    return params


def make_self_test_records(cfg, batch, seq, seed=1234):
    hyper = SELF_TEST_HYPER
    rng = np.random.default_rng(seed)
    params = random_params(cfg, rng)
    tokens = rng.integers(0, cfg.vocab, size=(batch, seq)).astype(np.int32)
    targets = rng.integers(0, cfg.vocab, size=(batch, seq)).astype(np.int32)
    computed = reference_run(cfg, hyper, params, tokens, targets, SELF_TEST_LRS, torch.float32)
    as_f32 = {name: np.asarray(value, dtype=np.float32) for name, value in computed.items()}

    records = {
        "config": np.array([cfg.vocab, cfg.context, cfg.layers, cfg.heads, cfg.width], dtype=np.int32),
        "hyper": np.array([hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, hyper.clip, 0.0],
                          dtype=np.float32),
        "tokens": tokens,
        "targets": targets,
    }
    names = [name for name, _ in parameter_shapes(cfg)]
    records.update({"param/" + name: params[name] for name in names})
    records["logits"] = as_f32["logits"]
    records["loss"] = as_f32["loss"]
    records.update({"grad/" + name: as_f32["grad/" + name] for name in names})
    records["step_lr"] = SELF_TEST_LRS
    records["step_loss"] = as_f32["step_loss"]
    records["step_grad_norm"] = as_f32["step_grad_norm"]
    records.update({"final/" + name: as_f32["final/" + name] for name in names})
    return records


def corrupted_copies(records):
    """Dumps that the checker must reject, each with the reason it should fail."""
    width = int(records["config"][4])
    last = f"h.{int(records['config'][2]) - 1}."
    key_bias = slice(width, 2 * width)

    def with_change(name, change):
        copy = dict(records)
        copy[name] = change(records[name].copy())
        return copy

    def scale_all(factor):
        return lambda a: (a * np.float32(factor)).astype(np.float32)

    def bump_key_bias(amount):
        def change(a):
            a[key_bias] += np.float32(amount)
            return a
        return change

    return [
        ("loss off by 1e-4", with_change("loss", scale_all(1 + 1e-4))),
        ("one grad off by 1e-3", with_change(f"grad/{last}mlp.fc.weight", scale_all(1 + 1e-3))),
        ("key-bias grad non-zero", with_change("grad/h.0.attn.qkv.bias", bump_key_bias(1e-5))),
        ("final key bias moved too far", with_change(f"final/{last}attn.qkv.bias",
                                                      bump_key_bias(4 * float(np.max(SELF_TEST_LRS))))),
        ("final lnf.bias off by 1e-4", with_change("final/lnf.bias", scale_all(1 + 1e-4))),
    ]


def self_test(cfg, batch, seq, keep_path=None):
    records = make_self_test_records(cfg, batch, seq)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        path = keep_path or os.path.join(tmp, "self_test.dump")
        write_dump(path, records)
        print(f"self-test: wrote {path}; checking torch float32 against torch float64")
        if not check_dump_file(path):
            print("self-test FAILED: the float32 torch dump does not pass")
            ok = False
        reread = read_dump(path)
        if list(reread) != list(records) or any(not np.array_equal(reread[n], records[n]) for n in records):
            print("self-test FAILED: dump does not round-trip through write/read")
            ok = False
        for reason, bad_records in corrupted_copies(records):
            try:
                failures = [c for c in run_checks(bad_records) if not c.passed]
            except DumpError as error:
                failures = [error]
            verdict = "rejected" if failures else "NOT rejected"
            print(f"self-test: corrupted dump ({reason}): {verdict}")
            ok = ok and bool(failures)
        truncated = os.path.join(tmp, "truncated.dump")
        with open(path, "rb") as src, open(truncated, "wb") as dst:
            dst.write(src.read()[:-3])
        try:
            read_dump(truncated)
            print("self-test: truncated dump NOT rejected")
            ok = False
        except DumpError:
            print("self-test: truncated dump rejected")
    print("self-test " + ("PASSED" if ok else "FAILED"))
    return ok


def self_test_shape(shape_arg):
    """(Config, batch, seq) from the --shape numbers, or the tiny default."""
    if shape_arg is None:
        return SELF_TEST_CONFIG, SELF_TEST_BATCH, SELF_TEST_SEQ
    vocab, context, layers, heads, width, batch, seq = shape_arg
    if width % heads != 0 or seq > context:
        raise SystemExit("--shape: need C divisible by NH and T <= CONTEXT")
    return Config(vocab, context, layers, heads, width), batch, seq


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", help="dump file written by build/tests/mt_ref_dump")
    parser.add_argument("--self-test", action="store_true",
                        help="check a dump made by torch in float32 (no C program needed)")
    parser.add_argument("--keep", metavar="PATH", help="with --self-test: write the dump here and keep it")
    parser.add_argument("--shape", type=int, nargs=7, metavar=("V", "CONTEXT", "L", "NH", "C", "B", "T"),
                        help="with --self-test: model and batch shape (default: a tiny one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    if args.self_test == bool(args.dump):
        parser.error("give either a dump file or --self-test")
    torch.set_num_threads(args.threads)
    if args.self_test:
        ok = self_test(*self_test_shape(args.shape), keep_path=args.keep)
    else:
        ok = check_dump_file(args.dump)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
