# python3.11 stopped in the interpreter's C code for tests/eim/stack:
# outer() -> inner() -> os.read on a pipe nobody writes. It prints
# "ready python" right before it blocks.
import os
import sys


def inner(fd):
    sys.stdout.write("ready python\n")
    sys.stdout.flush()
    return os.read(fd, 1)


def outer(fd):
    return len(inner(fd)) + 1


def main():
    r, _w = os.pipe()
    while True:
        outer(r)


main()
