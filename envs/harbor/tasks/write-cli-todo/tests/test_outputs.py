import subprocess
from pathlib import Path

PROG = "/app/todo.py"


class Todo:
    def __init__(self, db):
        self.db = str(db)

    def __call__(self, *args):
        return subprocess.run(["python3", PROG, "--db", self.db, *map(str, args)],
                              capture_output=True, text=True, timeout=20, cwd="/tmp")

    def ok(self, *args):
        r = self(*args)
        assert r.returncode == 0, (args, r.returncode, r.stderr)
        return r.stdout


def test_program_exists():
    assert Path(PROG).is_file()


def test_example_session(tmp_path):
    t = Todo(tmp_path / "t.json")
    assert t.ok("add", "buy", "milk") == "added #1: buy milk\n"
    assert t.ok("add", "--priority", "high", "renew", "passport") == "added #2: renew passport\n"
    assert t.ok("done", "1") == "completed #1: buy milk\n"
    assert t.ok("list") == "#2 [ ] renew passport (high)\n"
    assert t.ok("list", "--all") == "#1 [x] buy milk\n#2 [ ] renew passport (high)\n"


def test_empty_list_and_lazy_creation(tmp_path):
    db = tmp_path / "sub" / "none.json"
    (tmp_path / "sub").mkdir()
    t = Todo(db)
    assert t.ok("list") == "no items\n"
    assert t.ok("list", "--all") == "no items\n"
    t.ok("add", "x")
    assert db.is_file()


def test_ids_never_reused_and_persisted(tmp_path):
    t = Todo(tmp_path / "t.json")
    assert t.ok("add", "one") == "added #1: one\n"
    assert t.ok("add", "--priority", "low", "two  words") == "added #2: two  words\n"
    assert t.ok("add", "three") == "added #3: three\n"
    assert t.ok("remove", "3") == "removed #3: three\n"
    assert t.ok("add", "four") == "added #4: four\n"
    assert t.ok("remove", "1") == "removed #1: one\n"
    assert t.ok("list") == "#2 [ ] two  words (low)\n#4 [ ] four\n"
    assert t.ok("done", "4") == "completed #4: four\n"
    assert t.ok("done", "4") == "completed #4: four\n"
    assert t.ok("list") == "#2 [ ] two  words (low)\n"
    assert t.ok("list", "--all") == "#2 [ ] two  words (low)\n#4 [x] four\n"
    assert t.ok("done", "2") == "completed #2: two  words\n"
    assert t.ok("list") == "no items\n"


def test_separate_databases(tmp_path):
    a = Todo(tmp_path / "a.json")
    b = Todo(tmp_path / "b.json")
    a.ok("add", "alpha")
    assert b.ok("add", "beta") == "added #1: beta\n"
    assert a.ok("list") == "#1 [ ] alpha\n"
    assert b.ok("list") == "#1 [ ] beta\n"


def test_unknown_id(tmp_path):
    db = tmp_path / "t.json"
    t = Todo(db)
    t.ok("add", "keep", "me")
    before = db.read_bytes()
    for cmd in ("done", "remove"):
        r = t(cmd, "7")
        assert r.returncode == 1
        assert r.stderr.strip() == "todo: no item #7"
        assert r.stdout == ""
    assert db.read_bytes() == before
    assert t.ok("list") == "#1 [ ] keep me\n"


def test_usage_errors(tmp_path):
    t = Todo(tmp_path / "t.json")
    for args in ([], ["add", "--priority", "urgent", "x"], ["done", "abc"], ["frobnicate"]):
        r = t(*args)
        assert r.returncode == 2, (args, r.returncode, r.stdout)
    assert t.ok("list") == "no items\n"
