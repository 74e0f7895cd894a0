//! The step loop: steps until the budget ends or a stop is asked for, held-out evaluations,
//! the `[stop]` conditions, progress, checkpoints.
//!
//! A step whose weights are scored on the held-out set is also checkpointed, so every score
//! belongs to weights that can be offered to the gates: at the end the candidate is the
//! best-scoring retained checkpoint (`rlvr_protocol::checkpoints::best`), not the last.
//!
//! The loop's rule for logs: what a run writes up to a checkpoint is exactly what an
//! uninterrupted run writes, so a stop request only checkpoints (no scoring, no extra line).

use std::path::PathBuf;
use std::time::Instant;

use rlvr_protocol::checkpoints::{ScoredCheckpoint, best};
use rlvr_protocol::fs::replace_atomic;
use rlvr_protocol::jobdir::{RunDir, checkpoint_step};
use rlvr_protocol::signals::GroupSignals;
use rlvr_protocol::worker::{CandidateCheckpoint, MetricsLine, Outcome, Progress};
use rlvr_tensorboard::EventLog;
use tracing::{info, info_span, warn};

use crate::Work;
use crate::engine::{self, Engine, EngineDir, EngineEnd, EngineSettings, LaunchAt, Poll};
use crate::state::{Logs, TrainState, write_checkpoint};
use crate::step::{self, StepError};
use crate::stop::StopWatch;
use crate::{Job, WorkerError, eval, lifecycle, models};

/// How often an engine's metrics file and exit are looked at.
const ENGINE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Why the loop ended before `budget.max_steps`.
enum Ending {
    /// A stop request (SIGTERM) at a step boundary: checkpoint and resume later.
    Interrupted,
    /// A budget ran out: score where it got to, checkpoint, end.
    Budget(String),
}

/// One run of the loop: what it has done, and its clocks.
struct Loop<'a> {
    job: &'a mut Job,
    run: &'a RunDir,
    state: &'a mut TrainState,
    logs: &'a mut Logs,
    stop_watch: StopWatch,
    /// Steps whose groups gave no signal, for `progress.json`'s warnings.
    signals: GroupSignals,
    /// When this process's loop started, and the wall-clock spent before it (earlier runs).
    started: Instant,
    elapsed_before: f64,
    /// The step this process started from: the ETA is this run's pace.
    first_step: u64,
    last_checkpoint: Option<PathBuf>,
    /// The latest held-out accuracy, and the step whose weights it scored in this process.
    heldout: Option<f64>,
    scored_step: Option<u64>,
    /// Every metrics line again as TensorBoard scalars (`run/tensorboard/`); `None` once a write
    /// failed: charts are not worth a job.
    tensorboard: Option<EventLog>,
    /// The Ray job this run submitted for its engine, for `progress.json` (the job's record).
    engine_submission: Option<String>,
}

/// Runs the steps of `job` from `state` to its end; see the module docs.
pub fn drive(
    job: &mut Job,
    run: &RunDir,
    state: &mut TrainState,
    logs: &mut Logs,
) -> Result<Outcome, WorkerError> {
    // A resumed run's history is its log up to the checkpoint: the conditions judge as they would
    // have in one run.
    let mut stop_watch = StopWatch::new(&job.spec.stop);
    let mut signals = GroupSignals::default();
    let mut heldout = None;
    for line in run.read_metrics().unwrap_or_default() {
        stop_watch.observe(&line);
        signals.observe(&line);
        heldout = line.heldout.map(|score| score.accuracy).or(heldout);
    }
    let mut run_loop = Loop {
        stop_watch,
        signals,
        started: Instant::now(),
        elapsed_before: state.elapsed_s,
        first_step: state.step,
        last_checkpoint: run.latest_checkpoint().ok().flatten(),
        heldout,
        scored_step: None,
        tensorboard: Some(EventLog::new(run.tensorboard())),
        engine_submission: None,
        job,
        run,
        state,
        logs,
    };
    run_loop.write_progress(None, None)?;
    // An engine that scores held-out completes the starting weights' itself, before its first step.
    if run_loop.state.step == 0 && run_loop.job.has_heldout() && !run_loop.job.engine_scores_heldout() {
        run_loop.score_before_training()?;
    }
    let ending = match &run_loop.job.work {
        Work::Engine(settings) => {
            let settings = settings.clone();
            run_loop.engine_steps(&settings)?
        }
        _ => run_loop.steps()?,
    };
    run_loop.end(ending)
}

impl Loop<'_> {
    /// The held-out score of the starting weights: the baseline of every later one.
    fn score_before_training(&mut self) -> Result<(), WorkerError> {
        let score = eval::heldout(self.job).map_err(|error| WorkerError::from_step(0, error))?;
        info!(accuracy = score.accuracy, reward = score.reward_mean, "held-out before training");
        self.state.heldout_baseline = Some(score.accuracy);
        self.heldout = Some(score.accuracy);
        let line = MetricsLine { step: 0, heldout: Some(score.figures()), ..MetricsLine::default() };
        self.stop_watch.observe(&line);
        self.append_metrics(&line)
    }

    /// Steps until `budget.max_steps`, a budget or a stop request; `None` at `max_steps`.
    fn steps(&mut self) -> Result<Option<Ending>, WorkerError> {
        let max_steps = self.job.spec.budget.max_steps;
        while self.state.step < max_steps && !crate::sampling::done(self.job) {
            if let Some(ending) = self.budget_ending() {
                return Ok(Some(ending));
            }
            let step = self.state.step + 1;
            let span = info_span!("step", step);
            let _entered = span.enter();
            // The step's first device phase; a stop asked for while waiting for it leaves here.
            let grant = self.job.grants.hold_at_boundary(step::first_phase(self.job))?;
            let Some(grant) = grant else { return Ok(Some(Ending::Interrupted)) };
            let output = step::run_step(self.job, step, self.state.step, grant)
                .map_err(|error| WorkerError::from_step(step, error))?;
            self.state.step = step;
            self.state.tokens_generated += output.tokens_generated;
            let mut line = output.metrics;
            line.peak_memory_bytes = crate::memory::peak_bytes();
            let eval_every = self.job.spec.eval.every_steps;
            // A rejection-sampling job ends when every prompt was sampled.
            let last = step == max_steps || crate::sampling::done(self.job);
            if self.job.has_heldout() && (last || (eval_every > 0 && step % eval_every == 0)) {
                line.heldout = Some(self.score_heldout(step)?);
            }
            if let Some(tripped) = self.stop_watch.check(step, &line) {
                // The line that tripped stays in the log for the report; this step's weights are
                // not checkpointed.
                self.append_metrics(&line)?;
                let kept = self.last_checkpoint.as_deref().and_then(checkpoint_step);
                let kept = kept.map_or_else(|| "none yet".to_owned(), |at| format!("step {at}"));
                warn!(condition = tripped.condition, "stopped: {}", tripped.message);
                return Err(WorkerError::Stopped(format!(
                    "{}; the last good checkpoint is {kept}",
                    tripped.message
                )));
            }
            self.append_metrics(&line)?;
            self.signals.observe(&line);
            for record in &output.records {
                self.logs
                    .rollouts
                    .append(record)
                    .map_err(|error| self.state_error(format!("rollouts.jsonl: {error}")))?;
            }
            let eta_s = self.eta_s(step);
            step::log_progress(&line, max_steps, Some(eta_s));
            self.write_progress(Some(&line), Some(eta_s))?;
            let scored = self.scored_step == Some(step);
            if last || scored || step % self.job.spec.checkpoint.every_steps == 0 {
                self.checkpoint()?;
            }
        }
        Ok(None)
    }

    /// The steps of an `[engine]` job, on the engine (`crate::engine`): its lines into the logs
    /// and progress as they come; at its end its weights become the policy's, scored as the last
    /// step's are. `None` when it finished; interrupted when a stop request stopped it.
    fn engine_steps(&mut self, settings: &EngineSettings) -> Result<Option<Ending>, WorkerError> {
        // An engine job's only checkpoint of its own is written once its engine has finished
        // (below): a resume from it (the worker killed in the gates' evaluation, say) has the
        // trained weights loaded and every step logged, and only the end left to run.
        if self.state.step > 0 {
            info!(
                step = self.state.step,
                "resumed after the engine's end: its weights are the checkpoint's, the job's end is left"
            );
            return Ok(None);
        }
        let prepared = engine::prepare(self.job, self.run, settings)?;
        for line in &prepared.lines {
            self.engine_line(line)?;
        }
        let finished = EngineDir::of(self.run).finished();
        if prepared.finished {
            info!("the engine had finished before this run; it is not started again");
            models::load_trained_weights(&self.job.policy, &finished)?;
        } else {
            // The ranks load copies of their own: the worker's are freed while they train (the
            // reference for good: the engine's steps are the only ones that read it), and the
            // engine's weights loaded in their place at its end.
            self.job.reference = None;
            let released = models::release_weights(&self.job.policy);
            info!("the worker's copy of the model is freed while the engine trains");
            if let Some(ending) = self.run_engine(settings)? {
                return Ok(Some(ending));
            }
            models::load_released_weights(&self.job.policy, &released, &finished)?;
        }
        let step = self.state.step;
        info!(step, "the engine finished; its weights are the policy's");
        if self.job.has_heldout() {
            let figures = if self.job.engine_scores_heldout() {
                // An engine that ran no step (every one trained before a restart) still completed
                // the starting weights first.
                self.score_engine_start()?;
                let tokens = EngineDir::of(self.run).completions("final", "heldout")?;
                let score = eval::heldout_from_engine(self.job, tokens)
                    .map_err(|error| WorkerError::from_step(step, error))?;
                self.record_heldout(step, score.accuracy);
                score.figures()
            } else {
                self.score_heldout(step)?
            };
            self.append_metrics(&MetricsLine { step, heldout: Some(figures), ..MetricsLine::default() })?;
        }
        self.checkpoint()?;
        Ok(None)
    }

    /// Launches the engine and follows it to its end: `None` when it finished, interrupted when a
    /// stop request stopped it.
    fn run_engine(&mut self, settings: &EngineSettings) -> Result<Option<Ending>, WorkerError> {
        let mut running = Engine::launch(self.job, self.run, settings)?;
        if let LaunchAt::Ray { submission, .. } = &settings.launcher {
            // In the job's record from now on, not from the engine's first step (a minute away).
            self.engine_submission = Some(submission.clone());
            self.write_progress(None, None)?;
        }
        let end = loop {
            if lifecycle::stop_requested() {
                running.ask_to_stop();
            }
            let (lines, ended) = match running.poll()? {
                Poll::Running(lines) => (lines, None),
                Poll::Ended(end, lines) => (lines, Some(end)),
            };
            for line in &lines {
                self.engine_line(line)?;
            }
            if let Some(end) = ended {
                break end;
            }
            std::thread::sleep(ENGINE_POLL);
        };
        match end {
            // A stop passed on may end the launcher with a status of its own (torchrun's is 1):
            // the ranks checkpointed at the step they agreed on, and a resume starts there.
            _ if running.stop_sent() => Ok(Some(Ending::Interrupted)),
            EngineEnd::Interrupted => Ok(Some(Ending::Interrupted)),
            EngineEnd::Failed { code, message } => Err(engine::failed(code, message)),
            EngineEnd::Finished => Ok(None),
        }
    }

    /// One of the engine's step lines: logged, counted, shown in `progress.json`; with the
    /// held-out score of the ranks' completions at that step when they scored one.
    fn engine_line(&mut self, line: &MetricsLine) -> Result<(), WorkerError> {
        let mut line = line.clone();
        if self.job.engine_scores_heldout() && self.job.has_heldout() {
            self.score_engine_start()?;
            let every = self.job.spec.eval.every_steps;
            if every > 0 && line.step % every == 0 && line.step < self.job.spec.budget.max_steps {
                let tokens =
                    EngineDir::of(self.run).completions(&format!("step-{}", line.step), "heldout")?;
                let score = eval::heldout_from_engine(self.job, tokens)
                    .map_err(|error| WorkerError::from_step(line.step, error))?;
                // Not a candidate for the gates: the worker keeps no checkpoint of this step.
                self.heldout = Some(score.accuracy);
                line.heldout = Some(score.figures());
            }
        }
        self.state.step = line.step;
        self.state.tokens_generated += line.tokens_generated.unwrap_or(0);
        self.append_metrics(&line)?;
        self.signals.observe(&line);
        let eta_s = self.eta_s(line.step);
        step::log_progress(&line, self.job.spec.budget.max_steps, Some(eta_s));
        self.write_progress(Some(&line), Some(eta_s))
    }

    /// The budget that ran out before the next step, if one did; a stop request counts too.
    fn budget_ending(&self) -> Option<Ending> {
        if lifecycle::stop_requested() {
            return Some(Ending::Interrupted);
        }
        let budget = &self.job.spec.budget;
        if let Some(limit) = budget.max_generated_tokens
            && self.state.tokens_generated >= limit
        {
            return Some(Ending::Budget(format!(
                "budget.max_generated_tokens: {} ≥ {limit}",
                self.state.tokens_generated
            )));
        }
        if let Some(minutes) = budget.max_wall_minutes
            && self.elapsed_s() >= minutes * 60.0
        {
            return Some(Ending::Budget(format!("budget.max_wall_minutes: {minutes} reached")));
        }
        None
    }

    /// Wall-clock seconds spent on the job, over every run.
    fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// Seconds until the job ends after `step`: the steps left at this process's pace, capped by
    /// what is left of `budget.max_wall_minutes`. The one ETA: logged, and in `progress.json`.
    fn eta_s(&self, step: u64) -> f64 {
        // A line replayed from before this process started (an engine's, on resume) counts as
        // none of its steps.
        let per_step =
            self.started.elapsed().as_secs_f64() / step.saturating_sub(self.first_step).max(1) as f64;
        let mut eta_s = per_step * self.job.spec.budget.max_steps.saturating_sub(step) as f64;
        if let Some(minutes) = self.job.spec.budget.max_wall_minutes {
            eta_s = eta_s.min((minutes * 60.0 - self.elapsed_s()).max(0.0));
        }
        eta_s
    }

    fn score_heldout(&mut self, step: u64) -> Result<rlvr_protocol::worker::ScoreFigures, WorkerError> {
        let score = eval::heldout(self.job).map_err(|error| WorkerError::from_step(step, error))?;
        self.record_heldout(step, score.accuracy);
        Ok(score.figures())
    }

    /// The held-out baseline from the engine's completions of the starting weights, once a run
    /// (they are written before the engine's first step): the line of step 0, as
    /// `score_before_training` writes it.
    fn score_engine_start(&mut self) -> Result<(), WorkerError> {
        if self.state.heldout_baseline.is_some() {
            return Ok(());
        }
        let tokens = EngineDir::of(self.run).completions("start", "heldout")?;
        let score =
            eval::heldout_from_engine(self.job, tokens).map_err(|error| WorkerError::from_step(0, error))?;
        info!(
            accuracy = score.accuracy,
            reward = score.reward_mean,
            "held-out before training (the engine's completions)"
        );
        self.state.heldout_baseline = Some(score.accuracy);
        self.heldout = Some(score.accuracy);
        let line = MetricsLine { step: 0, heldout: Some(score.figures()), ..MetricsLine::default() };
        self.stop_watch.observe(&line);
        self.append_metrics(&line)
    }

    /// `accuracy` as the held-out score of `step`'s weights, the checkpoint written next.
    fn record_heldout(&mut self, step: u64, accuracy: f64) {
        self.heldout = Some(accuracy);
        self.scored_step = Some(step);
        // Recorded for this step's checkpoint, which follows; retention keeps or drops it there.
        self.state.scored.retain(|scored| scored.step != step);
        self.state.scored.push(ScoredCheckpoint { step, accuracy });
    }

    /// The checkpoint offered to the gates: the best-scoring retained one (ties: the earlier),
    /// or the last when nothing was scored. `None` before any checkpoint.
    fn candidate(&self) -> Option<(PathBuf, CandidateCheckpoint)> {
        let mut scored = self.state.scored.clone();
        scored.sort_by_key(|scored| scored.step);
        match best(&scored) {
            Some(chosen) => {
                let path = self.run.checkpoint(chosen.step);
                let choice =
                    CandidateCheckpoint { step: chosen.step, heldout: Some(chosen.accuracy), scored };
                Some((path, choice))
            }
            None => {
                let last = self.last_checkpoint.clone()?;
                let step = checkpoint_step(&last)?;
                Some((last, CandidateCheckpoint { step, heldout: None, scored }))
            }
        }
    }

    /// After the loop: a stop request only checkpoints; a budget scores the weights it ends with
    /// (as the last step does, so every job reports where it got to) and checkpoints.
    fn end(mut self, ending: Option<Ending>) -> Result<Outcome, WorkerError> {
        let mut stopped = None;
        let mut interrupted = false;
        match ending {
            // An evaluation (`budget.max_steps = 0`): the model as it was loaded is the candidate
            // the gates judge and the daemon publishes.
            None if self.job.spec.budget.max_steps == 0 && self.last_checkpoint.is_none() => {
                self.checkpoint()?;
            }
            None => {}
            Some(Ending::Interrupted) => {
                interrupted = true;
                stopped = Some("stopped on request (SIGTERM) at a step boundary".to_owned());
                // Only a checkpoint: scoring or logging anything here would make the resumed
                // run's logs differ from an uninterrupted one's.
                let at = self.last_checkpoint.as_deref().and_then(checkpoint_step);
                // An engine's checkpoint is its own (`engine/output/`); the policy here still
                // holds the starting weights.
                if self.state.step > 0
                    && at != Some(self.state.step)
                    && !matches!(self.job.work, Work::Engine(_))
                {
                    self.checkpoint()?;
                }
            }
            Some(Ending::Budget(reason)) if self.state.step > 0 => {
                // Not when this process ran no step (a resume of a job already stopped): that
                // process scored them.
                let step = self.state.step;
                if self.job.has_heldout() && step > self.first_step && self.scored_step != Some(step) {
                    let figures = self.score_heldout(step)?;
                    info!(accuracy = figures.accuracy, step, "held-out at the stop");
                    self.append_metrics(&MetricsLine {
                        step,
                        heldout: Some(figures),
                        ..MetricsLine::default()
                    })?;
                }
                self.checkpoint()?;
                stopped = Some(reason);
            }
            Some(Ending::Budget(reason)) => stopped = Some(reason),
        }
        if let Some(reason) = &stopped {
            warn!(%reason, step = self.state.step, "stopped before max_steps");
        }
        // An interrupted run is resumed, not gated: it offers its last checkpoint as before.
        let candidate = if interrupted { None } else { self.candidate() };
        if let Some((_, choice)) = &candidate {
            info!(step = choice.step, heldout = ?choice.heldout, scored = choice.scored.len(), "the gates' candidate");
        }
        let checkpoint = candidate
            .as_ref()
            .map(|(path, _)| path.clone())
            .or_else(|| self.last_checkpoint.clone())
            .unwrap_or_default();
        Ok(Outcome {
            steps: self.state.step,
            weights_sha256: self.job.weights_sha256(),
            heldout_before: self.state.heldout_baseline,
            heldout_after: self.scored_step.and(self.heldout),
            checkpoint,
            stopped,
            interrupted,
            training: self.stop_watch.trend(),
            evaluation: None,
            plugins: Vec::new(),
            data_sha256: Default::default(),
            peak_memory_bytes: None,
            candidate: candidate.map(|(_, choice)| choice),
            dataset: None,
        })
    }

    fn checkpoint(&mut self) -> Result<(), WorkerError> {
        self.state.elapsed_s = self.elapsed_s();
        if let Work::RejectionSampling(rejection) = &mut self.job.work {
            let synced = rejection.synced_len();
            self.state.dataset_bytes =
                synced.map_err(|error| self.state_error(format!("dataset.jsonl: {error}")))?;
        }
        self.last_checkpoint = Some(write_checkpoint(self.job, self.run, self.state, self.logs)?);
        Ok(())
    }

    fn append_metrics(&mut self, line: &MetricsLine) -> Result<(), WorkerError> {
        self.logs
            .metrics
            .append(line)
            .map_err(|error| self.state_error(format!("metrics.jsonl: {error}")))?;
        if let Some(tensorboard) = &mut self.tensorboard
            && let Err(error) = tensorboard.append(line)
        {
            warn!(%error, "tensorboard: this run writes no more events");
            self.tensorboard = None;
        }
        Ok(())
    }

    /// Replaces `progress.json` with where the job stands after `line`'s step (before the first
    /// step of this run: the step it starts from).
    fn write_progress(&self, line: Option<&MetricsLine>, eta_s: Option<f64>) -> Result<(), WorkerError> {
        let progress = Progress {
            step: self.state.step,
            max_steps: self.job.spec.budget.max_steps,
            reward: line.and_then(|line| line.reward_mean),
            loss: line.and_then(|line| line.loss),
            kl: line.and_then(|line| line.kl_ref),
            heldout: self.heldout,
            tokens_per_s: line.and_then(|line| line.time.as_ref()?.generation_tokens_per_s),
            step_s: line.and_then(|line| line.time.as_ref().map(|time| time.step_s)),
            eta_s,
            warnings: self.signals.warnings(),
            engine_submission: self.engine_submission.clone(),
        };
        // Live figures only: readers never see half a file, and a crash may lose the last one.
        serde_json::to_vec_pretty(&progress)
            .map_err(std::io::Error::other)
            .and_then(|bytes| replace_atomic(&self.run.progress(), &bytes))
            .map_err(|error| self.state_error(format!("progress.json: {error}")))
    }

    fn state_error(&self, message: String) -> WorkerError {
        WorkerError::State { path: self.run.path().to_owned(), message }
    }
}

impl WorkerError {
    /// A step's error: the grant socket's and an unreachable environment's are not the job's
    /// fault; anything else is, at `step`.
    pub fn from_step(step: u64, error: StepError) -> WorkerError {
        match error {
            StepError::Grants(error) => WorkerError::Grants(error),
            StepError::Failed(message) => WorkerError::Step { step, message },
            StepError::Environment(message) => WorkerError::Environment(format!("step {step}: {message}")),
        }
    }
}
