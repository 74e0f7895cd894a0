"""The rlvr package against a real `rlvrd serve` (tests/tests/python_client.rs starts it and Redis):
submits from a TOML file and from a dict, follows jobs to their end, lists, pages, dry-runs,
uploads, downloads and cancels, and meets the daemon's refusals as typed errors.

Environment: RLVR_SERVER, RLVR_TOKEN (team `tests`), RLVR_OTHER_TOKEN (team `others`),
RLVR_TEST_DATA (a directory holding the arithmetic train.jsonl and heldout.jsonl),
RLVR_LIMITED_SERVER (a daemon whose api.rate_limit_per_minute is 60). Without them every test
here is skipped, and the Rust test refuses a run with skips."""

import hashlib
import os
import shutil
import tempfile
import time
import tomllib
import unittest
import uuid
from datetime import UTC, datetime
from pathlib import Path

import rlvr

ENV = ["RLVR_SERVER", "RLVR_TOKEN", "RLVR_OTHER_TOKEN", "RLVR_TEST_DATA", "RLVR_LIMITED_SERVER"]
LINE = "tiny-arith"


def job_toml(name, steps):
    """A small GRPO job on the arithmetic data, naming it `data/…` relative to the spec file, with
    gates that pass any candidate (a few steps of a tiny model move its scores by noise only)."""
    return f"""
[job]
name = "{name}"
team = "tests"
model_line = "{LINE}"
seed = 7

[model]
policy = "builtin:tiny-arith"

[data]
train = "data/train.jsonl"
heldout = "data/heldout.jsonl"

[optimizer]
plugin = "grpo"
group_size = 4
lr = 1e-3
micro_batch_size = 8
kl_beta = 0.04

[[verifiers]]
plugin = "math"
fallback = "last"

[rollout]
max_new_tokens = 5
prompts_per_step = 4

[budget]
max_steps = {steps}

[checkpoint]
every_steps = 5

[eval]
max_prompts = 16

[gates]
heldout_gain_min = -1.0
refuse_reward_hacking = false
length_ratio_max = 100.0
"""


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@unittest.skipUnless(all(os.environ.get(name) for name in ENV), "needs a daemon: " + ", ".join(ENV))
class DaemonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = rlvr.Client(server=os.environ["RLVR_SERVER"], token=os.environ["RLVR_TOKEN"])
        cls.other = rlvr.Client(server=os.environ["RLVR_SERVER"], token=os.environ["RLVR_OTHER_TOKEN"])
        cls.dir = Path(tempfile.mkdtemp(prefix="rlvr-py-"))
        shutil.copytree(os.environ["RLVR_TEST_DATA"], cls.dir / "data")
        cls.spec_file = cls.dir / "job.toml"
        cls.spec_file.write_text(job_toml("from-toml", 6))
        # The job most tests read: submitted from its TOML file, followed to its end.
        cls.first = cls.client.submit(cls.spec_file)
        cls.published = cls.client.wait(cls.first.id, timeout=120)
        # A second job, submitted as a dict built in code, its data uploaded by us.
        train = cls.client.upload_dataset("py-train", cls.dir / "data/train.jsonl")
        heldout = cls.client.upload_dataset("py-heldout", cls.dir / "data/heldout.jsonl")
        cls.train = train
        spec = tomllib.loads(job_toml("from-dict", 3))
        spec["data"] = {"train": train.ref, "heldout": heldout.ref}
        cls.dict_spec = spec
        cls.key = f"py-dict-{uuid.uuid4().hex}"
        cls.second = cls.client.submit(spec, wait=True, idempotency_key=cls.key)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_a_toml_file_is_submitted_with_its_data_and_waited_for_to_published(self):
        self.assertTrue(self.first.created)
        self.assertEqual(self.first.name, "from-toml")
        self.assertEqual((self.published.state, self.published.step), ("published", 6), self.published.reason)
        self.assertEqual(self.published.published_version.line, LINE)
        self.assertEqual(self.published.output.reference, f"line:{LINE}@{self.published.published_version.version}")
        # Its relative data paths were read from the spec's directory and uploaded as datasets.
        datasets = {dataset.name: dataset for dataset in self.client.datasets()}
        self.assertEqual(datasets["train"].sha256, sha256(self.dir / "data/train.jsonl"))
        self.assertEqual(datasets["heldout"].records, 200)

    def test_a_dict_is_submitted_once_per_idempotency_key(self):
        self.assertEqual((self.second.state, self.second.name, self.second.created), ("published", "from-dict", True))
        again = self.client.submit(self.dict_spec, idempotency_key=self.key)
        self.assertEqual((again.id, again.created), (self.second.id, False))

    def test_jobs_are_listed_newest_first_in_pages_and_since_a_time(self):
        ids = [job.id for job in self.client.jobs()]
        paged = [job.id for job in self.client.jobs(limit=1)]
        self.assertEqual(paged, ids)
        self.assertGreaterEqual(len(ids), 2)
        self.assertLess(ids.index(self.second.id), ids.index(self.first.id), "newest first")
        page = self.client.jobs_page(limit=1)
        self.assertEqual(len(page.jobs), 1)
        self.assertIsNotNone(page.next)
        # The second job was submitted seconds after the first ended.
        since = [job.id for job in self.client.jobs(since=self.second.created_at, limit=1)]
        self.assertIn(self.second.id, since)
        self.assertNotIn(self.first.id, since)
        future = datetime(2100, 1, 1, tzinfo=UTC)
        self.assertEqual(list(self.client.jobs(since=future)), [])
        published = [job.id for job in self.client.jobs(state="published")]
        self.assertIn(self.first.id, published)
        with self.assertRaises(rlvr.Invalid) as caught:
            list(self.client.jobs(since="yesterday"))
        self.assertEqual(caught.exception.field, "since")

    def test_events_replay_a_jobs_life_and_resume_after_an_id(self):
        states = [event.state for event in self.client.events(self.first.id) if isinstance(event, rlvr.JobEvent)]
        self.assertEqual(states, ["queued", "admitted", "running", "evaluating", "published"])
        events = [event for event in self.client.events(self.first.id) if isinstance(event, rlvr.JobEvent)]
        resumed = [event.state for event in self.client.events(self.first.id, after=events[2].id)
                   if isinstance(event, rlvr.JobEvent)]
        self.assertEqual(resumed, ["evaluating", "published"])

    def test_gates_metrics_logs_and_report(self):
        gates = self.client.gates(self.first.id)
        self.assertTrue(gates.passed)
        self.assertEqual(gates.failed(), [])
        names = [criterion.name for criterion in gates.criteria]
        self.assertEqual(names[0], "heldout_gain")
        heldout_gain = gates.criteria[0]
        self.assertEqual((heldout_gain.status, heldout_gain.threshold, heldout_gain.op), ("pass", -1.0, ">="))
        metrics = self.client.metrics(self.first.id)
        self.assertEqual(sorted({line.step for line in metrics}), list(range(7)))
        self.assertTrue(all(line.reward_mean is not None for line in metrics if line.heldout is None))
        self.assertIsNotNone(metrics[0].heldout, "the held-out score before training")
        log = self.client.logs(self.first.id)
        self.assertIn("held-out before training", log.text)
        self.assertEqual(self.client.logs(self.first.id, since=log.end).text, "")
        page = self.client.report(self.first.id, self.dir / "report").read_text()
        self.assertIn(self.first.id, page)
        self.assertIn("<svg", page)

    def test_a_dry_run_answers_the_normalised_spec_or_the_refusal_and_queues_nothing(self):
        before = len(list(self.client.jobs()))
        spec = self.client.dry_run(self.spec_file)
        self.assertEqual(spec["job"]["name"], "from-toml")
        self.assertEqual(spec["optimizer"]["group_size"], 4)
        self.assertTrue(spec["data"]["train"].startswith("dataset:train@"), spec["data"])
        built = (rlvr.SpecBuilder("built", model_line=LINE, policy="builtin:tiny-arith")
                 .data(train=self.train.ref).optimizer("grpo", group_size=4, micro_batch_size=8)
                 .verifier("math").rollout(max_new_tokens=5, prompts_per_step=4).budget(max_steps=2))
        checked = self.client.dry_run(built)
        self.assertEqual(checked["data"]["train"], self.train.ref)
        self.assertEqual(checked["job"]["team"], "tests", "no team named: the token's is filled in")
        bad = self.dir / "bad.toml"
        bad.write_text(self.spec_file.read_text().replace("lr = 1e-3", "lr = -1.0"))
        with self.assertRaises(rlvr.Invalid) as caught:
            self.client.dry_run(bad)
        self.assertEqual((caught.exception.status, caught.exception.code, caught.exception.field),
                         (422, "invalid_spec", "optimizer.lr"))
        with self.assertRaises(rlvr.Invalid) as caught:
            self.client.submit(bad)
        self.assertEqual(caught.exception.field, "optimizer.lr")
        # The environment check of a spec with no environment: refused at the section it lacks.
        with self.assertRaises(rlvr.Invalid) as caught:
            self.client.env_check(self.spec_file)
        self.assertEqual((caught.exception.status, caught.exception.field), (422, "env"))
        self.assertEqual(len(list(self.client.jobs())), before)

    def test_another_teams_job_and_line_are_not_found(self):
        with self.assertRaises(rlvr.NotFound) as caught:
            self.other.job(self.first.id)
        self.assertEqual(caught.exception.code, "not_found")
        for call in [lambda: self.other.cancel(self.first.id), lambda: self.other.metrics(self.first.id),
                     lambda: self.other.manifest(LINE, 1), lambda: list(self.other.events(self.first.id))]:
            with self.assertRaises(rlvr.NotFound):
                call()
        self.assertEqual(list(self.other.jobs()), [])

    def test_refusals_of_the_token_and_no_daemon(self):
        with self.assertRaises(rlvr.Unauthorized) as caught:
            rlvr.Client(server=os.environ["RLVR_SERVER"], token="not-a-token").job(self.first.id)
        self.assertEqual(caught.exception.code, "unauthorized")
        with self.assertRaises(rlvr.Unreachable):
            rlvr.Client(server="http://127.0.0.1:9", token="x").health()

    def test_a_dataset_upload_is_the_files_content(self):
        self.assertEqual((self.train.name, self.train.sha256), ("py-train", sha256(self.dir / "data/train.jsonl")))
        self.assertEqual(self.train.records, 2000)
        self.assertEqual(self.client.dataset("py-train").sha256, self.train.sha256)
        with self.assertRaises(rlvr.Invalid) as caught:
            self.client.put_dataset("bad name", b"{}\n")
        self.assertEqual(caught.exception.field, "name")

    def test_model_lines_versions_manifests_and_a_checked_download(self):
        lines = {line.name: line for line in self.client.model_lines()}
        versions = lines[LINE].versions
        self.assertEqual(self.client.model_line(LINE).versions, versions)
        first = self.published.published_version.version
        self.assertIn(first, versions)
        manifest = self.client.manifest(LINE, first)
        self.assertEqual((manifest.job_id, manifest.version, manifest.model_line), (self.first.id, first, LINE))
        latest = self.client.manifest(LINE, "latest")
        self.assertEqual(latest.version, max(versions))
        self.assertTrue(manifest.files)
        target = self.dir / "download"
        downloaded = self.client.download(LINE, first, target)
        self.assertEqual(downloaded.files, manifest.files)
        self.assertEqual(sorted(os.listdir(target)), sorted([*manifest.files, "manifest.json"]))
        for name, expected in manifest.files.items():
            self.assertEqual(sha256(target / name), expected, name)
        self.assertEqual(rlvr.verify_files(target).version, first)
        # A tampered copy is caught, naming the file.
        tampered = self.dir / "tampered"
        shutil.copytree(target, tampered)
        name = sorted(manifest.files)[0]
        content = bytearray((tampered / name).read_bytes())
        content[len(content) // 2] ^= 0xFF
        (tampered / name).write_bytes(bytes(content))
        with self.assertRaises(rlvr.IntegrityError) as caught:
            rlvr.verify_files(tampered)
        self.assertEqual(caught.exception.file, name)
        # Into a directory that exists: refused before anything is fetched.
        with self.assertRaises(FileExistsError):
            self.client.download(LINE, first, target)
        with self.assertRaises(rlvr.NotFound):
            self.client.download(LINE, 999, self.dir / "nothing")
        self.assertFalse((self.dir / "nothing").exists())
        with self.assertRaises(rlvr.Invalid) as caught:
            self.client.manifest(LINE, "newest")
        self.assertEqual(caught.exception.field, "version")

    def test_a_running_job_is_cancelled(self):
        spec = self.dir / "long.toml"
        spec.write_text(job_toml("long", 100_000))
        job = self.client.submit(spec)
        for event in self.client.events(job.id):
            if isinstance(event, rlvr.Job) and event.step >= 2:
                break
        cancelling = self.client.cancel(job.id)
        self.assertEqual(cancelling.id, job.id)
        ended = self.client.wait(job.id, timeout=60)
        self.assertEqual(ended.state, "cancelled")
        self.assertLess(ended.step, 100_000)

    def test_verify_grades_items_with_a_grader(self):
        items = [{"id": "a", "prompt": "2+2=", "completion": "4", "reference": {"answer": "4"}},
                 {"id": "b", "prompt": "2+2=", "completion": "5", "reference": {"answer": "4"}}]
        results = self.client.verify(items, grader={"plugin": "math", "fallback": "last"})
        self.assertEqual([(r.id, r.passed, r.score) for r in results], [("a", True, 1.0), ("b", False, 0.0)])
        self.assertTrue(results[0].verifier.startswith("math@"))
        with self.assertRaises(rlvr.ApiError) as caught:
            self.client.verify(items, grader={"plugin": "nonexistent"})
        self.assertIn(caught.exception.status, (400, 404, 422))

    def test_plugins_are_listed(self):
        ids = {plugin.name: plugin for plugin in self.client.plugins().plugins}
        self.assertEqual((ids["grpo"].kind, ids["math"].kind), ("optimizer", "verifier"))

    def test_busy_answers_are_waited_out_then_raised(self):
        # A daemon allowing 60 requests a minute: the 61st within the minute gets 429 with
        # Retry-After, which the client waits out (and says so through on_busy).
        waits = []
        limited = rlvr.Client(server=os.environ["RLVR_LIMITED_SERVER"], token=os.environ["RLVR_TOKEN"],
                              on_busy=lambda status, wait: waits.append((status, wait)))
        started = time.monotonic()
        for _ in range(63):
            limited.plugins()
        self.assertGreaterEqual(len(waits), 1, "the limit was reached")
        self.assertTrue(all(status == 429 and 0 < wait <= 30 for status, wait in waits), waits)
        self.assertLess(time.monotonic() - started, 30)
        impatient = rlvr.Client(server=os.environ["RLVR_LIMITED_SERVER"], token=os.environ["RLVR_TOKEN"],
                                busy_retries=0)
        with self.assertRaises(rlvr.RateLimited) as caught:
            for _ in range(5):
                impatient.plugins()
        self.assertEqual(caught.exception.code, "rate_limited")
        self.assertGreater(caught.exception.retry_after, 0)

    def test_the_package_is_the_installed_one(self):
        source = os.environ.get("RLVR_PYTHON_SOURCE")
        if source:
            self.assertFalse(os.path.abspath(rlvr.__file__).startswith(os.path.abspath(source)), rlvr.__file__)


if __name__ == "__main__":
    unittest.main()
