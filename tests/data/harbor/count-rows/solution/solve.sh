#!/bin/bash
cd /app
awk -F, 'NR > 1 && $2 == "north"' sales.csv | wc -l | tr -d ' ' > north.txt
