import subprocess
from pathlib import Path

PROG = "/app/wordfreq.py"


def run(*args, stdin=None):
    return subprocess.run(["python3", PROG, *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=20, cwd="/tmp")


def test_program_exists():
    assert Path(PROG).is_file()


def test_example_from_instructions():
    r = run("-i", "-n", "3", "/app/sample.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "4\tthe\n2\tdog\n2\tfox\n"


def test_default_is_case_sensitive_top_10(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("b a c B A C a b a\nz y x w v u t s r q p o\n")
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("3\ta\n2\tb\n1\tA\n1\tB\n1\tC\n1\tc\n"
                        "1\to\n1\tp\n1\tq\n1\tr\n")


def test_word_definition_and_long_options(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("don't stop: it's 2024, don't-stop! naïve café x9y\n")
    r = run("--top", "20", "--min-length", "1", f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("2\tdon\n2\tstop\n2\tt\n1\tcaf\n1\tit\n1\tna\n"
                        "1\ts\n1\tve\n1\tx\n1\ty\n")


def test_min_length_and_ignore_case(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Tea tea TEA at At a cup Cup of oolong\n")
    r = run("-m", "3", "--ignore-case", f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "3\ttea\n2\tcup\n1\toolong\n"


def test_multiple_files_counted_together(tmp_path):
    f1 = tmp_path / "one.txt"
    f2 = tmp_path / "two.txt"
    f1.write_text("red green\nred\n")
    f2.write_text("green red blue\n")
    r = run("-n", "2", f1, f2)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "3\tred\n2\tgreen\n"


def test_reads_stdin_without_files():
    r = run("-n", "1", stdin="Spam spam spam eggs\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "2\tspam\n"


def test_no_words():
    r = run(stdin="123 456 --- !!!\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""


def test_invalid_values_are_usage_errors(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("a b c\n")
    for args in (["-n", "0", f], ["-n", "abc", f], ["--top", "-2", f],
                 ["--min-length", "0", f], ["--bogus", f]):
        r = run(*args)
        assert r.returncode == 2, (args, r.returncode, r.stdout)
        assert r.stdout == ""
        assert r.stderr.strip() != ""


def test_unreadable_file(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("a b c\n")
    r = run(good, tmp_path / "missing.txt")
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith("wordfreq: ")


def test_help():
    r = run("--help")
    assert r.returncode == 0
    for opt in ("--top", "--min-length", "--ignore-case"):
        assert opt in r.stdout
