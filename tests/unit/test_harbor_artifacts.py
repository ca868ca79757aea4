"""What a separate verifier receives (envs/harbor/artifacts.py): the sanitising filter and the
restore paths, on archives made here; the real container round trip is in
tests/integration/test_harbor_grading_adversarial.py."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import tarfile
from pathlib import Path

from agentrl_envs.harbor.artifacts import restore, take
from agentrl_envs.harbor.task import Artifact


def archive(members: list[tuple[str, str, str | int]]) -> bytes:
    """A tar of (name, kind, content-or-link-or-mode) entries, as ``docker cp`` makes one."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, value in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(value)
                tar.addfile(info)
            else:
                data = b"x"
                info.size, info.mode = len(data), int(value) if isinstance(value, int) else 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Container:
    """Holds archives by path, the one thing take() asks a sandbox for."""

    def __init__(self, archives: dict[str, bytes]) -> None:
        self.archives = archives

    async def read_archive(self, path: str, max_bytes: int) -> bytes | None:
        return self.archives.get(path)


def test_the_filter_keeps_files_and_refuses_what_leaves_the_artifact(tmp_path: Path) -> None:
    app = archive([("app", "dir", ""), ("app/ok.txt", "file", 0o644), ("app/run", "file", 0o4755),
                   ("app/abs", "link", "/etc/passwd"), ("app/up", "link", "../../etc"),
                   ("app/inside", "link", "ok.txt"), ("app/cache", "dir", ""), ("app/cache/x.pyc", "file", 0o644)])
    artifacts = [Artifact("/app", ("*.pyc",)), Artifact("/logs/artifacts")]
    records = asyncio.run(take(Container({"/app": app}), artifacts, tmp_path / "staging"))
    assert records[1] == {"source": "/logs/artifacts", "found": False, "files": 0, "refused": []}
    got = tmp_path / "staging" / "0" / "app"
    assert sorted(p.name for p in got.iterdir()) == ["cache", "inside", "ok.txt", "run"]
    assert records[0]["files"] == 2 and {r.split(" ")[0] for r in records[0]["refused"]} == {
        "app/abs", "app/up", "app/cache/x.pyc"}
    assert not os.stat(got / "run").st_mode & stat.S_ISUID  # set-uid bits are cleared
    assert os.readlink(got / "inside") == "ok.txt"

    workspace, logs = tmp_path / "workspace", tmp_path / "logs"
    workspace.mkdir(), logs.mkdir()
    restore(tmp_path / "staging", artifacts, records, str(workspace), "/app", str(logs))
    assert (workspace / "ok.txt").is_file() and records[0]["restored"] is True
    assert records[1]["restored"] is False


def test_a_source_outside_the_working_directory_is_reported_not_restored(tmp_path: Path) -> None:
    artifacts = [Artifact("/etc/app.conf"), Artifact("/app/out/result.json")]
    container = Container({"/etc/app.conf": archive([("app.conf", "file", 0o644)]),
                           "/app/out/result.json": archive([("result.json", "file", 0o644)])})
    records = asyncio.run(take(container, artifacts, tmp_path / "staging"))
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    restore(tmp_path / "staging", artifacts, records, str(workspace), "/app", str(tmp_path))
    assert records[0]["restored"] is False and "/etc/app.conf is elsewhere" in records[0]["why"]
    assert (workspace / "out" / "result.json").is_file() and records[1]["restored"] is True
