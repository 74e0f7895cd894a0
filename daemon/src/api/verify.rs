//! The graders' dry-run, so a team can test its reward before it spends a GPU hour:
//! `POST /v1/verify` grades sample items with one grader or a whole reward (graders and their
//! formula) through the daemon's loaded plugins; `POST /v1/graders/validate` checks the same
//! body without running anything. Both check what a submit checks of a job's graders — loaded
//! verifier plugins, their options (each refusal at the key as the body writes it:
//! `grader.fallback`, `reward.graders[1].url`, `reward.formula`), server paths refused, URLs
//! against the operator's outbound policy, secrets the caller's team's — and a run gets exactly
//! what that team's job would get: its secrets by name and the outbound policy.
//!
//! Grading runs in the daemon's process with the plugin host's batch engine (a call past its
//! deadline is answered as a timeout and abandoned). What one request may cost is bounded: at most
//! `VerifyRequest::MAX_ITEMS` items and [`MAX_GRADERS`] graders; a place in its team's lane (or its
//! job's, `api::lanes`), held until its grading has ended; and a [`Stop`]: once the request's
//! client goes away or `api.dry_run_budget_s` has passed, no item is handed to a grader any more,
//! each is answered as not graded at once.
//!
//! Why in the daemon's process and not a worker process per request: the verifiers are loaded into
//! `rlvrd` after their probe, so a dry-run answers in the plugins' own time (microseconds for
//! `math`) instead of a libtorch process start, and runs the very libraries a job would pin.  What is not bounded: a plugin that crashes
//! the process on some input would crash the daemon, as it already would at `check_options`; the
//! plugins are the operator's, probed and fuzzed.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use rlvr_plugin_host::LoadedPlugin;
use rlvr_plugin_host::reward::{Combiner, Grader, Reward, ToScore, VERIFY_DEADLINE};
use rlvr_plugin_host::verify::{Stop, parse_line};
use rlvr_protocol::api::{GraderCheck, GradersValid, VerifyRequest, VerifyResults};
use rlvr_protocol::formula::Formula;
use rlvr_protocol::job::ErrorBody;
use rlvr_protocol::reward_model::is_reward_model;
use rlvr_protocol::spec::{MAX_GRADERS, PluginSection, REWARD_MODEL_GRADER, SpecError, check_graders};
use serde_json::Value;

use super::auth::Caller;
use super::failure::{Answer, Failure};
use super::jobs::{JobsState, read_body};
use super::lanes::Lane;
use crate::jobs::checks::{PluginRefs, refuse_urls};

/// Items each grader grades at once.
const PARALLEL: usize = 4;

/// `POST /v1/verify`: grades `items` with `grader`, or with `reward`'s graders and formula.
#[utoipa::path(
    post,
    path = "/v1/verify",
    request_body(content = VerifyRequest, description = "A grader or a reward, and the items to grade (design.md §1 batch format)"),
    responses(
        (status = 200, description = "One line per item, in order", body = VerifyResults),
        (status = 400, description = "Not a request (syntax, types, unknown fields)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, description = "A grader, formula or item that cannot run here", body = ErrorBody),
        (status = 429, description = "Too many dry-runs at once, over the daemon or the team's; retry", body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "graders"
)]
pub async fn verify(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Answer<Json<VerifyResults>> {
    let request = read_request(&state, body).await?;
    let reward = RewardAsked::from(&request)?;
    const MAX_ITEMS: usize = VerifyRequest::MAX_ITEMS;
    if request.items.is_empty() || request.items.len() > MAX_ITEMS {
        return Err(Failure::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_items",
            format!("expected 1–{MAX_ITEMS} items, got {}", request.items.len()),
        )
        .field("items"));
    }
    // A team's dry-run has a budget; an engine's ranks grading their job's completions do not
    // (a job's rewards grade every item, as the native worker's do), only a cancel stops them.
    let (lane, stop) = match &caller.job {
        Some(job) => (Lane::Job { id: job.id.clone(), ranks: job.ranks }, Stop::on_cancel()),
        None => (Lane::Team(caller.team.clone()), Stop::within(state.dry_run_budget)),
    };
    // An engine scores what it is sent (an item not graded would train as a 0), and its requests
    // end with its graders' calls: only a team's dry-run is stopped by a stopping daemon.
    let stop_with_daemon = caller.job.is_none();
    let ticket = state
        .dry_runs
        .try_take(lane)
        .map_err(|message| Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", message).retry(1))?;
    // Dropped with this handler: when the client goes away before the answer, grading stops.
    let stop = Arc::new(stop);
    let _cancel_on_drop = CancelOnDrop(Arc::clone(&stop));
    let stopping = state.stopping.clone();
    let grading_stop = Arc::clone(&stop);
    let state = Arc::clone(&state);
    let mut grading = tokio::task::spawn_blocking(move || {
        let stop = grading_stop;
        // The lane's place is given back when the grading ends, not when the request does.
        let _ticket = ticket;
        let checked = check(&state, &caller, &reward, true)?;
        let items = parse_items(&request.items)?;
        let host = state
            .tenancy
            .host_context(&caller.team, state.outbound.policy())
            .map_err(|message| vec![SpecError { field: reward.graders_field.clone(), message }])?;
        let mut graders = Vec::with_capacity(checked.plugins.len());
        for (i, (plugin, section)) in checked.plugins.iter().zip(&reward.graders).enumerate() {
            // Only plugin graders run here (`check` refused a reward model).
            let Grading::Plugin(plugin) = plugin else { continue };
            let verifier = plugin.verifier_in(&section.plugin_config(), &host).map_err(|error| {
                vec![SpecError {
                    field: reward.field_of(i, ""),
                    message: format!("{} refused its options: {error}", plugin.id()),
                }]
            })?;
            graders.push(Grader { id: plugin.id(), verifier: Arc::new(verifier) });
        }
        let reward_run = Reward {
            graders,
            combiner: Combiner {
                names: reward.graders.iter().map(|g| g.grader_name().to_owned()).collect(),
                weights: reward.graders.iter().map(|g| g.weight).collect(),
                formula: checked.formula,
            },
            parallel: PARALLEL,
            deadline: VERIFY_DEADLINE,
            stop: Some(stop),
        };
        let to_score: Vec<ToScore<'_>> = items
            .iter()
            .map(|item| ToScore {
                id: item.id.as_deref().unwrap_or(""),
                prompt: &item.prompt,
                completion: &item.completion,
                reference_json: &item.reference_json,
            })
            .collect();
        let results = if reward.single {
            let mut lines = reward_run.verdicts(&to_score).remove(0);
            for (line, item) in lines.iter_mut().zip(&items) {
                line.id.clone_from(&item.id);
            }
            lines
        } else {
            let scored = reward_run.score(&to_score);
            scored
                .into_iter()
                .zip(&items)
                .map(|(scored, item)| scored.output_line(item.id.clone(), "reward"))
                .collect()
        };
        tracing::info!(team = %caller.team, items = items.len(), graders = reward.graders.len(), "dry-run graded");
        Ok(VerifyResults { results })
    });
    // A stopping daemon waits for its blocking tasks: a dry-run's grading stops with it, its
    // running calls ending at their deadline, so a SIGTERM ends in time whatever was being graded.
    let graded = tokio::select! {
        graded = &mut grading => graded,
        () = stopping.cancelled(), if stop_with_daemon => {
            stop.cancel();
            grading.await
        }
    };
    graded
        .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?
        .map(Json)
        .map_err(|problems| Failure::spec(StatusCode::UNPROCESSABLE_ENTITY, "cannot_run", problems))
}

/// Cancels its [`Stop`] when dropped: held by the request's handler, whose future is dropped when
/// the client disconnects before the answer.
struct CancelOnDrop(Arc<Stop>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// `POST /v1/graders/validate`: checks a grader or a reward as `verify` would, runs nothing.
#[utoipa::path(
    post,
    path = "/v1/graders/validate",
    request_body(content = VerifyRequest, description = "A grader or a reward (items are ignored)"),
    responses(
        (status = 200, description = "The graders as a job would use them", body = GradersValid),
        (status = 400, description = "Not a request (syntax, types, unknown fields)", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, description = "A grader or formula that cannot run here", body = ErrorBody),
    ),
    security(("bearer" = [])),
    tag = "graders"
)]
pub async fn validate(
    State(state): State<Arc<JobsState>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Answer<Json<GradersValid>> {
    let request = read_request(&state, body).await?;
    let reward = RewardAsked::from(&request)?;
    let state = Arc::clone(&state);
    tokio::task::spawn_blocking(move || {
        let checked = check(&state, &caller, &reward, false)?;
        let graders = reward
            .graders
            .iter()
            .zip(&checked.plugins)
            .enumerate()
            .map(|(i, (section, plugin))| {
                let field = reward.field_of(i, "");
                let mine = |key: &str| key == field || key.starts_with(&format!("{field}."));
                let of_this = |refs: &[(String, String)]| {
                    refs.iter().filter(|(key, _)| mine(key)).map(|(_, value)| value.clone()).collect()
                };
                let digests = checked
                    .refs
                    .digests
                    .iter()
                    .filter(|(key, _)| mine(key))
                    .map(|(key, sha256)| {
                        let option = key.strip_prefix(&format!("{field}.")).unwrap_or(key);
                        (option.to_owned(), sha256.clone())
                    })
                    .collect();
                let (plugin, options_checked) = match plugin {
                    Grading::Plugin(plugin) => (plugin.id(), !checked.refs.unchecked.contains(&field)),
                    Grading::RewardModel { model } => {
                        (format!("{REWARD_MODEL_GRADER} (built in; model {model})"), true)
                    }
                };
                GraderCheck {
                    name: section.grader_name().to_owned(),
                    plugin,
                    options_checked,
                    secrets: of_this(&checked.refs.secrets),
                    urls: of_this(&checked.refs.urls),
                    digests,
                }
            })
            .collect();
        Ok(GradersValid { graders, formula: reward.formula.clone() })
    })
    .await
    .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string()))?
    .map(Json)
    .map_err(|problems| Failure::spec(StatusCode::UNPROCESSABLE_ENTITY, "cannot_run", problems))
}

/// The graders a request asks for, whichever way it wrote them.
struct RewardAsked {
    graders: Vec<PluginSection>,
    formula: Option<String>,
    /// `grader` (one grader, answered with its own lines) or `reward.graders`.
    graders_field: String,
    single: bool,
}

impl RewardAsked {
    fn from(request: &VerifyRequest) -> Answer<Self> {
        let asked = match (&request.grader, &request.reward) {
            (Some(grader), None) => RewardAsked {
                graders: vec![grader.clone()],
                formula: None,
                graders_field: "grader".into(),
                single: true,
            },
            (None, Some(reward)) => RewardAsked {
                graders: reward.graders.clone(),
                formula: reward.formula.clone(),
                graders_field: "reward.graders".into(),
                single: false,
            },
            _ => {
                return Err(Failure::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    "expected either \"grader\" (one [[verifiers]] entry) or \"reward\" ({\"formula\", \"graders\"})",
                )
                .field("grader"));
            }
        };
        if asked.graders.is_empty() || asked.graders.len() > MAX_GRADERS {
            return Err(Failure::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("expected 1–{MAX_GRADERS} graders, got {}", asked.graders.len()),
            )
            .field(&asked.graders_field));
        }
        Ok(asked)
    }

    /// The field of grader `i`'s `key` (`grader.url`, `reward.graders[1].url`; the grader itself
    /// for an empty key).
    fn field_of(&self, i: usize, key: &str) -> String {
        let grader =
            if self.single { self.graders_field.clone() } else { format!("{}[{i}]", self.graders_field) };
        if key.is_empty() { grader } else { format!("{grader}.{key}") }
    }

    /// A field as `check_graders` names it (`grader[0].weight`), as this request wrote it.
    fn as_written(&self, field: String) -> String {
        if self.single {
            let indexed = format!("{}[0]", self.graders_field);
            if let Some(rest) = field.strip_prefix(&indexed) {
                return format!("{}{rest}", self.graders_field);
            }
        }
        field
    }
}

/// What grades with one of a request's graders.
enum Grading {
    Plugin(Arc<LoadedPlugin>),
    /// The built-in reward-model grader and its `model` as a job would pin it.
    RewardModel {
        model: String,
    },
}

/// What a request's graders passed.
struct Checked {
    /// One per grader, in order.
    plugins: Vec<Grading>,
    formula: Option<Formula>,
    refs: PluginRefs,
}

/// Everything a submit checks of a job's graders, for the caller's team; `run`: they are about
/// to grade here, which a reward-model grader cannot.
fn check(
    state: &JobsState,
    caller: &Caller,
    reward: &RewardAsked,
    run: bool,
) -> Result<Checked, Vec<SpecError>> {
    let (formula, mut problems) = check_graders(
        &reward.graders,
        None,
        reward.formula.as_deref(),
        &reward.graders_field,
        "reward.formula",
    );
    let mut refs = PluginRefs::default();
    let mut problem = |field: &str, message: String| {
        problems.push(SpecError { field: field.to_owned(), message });
    };
    // A reward model's `model`, resolved as a submit resolves it (its keys are `check_graders`').
    let mut models = Vec::new();
    for (i, grader) in reward.graders.iter().enumerate() {
        if !is_reward_model(grader) {
            continue;
        }
        if run {
            problem(
                &format!("{}[{i}].plugin", reward.graders_field),
                "a reward-model grader scores on a device inside a job; the dry-run runs plugin graders \
                 (POST /v1/graders/validate checks it)"
                    .into(),
            );
        } else if let Some(Value::String(model)) = grader.options.get("model") {
            match crate::tenancy::resolve::reward_model(&state.tenancy, &caller.team, model) {
                Ok(pinned) => models.push((i, pinned)),
                Err(message) => problem(&format!("{}[{i}].model", reward.graders_field), message),
            }
        }
    }
    let plugins = crate::jobs::checks::check_graders(
        &state.registry,
        &caller.team,
        &reward.graders,
        &reward.graders_field,
        &mut refs,
        &mut problem,
    );
    refuse_urls(
        state.outbound.policy(),
        refs.urls.iter().map(|(f, u)| (f.as_str(), u.as_str())),
        &mut problem,
    );
    problems.extend(state.tenancy.ungranted_secrets(&caller.team, &refs.secrets));
    if !problems.is_empty() {
        for problem in &mut problems {
            problem.field = reward.as_written(std::mem::take(&mut problem.field));
        }
        return Err(problems);
    }
    let plugins = plugins
        .into_iter()
        .enumerate()
        .map(|(i, plugin)| match plugin {
            Some(plugin) => Grading::Plugin(plugin),
            // `check_graders` found every plugin, so the others are reward models.
            None => Grading::RewardModel {
                model: models
                    .iter()
                    .find(|(at, _)| *at == i)
                    .map(|(_, model)| model.clone())
                    .unwrap_or_default(),
            },
        })
        .collect();
    let refs = PluginRefs {
        secrets: refs.secrets.into_iter().map(|(f, s)| (reward.as_written(f), s)).collect(),
        urls: refs.urls.into_iter().map(|(f, u)| (reward.as_written(f), u)).collect(),
        unchecked: refs.unchecked.into_iter().map(|f| reward.as_written(f)).collect(),
        digests: refs.digests.into_iter().map(|(f, d)| (reward.as_written(f), d)).collect(),
    };
    Ok(Checked { plugins, formula, refs })
}

/// The items in the batch format; a bad one is refused at `items[i]`.
fn parse_items(
    items: &[serde_json::Value],
) -> Result<Vec<rlvr_plugin_host::verify::InputItem>, Vec<SpecError>> {
    let mut parsed = Vec::with_capacity(items.len());
    let mut problems = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match parse_line(item.to_string().as_bytes()) {
            Ok(item) => parsed.push(item),
            Err((_, message)) => problems.push(SpecError { field: format!("items[{i}]"), message }),
        }
    }
    if problems.is_empty() { Ok(parsed) } else { Err(problems) }
}

async fn read_request(state: &JobsState, body: Body) -> Answer<VerifyRequest> {
    let body = read_body(body, state.max_body_bytes).await?;
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let field = error.path().to_string();
        Failure::new(StatusCode::BAD_REQUEST, "invalid_request", error.inner().to_string())
            .field(if field == "." { "" } else { &field })
    })
}
