#!python3
"""Counts the pixels of one colour inside a box of a PNG screenshot (no PIL on the test machines:
PNG is zlib-compressed scanlines, each behind a filter byte, so the standard library suffices).

  count_colour.py SHOT.png X,Y,W,H RRGGBB   → prints the count (±2 per channel counts as a match)
"""
import struct
import sys
import zlib


def read_png(path, last_row):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise SystemExit(f"{path}: only 8-bit RGB/RGBA, non-interlaced PNGs are read (got {depth}, {colour}, {interlace})")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(min(height, last_row)):  # rows below the box are not needed
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        rows.append(previous := unfilter(line[0], bytearray(line[1:]), previous, channels))
    return width, height, channels, rows


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


# The five PNG filters, undone left to right: each byte was stored as a difference from its
# left (a), upper (b) or upper-left (c) neighbour.
def unfilter(kind, line, up, bpp):
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = up[i], up[i - bpp] if i >= bpp else 0
        predictor = (0, a, b, (a + b) // 2, paeth(a, b, c))[kind]
        line[i] = (line[i] + predictor) & 0xFF
    return line


def main():
    path, box, colour = sys.argv[1], sys.argv[2], sys.argv[3].lstrip("#")
    x0, y0, w, h = (int(float(v)) for v in box.split(","))
    want = [int(colour[k:k + 2], 16) for k in (0, 2, 4)]
    width, height, channels, rows = read_png(path, y0 + h)
    n = 0
    for y in range(max(0, y0), min(len(rows), y0 + h)):
        row = rows[y]
        for x in range(max(0, x0), min(width, x0 + w)):
            px = row[x * channels:x * channels + 3]
            n += all(abs(px[k] - want[k]) <= 2 for k in range(3))
    print(n)


main()
