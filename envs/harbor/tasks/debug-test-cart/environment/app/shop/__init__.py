"""A tiny shop library."""
