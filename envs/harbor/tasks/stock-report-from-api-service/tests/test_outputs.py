from pathlib import Path


def test_low_stock_report():
    lines = Path("/app/low_stock.txt").read_text().strip().splitlines()
    assert [line.split() for line in lines] == [["B-300", "20"], ["A-100", "10"], ["D-500", "8"]]
