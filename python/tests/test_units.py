"""The rlvr package's pure parts, no daemon: the event-stream parser, dataset names, spec data
found, a download's checks, the errors' text, the report page and the build backend's wheel."""

import hashlib
import io
import json
import os
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

import rlvr
from rlvr import download, events, report, spec
from rlvr._http import Transport


class SseParserTest(unittest.TestCase):
    def check(self, stream, expected, last_id):
        parser = events.SseParser()
        got = [(e.event, e.data) for line in stream.split("\n")
               if (e := parser.line(line.rstrip("\r"))) is not None]
        self.assertEqual(got, expected, stream)
        self.assertEqual(parser.last_id, last_id, stream)

    def test_events_fields_and_comments(self):
        # (stream, events, last id): the cases of the Rust client's parser, which this mirrors.
        cases = [
            ("event: state\nid: 17-0\ndata: {\"a\":1}\n\n:\n: keep-alive\nevent: progress\ndata: {}\n\n",
             [("state", "{\"a\":1}"), ("progress", "{}")], "17-0"),
            ("data:one\r\ndata: two\r\n\r\n", [("message", "one\ntwo")], None),
            ("data:  x\ndata\n\n", [("message", " x\n")], None),
            ("id: 5-1\nretry: 100\nfoo: bar\n\n", [], "5-1"),
            ("event: state\ndata: {}", [], None),
            ("id: a\0b\ndata: x\n\n", [("message", "x")], None),
        ]
        for stream, expected, last_id in cases:
            self.check(stream, expected, last_id)

    def test_reconnect_forgets_the_half_event(self):
        parser = events.SseParser()
        for line in ["event: state", "id: 1-0", "data: {}", ""]:
            parser.line(line)
        for line in ["event: state", "id: 2-0", "data: {\"half"]:
            self.assertIsNone(parser.line(line))
        parser.reconnect()
        self.assertEqual(parser.last_id, "1-0", "event 2-0 never arrived whole")
        parser.line("data: {}")
        self.assertEqual(parser.line(""), events.SseEvent("message", "{}"))
        self.assertEqual(parser.last_id, "1-0")


def serve(answers):
    """A server on 127.0.0.1 answering each request with the next of `answers` (bytes of a whole
    HTTP answer) and closing the connection; returns its URL and the requests' heads."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    heads = []

    def run():
        for answer in answers:
            connection, _ = listener.accept()
            with connection:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += connection.recv(4096)
                heads.append(head.decode().lower())
                connection.sendall(answer)
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", heads


class FollowTest(unittest.TestCase):
    def test_following_resumes_after_the_last_complete_event_when_the_stream_drops(self):
        def event(event_id, state):
            data = json.dumps({"id": event_id, "at": "2026-11-21T12:00:01Z", "state": state, "reason": "", "step": 0})
            return f"event: state\nid: {event_id}\ndata: {data}\n\n"

        head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        # The first stream ends after one event, in the middle of the next one.
        first = head + ": keep-alive\n\n" + event("1-0", "running") + "event: state\nid: 2-0\n"
        second = head + event("3-0", "published")
        server, heads = serve([first.encode(), second.encode()])
        dropped = []
        followed = list(events.follow(Transport(server, "s3cret"), "01J",
                                      on_reconnect=lambda why, wait: dropped.append((why, wait))))
        self.assertEqual([(e.id, e.state) for e in followed], [("1-0", "running"), ("3-0", "published")])
        self.assertEqual(dropped, [("the daemon closed the stream", 0.5)])
        self.assertTrue(heads[0].startswith("get /v1/jobs/01j/events "), heads[0])
        self.assertNotIn("last-event-id", heads[0])
        self.assertIn("last-event-id: 1-0", heads[1])
        self.assertIn("authorization: bearer s3cret", heads[1])

    def test_busy_answers_are_waited_out_a_few_times_then_raised(self):
        busy = (b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 0\r\ncontent-type: application/json\r\n"
                b"connection: close\r\n\r\n{\"error\":{\"code\":\"rate_limited\",\"message\":\"slow down\"}}")
        server, heads = serve([busy] * 4)
        waits = []
        client = rlvr.Client(server=server, token="t", on_busy=lambda status, wait: waits.append((status, wait)))
        with self.assertRaises(rlvr.RateLimited) as caught:
            client.job("01J")
        self.assertEqual((len(heads), waits), (4, [(429, 0.0)] * 3), "three retries, then the answer")
        self.assertEqual((str(caught.exception), caught.exception.retry_after), ("rate_limited: slow down", 0.0))


class DisplayTest(unittest.TestCase):
    def test_plain_lines_say_each_state_and_the_steps_figures(self):
        from rlvr.progress import Display

        out = io.StringIO()
        display = Display(bar=False, out=out)
        display.state(rlvr.JobEvent.from_json({"id": "1-0", "at": "2026-11-21T12:00:01.000Z", "state": "running",
                                               "reason": "worker pid 7 started", "step": 0}))
        display.progress(rlvr.Job.from_json({"id": "j", "state": "running", "step": 6, "max_steps": 6,
                                             "updated_at": "2026-11-21T12:00:09Z",
                                             "progress": {"reward": 0.25, "kl": 0.001, "loss": None, "eta_s": 0}}))
        display.close()
        self.assertEqual(out.getvalue(), "12:00:01 running — worker pid 7 started\n"
                                         "12:00:09 step 6/6 · reward 0.25 · KL 0.001 · ETA 0 s\n")


class ModelsTest(unittest.TestCase):
    def test_a_jobs_progress_result_and_published_version_are_typed(self):
        job = rlvr.Job.from_json({
            "id": "j", "state": "published", "kind": "online_groups", "step": 6, "max_steps": 6,
            "progress": {"step": 6, "max_steps": 6, "reward": 0.5, "loss": None, "kl": 0.01, "heldout": 0.4,
                         "tokens_per_s": 90.0, "step_s": 1.5, "eta_s": 0.0},
            "result": {"steps": 6, "weights_sha256": "ab", "heldout_before": 0.2, "heldout_after": 0.4,
                       "stopped": None, "interrupted": False, "checkpoint": "registry:/tiny/1"},
            "output": {"kind": "checkpoint", "line": "tiny", "version": 1, "path": "registry:/tiny/1"},
            "published_version": {"line": "tiny", "version": 1}})
        self.assertEqual((job.kind, job.progress.reward, job.progress.eta_s, job.progress.warnings),
                         ("online_groups", 0.5, 0.0, []))
        self.assertEqual((job.result.steps, job.result.heldout_after, job.result.interrupted), (6, 0.4, False))
        self.assertEqual(job.published_version, rlvr.LineVersion("tiny", 1))
        self.assertEqual((job.output.kind, job.output.path, job.output.reference),
                         ("checkpoint", "registry:/tiny/1", "line:tiny@1"))
        dataset = rlvr.JobOutput.from_json({"kind": "dataset", "name": "rows", "sha256": "cd"})
        self.assertEqual(dataset.reference, "dataset:rows@cd")
        # What a newer daemon adds stays in `raw`.
        self.assertEqual(job.result.raw["checkpoint"], "registry:/tiny/1")
        bare = rlvr.Job.from_json({"id": "k", "state": "queued"})
        self.assertEqual((bare.kind, bare.progress, bare.result, bare.output, bare.published_version),
                         (None, None, None, None, None))


class SpecTest(unittest.TestCase):
    def test_dataset_names_follow_rlvrctls_rule(self):
        cases = [("/x/train.jsonl", "train"), ("a b.jsonl", "a-b"), (".hidden.jsonl", "hidden"),
                 ("/x/.jsonl", "jsonl"), ("/x/...", "train")]
        for path, expected in cases:
            self.assertEqual(spec.dataset_name(path, "train"), expected, path)

    def test_local_data_is_found_relative_to_the_base_and_must_be_a_regular_file(self):
        with tempfile.TemporaryDirectory() as base:
            Path(base, "t.jsonl").write_text("{}\n")
            value = {"data": {"train": "t.jsonl", "heldout": "dataset:h@" + "0" * 64, "canaries": "root:r/x"},
                     "stages": [{"data": {"train": "previous"}}, {"data": {"train": "t.jsonl"}}]}
            found = spec.local_data(value, Path(base))
            self.assertEqual([(f.field, f.path.name) for f in found],
                             [("data.train", "t.jsonl"), ("stages.1.data.train", "t.jsonl")])
            uploaded = spec.with_datasets(value, Path(base), lambda name, path: f"dataset:{name}@sha")
            self.assertEqual(uploaded["data"]["train"], "dataset:t@sha")
            self.assertEqual(uploaded["stages"][1]["data"]["train"], "dataset:t@sha")
            self.assertEqual(value["data"]["train"], "t.jsonl", "the caller's spec is left as it is")
            # (train as written, words of the refusal)
            for train, words in [("missing.jsonl", "data.train: cannot read"), (".", "not a regular file"),
                                 ("/dev/zero", "not a regular file")]:
                with self.assertRaises(rlvr.SpecError) as caught:
                    spec.local_data({"data": {"train": train}}, Path(base))
                self.assertIn(words, str(caught.exception))
                self.assertEqual(caught.exception.field, "data.train")

    def test_a_spec_file_that_does_not_parse_is_a_spec_error(self):
        with tempfile.TemporaryDirectory() as base:
            Path(base, "bad.toml").write_text("[job\n")
            with self.assertRaisesRegex(rlvr.SpecError, "not valid TOML"):
                rlvr.read_spec_file(Path(base, "bad.toml"))

    def test_the_builder_makes_the_sections_of_a_spec(self):
        built = (rlvr.SpecBuilder("x", team="t", model_line="m", policy="builtin:tiny-arith").optimizer("grpo", lr=0.1)
                 .verifier("math").verifier("format").budget(max_steps=3).section("budget", max_tokens=9)
                 .to_dict())
        self.assertEqual(built, {"job": {"name": "x", "team": "t", "model_line": "m"},
                                 "model": {"policy": "builtin:tiny-arith"},
                                 "optimizer": {"plugin": "grpo", "lr": 0.1},
                                 "verifiers": [{"plugin": "math"}, {"plugin": "format"}],
                                 "budget": {"max_steps": 3, "max_tokens": 9}})
        # No team: the daemon runs the job for the submitting token's.
        unnamed = rlvr.SpecBuilder("x", model_line="m", policy="builtin:tiny-arith").to_dict()
        self.assertEqual(unnamed["job"], {"name": "x", "model_line": "m"})


class DownloadTest(unittest.TestCase):
    def manifest(self, files):
        raw = {"job_id": "j", "model_line": "m", "version": 1,
               "files": {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}}
        return rlvr.Manifest.from_json(raw)

    def test_a_download_is_checked_and_whole_or_absent(self):
        files = {"model.safetensors": b"weights", "config.json": b"{}"}
        manifest = self.manifest(files)
        with tempfile.TemporaryDirectory() as base:
            target = Path(base, "v1")
            download.download_into(target, manifest, lambda name: io.BytesIO(files[name]))
            self.assertEqual(sorted(os.listdir(target)), ["config.json", "manifest.json", "model.safetensors"])
            self.assertEqual(rlvr.verify_files(target).files, manifest.files)
            # A file whose bytes differ from the manifest's: nothing is left, not even a temp dir.
            served = dict(files, **{"model.safetensors": b"tampered"})
            with self.assertRaises(rlvr.IntegrityError) as caught:
                download.download_into(Path(base, "v2"), manifest, lambda name: io.BytesIO(served[name]))
            self.assertEqual(caught.exception.file, "model.safetensors")
            self.assertEqual(sorted(os.listdir(base)), ["v1"])
            with self.assertRaises(FileExistsError):
                download.download_into(target, manifest, lambda name: io.BytesIO(files[name]))

    def test_a_manifest_cannot_name_a_path(self):
        for name in ["../evil", "/etc/passwd", "a/b", "..", "manifest.json", ""]:
            with tempfile.TemporaryDirectory() as base:
                with self.assertRaises(rlvr.BadAnswer, msg=name):
                    download.download_into(Path(base, "v"), self.manifest({name: b"x"}), lambda _: io.BytesIO(b"x"))
                self.assertEqual(os.listdir(base), [], name)


class ErrorTest(unittest.TestCase):
    def test_errors_carry_the_apis_code_field_and_message_by_status(self):
        body = {"error": {"code": "invalid_spec", "message": "expected 1", "field": "budget",
                          "more": [{"field": "rollout.top_p", "message": "expected (0, 1]"}]}}
        error = rlvr.ApiError.of(422, body, "http://h/v1/jobs", None, json.dumps(body))
        self.assertIsInstance(error, rlvr.Invalid)
        self.assertEqual((error.code, error.field, error.status), ("invalid_spec", "budget", 422))
        self.assertEqual(str(error), "invalid_spec: budget: expected 1\n  rollout.top_p: expected (0, 1]")
        # Not the daemon's body (a proxy's page): made from the status.
        error = rlvr.ApiError.of(502, None, "http://h/x", None, "<html>upstream down</html>")
        self.assertIsInstance(error, rlvr.ServerError)
        self.assertEqual((str(error), error.from_daemon), ("http_502: <html>upstream down</html>", False))
        for status, kind in [(401, rlvr.Unauthorized), (403, rlvr.Forbidden), (404, rlvr.NotFound),
                             (409, rlvr.Conflict), (413, rlvr.TooLarge), (429, rlvr.RateLimited), (418, rlvr.ApiError)]:
            self.assertIs(type(rlvr.ApiError.of(status, None, "u", None, "")), kind)

    def test_urls_encode_ids_and_keep_a_path_prefix(self):
        self.assertEqual(Transport("http://h:1", None).url(["v1", "jobs", "a/b?c"]), "http://h:1/v1/jobs/a%2Fb%3Fc")
        self.assertEqual(Transport("https://h/rlvr/", None).url(["v1", "jobs"], {"team": "a b", "limit": 5, "x": None,
                                                                               "dry_run": True}),
                         "https://h/rlvr/v1/jobs?team=a+b&limit=5&dry_run=true")
        for server in ["h:1", "ftp://h", "http://user:pw@h"]:
            with self.assertRaises(ValueError, msg=server):
                Transport(server, None)


class ReportTest(unittest.TestCase):
    def test_the_page_has_the_summary_the_gates_and_a_chart_per_figure(self):
        job = rlvr.Job.from_json({"id": "01J<x>", "state": "published", "step": 2, "max_steps": 2, "gates": {
            "passed": False, "criteria": [{"name": "kl", "status": "fail", "measured": 0.5, "threshold": 0.1,
                                           "op": "<=", "note": "KL"}]}})
        metrics = [rlvr.MetricsLine.from_json(line) for line in [
            {"step": 0, "heldout": {"accuracy": 0.1}}, {"step": 1, "reward_mean": 0.2}, {"step": 2, "reward_mean": 0.4},
        ]]
        page = report.render(job, metrics)
        self.assertIn("01J&lt;x&gt;", page)
        self.assertIn('<tr class="fail"><td>kl</td><td>FAIL</td><td>0.5</td><td>&lt;= 0.1</td>', page)
        self.assertEqual(page.count("<svg"), 2, "reward and held-out accuracy")
        self.assertIn("No data for: Pass rate, KL to the reference, Loss, Completion length (tokens).", page)


class BuildBackendTest(unittest.TestCase):
    def test_the_wheel_holds_the_package_its_metadata_and_a_true_record(self):
        root = os.environ.get("RLVR_PYTHON_SOURCE")
        if not root:
            self.skipTest("RLVR_PYTHON_SOURCE (the python/ directory) not set")
        sys.path.insert(0, os.path.join(root, "build_backend"))
        try:
            import rlvr_build
        finally:
            sys.path.pop(0)
        with tempfile.TemporaryDirectory() as out:
            name = rlvr_build.build_wheel(out)
            self.assertEqual(name, f"rlvr-{rlvr.__version__}-py3-none-any.whl")
            with zipfile.ZipFile(Path(out, name)) as wheel:
                names = set(wheel.namelist())
                self.assertTrue({"rlvr/__init__.py", "rlvr/py.typed", "rlvr-0.1.0.dist-info/METADATA"} <= names)
                record = wheel.read("rlvr-0.1.0.dist-info/RECORD").decode().splitlines()
                self.assertEqual({line.split(",")[0] for line in record}, names)
                for line in record:
                    path, digest, _ = line.split(",")
                    if digest:
                        import base64
                        expected = base64.urlsafe_b64encode(hashlib.sha256(wheel.read(path)).digest()).rstrip(b"=")
                        self.assertEqual(digest, "sha256=" + expected.decode(), path)
                metadata = wheel.read("rlvr-0.1.0.dist-info/METADATA").decode()
                self.assertIn('Requires-Dist: tqdm; extra == "progress"', metadata)


if __name__ == "__main__":
    unittest.main()
