#!/usr/bin/env python3
"""Read /app/deploy.toml (with tomllib), check it and print the deployment plan."""
import sys
import tomllib

CONFIG = "/app/deploy.toml"


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check(cfg):
    errors = []
    for key in ("app", "region"):
        if not isinstance(cfg.get(key), str):
            errors.append(f"{key} must be a string")
    replicas = cfg.get("replicas")
    if not is_int(replicas) or not 1 <= replicas <= 50:
        errors.append("replicas must be an integer from 1 to 50")
    hosts = cfg.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        errors.append("hosts must be an array of strings")
    elif is_int(replicas) and len(hosts) != replicas:
        errors.append(f"hosts lists {len(hosts)} hosts but replicas is {replicas}")
    env = cfg.get("env")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        errors.append("env must be a table of strings")
    image = cfg.get("image", {})
    if not isinstance(image.get("repository"), str) or not isinstance(image.get("tag"), str):
        errors.append("image needs string repository and tag")
    db = cfg.get("database", {})
    if not isinstance(db.get("host"), str) or not is_int(db.get("port")) or not is_int(db.get("pool_size")):
        errors.append("database needs a string host and integer port and pool_size")
    hc = cfg.get("healthcheck", {})
    if not isinstance(hc.get("path"), str) or not hc["path"].startswith("/"):
        errors.append("healthcheck.path must be a string starting with /")
    if not is_int(hc.get("interval_seconds")):
        errors.append("healthcheck.interval_seconds must be an integer")
    if not isinstance(hc.get("timeout_seconds"), float):
        errors.append("healthcheck.timeout_seconds must be a float")
    return errors


def main():
    try:
        with open(CONFIG, "rb") as f:
            cfg = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        print(f"error: {CONFIG}: {e}", file=sys.stderr)
        return 1
    errors = check(cfg)
    if errors:
        for err in errors:
            print(f"error: {err}", file=sys.stderr)
        return 1
    img, db, hc = cfg["image"], cfg["database"], cfg["healthcheck"]
    print(f"deploy {cfg['app']} {img['tag']} to {cfg['region']}")
    print(f"image {img['repository']}:{img['tag']}")
    print(f"replicas {cfg['replicas']}: {', '.join(cfg['hosts'])}")
    print(f"database {db['host']}:{db['port']} pool={db['pool_size']}")
    print(f"healthcheck {hc['path']} every {hc['interval_seconds']}s timeout {hc['timeout_seconds']}s")
    for key in sorted(cfg["env"]):
        print(f"env {key}={cfg['env'][key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
