import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

APP = Path("/app")
MEMBERS = {"__main__.py", "greeter/__init__.py", "greeter/__main__.py", "greeter/core.py"}


def check_dist(root, version):
    dist = root / "dist"
    pyz = dist / f"greeter-{version}.pyz"
    sha = dist / f"greeter-{version}.pyz.sha256"
    assert sorted(p.name for p in dist.iterdir()) == sorted([pyz.name, sha.name])
    data = pyz.read_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    assert pyz.stat().st_mode & 0o100, "archive is not executable"
    with zipfile.ZipFile(pyz) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
    assert names == MEMBERS
    digest = hashlib.sha256(data).hexdigest()
    assert sha.read_text().strip("\n") == f"{digest}  {pyz.name}"
    for args, want in (([], "Hello, world!"), (["--name", "Ada"], "Hello, Ada!"),
                       (["--name", "Ada", "--shout"], "HELLO, ADA!")):
        # run through python3: /tmp may be mounted noexec
        r = subprocess.run(["python3", str(pyz), *args], capture_output=True, text=True, timeout=20,
                           cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
        assert r.returncode == 0, r.stderr
        assert r.stdout == want + "\n"
    return digest


def test_build_script_exists():
    assert (APP / "build.sh").is_file()


def test_app_dist_built():
    check_dist(APP, "1.4.2")


def test_relocated_rebuild_with_new_version(tmp_path):
    proj = tmp_path / "copy of project"
    shutil.copytree(APP, proj, symlinks=True)
    init = proj / "src" / "greeter" / "__init__.py"
    init.write_text(init.read_text().replace('VERSION = "1.4.2"', 'VERSION = "9.10.0"'))
    # stray files that must not end up in the archive
    cache = proj / "src" / "greeter" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "core.cpython-311.pyc").write_bytes(b"junk")
    (proj / "dist").mkdir(exist_ok=True)
    (proj / "dist" / "old-build.txt").write_text("stale\n")
    before = sorted(str(p.relative_to(APP)) for p in APP.rglob("*"))
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    r = subprocess.run(["bash", str(proj / "build.sh")], capture_output=True, text=True,
                       timeout=30, cwd=workdir,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                            "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    check_dist(proj, "9.10.0")
    r = subprocess.run(["python3", str(proj / "dist" / "greeter-9.10.0.pyz"), "--version"],
                       capture_output=True, text=True, timeout=20)
    assert r.stdout.strip() == "greeter 9.10.0"
    assert list(workdir.iterdir()) == []
    assert sorted(str(p.relative_to(APP)) for p in APP.rglob("*")) == before


def test_failure_gives_nonzero_status(tmp_path):
    proj = tmp_path / "broken"
    shutil.copytree(APP, proj, symlinks=True)
    shutil.rmtree(proj / "src")
    r = subprocess.run(["bash", str(proj / "build.sh")], capture_output=True, text=True,
                       timeout=30, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
