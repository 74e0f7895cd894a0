"""Fills a job-spec template: render_job.py TEMPLATE OUT NAME=VALUE...

Each @NAME@ is replaced by its value (a whole TOML value); a line whose value is given empty is
dropped; comment lines are left alone. A placeholder written @NAME|DEFAULT@ takes DEFAULT when no
value is given (an empty DEFAULT drops the line), so a template can grow an option without its
callers changing. Used by trainer.sh, smollm2-arith.sh and gpu.sh.
"""
import re
import sys

PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)(?:\|([^@]*))?@")

template, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
values = dict(pair.split("=", 1) for pair in pairs)
lines = []
for line in open(template, encoding="utf-8"):
    found = [] if line.lstrip().startswith("#") else list(PLACEHOLDER.finditer(line))
    # Each placeholder's value: given, else its default, else None (missing).
    filled = {m.group(1): values.get(m.group(1), m.group(2)) for m in found}
    if any(value == "" for value in filled.values()):
        continue
    for name, value in filled.items():
        if value is None:
            sys.exit(f"render_job: no value for @{name}@ in {template}")
    lines.append(PLACEHOLDER.sub(lambda m: filled[m.group(1)], line))
open(out, "w", encoding="utf-8").writelines(lines)
