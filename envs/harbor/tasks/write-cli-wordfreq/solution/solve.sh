#!/bin/bash
set -e
cd /app
cat > /app/wordfreq.py <<'PY'
#!/usr/bin/env python3
"""Count words in files (or standard input) and print the most frequent ones."""
import argparse
import re
import sys
from collections import Counter

WORD = re.compile(r"[A-Za-z]+")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="wordfreq", description=__doc__)
    parser.add_argument("files", nargs="*", metavar="FILE", help="files to read (default: stdin)")
    parser.add_argument("-n", "--top", type=positive_int, default=10, metavar="N",
                        help="print at most N words (default 10)")
    parser.add_argument("-m", "--min-length", type=positive_int, default=1, metavar="L",
                        help="ignore words shorter than L letters (default 1)")
    parser.add_argument("-i", "--ignore-case", action="store_true",
                        help="lowercase words before counting")
    args = parser.parse_args(argv)

    texts = []
    if args.files:
        for name in args.files:
            try:
                with open(name, encoding="utf-8") as f:
                    texts.append(f.read())
            except (OSError, UnicodeDecodeError) as e:
                print(f"wordfreq: cannot read {name}: {e}", file=sys.stderr)
                return 1
    else:
        texts.append(sys.stdin.read())

    counts = Counter()
    for text in texts:
        for word in WORD.findall(text):
            if len(word) < args.min_length:
                continue
            counts[word.lower() if args.ignore_case else word] += 1

    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for word, count in ranked[:args.top]:
        print(f"{count}\t{word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
python3 /app/wordfreq.py -i -n 3 /app/sample.txt
