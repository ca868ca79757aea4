"""Reading a Harbor verifier's reward files, one test per case. Each case is what Harbor's
own verifier does with the same files (harbor 0.25.0: ``reward.json`` wins whenever it exists;
the result model turns booleans into floats; the reward is the ``reward`` entry, else the only
entry); tests/integration/test_harbor_rewards_crosscheck.py runs Harbor's code on every case
not marked ``ours_only`` and checks that it agrees."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agentrl.errors import GradingError
from agentrl_envs.harbor.verifier import REWARD_MAX_BYTES, read_reward

WHERE = "Harbor task t: tests/test.sh"


@dataclasses.dataclass(frozen=True)
class Case:
    """Files a verifier left in /logs/verifier and what reading them gives.

    Attributes:
        json: The bytes of ``reward.json`` (None: absent).
        txt: The bytes of ``reward.txt`` (None: absent).
        reward: The episode's reward, or None when reading fails.
        rewards: The entries as Harbor records them (values and their int/float types).
        error: A regular expression the GradingError's message matches (when ``reward`` is None).
        ours_only: Where agentrl is stricter than Harbor on purpose (not cross-checked).
    """

    json: bytes | None = None
    txt: bytes | None = None
    reward: float | None = None
    rewards: dict[str, float | int] | None = None
    error: str = ""
    ours_only: bool = False


CASES = {
    # reward.txt: one number, as Python's float() reads it
    "txt-number": Case(txt=b" 0.5\n", reward=0.5, rewards={"reward": 0.5}),
    "txt-integer": Case(txt=b"1", reward=1.0, rewards={"reward": 1.0}),
    "txt-exponent-and-sign": Case(txt=b"+1e0\n", reward=1.0, rewards={"reward": 1.0}),
    "txt-underscores": Case(txt=b"1_0", reward=10.0, rewards={"reward": 10.0}),
    "txt-unicode-digit": Case(txt="١".encode(), reward=1.0, rewards={"reward": 1.0}),
    "txt-negative-zero": Case(txt=b"-0.0", reward=-0.0, rewards={"reward": -0.0}),
    "txt-empty": Case(txt=b"", error="empty /logs/verifier/reward.txt"),
    "txt-whitespace-only": Case(txt=b"  \n", error="reward.txt that is not one finite number"),
    "txt-word": Case(txt=b"one", error="reward.txt that is not one finite number: 'one'"),
    "txt-two-numbers": Case(txt=b"1 2", error="not one finite number"),
    "txt-two-lines": Case(txt=b"1\n0\n", error="not one finite number"),
    "txt-hex": Case(txt=b"0x1", error="not one finite number"),
    "txt-nan": Case(txt=b"nan", error="not one finite number"),
    "txt-inf": Case(txt=b"inf", error="not one finite number"),
    "txt-infinity": Case(txt=b"-Infinity", error="not one finite number"),
    "txt-nul": Case(txt=b"1\x00", error="not one finite number"),
    "txt-not-utf8": Case(txt=b"\xff1", error="reward.txt that is not UTF-8"),
    "txt-bom": Case(txt=b"\xef\xbb\xbf1", error="not one finite number"),
    # reward.json: an object of finite numbers
    "json-reward-and-more": Case(json=b'{"reward": 1, "style": 0.25}', reward=1.0,
                                 rewards={"reward": 1, "style": 0.25}),
    "json-only-entry": Case(json=b'{"accuracy": 0.75}', reward=0.75, rewards={"accuracy": 0.75}),
    "json-whitespace": Case(json=b'\n  {"reward": 0.25}\n\n', reward=0.25, rewards={"reward": 0.25}),
    "json-booleans-are-floats": Case(json=b'{"reward": true, "strict": false}', reward=1.0,
                                     rewards={"reward": 1.0, "strict": 0.0}),
    "json-duplicate-key-last-wins": Case(json=b'{"reward": 0, "reward": 1}', reward=1.0,
                                         rewards={"reward": 1}),
    "json-huge-int-entry": Case(json=b'{"reward": 1, "steps": 1' + b"0" * 400 + b"}", reward=1.0,
                                rewards={"reward": 1, "steps": 10 ** 400}),
    "json-huge-int-reward": Case(json=b'{"reward": 1' + b"0" * 400 + b"}", error="too large for a float"),
    "json-several-entries-no-reward": Case(json=b'{"a": 1, "b": 0}',
                                           error="2 entries and none named 'reward'"),
    "json-empty-object": Case(json=b"{}", error="no entries and none named 'reward'"),
    "json-non-numeric-entry": Case(json=b'{"reward": 1, "note": "fine"}',
                                   error="a value that is not a finite number: fine"),
    "json-number-as-string": Case(json=b'{"reward": "1"}', error="not a finite number"),
    "json-null": Case(json=b'{"reward": null}', error="not a finite number"),
    "json-nested": Case(json=b'{"reward": 1, "parts": {"a": 1}}', error="not a finite number"),
    "json-list": Case(json=b"[1]", error="not a finite number"),
    "json-string": Case(json=b'"1"', error="not a finite number"),
    "json-bare-number": Case(json=b"1", error="a bare number, not a JSON object"),
    "json-nan": Case(json=b'{"reward": NaN}', error="not a finite number: nan"),
    "json-infinity": Case(json=b'{"reward": -Infinity}', error="not a finite number"),
    "json-overflowing-float": Case(json=b'{"reward": 1e400}', error="not a finite number: inf"),
    "json-malformed": Case(json=b'{"reward": 1', error="malformed /logs/verifier/reward.json"),
    "json-bom": Case(json=b'\xef\xbb\xbf{"reward": 1}', error="malformed"),
    "json-not-utf8": Case(json=b'{"reward": 1, "\xff": 0}', error="reward.json that is not UTF-8"),
    "json-empty": Case(json=b"", error="empty /logs/verifier/reward.json"),
    # both files: reward.json wins whenever it exists, reward.txt is not read
    "both-json-wins": Case(json=b'{"reward": 0}', txt=b"1", reward=0.0, rewards={"reward": 0}),
    "both-json-only-entry": Case(json=b'{"score": 0.5}', txt=b"1", reward=0.5, rewards={"score": 0.5}),
    "both-json-without-reward": Case(json=b'{"a": 1, "b": 0}', txt=b"1", error="none named 'reward'"),
    "both-json-empty": Case(json=b"", txt=b"1", error="empty /logs/verifier/reward.json"),
    "both-json-malformed": Case(json=b"{", txt=b"1", error="malformed"),
    "both-txt-malformed": Case(json=b'{"reward": 1}', txt=b"junk", reward=1.0, rewards={"reward": 1}),
    # neither
    "none": Case(error=r"wrote no /logs/verifier/reward.txt or reward.json \(exit code 3\).*boom"),
    # agentrl refuses what it will not read on the host: huge files (Harbor reads them whole)
    "txt-larger-than-the-limit": Case(txt=b"1" + b" " * REWARD_MAX_BYTES, error="larger than",
                                      ours_only=True),
}


def write_case(directory: Path, case: Case) -> Path:
    """Writes ``case``'s files into ``directory`` (made if missing); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in (("reward.json", case.json), ("reward.txt", case.txt)):
        if data is not None:
            (directory / name).write_bytes(data)
    return directory


def read_case(directory: Path) -> tuple[float, dict[str, float | int]]:
    return read_reward(str(directory), WHERE, 3, "boom")


@pytest.mark.parametrize("name", sorted(CASES))
def test_reward_files(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    logs = write_case(tmp_path, case)
    if case.reward is None:
        with pytest.raises(GradingError, match=case.error):
            read_case(logs)
        return
    reward, rewards = read_case(logs)
    assert repr(reward) == repr(case.reward)  # -0.0 stays -0.0
    assert rewards == case.rewards
    assert {k: type(v) for k, v in rewards.items()} == {k: type(v) for k, v in (case.rewards or {}).items()}


@pytest.mark.parametrize("name", ["reward.json", "reward.txt"])
def test_a_reward_file_that_is_a_symlink_is_refused_not_followed(tmp_path: Path, name: str) -> None:
    # The verifier runs in the container; the host reads the files: a link could name any
    # file of the host (Harbor follows it).
    secret = tmp_path / "secret"
    secret.write_text("1")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / name).symlink_to(secret)
    with pytest.raises(GradingError, match=f"/logs/verifier/{name} that is a symbolic link"):
        read_case(logs)
    (logs / name).unlink()
    (logs / name).symlink_to(tmp_path / "missing")  # dangling: Harbor would skip the file
    with pytest.raises(GradingError, match="that is a symbolic link"):
        read_case(logs)


def test_a_reward_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "reward.json").mkdir()
    with pytest.raises(GradingError, match="reward.json that is (not a regular file|unreadable)"):
        read_case(tmp_path)
    (tmp_path / "reward.json").rmdir()
    os.mkfifo(tmp_path / "reward.txt")  # opening it must not block
    with pytest.raises(GradingError, match="reward.txt that is not a regular file"):
        read_case(tmp_path)
