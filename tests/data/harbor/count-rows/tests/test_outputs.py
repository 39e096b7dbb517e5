import csv
import sys
from pathlib import Path

with open("/app/sales.csv", newline="") as f:
    want = sum(1 for row in csv.DictReader(f) if row["region"] == "north")
got = Path("/app/north.txt").read_text().strip() if Path("/app/north.txt").is_file() else ""
print(f"want {want}, got {got!r}")
sys.exit(0 if got == str(want) else 1)
