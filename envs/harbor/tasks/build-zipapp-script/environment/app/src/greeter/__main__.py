import argparse

from greeter import VERSION
from greeter.core import greeting


def main(argv=None):
    parser = argparse.ArgumentParser(prog="greeter")
    parser.add_argument("--name", default="world")
    parser.add_argument("--shout", action="store_true")
    parser.add_argument("--version", action="version", version=f"greeter {VERSION}")
    args = parser.parse_args(argv)
    print(greeting(args.name, args.shout))


if __name__ == "__main__":
    main()
