#!/bin/bash
# Keeps a copy of the inventory as it was before the restock, for the tests to compare.
set -e
mkdir -p archive
cp inventory.csv archive/inventory-before-restock.csv
