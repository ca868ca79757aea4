#!/usr/bin/env python3
"""Load and validate /app/config/service.json, then print the startup summary."""
import json
import sys

CONFIG = "/app/config/service.json"
LOG_LEVELS = ("debug", "info", "warning", "error")


def validate(cfg):
    errors = []
    expected = {"name", "host", "port", "workers", "debug", "log_level", "upstreams"}
    if set(cfg) != expected:
        errors.append("settings must be exactly: " + ", ".join(sorted(expected)))
        return errors
    for key in ("name", "host"):
        if not isinstance(cfg[key], str) or not cfg[key]:
            errors.append(f"{key} must be a non-empty string")
    for key, low, high in (("port", 1, 65535), ("workers", 1, 64)):
        value = cfg[key]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            errors.append(f"{key} must be an integer from {low} to {high}")
    if not isinstance(cfg["debug"], bool):
        errors.append("debug must be true or false")
    if cfg["log_level"] not in LOG_LEVELS:
        errors.append("log_level must be one of: " + ", ".join(LOG_LEVELS))
    ups = cfg["upstreams"]
    if not isinstance(ups, list) or not ups:
        errors.append("upstreams must be a non-empty list")
    else:
        for i, up in enumerate(ups):
            if (not isinstance(up, dict) or set(up) != {"url", "weight"}
                    or not isinstance(up["url"], str)
                    or not isinstance(up["weight"], int) or isinstance(up["weight"], bool)):
                errors.append(f"upstreams[{i}] must be an object with a string url and an integer weight")
    return errors


def main():
    try:
        with open(CONFIG, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        print(f"error: {CONFIG} is not valid JSON: {e}", file=sys.stderr)
        return 1
    if not isinstance(cfg, dict):
        print("error: the configuration must be a JSON object", file=sys.stderr)
        return 1
    errors = validate(cfg)
    if errors:
        for err in errors:
            print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"service {cfg['name']} on {cfg['host']}:{cfg['port']}")
    print(f"workers={cfg['workers']} debug={str(cfg['debug']).lower()} log_level={cfg['log_level']}")
    for up in cfg["upstreams"]:
        print(f"upstream {up['url']} weight={up['weight']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
