"""The arith family: generated two-number sums with disjoint train and held-out splits (generate.py writes them)."""
