import subprocess


def run(path):
    return subprocess.run(["bash", "/app/tally.sh", str(path)], capture_output=True,
                          text=True, timeout=20, cwd="/tmp")


def expect(total, system, regular, nologin):
    return (f"total: {total}\nsystem: {system}\n"
            f"regular: {regular}\nnologin: {nologin}\n")


def test_app_users():
    r = run("/app/users.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == expect(14, 9, 5, 8)


def test_numeric_uid_comparison(tmp_path):
    f = tmp_path / "u.txt"
    f.write_text("a:5:/bin/sh\n"
                 "b:50:/bin/sh\n"
                 "c:200:/sbin/nologin\n"
                 "d:999:/bin/false\n"
                 "e:1000:/bin/sh\n"
                 "f:10000:/bin/sh\n"
                 "g:3:/bin/bash\n")
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expect(7, 5, 2, 2)


def test_comments_and_blank_lines(tmp_path):
    f = tmp_path / "u.txt"
    f.write_text("# header\n\nx:1500:/usr/bin/false\n\n# trailing comment\n"
                 "y:42:/usr/local/sbin/nologin\n")
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expect(2, 1, 1, 2)


def test_only_comments(tmp_path):
    f = tmp_path / "u.txt"
    f.write_text("# nothing here\n# still nothing\n")
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expect(0, 0, 0, 0)


def test_shell_names_that_only_look_similar(tmp_path):
    f = tmp_path / "u.txt"
    f.write_text("p:1001:/bin/falsetto\nq:1002:/opt/nologin-wrapper\nr:1003:/bin/bash\n")
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expect(3, 0, 3, 0)
