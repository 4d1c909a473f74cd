"""`python3 -m simpler.demo [name ...] [--runtime NAME]`: runs the examples' Python
versions (examples/<name>/main.py), each checked against its numpy golden; exits
non-zero if any fails. `simpler demo` is the C++ entry."""

import argparse
import importlib
import sys
import time

from .examples import NAMES


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m simpler.demo", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"examples to run (default: all of {', '.join(NAMES)})")
    parser.add_argument("--runtime", help="the chip runtime, by its C++ name (default: each example's own)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        parser.error(f"unknown example {unknown[0]!r}; there are {', '.join(NAMES)}")
    failed = 0
    for name in args.names or NAMES:
        module = importlib.import_module(f"simpler.examples.{name}")
        start = time.perf_counter()
        try:
            detail = module.run(runtime=args.runtime) if args.runtime else module.run()
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next example runs
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            continue
        print(f"ok   {name:<17} {time.perf_counter() - start:6.2f} s  {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
