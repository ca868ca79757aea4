import subprocess
import sys

import pytest

sys.path.insert(0, "/app")


def test_unit_tests_pass():
    # The pristine copy of the task's unit tests, run against /app/shop.
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "/tests/test_cart.py"], capture_output=True, text=True, timeout=40,
                       cwd="/tmp")
    assert r.returncode == 0, r.stdout[-3000:]


def test_many_independent_carts():
    from shop.cart import Cart
    carts = [Cart() for _ in range(3)]
    for i, cart in enumerate(carts):
        cart.add(f"sku{i}", 100 * (i + 1), qty=i + 1)
    assert [c.subtotal() for c in carts] == [100, 400, 900]
    assert [len(c.items) for c in carts] == [1, 1, 1]
    assert Cart().subtotal() == 0


@pytest.mark.parametrize("prices, expected", [
    ([(1000, 1)], 900),
    ([(1, 1)], 1),          # 10% of 1 cent rounds down to 0
    ([(19, 1)], 18),        # 1.9 -> 1 cent off
    ([(333, 3)], 900),      # 999 - 99
    ([(5, 2), (7, 3)], 28), # 31 - 3
])
def test_save10(prices, expected):
    from shop.cart import Cart
    cart = Cart()
    for i, (price, qty) in enumerate(prices):
        cart.add(f"s{i}", price, qty=qty)
    assert cart.total("SAVE10") == expected


def test_flat500():
    from shop.cart import Cart
    cart = Cart()
    cart.add("a", 250, qty=3)
    assert cart.total("FLAT500") == 250
    assert cart.total() == 750
