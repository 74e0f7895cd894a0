#!/usr/bin/env python3
"""The soak run's driver (scripts/soak.sh starts the daemon and Redis, then this): submits short
jobs through the HTTP API from several teams, cancels some and asks for graders' dry-runs at
random (seeded), samples what the daemon and Redis hold, waits for every job to end, and writes
samples.csv, jobs.csv, summary.txt and plot.svg. Standard library only.

Exit status: 0 when every job ended and nothing grew past its bound; 1 otherwise (summary.txt says
which); 2 for a run that could not start (a refused upload or spec).
"""

import argparse
import csv
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
TERMINAL = {"published", "refused", "failed", "cancelled"}
# The series sampled, in samples.csv's order after t_s, phase and the job counts.
SERIES = [
    ("fds", "open fds (/proc/PID/fd)"),
    ("rss_mib", "RSS, MiB (VmRSS)"),
    ("threads", "threads"),
    ("children", "child processes"),
    ("zombies", "zombie children"),
    ("grader_work", "entries in grader-work/"),
    ("tmp_entries", "entries in the daemon's TMPDIR"),
    ("tmp_rlvr", "rlvr-named entries in TMPDIR"),
    ("job_dirs", "job directories (state/jobs)"),
    ("job_dirs_mib", "size of state/jobs, MiB"),
    ("redis_used_mib", "Redis used_memory, MiB"),
    ("redis_keys", "Redis keys (DBSIZE)"),
    ("redis_event_streams", "event streams (rlvr:events:*)"),
    ("redis_job_records", "job records (rlvr:job:*)"),
    ("redis_index", "jobs index (ZCARD rlvr:jobs)"),
    ("apalis_meta", "dispatch tasks' meta keys"),
    ("apalis_data", "dispatch tasks' data (HLEN)"),
    ("apalis_done", "dispatch tasks done (SCARD)"),
    ("apalis_workers", "queue workers' metadata keys"),
]
# One round trip for Redis's counts: DBSIZE, then the keys of each pattern, the jobs index, and the
# dispatch queues' (apalis's) task data, done sets and worker metadata over the three priorities.
REDIS_COUNTS = """
local function count(pattern) return #redis.call('keys', pattern) end
local data, done = 0, 0
for _, q in ipairs({'high', 'normal', 'low'}) do
  data = data + redis.call('hlen', 'rlvr:queue:' .. q .. ':data')
  done = done + redis.call('scard', 'rlvr:queue:' .. q .. ':done')
end
return {redis.call('dbsize'), count('rlvr:events:*'), count('rlvr:job:*'), redis.call('zcard', 'rlvr:jobs'),
        count('rlvr:queue:*:meta:*'), data, done, count('rlvr:queue:*:workers:metadata:*')}
"""
# The series whose rise over the loaded run's second half fails the run past a bound.
JUDGED = {"fds": "fd_bound", "threads": "thread_bound"}
# The fewest samples in the second half for a fitted rise to be judged.
MIN_JUDGED_SAMPLES = 10
# Series that should level off once the ended records' retention bites: a rise over the second half
# is noted in the summary, not judged.
NOTED = ["rss_mib", "job_dirs", "job_dirs_mib", "redis_used_mib", "redis_keys", "apalis_meta", "apalis_data",
         "apalis_done", "apalis_workers"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--tokens", required=True, help="JSON file: {team: token}")
    p.add_argument("--data", required=True, help="rlvrd data arith's output directory")
    p.add_argument("--daemon-pid", type=int, required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--tmp-dir", required=True, help="the daemon's TMPDIR")
    p.add_argument("--redis-cli", required=True)
    p.add_argument("--redis-port", required=True)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--in-flight", type=int, default=6, help="jobs submitted and not seen ended, at most")
    p.add_argument("--sample-s", type=float, default=3.0)
    p.add_argument("--keep-ended", type=int, default=20, help="the daemon's queue.keep_ended_per_team")
    p.add_argument("--fd-bound", type=float, default=16)
    p.add_argument("--thread-bound", type=float, default=8)
    p.add_argument("--cancel-p", type=float, default=0.1, help="chance of a cancel after each submit")
    p.add_argument("--verify-p", type=float, default=0.15, help="chance of a dry-run after each submit")
    p.add_argument("--drain-timeout-s", type=float, default=600)
    p.add_argument("--log", help="the daemon's log, whose warnings and errors the summary counts")
    p.add_argument("--out", required=True)
    return p.parse_args()


class Api:
    """The daemon's HTTP API, one team's token per call."""

    def __init__(self, server, tokens):
        self.server = server.rstrip("/")
        self.tokens = tokens
        self.statuses = {}  # (method, route, status) -> count

    def call(self, team, method, path, body=None, content_type="application/json", route=None):
        data = None
        headers = {"Authorization": f"Bearer {self.tokens[team]}"}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                status, text, retry = answer.status, answer.read(), None
        except urllib.error.HTTPError as error:
            status, text, retry = error.code, error.read(), error.headers.get("Retry-After")
        key = (method, route or path, status)
        self.statuses[key] = self.statuses.get(key, 0) + 1
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = {"text": text.decode(errors="replace")}
        return status, parsed, retry


def job_spec(rng, team, number):
    """A tiny GRPO or SFT job of 1 to 3 steps on the team's datasets; its gate always passes."""
    kind = rng.choice(["grpo", "sft"])
    steps = rng.randint(1, 3)
    if kind == "grpo":
        optimizer = {"plugin": "grpo", "group_size": 2, "lr": 1e-3}
        train = "dataset:train"
    else:
        optimizer = {"plugin": "sft", "lr": 1e-3, "micro_batch_size": 2}
        train = "dataset:sft"
    spec = {
        "job": {"name": f"soak-{number}", "team": team, "model_line": f"soak-{team}-{kind}", "seed": number},
        "model": {"policy": "builtin:tiny-arith"},
        "data": {"train": train, "heldout": "dataset:heldout"},
        "optimizer": optimizer,
        "verifiers": [{"plugin": "math", "fallback": "last"}],
        "rollout": {"prompts_per_step": 2, "max_new_tokens": 3},
        "budget": {"max_steps": steps},
        "eval": {"max_prompts": 4},
        "gates": {"heldout_gain_min": -1.0, "refuse_reward_hacking": False, "length_ratio_max": 100.0},
    }
    return kind, steps, spec


def verify_body(rng, items):
    """A math grader's dry-run on a few training items, half answered right."""
    chosen = rng.sample(items, 4)
    graded = []
    for i, item in enumerate(chosen):
        answer = item["reference"]["answer"]
        right = i % 2 == 0
        graded.append({
            "id": item["id"],
            "prompt": item["prompt"],
            "completion": answer if right else answer + "7",
            "reference": item["reference"],
        })
    return {"grader": {"plugin": "math", "fallback": "last"}, "items": graded}, [i % 2 == 0 for i in range(4)]


class Sampler:
    """What the daemon and Redis hold, read from /proc, the state directory and redis-cli."""

    def __init__(self, args):
        self.pid = args.daemon_pid
        self.state_dir = args.state_dir
        self.tmp_dir = args.tmp_dir
        self.redis = [args.redis_cli, "-p", str(args.redis_port)]

    def redis_cmd(self, *words):
        return subprocess.run(self.redis + list(words), capture_output=True, text=True, check=True).stdout

    def key_patterns(self):
        """Redis's keys by pattern, job ids (26-character ULIDs) as {id}: what each kind costs."""
        patterns = {}
        for key in self.redis_cmd("keys", "*").splitlines():
            pattern = ":".join("{id}" if ULID.fullmatch(part) else part for part in key.split(":"))
            patterns[pattern] = patterns.get(pattern, 0) + 1
        return sorted(patterns.items(), key=lambda item: (-item[1], item[0]))

    def children(self):
        kids = []
        for task in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{task}/children") as f:
                    kids += f.read().split()
            except OSError:
                pass
        zombies = 0
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        zombies += 1
            except OSError:
                pass
        return len(kids), zombies

    def sample(self):
        row = {}
        row["fds"] = len(os.listdir(f"/proc/{self.pid}/fd"))
        with open(f"/proc/{self.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        row["rss_mib"] = round(int(status["VmRSS"].split()[0]) / 1024, 1)
        row["threads"] = int(status["Threads"])
        row["children"], row["zombies"] = self.children()
        row["grader_work"] = len(listdir(os.path.join(self.state_dir, "grader-work")))
        tmp = listdir(self.tmp_dir)
        row["tmp_entries"] = len(tmp)
        row["tmp_rlvr"] = sum(1 for name in tmp if "rlvr" in name)
        row["job_dirs"] = len(listdir(os.path.join(self.state_dir, "jobs")))
        row["job_dirs_mib"] = round(tree_bytes(os.path.join(self.state_dir, "jobs")) / 2**20, 2)
        memory = dict(
            line.split(":", 1) for line in self.redis_cmd("info", "memory").splitlines() if ":" in line
        )
        row["redis_used_mib"] = round(int(memory["used_memory"]) / 2**20, 2)
        # KEYS in a script: the soak's Redis holds a few hundred keys.
        counts = [int(n) for n in self.redis_cmd("eval", REDIS_COUNTS, "0").split()]
        names = ["redis_keys", "redis_event_streams", "redis_job_records", "redis_index", "apalis_meta",
                 "apalis_data", "apalis_done", "apalis_workers"]
        row.update(zip(names, counts))
        return row


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def listdir(path):
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def log_digest(path):
    """The daemon log's warnings and errors, counted by message (ids and numbers masked)."""
    kinds = {}
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) < 3 or parts[1] not in ("WARN", "ERROR"):
                continue
            text = re.sub(r"\x1b\[[0-9;]*m", "", parts[2])
            text = ULID.sub("{id}", text)
            text = re.sub(r"\d+", "N", text)[:160].strip()
            key = (parts[1], text)
            kinds[key] = kinds.get(key, 0) + 1
    if not kinds:
        return ["daemon log: no warnings or errors"]
    lines = [f"daemon log: {sum(kinds.values())} warnings and errors"]
    for (level, text), n in sorted(kinds.items(), key=lambda item: -item[1])[:12]:
        lines.append(f"  {n:>5} × {level} {text}")
    return lines


def slope_per_min(points):
    """Least-squares slope of (t_s, value) points, per minute; None for fewer than 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var


def run(args):
    rng = random.Random(args.seed)
    with open(args.tokens) as f:
        tokens = json.load(f)
    teams = sorted(tokens)
    api = Api(args.server, tokens)
    sampler = Sampler(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.data, "train.jsonl")) as f:
        train_items = [json.loads(line) for line in f]

    for team in teams:
        for name in ("sft", "train", "heldout"):
            with open(os.path.join(args.data, f"{name}.jsonl"), "rb") as f:
                body = f.read()
            status, answer, _ = api.call(team, "PUT", f"/v1/datasets/{name}", body, "application/x-ndjson",
                                         route="/v1/datasets/{name}")
            if status not in (200, 201):
                print(f"soak: dataset {name} of team {team}: {status} {answer}", file=sys.stderr)
                return 2

    started = time.monotonic()
    samples = []
    jobs = {}  # id -> record dict
    unended = {}  # id -> team
    counts = {"submitted": 0}
    marks = {}
    samples_file = open(os.path.join(args.out, "samples.csv"), "w", newline="")
    fields = ["t_s", "phase", "submitted", "unended", "ended"] + [name for name, _ in SERIES]
    writer = csv.DictWriter(samples_file, fieldnames=fields)
    writer.writeheader()
    next_sample = [0.0]

    def take_sample(phase):
        row = {"t_s": round(time.monotonic() - started, 2), "phase": phase, "submitted": counts["submitted"],
               "unended": len(unended), "ended": counts["submitted"] - len(unended)}
        row.update(sampler.sample())
        samples.append(row)
        writer.writerow(row)
        samples_file.flush()
        next_sample[0] = time.monotonic() + args.sample_s

    def maybe_sample(phase):
        if time.monotonic() >= next_sample[0]:
            take_sample(phase)

    def poll():
        for job_id, team in list(unended.items()):
            status, answer, _ = api.call(team, "GET", f"/v1/jobs/{job_id}", route="/v1/jobs/{id}")
            record = jobs[job_id]
            if status == 404:
                # Seen unended and gone before it was seen ended: retention never deletes a job
                # not ended, and this driver looks at each one before 20 more of its team end.
                record["state"] = "lost (404)"
                record["ended_s"] = round(time.monotonic() - started, 2)
                del unended[job_id]
            elif status == 200:
                record["state"] = answer["state"]
                if answer["state"] in TERMINAL:
                    record["ended_s"] = round(time.monotonic() - started, 2)
                    record["reason"] = (answer.get("reason") or "")[:200]
                    del unended[job_id]
            else:
                print(f"soak: GET job {job_id}: {status} {answer}", file=sys.stderr)

    cancels = {"asked": 0, "accepted": 0, "already_ended": 0, "other": 0}
    verifies = {"asked": 0, "ok": 0, "busy": 0, "wrong": 0, "other": 0}

    def cancel_one():
        if not unended:
            return
        job_id = rng.choice(sorted(unended))
        cancels["asked"] += 1
        status, _, _ = api.call(unended[job_id], "DELETE", f"/v1/jobs/{job_id}", route="/v1/jobs/{id}")
        jobs[job_id]["cancel_asked"] = True
        if status in (200, 202):
            cancels["accepted"] += 1
        elif status == 409:
            cancels["already_ended"] += 1
        else:
            cancels["other"] += 1

    def verify_one():
        team = rng.choice(teams)
        body, expected = verify_body(rng, train_items)
        verifies["asked"] += 1
        status, answer, _ = api.call(team, "POST", "/v1/verify", body)
        if status == 200:
            passed = [bool(r.get("passed")) for r in answer.get("results", [])]
            verifies["ok" if passed == expected else "wrong"] += 1
            if passed != expected:
                print(f"soak: dry-run graded {passed}, expected {expected}: {answer}", file=sys.stderr)
        elif status == 429:
            verifies["busy"] += 1
        else:
            verifies["other"] += 1
            print(f"soak: POST /v1/verify: {status} {answer}", file=sys.stderr)

    # Idle before the first job: the baseline.
    for _ in range(3):
        take_sample("idle")
        time.sleep(args.sample_s)
    marks["load_start"] = time.monotonic() - started
    refused = 0
    throttled = 0
    while counts["submitted"] < args.jobs:
        poll()
        while counts["submitted"] < args.jobs and len(unended) < args.in_flight:
            team = teams[counts["submitted"] % len(teams)]
            kind, steps, spec = job_spec(rng, team, counts["submitted"])
            status, answer, retry = api.call(team, "POST", "/v1/jobs", spec)
            if status == 201:
                job_id = answer["id"]
                jobs[job_id] = {"id": job_id, "team": team, "kind": kind, "steps": steps,
                                "submitted_s": round(time.monotonic() - started, 2), "state": "queued",
                                "ended_s": "", "reason": "", "cancel_asked": False}
                unended[job_id] = team
                counts["submitted"] += 1
                if counts["submitted"] % 10 == 0:
                    print(f"soak: {counts['submitted']}/{args.jobs} submitted, {len(unended)} not ended",
                          file=sys.stderr)
                if rng.random() < args.cancel_p:
                    cancel_one()
                if rng.random() < args.verify_p:
                    verify_one()
            elif status == 429:
                throttled += 1
                time.sleep(min(float(retry or 1), 5))
                break
            else:
                refused += 1
                print(f"soak: submit refused: {status} {answer}", file=sys.stderr)
                if refused >= 3:
                    return 2
                break
        maybe_sample("load")
        time.sleep(0.3)
    marks["submits_end"] = time.monotonic() - started
    deadline = time.monotonic() + args.drain_timeout_s
    while unended and time.monotonic() < deadline:
        poll()
        maybe_sample("load")
        time.sleep(0.3)
    stuck = dict(unended)
    for job_id in stuck:
        jobs[job_id]["state"] += " (not ended by the deadline)"
    marks["load_end"] = time.monotonic() - started
    # Idle after the last job: what is left once the daemon has nothing to do.
    for _ in range(3):
        time.sleep(args.sample_s)
        take_sample("idle-end")
    samples_file.close()

    with open(os.path.join(args.out, "jobs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "team", "kind", "steps", "submitted_s", "ended_s", "state",
                                          "cancel_asked", "reason"])
        w.writeheader()
        for record in jobs.values():
            w.writerow(record)

    lines, failures = summarize(args, jobs, samples, marks, cancels, verifies, throttled, api, len(teams))
    patterns = ", ".join(f"{pattern} {n}" for pattern, n in sampler.key_patterns())
    lines.insert(-2, f"Redis keys at the end by pattern: {patterns}")
    if args.log:
        lines[-2:-2] = [""] + log_digest(args.log)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    with open(os.path.join(args.out, "plot.svg"), "w") as f:
        f.write(plot(samples, marks))
    return 1 if failures else 0


def summarize(args, jobs, samples, marks, cancels, verifies, throttled, api, n_teams):
    by_state = {}
    for record in jobs.values():
        by_state[record["state"]] = by_state.get(record["state"], 0) + 1
    lost = sum(n for state, n in by_state.items() if state not in TERMINAL)
    lines = []
    failures = []
    duration = marks["load_end"] - marks["load_start"]
    lines.append(f"soak: {len(jobs)} jobs submitted in {duration:.0f} s of load (seed {args.seed}, "
                 f"at most {args.in_flight} unended, {n_teams} teams)")
    lines.append("jobs by end state: " + ", ".join(f"{state} {n}" for state, n in sorted(by_state.items())))
    for state in ("published", "refused", "failed", "cancelled"):
        lines.append(f"  {state:<10} {by_state.get(state, 0)}")
    lines.append(f"  {'lost':<10} {lost}")
    lines.append(f"cancels: asked {cancels['asked']}, accepted {cancels['accepted']}, already ended "
                 f"{cancels['already_ended']}, other {cancels['other']}")
    lines.append(f"dry-runs: asked {verifies['asked']}, graded as expected {verifies['ok']}, 429 busy "
                 f"{verifies['busy']}, graded wrong {verifies['wrong']}, other {verifies['other']}")
    lines.append(f"submits answered 429: {throttled}")
    unexpected = {k: n for k, n in api.statuses.items() if k[2] >= 500}
    if unexpected:
        lines.append("server errors: " + ", ".join(f"{m} {r} {s} ×{n}" for (m, r, s), n in unexpected.items()))
    if lost:
        failures.append(f"{lost} job(s) lost or not ended")
    if verifies["wrong"]:
        failures.append(f"{verifies['wrong']} dry-run(s) graded wrong")

    # The loaded run's second half: from halfway between the first submit and the last job's end.
    half = (marks["load_start"] + marks["load_end"]) / 2
    second = [s for s in samples if s["phase"] == "load" and s["t_s"] >= half]
    half_len = marks["load_end"] - half
    lines.append("")
    lines.append(f"samples: {len(samples)}, every {args.sample_s:g} s; second half of the load from "
                 f"t = {half:.0f} s ({len(second)} samples, {half_len:.0f} s)")
    lines.append(f"{'series':<22} {'first':>9} {'last':>9} {'max':>9} {'idle→idle':>19} "
                 f"{'slope/min (2nd half)':>21} {'rise (2nd half)':>16}")
    notes = []
    idle_start = [s for s in samples if s["phase"] == "idle"]
    idle_end = [s for s in samples if s["phase"] == "idle-end"]
    for name, _ in SERIES:
        values = [s[name] for s in samples]
        slope = slope_per_min([(s["t_s"], s[name]) for s in second])
        rise = None if slope is None else slope * half_len / 60
        idle = f"{idle_start[-1][name]:g} → {idle_end[-1][name]:g}" if idle_start and idle_end else ""
        lines.append(f"{name:<22} {values[0]:>9g} {values[-1]:>9g} {max(values):>9g} {idle:>19} "
                     f"{'' if slope is None else f'{slope:+.3f}':>21} "
                     f"{'' if rise is None else f'{rise:+.2f}':>16}")
        if name in NOTED and rise is not None and rise > 0.05 * max(abs(max(values)), 1):
            notes.append(f"note: {name} rose {rise:+.2f} over the second half ({slope:+.3f}/min), "
                         f"{values[0]:g} → {values[-1]:g} over the run")
        if name in JUDGED:
            bound = getattr(args, JUDGED[name])
            # A line through a few samples follows how many workers happened to run: too noisy.
            if len(second) < MIN_JUDGED_SAMPLES:
                notes.append(f"note: the rise of {name} not judged: {len(second)} samples in the second half, "
                             f"fewer than {MIN_JUDGED_SAMPLES}")
            elif rise is not None and rise > bound:
                failures.append(f"{name} rose {rise:+.1f} over the second half (bound {bound:g})")
            if idle_start and idle_end and idle_end[-1][name] - idle_start[-1][name] > bound:
                failures.append(f"{name} idle at the end {idle_end[-1][name]} against {idle_start[-1][name]} "
                                f"at the start (bound {bound:g})")
    lines += notes
    # Ended records are bounded: every team keeps at most keep_ended; nothing is unended at the end.
    record_bound = n_teams * args.keep_ended
    end = samples[-1]
    lines.append("")
    lines.append(f"Redis at the end: {end['redis_job_records']} job records, {end['redis_event_streams']} event "
                 f"streams, {end['redis_index']} in the jobs index (bound {n_teams} teams × "
                 f"{args.keep_ended} = {record_bound}); max during the run {max(s['redis_job_records'] for s in samples)} "
                 f"records (bound + {args.in_flight} unended = {record_bound + args.in_flight})")
    for name in ("redis_job_records", "redis_event_streams", "redis_index"):
        if end[name] > record_bound:
            failures.append(f"{name} = {end[name]} at the end, over {record_bound}")
    if end["zombies"]:
        failures.append(f"{end['zombies']} zombie child(ren) at the end")
    lines.append("")
    lines.append("FAILED: " + "; ".join(failures) if failures else "OK: no job lost, fds and threads within bounds")
    return lines, failures


def plot(samples, marks):
    """One small line chart per series against time, as plain SVG."""
    cols, w, h = 3, 330, 190
    left, right, top, bottom = 52, 12, 26, 30
    rows = (len(SERIES) + cols - 1) // cols
    width, height = cols * w, rows * h + 30
    t_max = max(s["t_s"] for s in samples) or 1
    half = (marks["load_start"] + marks["load_end"]) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="8" y="18" font-size="13">rlvrd soak: {samples[-1]["submitted"]} jobs; shaded: second half '
           f'of the load; dashed: first submit, last job ended</text>']
    for i, (name, title) in enumerate(SERIES):
        ox, oy = (i % cols) * w, 30 + (i // cols) * h
        pw, ph = w - left - right, h - top - bottom
        values = [s[name] for s in samples]
        lo, hi = min(values), max(values)
        if hi == lo:
            hi = lo + 1

        def x(t):
            return ox + left + pw * t / t_max

        def y(v):
            return oy + top + ph * (1 - (v - lo) / (hi - lo))

        out.append(f'<text x="{ox + left}" y="{oy + 16}" font-size="11" font-weight="bold">{title}</text>')
        out.append(f'<rect x="{x(half):.1f}" y="{oy + top}" width="{x(marks["load_end"]) - x(half):.1f}" '
                   f'height="{ph}" fill="#eef3fb"/>')
        out.append(f'<rect x="{ox + left}" y="{oy + top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for t in (marks["load_start"], marks["load_end"]):
            out.append(f'<line x1="{x(t):.1f}" y1="{oy + top}" x2="{x(t):.1f}" y2="{oy + top + ph}" '
                       f'stroke="#888" stroke-dasharray="3,3"/>')
        points = " ".join(f"{x(s['t_s']):.1f},{y(s[name]):.1f}" for s in samples)
        out.append(f'<polyline points="{points}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>')
        out.append(f'<text x="{ox + left - 4}" y="{oy + top + 8}" text-anchor="end">{hi:g}</text>')
        out.append(f'<text x="{ox + left - 4}" y="{oy + top + ph}" text-anchor="end">{lo:g}</text>')
        out.append(f'<text x="{ox + left}" y="{oy + top + ph + 13}">0</text>')
        out.append(f'<text x="{ox + left + pw}" y="{oy + top + ph + 13}" text-anchor="end">{t_max:.0f} s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(run(parse_args()))
    except KeyboardInterrupt:
        sys.exit(130)
