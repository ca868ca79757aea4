import sys

import pytest

sys.path.insert(0, "/app")

from shop.cart import Cart


def test_new_carts_are_empty_and_independent():
    a = Cart()
    a.add("apple", 50)
    b = Cart()
    assert b.items == []
    assert b.count() == 0
    assert a.count() == 1


def test_add_merges_same_sku():
    cart = Cart()
    cart.add("pen", 120, qty=2)
    cart.add("pen", 120)
    assert len(cart.items) == 1
    assert cart.count() == 3


def test_subtotal_uses_quantities():
    cart = Cart()
    cart.add("pen", 120, qty=3)
    cart.add("pad", 250)
    assert cart.subtotal() == 610


def test_add_rejects_bad_qty():
    cart = Cart()
    with pytest.raises(ValueError):
        cart.add("pen", 120, qty=0)


def test_total_without_coupon():
    cart = Cart()
    cart.add("book", 1999, qty=2)
    assert cart.total() == 3998


def test_save10_coupon():
    cart = Cart()
    cart.add("book", 1999, qty=2)   # 3998, 10% = 399.8 -> 399 off
    assert cart.total("SAVE10") == 3599


def test_flat500_coupon_never_negative():
    cart = Cart()
    cart.add("gum", 99, qty=3)
    assert cart.total("FLAT500") == 0
    cart.add("book", 1999)
    assert cart.total("FLAT500") == 1796


def test_unknown_coupon():
    cart = Cart()
    cart.add("gum", 99)
    with pytest.raises(ValueError):
        cart.total("FREESTUFF")
