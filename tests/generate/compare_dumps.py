"""Checks one generation against another from `meshtrain generate --dump` files (per token: its
int32 id, then the vocab float32 logits it was drawn from): the same tokens and logits within
the tolerance, up to the first position where the reference's two largest logits are within
1e-4 of each other (a near-tie that rounding may break either way); past it nothing is checked.
usage: compare_dumps.py REFERENCE OTHER VOCAB [TOLERANCE] [MIN_CHECKED]"""
import struct
import sys


def load(path, vocab):
    with open(path, "rb") as f:
        raw = f.read()
    record = 4 + 4 * vocab
    if not raw or len(raw) % record:
        sys.exit(f"{path}: {len(raw)} bytes is not a whole number of {record}-byte records")
    tokens, logits = [], []
    for at in range(0, len(raw), record):
        tokens.append(struct.unpack_from("<i", raw, at)[0])
        logits.append(struct.unpack_from(f"<{vocab}f", raw, at + 4))
    return tokens, logits


def main():
    ref_path, other_path, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tolerance = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
    min_checked = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    ref_tokens, ref_logits = load(ref_path, vocab)
    tokens, logits = load(other_path, vocab)
    if len(tokens) != len(ref_tokens):
        sys.exit(f"{other_path}: {len(tokens)} tokens, the reference {len(ref_tokens)}")
    checked, worst = 0, 0.0
    for i in range(len(ref_tokens)):
        diff = max(abs(a - b) for a, b in zip(logits[i], ref_logits[i]))
        worst = max(worst, diff)
        if diff > tolerance:
            sys.exit(f"{other_path}: token {i}: logits differ by {diff:.3g} > {tolerance:g}")
        top = sorted(ref_logits[i])[-2:]
        if top[1] - top[0] < 1e-4:
            break  # a near-tie: the tokens may part here, and every logit after with them
        if tokens[i] != ref_tokens[i]:
            sys.exit(f"{other_path}: token {i} is {tokens[i]}, the reference's {ref_tokens[i]}")
        checked += 1
    if checked < min_checked:
        sys.exit(f"{other_path}: only {checked} tokens before a near-tie, fewer than "
                 f"{min_checked}: the check says too little")
    print(f"{other_path}: {checked} of {len(ref_tokens)} tokens the same, logits within "
          f"{worst:.2g}")


main()
