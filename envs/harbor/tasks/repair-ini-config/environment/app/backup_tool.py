#!/usr/bin/env python3
"""Print the summary of the backup job configured in /app/backup.ini."""
import configparser
import sys

CONFIG = "/app/backup.ini"


def main():
    parser = configparser.ConfigParser()  # strict, with %(name)s interpolation
    try:
        with open(CONFIG, encoding="utf-8") as f:
            parser.read_file(f)
        job = parser["job"]
        schedule = parser["schedule"]
        retention = parser["retention"]
        lines = [
            f"job: {job['name']}",
            f"source: {job['source']}",
            f"destination: {job['destination']}",
            f"archive: {job['archive_name']}",
            f"compress: {str(job.getboolean('compress')).lower()}",
            f"schedule: {schedule['time']} {schedule['days']}",
            "keep: {} daily, {} weekly, {} monthly".format(
                retention.getint("keep_daily"),
                retention.getint("keep_weekly"),
                retention.getint("keep_monthly")),
        ]
    except (configparser.Error, KeyError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
