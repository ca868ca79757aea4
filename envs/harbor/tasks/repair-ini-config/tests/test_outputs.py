import configparser
import subprocess
from pathlib import Path

EXPECTED = (
    "job: nightly\n"
    "source: /srv/data\n"
    "destination: /mnt/backup/nightly\n"
    "archive: nightly-%Y%m%d.tar.gz\n"
    "compress: true\n"
    "schedule: 02:30 daily\n"
    "keep: 7 daily, 4 weekly, 6 monthly\n"
)


def load():
    parser = configparser.ConfigParser()
    with open("/app/backup.ini", encoding="utf-8") as f:
        parser.read_file(f)
    return parser


def test_tool_unchanged():
    assert Path("/app/backup_tool.py").read_bytes() == Path("/tests/backup_tool.py.orig").read_bytes()


def test_tool_output():
    r = subprocess.run(["python3", "/app/backup_tool.py"], capture_output=True, text=True,
                       timeout=20, cwd="/tmp")
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED


def test_structure():
    parser = load()
    assert sorted(parser.sections()) == ["job", "retention", "schedule"]
    assert parser.get("job", "source") == "/srv/data"
    assert parser.get("schedule", "time") == "02:30"
    assert parser.get("schedule", "days") == "daily"
    assert parser.getint("retention", "keep_monthly") == 6


def test_interpolation_kept():
    parser = load()
    raw_dest = parser.get("job", "destination", raw=True)
    raw_archive = parser.get("job", "archive_name", raw=True)
    assert "%(name)s" in raw_dest and "nightly" not in raw_dest
    assert "%(name)s" in raw_archive and "nightly" not in raw_archive
    # Renaming the job must rename the derived values.
    parser.set("job", "name", "weekly")
    assert parser.get("job", "destination") == "/mnt/backup/weekly"
    assert parser.get("job", "archive_name") == "weekly-%Y%m%d.tar.gz"
