import subprocess

SCRIPT = "/app/report.sh"


def run(directory):
    return subprocess.run(["bash", SCRIPT, str(directory)], capture_output=True,
                          text=True, timeout=20, cwd="/tmp")


def test_app_data():
    r = run("/app/data")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("empty.txt\t0\n"
                        "inventory.txt\t3\n"
                        "meeting notes.txt\t5\n"
                        "todo.txt\t3\n"
                        "TOTAL\t11\n")


def test_other_directory_with_spaces(tmp_path):
    d = tmp_path / "my reports"
    d.mkdir()
    (d / "z last.txt").write_text("1\n2\n3\n4\n")
    (d / "a.txt").write_text("only\n")
    (d / "mid  two spaces.txt").write_text("x\ny")
    (d / "notes.md").write_text("ignored\nignored\n")
    (d / "sub.txt").mkdir()
    (d / "sub.txt" / "inner.txt").write_text("ignored\n")
    r = run(d)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("a.txt\t1\n"
                        "mid  two spaces.txt\t2\n"
                        "z last.txt\t4\n"
                        "TOTAL\t7\n")


def test_no_txt_files(tmp_path):
    (tmp_path / "readme.md").write_text("hello\n")
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "TOTAL\t0\n"


def test_empty_directory(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "TOTAL\t0\n"


def test_large_total(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_text("l\n" * (i * 10))
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "TOTAL\t660"
    assert lines[3] == "f03.txt\t30"
    assert len(lines) == 13
