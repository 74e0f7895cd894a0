"""Fills a job-spec template: render_job.py TEMPLATE OUT NAME=VALUE...

Each @NAME@ is replaced by its value (a whole TOML value); a line whose value is given empty is
dropped; comment lines are left alone. Used by trainer.sh and smollm2-arith.sh.
"""
import re
import sys

template, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
values = dict(pair.split("=", 1) for pair in pairs)
lines = []
for line in open(template, encoding="utf-8"):
    names = [] if line.lstrip().startswith("#") else re.findall(r"@([A-Z_]+)@", line)
    if any(values.get(name) == "" for name in names):
        continue
    for name in names:
        if name not in values:
            sys.exit(f"render_job: no value for @{name}@ in {template}")
        line = line.replace(f"@{name}@", values[name])
    lines.append(line)
open(out, "w", encoding="utf-8").writelines(lines)
