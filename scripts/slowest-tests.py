#!/usr/bin/env python3
"""Prints the N slowest tests of a nextest JUnit report: seconds, binary, test.

Usage: scripts/slowest-tests.py target/nextest/ci/junit.xml [N]
Standard library only: it runs before and without any venv.
"""
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"no test report at {path}: {error}", file=sys.stderr)
        return 1
    cases = []
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            cases.append((float(case.get("time", "0")), suite.get("name", ""), case.get("name", ""), failed))
    cases.sort(reverse=True)
    total = sum(seconds for seconds, *_ in cases)
    print(f"{len(cases)} tests, {total:.0f} s of test time in all")
    for seconds, suite, name, failed in cases[:count]:
        print(f"{seconds:8.1f} s  {suite} {name}{'  FAILED' if failed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
