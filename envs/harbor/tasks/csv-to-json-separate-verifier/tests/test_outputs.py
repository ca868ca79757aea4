import json
from pathlib import Path

EXPECTED = [
    {"name": "Ada", "age": 36, "city": "London"},
    {"name": "Grace", "age": 45, "city": "New York"},
    {"name": "Linus", "age": 28, "city": "Helsinki"},
]


def test_people_json():
    assert json.loads(Path("/app/people.json").read_text()) == EXPECTED


def test_the_collect_hook_listed_the_agents_files():
    assert "people.json" in Path("/logs/artifacts/listing.txt").read_text().split()
