#!/bin/bash
# From a CSV on disk to an audited model, as a new user: look, schema, train, audit. Times each step.
# Usage: bash benchmarks/csv_to_audit.sh FILE.csv  (a Census-Income-like table: label income, sex and race private).
# The table measured in docs/own-data.md: 8,000 random rows of the Census-Income training file, made with
#   featuredp data fetch census-income && python -c "import pandas as pd, pathlib; pd.read_parquet(pathlib.Path.home()
#   / '.cache/featuredp/census-income/train.parquet').sample(8000, random_state=1).to_csv('census8k.csv', index=False)"
set -e
CSV=$1; W=$(mktemp -d)
t0=$(date +%s.%N)
step() { local s=$(date +%s.%N); "$@" > $W/out.txt 2>&1 || { cat $W/out.txt; exit 1; }; echo "$(echo "$(date +%s.%N) - $s" | bc | xargs printf '%.1f') s  $*"; }
step featuredp data info --data $CSV --label income --private sex,race --missing category
step featuredp data schema $CSV --label income --private sex,race --out $W/schema.json
# the private columns' categories are public knowledge (the Census codebook): fill them in as a user would
python - "$W/schema.json" <<'PY'
import json, sys
p = sys.argv[1]; s = json.load(open(p))
cols = s["columns"]
s["missing"] = "category"
cols["sex"].update(type="categorical", categories=["Female", "Male"], bounds=None)
cols["race"].update(type="categorical", bounds=None,
                    categories=["Amer Indian Aleut or Eskimo", "Asian or Pacific Islander", "Black", "Other", "White"])
json.dump(s, open(p, "w"), indent=1)
PY
step featuredp train --data $CSV --schema $W/schema.json --epsilon 2 --out $W/run
grep -E "test accuracy|references|epsilon " $W/out.txt
step featuredp audit $W/run --attack attribute
tail -4 $W/out.txt
echo "total $(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.1f') s (CSV on disk -> audited model)"
