//! What `POST /v1/jobs` checks beyond the spec itself, so a job that cannot run is refused at
//! submit, not at 3 a.m.: the plugins it names are loaded and of the right kind, they fit each
//! other and the data (the rules the worker applies at start, `rlvr_plugin_host::fit`), its
//! webhook is a destination the operator's `[outbound]` policy allows, its budget is sane, and its
//! `[resources]` fit this daemon's devices. What its names reach (datasets, models, the model
//! line) is `tenancy::resolve`'s.

use rlvr_plugin_api::PluginKind;
use rlvr_protocol::spec::{JobSpec, SpecError};

use rlvr_plugin_host::Registry;
use rlvr_plugin_host::fit::{fit_problems, optimizer_needs};

use crate::sched::service::Scheduler;

/// Longest wall-clock budget a job may ask for: 30 days.
const MAX_WALL_MINUTES: f64 = 30.0 * 24.0 * 60.0;

/// Every problem found, each naming its field.
pub fn check_runnable(
    spec: &JobSpec,
    registry: &Registry,
    scheduler: &Scheduler,
    outbound: &rlvr_outbound::Policy,
) -> Vec<SpecError> {
    let mut problems = Vec::new();
    let mut problem =
        |field: &str, message: String| problems.push(SpecError { field: field.to_owned(), message });

    // Plugins: loaded, and of the right kind.
    let find = |name: &str, kind: PluginKind| {
        registry.find(name, Some(kind)).map_err(|error| {
            let known: Vec<String> = registry
                .plugins()
                .iter()
                .filter(|plugin| plugin.meta.kind == kind)
                .map(|plugin| plugin.id())
                .collect();
            format!(
                "{error}; loaded {} plugins: {}",
                kind.as_str(),
                if known.is_empty() { "none".into() } else { known.join(", ") }
            )
        })
    };
    let optimizer = match find(&spec.optimizer.plugin, PluginKind::Optimizer) {
        Ok(plugin) => Some(plugin),
        Err(message) => {
            problem("optimizer.plugin", message);
            None
        }
    };
    for (i, verifier) in spec.verifiers.iter().enumerate() {
        if let Err(message) = find(&verifier.plugin, PluginKind::Verifier) {
            problem(&format!("verifiers[{i}].plugin"), message);
        }
    }
    if let Some(curriculum) = &spec.curriculum
        && let Err(message) = find(&curriculum.plugin, PluginKind::Curriculum)
    {
        problem("curriculum.plugin", message);
    }
    if let Some(name) = spec.curriculum.as_ref().and_then(|c| c.name.as_deref())
        && !crate::curricula::valid_name(name)
    {
        problem("curriculum.name", format!("expected {}, got {name:?}", crate::curricula::NAME_RULE));
    }

    // The optimizer's needs against the rest of the spec: the worker's own rules.
    if let Some(optimizer) = &optimizer {
        match optimizer_needs(&optimizer.meta) {
            None => problem(
                "optimizer.plugin",
                format!("{} reports no data mode this daemon knows", optimizer.id()),
            ),
            Some(info) => {
                for (field, message) in fit_problems(spec, &info, &optimizer.id()) {
                    problem(&field, message);
                }
            }
        }
    }

    // The built-in model's name; the data and the other models are the team's names, which
    // `tenancy::resolve` checks.
    builtin_model(&mut problem, "model.policy", &spec.model.policy);
    builtin_model(&mut problem, "model.reference", &spec.model.reference);

    // The webhook: checked again, with DNS, when it is called.
    if let Some(url) = spec.publish.as_ref().and_then(|publish| publish.webhook.as_deref())
        && let Err(refusal) = outbound.check_url(url)
    {
        problem("publish.webhook", refusal.to_string());
    }

    // Budgets and resources within what a daemon can honour.
    if let Some(minutes) = spec.budget.max_wall_minutes
        && minutes > MAX_WALL_MINUTES
    {
        problem(
            "budget.max_wall_minutes",
            format!("expected at most {MAX_WALL_MINUTES} (30 days), got {minutes}"),
        );
    }
    let demand = scheduler.demand("submitted", spec, std::time::Duration::ZERO);
    if let Err(why) = scheduler.can_ever_fit(&demand) {
        problem(why.field, why.message);
    }
    problems
}

fn builtin_model(problem: &mut impl FnMut(&str, String), field: &str, source: &str) {
    if source.starts_with("builtin:") && rlvr_protocol::spec::builtin_seed(source).is_none() {
        let name = rlvr_protocol::spec::BUILTIN_MODEL;
        problem(field, format!("expected {name} or {name}?seed=N, got {source:?}"));
    }
}
