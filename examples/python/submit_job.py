#!/usr/bin/env python3
"""Submit an rlvr job and follow it to its end, with the `rlvr` package (`pip install ./python`).

    python3 examples/python/submit_job.py JOB.toml [--server URL] [--token TOKEN]
                                          [--idempotency-key KEY]

As `rlvrctl submit --wait`: the spec's local data files (data.train, heldout, canaries, relative to
the spec's directory) are uploaded as the team's datasets, the job is submitted with an
Idempotency-Key, its id printed, and its events shown until it ends. The server defaults to
$RLVR_SERVER (else http://127.0.0.1:8470), the token to $RLVR_TOKEN. Run from a checkout, it
finds the package there when it is not installed.

Exit status: 0 the job was published; 1 it ended otherwise; 2 the daemon refused the request (its
code, field and message are printed) or the spec cannot be read; 3 the daemon cannot be reached or
failed.
"""

import argparse
import os
import sys

try:
    import rlvr
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import rlvr


def main() -> int:
    parser = argparse.ArgumentParser(description="Submit an rlvr job and follow it to its end.")
    parser.add_argument("spec", metavar="JOB.toml", help="the job spec (TOML, or JSON when it ends in .json)")
    parser.add_argument("--server", help="the daemon's API (default: $RLVR_SERVER)")
    parser.add_argument("--token", help="the team's bearer token (default: $RLVR_TOKEN)")
    parser.add_argument("--idempotency-key", help="makes a repeated submit answer with the first one's job")
    args = parser.parse_args()
    client = rlvr.Client(server=args.server, token=args.token)
    try:
        job = client.submit(args.spec, idempotency_key=args.idempotency_key)
        print(job.id, flush=True)
        if not job.created:
            print("submit_job.py: an earlier submit with this key made this job", file=sys.stderr)
        job = client.watch(job.id, bar=False)
    except (rlvr.SpecError, rlvr.ApiError) as error:
        print(f"submit_job.py: {error}", file=sys.stderr)
        return 3 if isinstance(error, rlvr.ServerError) else 2
    except (rlvr.Unreachable, rlvr.BadAnswer) as error:
        print(f"submit_job.py: {error}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    if job.state == "published":
        return 0
    print(f"submit_job.py: job {job.id} {job.state}: {job.reason}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
