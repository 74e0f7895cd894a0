//! `[tracking] mlflow_uri` against a real MLflow tracking server (`mlflow server`, from
//! `scripts/mlflow-venv.sh`) started by the test on loopback, beside a real Redis and a real
//! `rlvrd serve`: a job that publishes is one MLflow run — named by its id, its spec as params,
//! each metrics line's figures at their steps, FINISHED with its published version, and the
//! published files and manifest as its artifacts, byte for byte; a longer job's figures reach
//! MLflow while it runs and its cancel ends its run KILLED; and a url the operator's
//! `[outbound] allow` does not cover is refused at submit, naming `tracking.mlflow_uri`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rlvr_protocol::job::JobState;
use rlvr_tests::jobs::{api, ended, submit, submit_ok, wait_job};
use rlvr_tests::{
    Daemon, PERMISSIVE_GATES, Redis, TEAM_TOKEN, arith_data, arith_grpo_spec, free_port, wait_until,
    workspace_root,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

const PLUGINS: [&str; 2] = ["rlvr-optimizer-grpo", "rlvr-verifier-math"];

/// The python of `scripts/mlflow-venv.sh` (installs it on first use).
fn mlflow_python() -> PathBuf {
    let output = Command::new("bash")
        .arg(workspace_root().join("scripts/mlflow-venv.sh"))
        .output()
        .expect("run scripts/mlflow-venv.sh");
    assert!(output.status.success(), "mlflow-venv.sh failed:\n{}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// `mlflow server` on 127.0.0.1, its runs in SQLite and its artifacts served from a directory,
/// both in `dir`; stopped (its whole process group) when dropped.
struct MlflowServer {
    child: Child,
    url: String,
    log: PathBuf,
}

impl MlflowServer {
    /// Starts it without waiting for it ([`MlflowServer::wait_ready`]).
    fn start(python: &Path, dir: &Path) -> MlflowServer {
        let port = free_port();
        let log = dir.join("mlflow.log");
        // A copy of the migrated empty database scripts/mlflow-venv.sh keeps: no migrations here.
        let venv = python.parent().and_then(Path::parent).expect("the venv of scripts/mlflow-venv.sh");
        fs::copy(venv.join("empty-tracking.db"), dir.join("mlflow.db"))
            .expect("the empty tracking database of scripts/mlflow-venv.sh");
        let child = Command::new(python.with_file_name("mlflow"))
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("artifacts"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(dir.join("mlflow.stderr")).unwrap())
            .process_group(0)
            .spawn()
            .expect("start mlflow server");
        MlflowServer { child, url: format!("http://127.0.0.1:{port}"), log }
    }

    fn wait_ready(&mut self) {
        let health = format!("{}/health", self.url);
        let up = wait_until(Duration::from_secs(120), || {
            reqwest::blocking::get(&health).is_ok_and(|answer| answer.status().is_success())
        });
        assert!(up, "mlflow server did not answer in 120 s:\n{}", self.logs());
    }

    fn logs(&self) -> String {
        let stderr = self.log.with_file_name("mlflow.stderr");
        format!(
            "{}{}",
            fs::read_to_string(&self.log).unwrap_or_default(),
            fs::read_to_string(stderr).unwrap_or_default()
        )
    }

    /// A JSON call to `/api/2.0/mlflow/<route>` (a GET when `body` is `None`).
    fn call(&self, route: &str, body: Option<Value>) -> Value {
        self.try_call(route, body).unwrap_or_else(|error| panic!("{error}"))
    }

    fn try_call(&self, route: &str, body: Option<Value>) -> Result<Value, String> {
        let client = reqwest::blocking::Client::new();
        let url = format!("{}/api/2.0/mlflow/{route}", self.url);
        let request = match body {
            Some(body) => client.post(&url).header("content-type", "application/json").body(body.to_string()),
            None => client.get(&url),
        };
        let answer = request.send().map_err(|error| format!("{route}: {error}"))?;
        let status = answer.status();
        let text = answer.text().map_err(|error| format!("{route}: {error}"))?;
        if !status.is_success() {
            return Err(format!("{route}: HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|error| format!("{route}: {error}: {text}"))
    }

    /// The bytes of artifact `path` of `run` in `experiment`, through the server's proxy.
    fn artifact(&self, experiment: &str, run: &str, path: &str) -> Vec<u8> {
        let url =
            format!("{}/api/2.0/mlflow-artifacts/artifacts/{experiment}/{run}/artifacts/{path}", self.url);
        let answer = reqwest::blocking::get(&url).unwrap();
        assert!(answer.status().is_success(), "{path}: HTTP {}", answer.status());
        answer.bytes().unwrap().to_vec()
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        // Its uvicorn workers are its children: the whole group goes, at once (a SIGTERM takes
        // it 10 s; its store is a temporary directory).
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// `metric` of each line of `metrics.jsonl` that has it (`heldout/accuracy`: a nested figure),
/// by step.
fn figures(metrics: &str, metric: &str) -> Vec<(u64, f64)> {
    metrics
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter_map(|line| {
            let value = metric.split('/').fold(&line, |value, part| &value[part]);
            Some((line["step"].as_u64()?, value.as_f64()?))
        })
        .collect()
}

#[test]
fn each_job_is_one_mlflow_run_with_its_params_live_metrics_status_and_published_files() {
    let started = Instant::now();
    let python = mlflow_python();
    let installed = started.elapsed();
    let work = tempfile::tempdir().unwrap();
    // Slow to start (its database's migrations): started first, waited for last.
    let mut mlflow = MlflowServer::start(&python, work.path());
    let redis = Redis::start();
    let allowed = mlflow.url.trim_start_matches("http://");
    let config = format!(
        "[queue]\nworker_threads = 1\n[devices]\ncpu_slots = 1\ncpu_slot_memory_gb = 8\n\
         [outbound]\nallow = [\"{allowed}\"]\n"
    );
    let daemon = Daemon::start_with(&PLUGINS, &redis.url(), &config);
    let data = arith_data(work.path(), &[]);
    let spec = |uri: &str| {
        arith_grpo_spec(&data, "tracked", "builtin:tiny-arith", 4, 2)
            + PERMISSIVE_GATES
            + &format!("[tracking]\nmlflow_uri = {uri:?}\n")
    };

    // regression: a tenant's url is the daemon's request — only where the operator allows.
    for uri in [format!("http://127.0.0.1:{}", free_port()), "http://169.254.169.254/latest".to_owned()] {
        let (status, body) = submit(&daemon, TEAM_TOKEN, &spec(&uri), None);
        assert_eq!(status, 422, "{uri}: {body}");
        assert_eq!(body["error"]["field"], "tracking.mlflow_uri", "{uri}: {body}");
    }

    mlflow.wait_ready();
    let ready = started.elapsed() - installed;
    let id = submit_ok(&daemon, &spec(&format!("{}/", mlflow.url)));
    let job = wait_job(&daemon, &id, Duration::from_secs(120), ended);
    assert_eq!(job.state, JobState::Published, "{job}\n{}", daemon.log());

    // The run: found by its tag, named by the job, FINISHED once the tracker saw the end.
    let tracker_log =
        || daemon.log().lines().filter(|line| line.contains("mlflow")).collect::<Vec<_>>().join("\n");
    let by_name = "experiments/get-by-name?experiment_name=tests%2Ftiny-arith";
    let mut experiment = Err(String::new());
    wait_until(Duration::from_secs(30), || {
        experiment = mlflow.try_call(by_name, None);
        experiment.is_ok()
    });
    let experiment = experiment.unwrap_or_else(|error| panic!("{error}\n{}", tracker_log()));
    let experiment = experiment["experiment"]["experiment_id"].as_str().unwrap().to_owned();
    let search = serde_json::json!({
        "experiment_ids": [experiment],
        "filter": format!("tags.`rlvr.job_id` = '{id}'"),
    });
    let mut run = Value::Null;
    let finished = wait_until(Duration::from_secs(30), || {
        run = mlflow.call("runs/search", Some(search.clone()))["runs"][0].clone();
        run["info"]["status"] == "FINISHED"
    });
    assert!(finished, "the run did not finish: {run}\n{}", tracker_log());
    let runs = mlflow.call("runs/search", Some(search.clone()))["runs"].as_array().unwrap().len();
    assert_eq!(runs, 1, "one run per job");
    assert_eq!(run["info"]["run_name"], id.as_str());
    let run_id = run["info"]["run_id"].as_str().unwrap().to_owned();
    let pairs = |kind: &str| -> BTreeMap<String, String> {
        run["data"][kind]
            .as_array()
            .unwrap()
            .iter()
            .map(|pair| {
                (pair["key"].as_str().unwrap().to_owned(), pair["value"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    let (params, tags) = (pairs("params"), pairs("tags"));
    let version = job.published_version.clone().expect("a published version");
    let expected_tags = [
        ("rlvr.team", "tests".to_owned()),
        ("rlvr.model_line", "tiny-arith".to_owned()),
        ("rlvr.state", "published".to_owned()),
        ("rlvr.gates", "passed".to_owned()),
        ("rlvr.published_version", format!("{}@{}", version.line, version.version)),
    ];
    for (key, value) in expected_tags {
        assert_eq!(tags.get(key), Some(&value), "tag {key}: {tags:?}");
    }
    let expected_params =
        [("optimizer.plugin", "grpo"), ("rollout.max_new_tokens", "5"), ("verifiers.0.plugin", "math")];
    for (key, value) in expected_params {
        assert_eq!(params.get(key).map(String::as_str), Some(value), "param {key}: {params:?}");
    }

    // Every metrics line's figure, at its step, exactly.
    let metrics = fs::read_to_string(daemon.state.join(format!("jobs/{id}/run/metrics.jsonl"))).unwrap();
    for metric in ["reward_mean", "heldout/accuracy", "loss"] {
        let expected = figures(&metrics, metric);
        assert!(!expected.is_empty(), "{metric} is in no line of metrics.jsonl");
        let route = format!("metrics/get-history?run_id={run_id}&metric_key={}", metric.replace('/', "%2F"));
        let mut logged: Vec<(u64, f64)> = mlflow.call(&route, None)["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|point| (point["step"].as_u64().unwrap(), point["value"].as_f64().unwrap()))
            .collect();
        logged.sort_by_key(|(step, _)| *step);
        assert_eq!(logged, expected, "{metric}");
    }

    // The published files and the manifest, the same bytes as published.
    let published = job.published_dir().to_owned();
    let manifest: Value =
        serde_json::from_slice(&fs::read(published.join("manifest.json")).unwrap()).unwrap();
    let listed = mlflow.call(&format!("artifacts/list?run_id={run_id}&path=model"), None);
    let mut names: Vec<&str> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["path"].as_str().unwrap().trim_start_matches("model/"))
        .collect();
    names.sort();
    let mut expected: Vec<&str> = manifest["files"].as_object().unwrap().keys().map(String::as_str).collect();
    expected.push("manifest.json");
    expected.sort();
    assert_eq!(names, expected);
    for (name, sha256) in manifest["files"].as_object().unwrap() {
        let bytes = mlflow.artifact(&experiment, &run_id, &format!("model/{name}"));
        assert_eq!(hex::encode(Sha256::digest(&bytes)), sha256.as_str().unwrap(), "{name}");
    }
    let uploaded = mlflow.artifact(&experiment, &run_id, "model/manifest.json");
    assert_eq!(uploaded, fs::read(published.join("manifest.json")).unwrap());

    // A longer job: its figures reach MLflow while it runs, and its cancel ends the run KILLED.
    let long = submit_ok(&daemon, &spec(&mlflow.url).replace("max_steps = 4", "max_steps = 400"));
    let search = serde_json::json!({
        "experiment_ids": [experiment],
        "filter": format!("tags.`rlvr.job_id` = '{long}'"),
    });
    let mut live = 0;
    let logged_live = wait_until(Duration::from_secs(60), || {
        let run = mlflow.call("runs/search", Some(search.clone()))["runs"][0].clone();
        let Some(run_id) = run["info"]["run_id"].as_str() else { return false };
        let route = format!("metrics/get-history?run_id={run_id}&metric_key=reward_mean");
        live = mlflow.call(&route, None)["metrics"].as_array().map_or(0, Vec::len);
        live >= 3 && run["info"]["status"] == "RUNNING"
    });
    assert!(logged_live, "{live} steps logged while the job runs\n{}", tracker_log());
    api(&daemon, Some(TEAM_TOKEN)).cancel(&long).unwrap();
    assert_eq!(wait_job(&daemon, &long, Duration::from_secs(60), ended).state, JobState::Cancelled);
    let mut run = Value::Null;
    let killed = wait_until(Duration::from_secs(30), || {
        run = mlflow.call("runs/search", Some(search.clone()))["runs"][0].clone();
        run["info"]["status"] == "KILLED"
    });
    assert!(killed, "the cancelled job's run: {run}\n{}", tracker_log());
    eprintln!(
        "mlflow venv ready in {installed:.1?}, server answering {ready:.1?} later, test done in {:.1?}",
        started.elapsed()
    );
}
