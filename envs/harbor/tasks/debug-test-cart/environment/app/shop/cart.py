"""Shopping cart with prices in integer cents."""
from dataclasses import dataclass


@dataclass
class LineItem:
    sku: str
    price_cents: int
    qty: int


class Cart:
    """A shopping cart. Each Cart has its own, independent list of line items."""

    def __init__(self, items=[]):
        self.items = items

    def add(self, sku, price_cents, qty=1):
        """Add qty (>= 1) units of sku. Adding a sku already in the cart increases its qty."""
        if qty < 1:
            raise ValueError("qty must be at least 1")
        for item in self.items:
            if item.sku == sku:
                item.qty += qty
                return
        self.items.append(LineItem(sku, price_cents, qty))

    def count(self):
        """Total number of units in the cart."""
        return sum(item.qty for item in self.items)

    def subtotal(self):
        """Sum of price_cents * qty over all line items."""
        return sum(item.price_cents for item in self.items)

    def total(self, coupon=None):
        """Amount to pay, in cents, after an optional coupon.

        "SAVE10": 10% off the subtotal; the discount is rounded down to whole cents.
        "FLAT500": 500 cents off, but the total never goes below 0.
        Any other coupon raises ValueError.
        """
        sub = self.subtotal()
        if coupon is None:
            return sub
        if coupon == "SAVE10":
            return sub * 10 // 100
        if coupon == "FLAT500":
            return max(sub - 500, 0)
        raise ValueError(f"unknown coupon: {coupon}")
