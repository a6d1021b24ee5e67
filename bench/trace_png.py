#!/usr/bin/python3
# Draws a merged meshtrain trace (meshtrain trace merge) as a PNG timeline, one row per rank.
# Standard library only (zlib and struct write the PNG, a built-in 5x7 font the text).
"""Render a meshtrain trace as a PNG timeline.

usage: /usr/bin/python3 bench/trace_png.py MERGED.json OUT.png [--width 1600]
                                           [--from-step K] [--steps N]

One row per rank (labelled with the rank's name from the trace), time left to right in
milliseconds since the trace's earliest event (the axis at the bottom). In each row:
  forward     blue          backward    green
  send        dark orange   recv        light orange
  collective  red           idle        light grey (the pipeline bubble)
  other       purple        no span     white (time not recorded as any kind)
A thin strip above each row outlines the optimizer steps ("STEP 12"). A span inside another
(a collective during a forward) is drawn over it. Spans wide enough carry their names
("F3", "B3.1"); a span narrower than a pixel is still drawn one pixel wide.

A trace of many steps is too long to read at once: when the trace has step spans, the
picture shows --steps N steps (default 2) from step --from-step K (default: the last N).
Steps are numbered as in the trace ("step 12"; in order from 0 when unnumbered). Without
step spans the whole trace is drawn. A per-rank file (not merged) is accepted too.
Exit status 1 with a message on bad input, 2 on bad arguments.
"""
import argparse
import json
import math
import struct
import sys
import zlib

COLOURS = {
    "forward": (66, 133, 244),
    "backward": (52, 168, 83),
    "send": (230, 115, 0),
    "recv": (255, 183, 77),
    "collective": (219, 68, 55),
    "idle": (210, 210, 210),
}
OTHER = (150, 90, 200)
LEGEND = ["forward", "backward", "send", "recv", "collective", "idle"]
WHITE, BLACK, GREY, FRAME = (255, 255, 255), (0, 0, 0), (110, 110, 110), (60, 60, 60)

# 5x7 glyphs: 7 rows of 5 bits (the high bit is the left column), as 14 hex digits.
FONT = {
    "0": "0e11131519110e", "1": "040c040404040e", "2": "0e11010204081f", "3": "1f02040201110e",
    "4": "02060a121f0202", "5": "1f101e0101110e", "6": "0608101e11110e", "7": "1f010204080808",
    "8": "0e11110e11110e", "9": "0e11110f01020c", "A": "0e1111111f1111", "B": "1e11111e11111e",
    "C": "0e11101010110e", "D": "1c12111111121c", "E": "1f10101e10101f", "F": "1f10101e101010",
    "G": "0e11101711110f", "H": "1111111f111111", "I": "0e04040404040e",
    "J": "0702020202120c", "K": "11121418141211", "L": "1010101010101f", "M": "111b1515111111",
    "N": "11111915131111", "O": "0e11111111110e", "P": "1e11111e101010", "Q": "0e11111115120d",
    "R": "1e11111e141211", "S": "0f10100e01011e", "T": "1f040404040404", "U": "1111111111110e",
    "V": "11111111110a04", "W": "1111111515150a", "X": "11110a040a1111",
    "Y": "1111110a040404", "Z": "1f01020408101f", " ": "00000000000000", "(": "02040808080402",
    ")": "08040202020408", ",": "000000000c0408", ".": "00000000000c0c", ":": "000c0c000c0c00",
    "-": "0000001f000000", "/": "00010204081000", "+": "0004041f040400", "_": "0000000000001f",
    "=": "00001f001f0000", "?": "0e110102040004", "%": "18190204081303", "'": "04040800000000",
    "#": "0a0a1f0a1f0a0a", "[": "0e08080808080e", "]": "0e02020202020e", "<": "02040810080402",
    ">": "08040201020408", "*": "0004150e150400", '"': "0a0a0000000000",
}


class Canvas:
    """An RGB picture with filled rectangles and text, written as an 8-bit PNG."""

    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def rect(self, x0, y0, x1, y1, colour):
        """Fills [x0, x1) x [y0, y1), clipped to the picture."""
        x0, x1 = max(0, int(x0)), min(self.width, int(x1))
        y0, y1 = max(0, int(y0)), min(self.height, int(y1))
        if x1 <= x0 or y1 <= y0:
            return
        run = bytes(colour) * (x1 - x0)
        for y in range(y0, y1):
            at = (y * self.width + x0) * 3
            self.pixels[at:at + len(run)] = run

    def outline(self, x0, y0, x1, y1, colour):
        self.rect(x0, y0, x1, y0 + 1, colour)
        self.rect(x0, y1 - 1, x1, y1, colour)
        self.rect(x0, y0, x0 + 1, y1, colour)
        self.rect(x1 - 1, y0, x1, y1, colour)

    def text(self, x, y, string, colour, scale=1):
        """Draws upper-cased text from (x, y), its top left; returns the x after it."""
        for ch in string.upper():
            glyph = FONT.get(ch, FONT["?"])
            for row in range(7):
                bits = int(glyph[2 * row:2 * row + 2], 16)
                for col in range(5):
                    if bits & (0x10 >> col):
                        self.rect(x + col * scale, y + row * scale,
                                  x + (col + 1) * scale, y + (row + 1) * scale, colour)
            x += 6 * scale
        return x

    def save(self, path):
        stride = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride:(y + 1) * stride])
                       for y in range(self.height))

        def chunk(tag, data):
            body = tag + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) +
                    chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(string, scale=1):
    return 6 * scale * len(string)


class BadTrace(Exception):
    pass


def load(path):
    """The trace's rows: {pid: {"label", "order", "spans": [(start, end, cat, name)],
    "steps": [(start, end, number)]}}, times in ms."""
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except OSError as e:
        raise BadTrace(f"cannot read {path}: {e.strerror}")
    except (ValueError, UnicodeDecodeError) as e:
        raise BadTrace(f"{path} is not JSON: {e}")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list) \
            or not isinstance(trace.get("meshtrain"), dict):
        raise BadTrace(f"{path} is not a meshtrain trace (no traceEvents list and meshtrain "
                       "object; make one with `meshtrain trace merge`)")
    rows = {}
    for i, event in enumerate(trace["traceEvents"]):
        where = f"{path}: event {i}"
        if not isinstance(event, dict) or not isinstance(event.get("pid"), int):
            raise BadTrace(f"{where} is not an object with a pid")
        row = rows.setdefault(event["pid"], {"label": f"rank {event['pid']}",
                                             "order": event["pid"], "spans": [], "steps": []})
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if event.get("ph") == "M":
            if event.get("name") == "process_name" and isinstance(args.get("name"), str):
                row["label"] = args["name"]
            elif event.get("name") == "process_sort_index" and \
                    isinstance(args.get("sort_index"), int):
                row["order"] = args["sort_index"]
            continue
        if event.get("ph") != "X":
            continue
        ts, dur = event.get("ts"), event.get("dur")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ts, dur)):
            raise BadTrace(f"{where} has no numeric ts and dur")
        start, end = ts / 1000.0, (ts + dur) / 1000.0
        category, name = str(event.get("cat", "")), str(event.get("name", ""))
        if category == "step":
            number = args.get("step")
            row["steps"].append((start, end, number if isinstance(number, int) else None))
        else:
            row["spans"].append((start, end, category, name))
    if not any(row["spans"] or row["steps"] for row in rows.values()):
        raise BadTrace(f"{path} holds no spans")
    for row in rows.values():
        row["spans"].sort(key=lambda s: (s[0], -s[1]))  # enclosing spans first, drawn under
        row["steps"].sort()
        row["steps"] = [(s, e, k if n is None else n) for k, (s, e, n) in enumerate(row["steps"])]
    return rows


def window(rows, from_step, count):
    """The [start, end) ms to draw and a caption saying which steps they are."""
    numbers = sorted({n for row in rows.values() for _, _, n in row["steps"]})
    if not numbers:
        if from_step is not None:
            raise BadTrace("--from-step: the trace has no step spans")
        starts = [s for row in rows.values() for s, _, _, _ in row["spans"]]
        ends = [e for row in rows.values() for _, e, _, _ in row["spans"]]
        return min(starts), max(ends), "whole trace"
    first = numbers[-count] if from_step is None and len(numbers) >= count else numbers[0]
    if from_step is not None:
        if from_step not in numbers:
            raise BadTrace(f"--from-step {from_step}: the trace has steps {numbers[0]} to "
                           f"{numbers[-1]}")
        first = from_step
    chosen = [n for n in numbers if n >= first][:count]
    steps = [(s, e) for row in rows.values() for s, e, n in row["steps"] if n in chosen]
    caption = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {chosen[0]}-{chosen[-1]}"
    return min(s for s, _ in steps), max(e for _, e in steps), caption


def nice_interval(length, ticks):
    """The largest 1, 2 or 5 times a power of ten at most length / ticks: at least `ticks`."""
    raw = length / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return max(m * power for m in (1, 2, 5) if m * power <= raw * (1 + 1e-9))


def legend_layout(width):
    """Where each legend entry goes, (x, y, category; None for the step outline), wrapping
    onto more lines in a narrow picture; and the y below the legend."""
    places, x, y = [], 16, 44
    for category in LEGEND + [None]:
        entry = 28 + text_width(category or "step", 2) + 20
        if x > 16 and x + entry > width:
            x, y = 16, y + 22
        places.append((x, y, category))
        x += entry
    return places, y + 36


def darker(colour):
    return tuple(int(c * 0.65) for c in colour)


def ink_on(colour):
    """Black or white text, whichever reads on the colour."""
    return BLACK if sum(colour) > 500 else WHITE


def draw(rows, t0, t1, caption, width):
    order = sorted(rows, key=lambda pid: (rows[pid]["order"], pid))
    row_height, strip, gap = 40, 12, 12
    labels = {pid: rows[pid]["label"] for pid in order}
    widest = max(len(label) for label in labels.values())
    label_scale = 2 if 16 + text_width("x" * widest, 2) <= width // 3 else 1
    left = min(width // 3, 16 + text_width("x" * widest, label_scale))
    right = width - 20
    places, top = legend_layout(width)
    height = top + len(order) * (strip + row_height + gap) + 56
    canvas = Canvas(width, height)
    scale = (right - left) / max(t1 - t0, 1e-9)

    def x_of(t):
        return left + (t - t0) * scale

    title = f"meshtrain trace: {caption}, {t1 - t0:.4g} ms"
    canvas.text(16, 12, title, BLACK, 2 if 16 + text_width(title, 2) <= width else 1)
    for x, y, category in places:
        if category:
            canvas.rect(x, y, x + 22, y + 14, COLOURS[category])
        else:
            canvas.outline(x, y + 1, x + 22, y + 13, FRAME)
        canvas.text(x + 28, y, category or "step", BLACK, 2)

    y = top
    for pid in order:
        label = labels[pid]
        while text_width(label, label_scale) > left - 16:
            label = label[:-1]
        canvas.text(8, y + strip + (row_height - 7 * label_scale) // 2, label, BLACK, label_scale)
        for start, end, number in rows[pid]["steps"]:
            if end > t0 and start < t1:
                x0, x1 = max(x_of(start), left), min(x_of(end), right)
                canvas.outline(x0, y, max(x1, x0 + 2), y + strip - 2, FRAME)
                name = f"step {number}"
                if x1 - x0 > text_width(name) + 6:
                    canvas.text(x0 + 3, y + 2, name, FRAME)
        band = y + strip
        canvas.outline(left - 1, band - 1, right + 1, band + row_height + 1, (200, 200, 200))
        for start, end, category, name in rows[pid]["spans"]:
            if end < t0 or start > t1:
                continue
            colour = COLOURS.get(category, OTHER)
            x0, x1 = max(x_of(start), left), min(x_of(end), right)
            x1 = max(x1, x0 + 1)
            canvas.rect(x0, band, x1, band + row_height, colour)
            if x1 - x0 >= 4:
                canvas.rect(x0, band, x0 + 1, band + row_height, darker(colour))
            if x1 - x0 > text_width(name) + 6:
                canvas.text(x0 + 3, band + (row_height - 7) // 2, name, ink_on(colour))
        y += strip + row_height + gap

    interval = nice_interval(t1 - t0, max(2, (right - left) // 120))
    tick = interval * math.ceil(t0 / interval)
    canvas.rect(left, y, right, y + 1, BLACK)
    decimals = max(0, -int(math.floor(math.log10(interval))))
    while tick <= t1 + 1e-9:
        x = x_of(tick)
        canvas.rect(x, y, x + 1, y + 6, BLACK)
        text = f"{tick:.{decimals}f}"
        canvas.text(min(x - text_width(text, 2) / 2, width - text_width(text, 2) - 2), y + 10,
                    text, GREY, 2)
        tick += interval
    canvas.text(right - text_width("ms", 2), y + 30, "ms", GREY, 2)
    return canvas


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="a merged trace (meshtrain trace merge --out FILE ...)")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--width", type=int, default=1600, help="picture width in pixels")
    parser.add_argument("--from-step", type=int, default=None,
                        help="first step shown (default: the last --steps steps)")
    parser.add_argument("--steps", type=int, default=2, help="steps shown (default 2)")
    args = parser.parse_args()
    if args.width < 400 or args.width > 20000:
        parser.error("--width must be in 400..20000")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        rows = load(args.trace)
        t0, t1, caption = window(rows, args.from_step, args.steps)
        canvas = draw(rows, t0, t1, caption, args.width)
        canvas.save(args.out)
    except BadTrace as e:
        sys.exit(f"trace_png.py: error: {e}")
    except OSError as e:
        sys.exit(f"trace_png.py: error: cannot write {args.out}: {e.strerror}")
    print(f"trace_png.py: wrote {args.out} ({canvas.width}x{canvas.height}, {caption})")


if __name__ == "__main__":
    main()
