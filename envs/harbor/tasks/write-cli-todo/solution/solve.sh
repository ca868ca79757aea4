#!/bin/bash
set -e
cd /app
cat > /app/todo.py <<'PY'
#!/usr/bin/env python3
"""A small to-do list kept in a JSON file."""
import argparse
import json
import os
import sys

PRIORITIES = ("low", "normal", "high")


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {"next_id": 1, "items": []}


def save(path, data):
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def find(data, item_id):
    for item in data["items"]:
        if item["id"] == item_id:
            return item
    print(f"todo: no item #{item_id}", file=sys.stderr)
    sys.exit(1)


def line(item):
    mark = "x" if item["done"] else " "
    suffix = "" if item["priority"] == "normal" else f" ({item['priority']})"
    return f"#{item['id']} [{mark}] {item['text']}{suffix}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="todo", description=__doc__)
    parser.add_argument("--db", default="/app/todo.json", help="JSON file (default /app/todo.json)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_add = sub.add_parser("add", help="add an item")
    p_add.add_argument("--priority", choices=PRIORITIES, default="normal")
    p_add.add_argument("text", nargs="+")
    p_list = sub.add_parser("list", help="list items")
    p_list.add_argument("--all", action="store_true", help="include done items")
    for name in ("done", "remove"):
        p = sub.add_parser(name, help=f"{name} an item")
        p.add_argument("id", type=int)
    args = parser.parse_args(argv)

    data = load(args.db)
    if args.command == "add":
        item = {"id": data["next_id"], "text": " ".join(args.text),
                "priority": args.priority, "done": False}
        data["next_id"] += 1
        data["items"].append(item)
        save(args.db, data)
        print(f"added #{item['id']}: {item['text']}")
    elif args.command == "list":
        shown = [i for i in sorted(data["items"], key=lambda i: i["id"]) if args.all or not i["done"]]
        print("\n".join(line(i) for i in shown) if shown else "no items")
    elif args.command == "done":
        item = find(data, args.id)
        item["done"] = True
        save(args.db, data)
        print(f"completed #{item['id']}: {item['text']}")
    elif args.command == "remove":
        item = find(data, args.id)
        data["items"].remove(item)
        save(args.db, data)
        print(f"removed #{item['id']}: {item['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
